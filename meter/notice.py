"""A pending reclaim, shown to the workloads on a node (as clouds show spot interruption
notices), so a buyer's job can checkpoint before its GPUs go.

The operator hands each node its signed reclaim (``gridledger meter notice RECLAIM.json
--config meter.toml``); the node checks it against the signed terms the meter meters —
signed by that placement's operator key (SPEC §4.0), naming GPUs of this node — and
writes the **notice file** ``<spool>.reclaim-notice.json`` beside its spool directory
(atomically)::

    {"placement_id": ..., "reclaim_id": ..., "gpus": [this node's GPUs],
     "effective_at_ms": ..., "effective_at": "2027-...Z", "issued_at_ms": ...}

``gridledger meter notice-serve --config meter.toml --listen 127.0.0.1:PORT`` answers it
on the node's loopback: ``GET /reclaim`` is 200 with the notice and ``seconds_left``
(until the effective time; 0 once passed), or 404 when none is pending. Nothing here
changes what is metered or billed: the ledger folds the reclaim it receives (SPEC §6.3).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final

from proto.envelope import check_signatures, open_envelope
from proto.errors import ProtoError
from proto.keys import key_id
from proto.limits import MAX_ENVELOPE_BYTES
from proto.records import PlacementTerms, ReclaimNotice

NOTICE_FILE: Final = "reclaim-notice.json"
NOTICE_HTTP_TIMEOUT_S: Final = 5.0


class NoticeRefused(Exception):
    """The reclaim is not one this node should show (the message says why)."""


@dataclass(frozen=True, slots=True)
class Notice:
    """A checked reclaim, as the node shows it."""

    placement_id: str
    reclaim_id: str
    gpus: list[str]
    effective_at_ms: int
    issued_at_ms: int

    def as_json(self) -> dict[str, Any]:
        """The notice file's fields."""
        return {
            "placement_id": self.placement_id,
            "reclaim_id": self.reclaim_id,
            "gpus": self.gpus,
            "effective_at_ms": self.effective_at_ms,
            "effective_at": datetime.fromtimestamp(self.effective_at_ms / 1000, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "issued_at_ms": self.issued_at_ms,
        }


def check_notice(raw: bytes, terms: tuple[PlacementTerms, ...], node_id: str) -> Notice:
    """The notice of a signed reclaim for ``node_id``; NoticeRefused naming what is wrong."""
    if len(raw) > MAX_ENVELOPE_BYTES:
        raise NoticeRefused(f"a reclaim is at most {MAX_ENVELOPE_BYTES} bytes")
    try:
        opened = open_envelope(raw.strip())
    except ProtoError as exc:
        raise NoticeRefused(f"not a signed record: {exc}") from exc
    record = opened.record
    if not isinstance(record, ReclaimNotice):
        raise NoticeRefused(f"a {opened.kind}, not a reclaim")
    placement = next((t for t in terms if t.placement_id == record.placement_id), None)
    if placement is None:
        raise NoticeRefused(f"placement {record.placement_id} is not metered on this node")
    operator = placement.operator.key
    report = check_signatures(opened.envelope, {key_id(operator): operator})
    if report.failure() is not None:
        raise NoticeRefused(
            f"not signed by the operator of {record.placement_id} ({report.failure()})"
        )
    here = {g.uuid for g in placement.gpus if g.node_id == node_id}
    mine = [g for g in record.gpus if g in here]
    if not mine:
        raise NoticeRefused(f"reclaim {record.reclaim_id} names no GPU of node {node_id}")
    return Notice(
        record.placement_id, record.reclaim_id, mine, record.effective_at_ms, record.issued_at_ms
    )


def notice_path(spool_dir: Path) -> Path:
    """Where the node's notice file is: beside its spool, named after it."""
    return spool_dir.parent / f"{spool_dir.name}.{NOTICE_FILE}"


def write_notice(path: Path, notice: Notice) -> None:
    """Write the notice file atomically (temporary file, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w", encoding="utf-8") as out:
        out.write(json.dumps(notice.as_json(), sort_keys=True) + "\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def read_notice(path: Path, now_ms: int) -> dict[str, Any] | None:
    """The pending notice with ``seconds_left`` at ``now_ms``, or None (no file)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    left_ms = max(0, int(data["effective_at_ms"]) - now_ms)
    return {**data, "seconds_left": left_ms // 1000}


class NoticeServer:
    """``GET /reclaim`` on a loopback address, from the notice file."""

    def __init__(self, path: Path, host: str, port: int) -> None:
        notice_file = path

        class Handler(BaseHTTPRequestHandler):
            timeout = NOTICE_HTTP_TIMEOUT_S

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/reclaim":
                    self._json(HTTPStatus.NOT_FOUND, {"error": "no such path; GET /reclaim"})
                    return
                try:
                    notice = read_notice(notice_file, int(time.time() * 1000))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": repr(exc)})
                    return
                if notice is None:
                    self._json(HTTPStatus.NOT_FOUND, {"error": "no reclaim pending"})
                else:
                    self._json(HTTPStatus.OK, notice)

            def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
                data = json.dumps(body, sort_keys=True).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """Base URL."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{int(port)}"

    def start(self) -> None:
        """Serve on a daemon thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=NOTICE_HTTP_TIMEOUT_S)
