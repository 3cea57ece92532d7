"""The ledger's small HTTP API (stdlib ``http.server``, one thread per request).

A running ledger owns its DuckDB file, so parties reach it here::

    GET  /health                               {"status": "ok", ...}
    GET  /metrics                              Prometheus text exposition
    GET  /placements                           every placement: parties, window, status (JSON)
    GET  /placements/<id>/statement            statement through the current head (JSON)
    GET  /placements/<id>/statement.html?party=buyer|operator|desk   the bill a person reads
         (party: also a party's id, or a new buyer's id, SPEC §7.10)
    GET  /placements/<id>/statement.csv|.json  its line items (``ledger/bill.py``, ``billview``)
    GET  /placements/<id>/export               the export DuckDB file (bytes)
    GET  /placements/<id>/checkpoint           checkpoint note (text), cosignatures included
    POST /placements/<id>/checkpoint/cosign    body: the note with one more party signature

Loopback by default. Errors are JSON ``{"error": ...}`` with 400 (bad request), 404
(unknown placement or path), 413 (body too large) or 500; the server never dies on a
request. The bound address is written to a port file next to the DB, so the CLI finds
a ledger listening on an OS-chosen port.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, quote, unquote

import structlog

from billview import render
from ledger.bill import bill_doc
from ledger.export import export_placement
from ledger.issuer import UnknownPlacement, cosign_checkpoint, issue_checkpoint, statement_answer
from ledger.limits import HTTP_TIMEOUT_S, MAX_HTTP_BODY_BYTES
from ledger.listing import placement_list
from ledger.metrics import LedgerMetrics
from ledger.store import Store
from proto import merkle
from proto.errors import ProtoError
from proto.keys import SigningKey

log = structlog.get_logger("ledger.http")

_ROUTE: Final = re.compile(
    r"^/placements/([^/]+)/(statement|statement\.html|statement\.csv|statement\.json|export"
    r"|checkpoint|checkpoint/cosign|records|consistency)$"
)
# Records served per request: a witness pages through a long log (SPEC §8.4).
MAX_RECORDS_PER_REQUEST: Final = 10_000
_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class LedgerApi:
    """What the handlers call: the store, the ledger key, metrics, and a health probe."""

    def __init__(
        self,
        store: Store,
        key: SigningKey,
        metrics: LedgerMetrics,
        health: Callable[[], dict[str, Any]] | None = None,
        behind: Callable[[], str | None] | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.metrics = metrics
        self.health = health or (lambda: {})
        # SPEC §8.4: why the ledger is behind its log (no checkpoint for witnesses), or None
        self.behind = behind or (lambda: None)

    def statement(self, placement_id: str) -> dict[str, Any]:
        """JSON of the statement through the current head: the signed one stored for it, or
        an unsigned preview marked so (a GET never writes)."""
        return statement_answer(self.store, placement_id)

    def placements(self) -> dict[str, Any]:
        """JSON of every placement (ledger/listing.py)."""
        return {"placements": placement_list(self.store)}

    def bill(self, placement_id: str, form: str, party: str) -> tuple[str, bytes]:
        """(content type, body) of the bill in ``form`` (html, csv, json) for ``party``."""
        doc = bill_doc(self.store, self.key, placement_id)
        if form == "csv":
            return "text/csv; charset=utf-8", render.to_csv(doc).encode()
        if form == "json":
            return "application/json", render.to_json(doc)
        parties = render.parties_of(doc)  # the roles, then each new buyer (SPEC §7.10)
        page = render.page_of(doc, party)  # also a party's id: ?party=gridx-desk
        if page is None:
            ids = ", ".join(doc.parties[role] for role in ("buyer", "operator", "desk"))
            raise _HttpError(
                HTTPStatus.BAD_REQUEST,
                f"party is one of {', '.join(parties)}, or a party's id ({ids})",
            )
        party = page
        links = [("CSV", "statement.csv"), ("JSON", "statement.json")] + [
            (f"{p}'s page", f"statement.html?party={quote(p)}") for p in parties
        ]
        return "text/html; charset=utf-8", render.to_html(doc, party, links).encode()

    def checkpoint(self, placement_id: str) -> str:
        """The checkpoint note through the current head — none while the ledger is behind
        its log (SPEC §8.4: a witness would cosign a tree that inputs already in the log are
        not in yet, and they would look backdated)."""
        why = self.behind()
        if why is not None:
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"{why}; witness again shortly")
        return issue_checkpoint(self.store, self.key, placement_id)

    def cosign(self, placement_id: str, note_text: str) -> str:
        """Merge a party's cosignature; the stored note."""
        merged, added = cosign_checkpoint(self.store, self.key, placement_id, note_text)
        log.info("checkpoint_cosigned", placement=placement_id, parties=added)
        return merged

    def _span(self, placement_id: str, lo: int, hi: int | None) -> tuple[int, int]:
        """(lo, hi) checked against the log's size; ``hi`` None: the size."""
        head = self.store.head(placement_id)
        if head is None:
            raise UnknownPlacement(f"no records for placement {placement_id!r}")
        size = head.chain_index + 1
        hi = size if hi is None else hi
        if not 0 <= lo <= hi <= size:
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"sizes {lo}..{hi} outside 0..{size}")
        return lo, hi

    def records(self, placement_id: str, start: int, stop: int | None) -> str:
        """Record envelopes [start, stop), base64, one per line (at most a page), never past
        the latest checkpoint: records are unsigned (SPEC §8, §8.4), so one past every
        checkpoint is covered by a checkpoint issued for it first."""
        start, stop = self._span(placement_id, start, stop)
        stop = min(stop, start + MAX_RECORDS_PER_REQUEST)
        covered = max((size for size, _ in self.store.checkpoints(placement_id)), default=0)
        if stop > covered:
            issue_checkpoint(self.store, self.key, placement_id)  # the head: >= stop
        envelopes = self.store.record_envelopes(placement_id, stop - 1)[start:stop]
        return "".join(base64.b64encode(e).decode() + "\n" for e in envelopes)

    def consistency(self, placement_id: str, first: int, second: int | None) -> str:
        """RFC 9162 consistency proof from size ``first`` to ``second``, one hash a line."""
        first, second = self._span(placement_id, first, second)
        if first == 0:  # RFC 9162: every tree extends the empty one; the proof is empty
            return ""
        payloads = self.store.record_payloads(placement_id, second - 1)
        proof = merkle.consistency_proof([merkle.leaf_hash(p) for p in payloads], first)
        return "".join(base64.b64encode(h).decode() + "\n" for h in proof)

    def export_bytes(self, placement_id: str) -> bytes:
        """The export file of the placement, built in a temporary directory."""
        with tempfile.TemporaryDirectory(prefix="gridledger-export-") as tmp:
            out = Path(tmp) / f"{placement_id}.duckdb"
            export_placement(self.store, placement_id, out, key=self.key)
            return out.read_bytes()


