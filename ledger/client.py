"""The CLI's side of the HTTP API: find a running ledger and talk to it.

A DuckDB file has one writer. When the ledger is running, ``gridledger ledger
statement/export/cosign`` must go through its API; otherwise they open the file
directly. A ledger is running when its configured fixed ``http`` address, or the address
in its port file (``<db>.http.json``, written at start, removed at stop), answers
``/health``. A port file left by a killed ledger is ignored: its pid is gone or its
address does not answer. Every request is signed (RFC 9421, SPEC §13) with the key the
caller passes: the local CLI's is the ledger's own key, which sees every placement; a
party's (``gridledger fetch``) sees its own. An https ledger's certificate is checked
against the system's authorities, or a CA given with ``trust_tls``.
"""

from __future__ import annotations

import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Final

from ledger.config import LedgerConfig
from ledger.limits import HTTP_CLIENT_TIMEOUT_S
from proto.durable_io import pid_alive
from proto.httpsig import sign_url
from proto.keys import SigningKey

_PROBE_TIMEOUT_S: Final = 2.0


class ApiError(Exception):
    """The running ledger answered with an error; ``status`` is the HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        # status 0: no HTTP answer at all (refused, unreachable, timed out)
        super().__init__(
            f"ledger API: HTTP {status}: {message}" if status else f"ledger API: {message}"
        )
        self.status = status
        self.message = message


# TLS contexts of the ledgers this process talks to, by base URL (``trust_tls``); any
# other https URL is checked against the system's certificate authorities.
_TLS: dict[str, ssl.SSLContext] = {}


def trust_tls(base: str, cafile: Path, *, check_hostname: bool = True) -> None:
    """Check the TLS certificate of the ledger at ``base`` against ``cafile``."""
    context = ssl.create_default_context(cafile=str(cafile))
    context.check_hostname = check_hostname
    _TLS[base.rstrip("/")] = context


def forget_tls(base: str) -> None:
    """Undo ``trust_tls`` for ``base``."""
    _TLS.pop(base.rstrip("/"), None)


def _context(url: str) -> ssl.SSLContext | None:
    return next((c for base, c in _TLS.items() if url.startswith(base + "/")), None)


def _candidates(config: LedgerConfig) -> list[str]:
    urls: list[str] = []
    scheme = "http" if config.tls is None else "https"
    if config.http is not None and config.http[1] != 0:
        host, port = config.http
        urls.append(f"{scheme}://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}")
    try:
        data = json.loads(config.port_file.read_text())
        if pid_alive(int(data["pid"])):
            host = str(data["host"])
            if host in ("0.0.0.0", "", "::"):
                host = "127.0.0.1"
            urls.append(f"{data.get('scheme', 'http')}://{host}:{int(data['port'])}")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if config.tls is not None:
        for url in urls:  # its own ledger: the certificate it serves, whatever its name
            trust_tls(url, config.tls[0], check_hostname=False)
    return urls


def find_running(config: LedgerConfig) -> str | None:
    """Base URL of the running ledger that owns ``config.db``, or None."""
    for url in _candidates(config):
        try:
            with urllib.request.urlopen(
                f"{url}/health", timeout=_PROBE_TIMEOUT_S, context=_context(f"{url}/health")
            ) as reply:
                if reply.status == 200:
                    return url
        except (OSError, urllib.error.URLError):
            continue
    return None


def _request(url: str, key: SigningKey, data: bytes | None = None) -> bytes:
    """One request signed with ``key`` (SPEC §13); ApiError for any failure."""
    method = "POST" if data is not None else "GET"
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "text/plain; charset=utf-8")
    for name, value in sign_url(key, method, url, data or b"", int(time.time())).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(
            request, timeout=HTTP_CLIENT_TIMEOUT_S, context=_context(url)
        ) as reply:
            body: bytes = reply.read()
            return body
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            message = str(json.loads(raw).get("error", raw.decode(errors="replace")))
        except ValueError:
            message = raw.decode(errors="replace")
        raise ApiError(exc.code, message) from exc
    except (OSError, urllib.error.URLError) as exc:  # TimeoutError is an OSError
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if isinstance(reason, TimeoutError):  # the wait ran out: say how long it was
            message = (
                f"the running ledger did not answer {url} within {HTTP_CLIENT_TIMEOUT_S:g} s: "
                f"{reason}"
            )
        else:  # refused or unreachable at once: no wait to speak of
            why = reason.strerror if isinstance(reason, OSError) and reason.strerror else reason
            message = f"cannot reach the ledger at {url}: {why}"
        raise ApiError(0, message) from exc


def get_statement(base: str, placement_id: str, key: SigningKey) -> dict[str, Any]:
    """GET /placements/<id>/statement."""
    body: dict[str, Any] = json.loads(_request(f"{base}/placements/{placement_id}/statement", key))
    return body


def get_placements(base: str, key: SigningKey) -> list[dict[str, Any]]:
    """GET /placements."""
    body: dict[str, Any] = json.loads(_request(f"{base}/placements", key))
    return list(body["placements"])


def get_bill(base: str, placement_id: str, key: SigningKey) -> bytes:
    """GET /placements/<id>/statement.json: the bill's line items (``billview`` JSON)."""
    return _request(f"{base}/placements/{placement_id}/statement.json", key)


def get_checkpoint(base: str, placement_id: str, key: SigningKey) -> str:
    """GET /placements/<id>/checkpoint."""
    return _request(f"{base}/placements/{placement_id}/checkpoint", key).decode()


def request_checkpoint(base: str, placement_id: str, key: SigningKey) -> str:
    """POST /placements/<id>/checkpoint: ask for a statement and checkpoint at the head
    (SPEC §8.4; rate-limited by the ledger); the latest note."""
    return _request(f"{base}/placements/{placement_id}/checkpoint", key, b"").decode()


def download_export(base: str, placement_id: str, out: Path, key: SigningKey) -> int:
    """GET /placements/<id>/export into ``out`` (temp file + rename), after asking for a
    checkpoint at the head (the export runs through the latest); bytes written."""
    request_checkpoint(base, placement_id, key)
    data = _request(f"{base}/placements/{placement_id}/export", key)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    return len(data)


def get_page(base: str, placement_id: str, key: SigningKey, party: str | None = None) -> bytes:
    """GET /placements/<id>/statement.html: the caller's page (``party``: one of its own)."""
    query = "" if party is None else "?party=" + urllib.parse.quote(party, safe="")
    return _request(f"{base}/placements/{placement_id}/statement.html{query}", key)
