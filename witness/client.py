"""The witness's side of the ledger API (SPEC §8.4): checkpoint, records, cosignature.

Every request is signed with the witness's own key (RFC 9421, SPEC §13): the ledger
serves a placement only to its parties' keys and the auditors it lists."""

from __future__ import annotations

import base64
import binascii
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Final

from proto.httpsig import sign_url
from proto.keys import SigningKey

MAX_RESPONSE_BYTES: Final = 512 * 1024 * 1024
MAX_PAGES: Final = 10_000
HTTP_TIMEOUT_S: Final = 30.0


class LedgerUnreachable(Exception):
    """The ledger did not answer (network, timeout)."""


class LedgerRefused(Exception):
    """The ledger answered with an error status; the message carries its words."""


class LedgerClient:
    """Talks to one ledger's HTTP API about one placement."""

    def __init__(self, base_url: str, placement_id: str, key: SigningKey) -> None:
        self.base = base_url.rstrip("/")
        self.placement = urllib.parse.quote(placement_id, safe="")
        self.key = key

    def _request(self, path: str, body: bytes | None = None) -> bytes:
        url = f"{self.base}/placements/{self.placement}/{path}"
        method = "POST" if body is not None else "GET"
        request = urllib.request.Request(url, data=body, method=method)
        for name, value in sign_url(self.key, method, url, body or b"", int(time.time())).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
                data: bytes = response.read(MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            words = exc.read(4096).decode("utf-8", "replace").strip()
            if exc.code == 503:  # SPEC §8.4: behind its log, no checkpoint yet: try later
                raise LedgerUnreachable(f"ledger is not ready for {path}: {words}") from exc
            raise LedgerRefused(f"ledger answered HTTP {exc.code} for {path}: {words}") from exc
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise LedgerUnreachable(f"ledger at {self.base} did not answer: {reason}") from exc
        if len(data) > MAX_RESPONSE_BYTES:
            raise LedgerRefused(f"ledger answer for {path} exceeds {MAX_RESPONSE_BYTES} bytes")
        return data

    def checkpoint(self) -> str:
        """A checkpoint at the ledger's head, asked for (SPEC §8.4: a POST, rate-limited
        by the ledger, which answers with its latest note)."""
        return self._request("checkpoint", b"").decode("utf-8", "replace")

    def records(self, start: int, stop: int) -> list[bytes]:
        """Record envelopes [start, stop), paging as the ledger serves them."""
        out: list[bytes] = []
        for _ in range(MAX_PAGES):
            if start + len(out) >= stop:
                return out
            text = self._request(f"records?from={start + len(out)}&to={stop}").decode("ascii")
            lines = text.splitlines()
            if not lines:
                raise LedgerRefused(f"ledger served no records from {start + len(out)}")
            try:
                out.extend(base64.b64decode(line, validate=True) for line in lines)
            except binascii.Error as exc:
                raise LedgerRefused("ledger served a record that is not base64") from exc
        raise LedgerRefused(f"more than {MAX_PAGES} pages of records")

    def submit(self, note_text: str) -> str:
        """Hand the cosigned note to the ledger; the note it stores."""
        return self._request("checkpoint/cosign", note_text.encode()).decode("utf-8", "replace")