def _range_query(path: str) -> tuple[int, int | None]:
    """``from`` (default 0) and ``to`` (default: the current size) of a query string."""
    query = parse_qs(path.partition("?")[2], max_num_fields=4)
    values: dict[str, int] = {}
    for name in ("from", "to"):
        texts = query.get(name, [])
        if len(texts) > 1 or (texts and not (texts[0].isascii() and texts[0].isdigit())):
            raise _HttpError(HTTPStatus.BAD_REQUEST, f"{name!r} is not one decimal number")
        if texts:
            if len(texts[0]) > 16:
                raise _HttpError(HTTPStatus.BAD_REQUEST, f"{name!r} is out of range")
            values[name] = int(texts[0])
    return values.get("from", 0), values.get("to")


def _party_query(path: str) -> str:
    """``party`` of a statement page: buyer (default), operator, desk, or the id of a new
    buyer by resale (SPEC §7.10; ``LedgerApi.bill`` checks it is one of the bill's)."""
    texts = parse_qs(path.partition("?")[2], max_num_fields=4).get("party", ["buyer"])
    if len(texts) != 1 or not (texts[0] in ("buyer", "operator", "desk") or _ID.match(texts[0])):
        raise _HttpError(
            HTTPStatus.BAD_REQUEST, "party is one of buyer, operator, desk or a new buyer's id"
        )
    return texts[0]


