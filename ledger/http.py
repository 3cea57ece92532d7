"""The ledger's HTTP API (stdlib ``http.server``, one thread per request; SPEC §13).

Parties on other machines reach a running ledger here. Every request but ``/health`` is
signed with the caller's own Ed25519 key (RFC 9421, ``proto/httpsig.py``); what a key may
see is ``ledger/access.py``'s answer: unsigned or badly signed 401, a placement the key is
no party of 404 (as an unknown one)::

    GET  /health                               {"status": "ok", ...} (unsigned)
    GET  /metrics                              Prometheus text (the ledger's or an auditor's key;
                                               unsigned on the ops listener, ``ops_http``)
    GET  /placements                           the caller's placements: parties, window, status
    GET  /placements/<id>/statement            the latest statement (JSON; parties of the terms)
    GET  /placements/<id>/statement.html?party=buyer|operator|desk|<id>   the caller's page
    GET  /placements/<id>/statement.csv|.json  its line items (parties of the terms)
    GET  /placements/<id>/export               the export through the latest statement
    GET  /placements/<id>/checkpoint           the latest checkpoint note, cosignatures included
    POST /placements/<id>/checkpoint           ask for a checkpoint at the head (rate-limited)
    GET  /placements/<id>/records?from=N&to=M  record envelopes, never past the latest checkpoint
    GET  /placements/<id>/consistency?from=N&to=M   RFC 9162 consistency proof
    POST /placements/<id>/checkpoint/cosign    body: the note with one more party signature

A GET never writes (SPEC §8.4): statements and checkpoints are issued by the ledger's own
loop (``ledger/attest_loop.py``) and on a party's POST. Loopback by default. Errors are
JSON ``{"error": ...}`` with 400, 401, 404, 413, 503 or 500; the server never dies on a
request. The bound address is written to a port file next to the DB, so the CLI finds a
ledger listening on an OS-chosen port.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, quote, unquote

import structlog

from billview import render
from ledger.access import Access, Busy, Caller, RateLimited, Roles, Unauthenticated
from ledger.bill import bill_doc
from ledger.export import NotAttested, export_placement
from ledger.issuer import UnknownPlacement, cosign_checkpoint, issue_statement, statement_answer
from ledger.limits import HTTP_TIMEOUT_S, MAX_HTTP_BODY_BYTES
from ledger.listing import placement_list
from ledger.metrics import LedgerMetrics
from ledger.openapi import OPENAPI
from ledger.store import Store
from proto import merkle
from proto.errors import ProtoError
from proto.httpsig import Request
from proto.keys import SigningKey, key_id

log = structlog.get_logger("ledger.http")

_ROUTE: Final = re.compile(
    r"^/placements/([^/]+)/(statement|statement\.html|statement\.csv|statement\.json|export"
    r"|checkpoint|checkpoint/cosign|records|consistency)$"
)
# Records served per request: a witness pages through a long log (SPEC §8.4).
MAX_RECORDS_PER_REQUEST: Final = 10_000
# SPEC §8.4: a party's POST .../checkpoint issues at most one checkpoint per placement
# this often; within it, the answer is the latest one.
CHECKPOINT_REQUEST_INTERVAL_S: Final = 5.0
_ID: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")
# RFC 9421 §5.1: what a signature must cover, sent with a 401.
ACCEPT_SIGNATURE: Final = 'sig1=("@method" "@authority" "@path" "@query");alg="ed25519"'
# The caller of an API built without ``Access`` (a test or an embedding in one process):
# the ledger's own, seeing everything. ``ledger run`` always builds it with ``Access``.
_IN_PROCESS: Final = Caller(b"", everything=True)


class _HttpError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _hidden(placement_id: str) -> UnknownPlacement:
    """The answer to a placement the caller is no party of: the one to an unknown one."""
    return UnknownPlacement(f"no records for placement {placement_id!r}")


class LedgerApi:
    """What the handlers call: the store, the ledger key, metrics, access, health."""

    def __init__(
        self,
        store: Store,
        key: SigningKey,
        metrics: LedgerMetrics,
        health: Callable[[], dict[str, Any]] | None = None,
        behind: Callable[[], str | None] | None = None,
        access: Access | None = None,
    ) -> None:
        self.store = store
        self.key = key
        self.metrics = metrics
        self.health = health or (lambda: {})
        # SPEC §8.4: why the ledger is behind its log (no checkpoint for witnesses), or None
        self.behind = behind or (lambda: None)
        self.access = access
        self._asked: dict[str, float] = {}  # placement -> monotonic time of the last POST
        self._asked_lock = threading.Lock()

    def caller(self, request: Request, headers: dict[str, str]) -> Caller:
        """The authenticated caller (Unauthenticated, Busy)."""
        if self.access is None:
            return _IN_PROCESS
        return self.access.authenticate(request, headers)

    def roles(self, caller: Caller, placement_id: str) -> Roles:
        """The caller's roles in the placement; UnknownPlacement (404) when it has none."""
        if self.access is None or caller.everything:
            return Roles(everything=True)
        roles = self.access.roles(caller, placement_id)
        if not roles.any:
            raise _hidden(placement_id)
        return roles

    def statement(self, placement_id: str) -> dict[str, Any]:
        """JSON of the statement through the current head: the signed one stored for it, or
        an unsigned preview marked so (a GET never writes)."""
        return statement_answer(self.store, placement_id)

    def placements(self, caller: Caller) -> dict[str, Any]:
        """JSON of the caller's placements (ledger/listing.py); a new buyer's entry names
        only the placement, its window, status and the caller's own id."""
        everything = placement_list(self.store)
        if self.access is None or caller.everything:
            return {"placements": everything}
        visible = self.access.visible(caller)
        out: list[dict[str, Any]] = []
        for entry in everything:
            roles = visible.get(entry["placement_id"])
            if roles is None:
                continue
            if not roles.full:
                entry = {
                    k: entry[k] for k in ("placement_id", "status", "window_start", "window_end")
                } | {"new_buyers": list(roles.new_buyer_ids)}
            out.append(entry | {"roles": [*roles.roles, *roles.new_buyer_ids]})
        return {"placements": out}

    def bill(
        self, placement_id: str, form: str, party: str | None, roles: Roles
    ) -> tuple[str, bytes]:
        """(content type, body) of the bill in ``form`` (html, csv, json) for ``party``
        (None: the caller's first page); a page that is not the caller's is 404."""
        doc = bill_doc(self.store, self.key, placement_id)
        if form in ("csv", "json") and not roles.full:
            raise _hidden(placement_id)  # a new buyer sees its page only (SPEC §13)
        if form == "csv":
            return "text/csv; charset=utf-8", render.to_csv(doc).encode()
        if form == "json":
            return "application/json", render.to_json(doc)
        parties = render.parties_of(doc)  # the roles, then each new buyer (SPEC §7.10)
        allowed = roles.pages() or parties
        page = render.page_of(doc, party or allowed[0])  # also a party's id: ?party=gridx-desk
        if page is None:
            ids = ", ".join(doc.parties[role] for role in ("buyer", "operator", "desk"))
            raise _HttpError(
                HTTPStatus.BAD_REQUEST,
                f"party is one of {', '.join(parties)}, or a party's id ({ids})",
            )
        if page not in allowed:
            raise _hidden(placement_id)
        links = [("CSV", "statement.csv"), ("JSON", "statement.json")] if roles.full else []
        links += [(f"{p}'s page", f"statement.html?party={quote(p)}") for p in allowed]
        return "text/html; charset=utf-8", render.to_html(doc, page, links).encode()

    def _not_behind(self) -> None:
        why = self.behind()
        if why is not None:
            raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, f"{why}; witness again shortly")

    def checkpoint(self, placement_id: str) -> str:
        """The latest checkpoint note stored — none while the ledger is behind its log
        (SPEC §8.4: a witness would cosign a tree that inputs already in the log are not in
        yet, and they would look backdated). A read issues nothing."""
        self._not_behind()
        latest = self.store.checkpoints(placement_id)
        if not latest:
            if self.store.head(placement_id) is None:
                raise _hidden(placement_id)
            raise _HttpError(
                HTTPStatus.SERVICE_UNAVAILABLE,
                "no checkpoint issued yet; POST to this path asks for one",
            )
        return latest[-1][1]

    def request_checkpoint(self, placement_id: str) -> str:
        """A party's request (SPEC §8.4): a statement and checkpoint at the head, at most
        once per CHECKPOINT_REQUEST_INTERVAL_S per placement; the latest note."""
        self._not_behind()
        if self.store.head(placement_id) is None:
            raise _hidden(placement_id)
        now = time.monotonic()
        with self._asked_lock:
            last = self._asked.get(placement_id)
            issue = last is None or now - last >= CHECKPOINT_REQUEST_INTERVAL_S
            if issue:
                self._asked[placement_id] = now
        if issue:
            try:
                issue_statement(self.store, self.key, placement_id)  # and its checkpoint
            except UnknownPlacement:
                raise _hidden(placement_id) from None
        return self.checkpoint(placement_id)

    def cosign(self, placement_id: str, note_text: str) -> str:
        """Merge a party's cosignature; the stored note."""
        merged, added = cosign_checkpoint(self.store, self.key, placement_id, note_text)
        log.info("checkpoint_cosigned", placement=placement_id, parties=added)
        return merged

    def _span(self, placement_id: str, lo: int, hi: int | None) -> tuple[int, int]:
        """(lo, hi) checked against the size of the latest checkpoint (SPEC §8.4: nothing
        past it is served); ``hi`` None: that size."""
        if self.store.head(placement_id) is None:
            raise _hidden(placement_id)
        size = max((n for n, _ in self.store.checkpoints(placement_id)), default=0)
        hi = size if hi is None else hi
        if not 0 <= lo <= hi <= size:
            raise _HttpError(
                HTTPStatus.BAD_REQUEST,
                f"sizes {lo}..{hi} outside 0..{size} (the latest checkpoint)",
            )
        return lo, hi

    def records(self, placement_id: str, start: int, stop: int | None) -> str:
        """Record envelopes [start, stop), base64, one per line (at most a page), never past
        the latest checkpoint: records are unsigned (SPEC §8, §8.4)."""
        start, stop = self._span(placement_id, start, stop)
        stop = min(stop, start + MAX_RECORDS_PER_REQUEST)
        if stop == start:
            return ""
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
        """The export file of the placement through its latest statement and checkpoint,
        built in a temporary directory; issues nothing (503 while none covers the head)."""
        with tempfile.TemporaryDirectory(prefix="gridledger-export-") as tmp:
            out = Path(tmp) / f"{placement_id}.duckdb"
            try:
                export_placement(self.store, placement_id, out, key=self.key, issue=False)
            except NotAttested as exc:
                raise _HttpError(HTTPStatus.SERVICE_UNAVAILABLE, str(exc)) from exc
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


