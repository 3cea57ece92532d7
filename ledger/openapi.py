"""The OpenAPI 3.1 description of the ledger's HTTP API (``GET /openapi.json``; SPEC §8.4,
§13). ``tests/test_api_openapi.py`` checks the running API against it with a
property-based tester (schemathesis): every answer's status, content type and body are
the ones described here."""

from __future__ import annotations

from typing import Any, Final

from ledger.limits import MAX_HTTP_BODY_BYTES

_ERROR: Final = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}, "reason": {"type": "string"}},
}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "bad request (the reason named)",
        401: "unsigned, or the signature refused (SPEC §13); Accept-Signature says what to sign",
        404: "no such placement for this key (as one that does not exist), or no such path",
        405: "method not allowed on this path",
        411: "Content-Length required",
        413: "body over the bound",
        429: "too many requests from this key; retry after Retry-After seconds",
        503: "not ready: behind its log, nothing issued yet, or busy (retry shortly)",
    }
    return {
        str(code): {
            "description": words[code],
            "content": {"application/json": {"schema": _ERROR}},
        }
        for code in codes
    }


_SIGNED: Final = (400, 401, 404, 429, 503)
_PID: Final = {
    "name": "placement_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"},
}
_RANGE: Final = [
    {"name": n, "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}}
    for n in ("from", "to")
]


def _ok(media: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": "OK", "content": {media: {"schema": schema or {"type": "string"}}}}


def _get(summary: str, ok: dict[str, Any], params: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": params,
        "responses": {"200": ok, **_errors(*_SIGNED)},
    }


def _post(summary: str, body: str) -> dict[str, Any]:
    return {
        "summary": summary,
        "parameters": [_PID],
        "requestBody": {
            "required": True,
            "content": {
                "text/plain": {"schema": {"type": "string", "maxLength": MAX_HTTP_BODY_BYTES}}
            },
            "description": body,
        },
        "responses": {
            "200": _ok("text/plain"),
            **_errors(*_SIGNED, 411, 413),
        },
    }


_OBJECT: Final = {"type": "object"}
_PLACEMENT: Final = "/placements/{placement_id}"

OPENAPI: Final[dict[str, Any]] = {
    "openapi": "3.1.0",
    "info": {
        "title": "gridledger ledger API",
        "version": "1",
        "description": (
            "Every operation but /health and /openapi.json is signed with the caller's own "
            "Ed25519 key (HTTP Message Signatures, RFC 9421; proto/SPEC.md §13); each key "
            "sees only its own placements. A GET never writes (§8.4)."
        ),
    },
    "components": {
        "securitySchemes": {
            "rfc9421": {
                "type": "apiKey",
                "in": "header",
                "name": "Signature",
                "description": (
                    "RFC 9421 Signature and Signature-Input (and Content-Digest on a POST), "
                    'label sig1, alg="ed25519", keyid the base64 public key (SPEC §13)'
                ),
            }
        }
    },
    "security": [{"rfc9421": []}],
    "paths": {
        "/health": {
            "get": {
                "summary": "liveness",
                "security": [],
                "responses": {"200": _ok("application/json", _OBJECT)},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this document",
                "security": [],
                "responses": {"200": _ok("application/json", _OBJECT)},
            }
        },
        "/metrics": {
            "get": _get("Prometheus text (the ledger's and auditors' keys)", _ok("text/plain"), [])
        },
        "/placements": {
            "get": _get(
                "the caller's placements",
                _ok(
                    "application/json",
                    {
                        "type": "object",
                        "required": ["placements"],
                        "properties": {"placements": {"type": "array", "items": _OBJECT}},
                    },
                ),
                [],
            )
        },
        f"{_PLACEMENT}/statement": {
            "get": _get("the latest statement", _ok("application/json", _OBJECT), [_PID])
        },
        f"{_PLACEMENT}/statement.html": {
            "get": _get(
                "the caller's page",
                _ok("text/html"),
                [_PID, {"name": "party", "in": "query", "schema": {"type": "string"}}],
            )
        },
        f"{_PLACEMENT}/statement.csv": {
            "get": _get("the bill's line items, CSV", _ok("text/csv"), [_PID])
        },
        f"{_PLACEMENT}/statement.json": {
            "get": _get("the bill's line items, JSON", _ok("application/json", _OBJECT), [_PID])
        },
        f"{_PLACEMENT}/export": {
            "get": _get(
                "the export through the latest statement",
                _ok("application/octet-stream", {"type": "string", "format": "binary"}),
                [_PID],
            )
        },
        f"{_PLACEMENT}/checkpoint": {
            "get": _get("the latest checkpoint note", _ok("text/plain"), [_PID]),
            "post": _post("ask for a checkpoint at the head (rate-limited)", "empty"),
        },
        f"{_PLACEMENT}/checkpoint/cosign": {
            "post": _post("add cosignatures", "the note with the party's cosignature line")
        },
        f"{_PLACEMENT}/records": {
            "get": _get("record envelopes, base64, one a line", _ok("text/plain"), [_PID, *_RANGE])
        },
        f"{_PLACEMENT}/consistency": {
            "get": _get("RFC 9162 consistency proof", _ok("text/plain"), [_PID, *_RANGE])
        },
    },
}