def _handler(api: LedgerApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "gridledger-ledger/1"
        timeout = HTTP_TIMEOUT_S

        def log_message(self, format: str, *args: Any) -> None:
            pass  # no access log on stdout; errors are logged with structlog below

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def _dispatch(self, method: str) -> None:
            try:
                self._route(method)
            except _HttpError as exc:
                self._json(exc.status, {"error": str(exc)})
            except UnknownPlacement as exc:
                self._json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
            except ProtoError as exc:
                self._json(
                    HTTPStatus.BAD_REQUEST, {"error": exc.detail, "reason": exc.reason.value}
                )
            except Exception as exc:  # a request never takes the server down
                log.exception("http_error", path=self.path)
                self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": repr(exc)})

        def _route(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            if method == "GET" and path == "/health":
                self._json(HTTPStatus.OK, {"status": "ok", **api.health()})
                return
            if method == "GET" and path == "/metrics":
                self._send(HTTPStatus.OK, "text/plain; version=0.0.4", api.metrics.exposition())
                return
            if method == "GET" and path in ("/placements", "/"):
                self._json(HTTPStatus.OK, api.placements())
                return
            match = _ROUTE.match(path)
            if match is None:
                raise _HttpError(HTTPStatus.NOT_FOUND, f"no such path {path!r}")
            placement_id, action = unquote(match.group(1)), match.group(2)
            if not _ID.match(placement_id):
                raise _HttpError(HTTPStatus.BAD_REQUEST, "placement id is not an identifier")
            if (method, action) == ("GET", "statement"):
                self._json(HTTPStatus.OK, api.statement(placement_id))
            elif method == "GET" and action.startswith("statement."):
                form = action.partition(".")[2]
                self._send(HTTPStatus.OK, *api.bill(placement_id, form, _party_query(self.path)))
            elif (method, action) == ("GET", "checkpoint"):
                self._text(HTTPStatus.OK, api.checkpoint(placement_id))
            elif (method, action) == ("GET", "export"):
                self._send(
                    HTTPStatus.OK, "application/octet-stream", api.export_bytes(placement_id)
                )
            elif (method, action) == ("GET", "records"):
                start, stop = _range_query(self.path)
                self._text(HTTPStatus.OK, api.records(placement_id, start, stop))
            elif (method, action) == ("GET", "consistency"):
                start, stop = _range_query(self.path)
                self._text(HTTPStatus.OK, api.consistency(placement_id, start, stop))
            elif (method, action) in (("POST", "checkpoint/cosign"), ("POST", "cosign")):
                self._text(HTTPStatus.OK, api.cosign(placement_id, self._body()))
            else:
                raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {action}")

        def _body(self) -> str:
            length_text = self.headers.get("Content-Length", "")
            if not length_text.isdigit():
                raise _HttpError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
            length = int(length_text)
            if length > MAX_HTTP_BODY_BYTES:
                raise _HttpError(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_HTTP_BODY_BYTES} bytes"
                )
            try:
                return self.rfile.read(length).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _HttpError(HTTPStatus.BAD_REQUEST, "body is not UTF-8") from exc

        def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
            self._send(status, "application/json", json.dumps(body, sort_keys=True).encode())

        def _text(self, status: HTTPStatus, body: str) -> None:
            self._send(status, "text/plain; charset=utf-8", body.encode())

        def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


class LedgerHttpServer:
    """The API on a background thread; ``start`` binds, ``stop`` shuts it down."""

    def __init__(
        self, api: LedgerApi, host: str, port: int, *, port_file: Path | None = None
    ) -> None:
        self.api = api
        self._server = ThreadingHTTPServer((host, port), _handler(api))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None
        self.port_file = port_file

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port)."""
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        """Base URL of the API."""
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> None:
        """Serve on a daemon thread; write the port file."""
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="ledger-http", daemon=True
        )
        self._thread.start()
        if self.port_file is not None:
            host, port = self.address
            write_port_file(self.port_file, host, port)
        log.info("http_listening", url=self.url)

    def stop(self) -> None:
        """Stop serving and remove the port file."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=HTTP_TIMEOUT_S)
        if self.port_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.port_file.unlink()


def write_port_file(path: Path, host: str, port: int) -> None:
    """Atomically write {"host", "port", "pid"} to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"host": host, "port": port, "pid": os.getpid()}) + "\n")
    os.replace(tmp, path)