def _party_query(path: str) -> str | None:
    """``party`` of a statement page: buyer, operator, desk, or the id of a new buyer by
    resale (SPEC §7.10; ``LedgerApi.bill`` checks it is one of the caller's); None: the
    caller's own."""
    texts = parse_qs(path.partition("?")[2], max_num_fields=4).get("party")
    if texts is None:
        return None
    if len(texts) != 1 or not (texts[0] in ("buyer", "operator", "desk") or _ID.match(texts[0])):
        raise _HttpError(
            HTTPStatus.BAD_REQUEST, "party is one of buyer, operator, desk or a new buyer's id"
        )
    return texts[0]


class _Handler(BaseHTTPRequestHandler):
    """The API's request handler; ``_handler`` binds it to an API (``ops``: the ops
    listener's: /health and /metrics unsigned, nothing else)."""

    api: LedgerApi
    ops: bool = False
    _status: int = 0  # of the answer sent (the access log)
    _key: str = ""  # key id of the authenticated caller
    server_version = "gridledger-ledger/1"
    timeout = HTTP_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        pass  # no access log on stdout; errors are logged with structlog below

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib's own errors (a bad request line, any method but GET and POST) as
        JSON like every other: an unknown method is 405, not 501."""
        status = HTTPStatus.METHOD_NOT_ALLOWED if code == 501 else HTTPStatus(code)
        self.close_connection = True
        self._json(status, {"error": message or status.phrase})

    def _dispatch(self, method: str) -> None:
        started = time.monotonic()
        self._status = 0
        self._key = ""
        try:
            self._route(method)
        except _HttpError as exc:
            self._json(exc.status, {"error": str(exc)})
        except Unauthenticated as exc:
            self._json(HTTPStatus.UNAUTHORIZED, {"error": str(exc)})
        except Busy as exc:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})
        except RateLimited as exc:
            self._json(HTTPStatus.TOO_MANY_REQUESTS, {"error": str(exc)})
        except UnknownPlacement as exc:
            self._json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except ProtoError as exc:
            self._json(HTTPStatus.BAD_REQUEST, {"error": exc.detail, "reason": exc.reason.value})
        except Exception as exc:  # a request never takes the server down
            log.exception("http_error", path=self.path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": repr(exc)})
        # The access log: one structured line a request (the signer's key id, not a name),
        # at debug (``ledger run --log-level debug``): a busy API would drown the rest.
        log.debug(
            "http_request",
            method=method,
            path=self.path.partition("?")[0][:256],
            status=self._status,
            key=self._key,
            ms=round((time.monotonic() - started) * 1000, 1),
        )

    def _route(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        if method == "GET" and path == "/health":
            self._json(HTTPStatus.OK, {"status": "ok", **self.api.health()})
            return
        if method == "GET" and path == "/openapi.json" and not self.ops:
            self._json(HTTPStatus.OK, OPENAPI)
            return
        if self.ops:
            if method == "GET" and path == "/metrics":
                self._metrics()
                return
            raise _HttpError(HTTPStatus.NOT_FOUND, f"no such path {path!r} (ops listener)")
        body = self._body() if method == "POST" else b""
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = Request(method, self.headers.get("Host", ""), path, query, body)
        caller = self.api.caller(request, headers)
        self._key = key_id(caller.public_key) if caller.public_key else "in-process"
        if method == "GET" and path == "/metrics":
            if not caller.everything:
                raise _HttpError(HTTPStatus.NOT_FOUND, "no such path '/metrics'")
            self._metrics()
            return
        if method == "GET" and path in ("/placements", "/"):
            self._json(HTTPStatus.OK, self.api.placements(caller))
            return
        match = _ROUTE.match(path)
        if match is None:
            raise _HttpError(HTTPStatus.NOT_FOUND, f"no such path {path!r}")
        placement_id, action = unquote(match.group(1)), match.group(2)
        if not _ID.match(placement_id):
            raise _HttpError(HTTPStatus.BAD_REQUEST, "placement id is not an identifier")
        roles = self.api.roles(caller, placement_id)
        self._placement(method, action, placement_id, roles, body)

    def _placement(
        self, method: str, action: str, placement_id: str, roles: Roles, body: bytes
    ) -> None:
        if (method, action) == ("GET", "statement"):
            if not roles.full:
                raise _hidden(placement_id)
            self._json(HTTPStatus.OK, self.api.statement(placement_id))
        elif method == "GET" and action.startswith("statement."):
            form = action.partition(".")[2]
            party = _party_query(self.path)
            self._send(HTTPStatus.OK, *self.api.bill(placement_id, form, party, roles))
        elif (method, action) == ("GET", "checkpoint"):
            self._text(HTTPStatus.OK, self.api.checkpoint(placement_id))
        elif (method, action) == ("POST", "checkpoint"):
            self._text(HTTPStatus.OK, self.api.request_checkpoint(placement_id))
        elif (method, action) == ("GET", "export"):
            self._send(
                HTTPStatus.OK, "application/octet-stream", self.api.export_bytes(placement_id)
            )
        elif (method, action) == ("GET", "records"):
            start, stop = _range_query(self.path)
            self._text(HTTPStatus.OK, self.api.records(placement_id, start, stop))
        elif (method, action) == ("GET", "consistency"):
            start, stop = _range_query(self.path)
            self._text(HTTPStatus.OK, self.api.consistency(placement_id, start, stop))
        elif (method, action) == ("POST", "checkpoint/cosign"):
            self._text(HTTPStatus.OK, self.api.cosign(placement_id, _utf8(body)))
        else:
            raise _HttpError(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {action}")

    def _metrics(self) -> None:
        self._send(HTTPStatus.OK, "text/plain; version=0.0.4", self.api.metrics.exposition())

    def _body(self) -> bytes:
        length_text = self.headers.get("Content-Length", "")
        if not length_text.isdigit():
            raise _HttpError(HTTPStatus.LENGTH_REQUIRED, "Content-Length required")
        length = int(length_text)
        if length > MAX_HTTP_BODY_BYTES:
            raise _HttpError(
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"body over {MAX_HTTP_BODY_BYTES} bytes"
            )
        return self.rfile.read(length)

    def _json(self, status: HTTPStatus, body: dict[str, Any]) -> None:
        self._send(status, "application/json", json.dumps(body, sort_keys=True).encode())

    def _text(self, status: HTTPStatus, body: str) -> None:
        self._send(status, "text/plain; charset=utf-8", body.encode())

    def _send(self, status: HTTPStatus, content_type: str, body: bytes) -> None:
        self._status = int(status)
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if status == HTTPStatus.UNAUTHORIZED:
            self.send_header("Accept-Signature", ACCEPT_SIGNATURE)
        if status == HTTPStatus.TOO_MANY_REQUESTS:
            self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(body)


def _handler(api: LedgerApi, *, ops: bool = False) -> type[BaseHTTPRequestHandler]:
    """The request handler of ``api``; ``ops``: the ops listener's."""
    # The read timeout as it is now (a test shortens it before it builds a server).
    return type("Handler", (_Handler,), {"api": api, "ops": ops, "timeout": HTTP_TIMEOUT_S})


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _HttpError(HTTPStatus.BAD_REQUEST, "body is not UTF-8") from exc


