"""The exceptions of proto/: one class, carrying a stable reason code and a detail."""

from __future__ import annotations

from proto.reasons import Reason


class ProtoError(Exception):
    """Input that does not satisfy SPEC.md. ``reason`` is stable; ``detail`` is for people."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


class KeyFileError(Exception):
    """A key file that cannot be used (missing, malformed, or readable by others)."""