class OpsBindError(OSError):
    """The ops listener's address cannot be bound (``ops_http``)."""


class TlsConfigError(Exception):
    """The TLS certificate or key cannot be used."""


class LedgerHttpServer:
    """The API on a background thread; ``start`` binds, ``stop`` shuts it down. ``ops``:
    the address of the ops listener (``/health``, ``/metrics`` unsigned), or None;
    ``tls``: (certificate chain, private key) PEM files to serve the API over TLS."""

    def __init__(
        self,
        api: LedgerApi,
        host: str,
        port: int,
        *,
        port_file: Path | None = None,
        ops: tuple[str, int] | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.api = api
        self._server = ThreadingHTTPServer((host, port), _handler(api))
        self._server.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            try:
                context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(str(tls[0]), str(tls[1]))
            except (OSError, ssl.SSLError) as exc:
                self._server.server_close()
                raise TlsConfigError(
                    f"cannot use TLS certificate {tls[0]} with key {tls[1]}: {exc}"
                ) from exc
            # The handshake happens on the request's own thread (its first read, under
            # the handler's timeout), never in the accept loop.
            self._server.socket = context.wrap_socket(
                self._server.socket, server_side=True, do_handshake_on_connect=False
            )
            self.scheme = "https"
        self._ops: ThreadingHTTPServer | None = None
        if ops is not None:
            try:
                self._ops = ThreadingHTTPServer(ops, _handler(api, ops=True))
            except OSError as exc:
                self._server.server_close()
                raise OpsBindError(exc.errno, exc.strerror) from exc
            except BaseException:
                self._server.server_close()
                raise
            self._ops.daemon_threads = True
        self._threads: list[threading.Thread] = []
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
        return f"{self.scheme}://{host}:{port}"

    @property
    def ops_url(self) -> str | None:
        """Base URL of the ops listener, or None."""
        if self._ops is None:
            return None
        host, port = self._ops.server_address[:2]
        return f"http://{host!s}:{int(port)}"

    def start(self) -> None:
        """Serve on daemon threads; write the port file."""
        for server, name in ((self._server, "ledger-http"), (self._ops, "ledger-ops-http")):
            if server is not None:
                thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
                thread.start()
                self._threads.append(thread)
        if self.port_file is not None:
            host, port = self.address
            write_port_file(self.port_file, host, port, ops_url=self.ops_url, scheme=self.scheme)
        log.info("http_listening", url=self.url, ops_url=self.ops_url)

    def stop(self) -> None:
        """Stop serving and remove the port file."""
        for server in (self._server, self._ops):
            if server is not None:
                server.shutdown()
                server.server_close()
        for thread in self._threads:
            thread.join(timeout=HTTP_TIMEOUT_S)
        if self.port_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.port_file.unlink()


def write_port_file(
    path: Path, host: str, port: int, *, ops_url: str | None = None, scheme: str = "http"
) -> None:
    """Atomically write {"host", "port", "pid"} (and "ops_url", "scheme") to ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    data: dict[str, Any] = {"host": host, "port": port, "pid": os.getpid()}
    if ops_url is not None:
        data["ops_url"] = ops_url
    if scheme != "http":
        data["scheme"] = scheme
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)
