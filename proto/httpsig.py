"""HTTP Message Signatures (RFC 9421) with Ed25519, as the ledger API uses them (SPEC §13).

A request is signed by the caller's own Ed25519 key — the key a party's terms pin, or an
auditor's key the ledger lists — so no secret is shared with the ledger. ``sign_request``
gives the ``Signature-Input`` and ``Signature`` fields (and ``Content-Digest``, RFC 9530,
for a body); ``verify_request`` rebuilds the signature base (RFC 9421 §2.5) from what the
server received and checks the signature, the covered components, the time window and the
nonce's form. Replay (a nonce seen before) is the server's check, with its own memory.

Only the subset SPEC §13 requires is accepted: one signature, label ``sig1``, components
``"@method" "@authority" "@path" "@query"`` (and ``"content-digest"`` when the request has
a body), parameters ``created``, ``expires``, ``nonce``, ``alg="ed25519"`` and ``keyid``
(the signer's public key, standard base64). Anything else is refused with its name.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from proto.keys import SigningKey, verify

LABEL: Final = "sig1"
ALG: Final = "ed25519"
# The longest a signature may be valid (expires - created), and the clock skew allowed
# between the signer's clock and the verifier's, seconds.
MAX_SIGNATURE_LIFETIME_S: Final = 300
MAX_SIGNATURE_SKEW_S: Final = 60
DEFAULT_LIFETIME_S: Final = 120  # room for a signer's clock up to 60 s behind
_COMPONENTS: Final = ("@method", "@authority", "@path", "@query")
_WITH_BODY: Final = (*_COMPONENTS, "content-digest")
_NONCE: Final = re.compile(r"^[A-Za-z0-9_-]{16,64}\Z")
_INPUT: Final = re.compile(
    r'^sig1=\(((?:"[a-z@-]+"(?: "[a-z@-]+")*)?)\)((?:;[a-z]+=(?:\d{1,16}|"[^"\\]{0,128}"))*)\Z'
)
_PARAM: Final = re.compile(r';([a-z]+)=(\d{1,16}|"[^"\\]{0,128}")')
_SIGNATURE: Final = re.compile(r"^sig1=:([A-Za-z0-9+/]{86}==):\Z")


class SignatureRefused(Exception):
    """The request's signature is missing, malformed, outside its window or invalid;
    the message says which."""


@dataclass(frozen=True, slots=True)
class Request:
    """What the signature covers: method, authority (host[:port] as sent in ``Host``),
    path, query (without ``?``, empty when none) and body."""

    method: str
    authority: str
    path: str
    query: str
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Signed:
    """A verified request: the signer's public key, its nonce and when it expires."""

    public_key: bytes
    nonce: str
    expires: int


def content_digest(body: bytes) -> str:
    """RFC 9530 ``Content-Digest`` of ``body``: ``sha-256=:BASE64:``."""
    return f"sha-256=:{base64.b64encode(hashlib.sha256(body).digest()).decode()}:"


def _value(request: Request, component: str, digest: str) -> str:
    """RFC 9421 §2.2 derived components, and the ``content-digest`` field."""
    if component == "@method":
        return request.method.upper()
    if component == "@authority":
        return request.authority.lower()
    if component == "@path":
        return request.path or "/"
    if component == "@query":
        return f"?{request.query}"
    return digest


def params_text(components: tuple[str, ...], params: list[tuple[str, int | str]]) -> str:
    """The inner list of ``@signature-params`` (RFC 9421 §2.3), as in ``Signature-Input``."""
    items = " ".join(f'"{c}"' for c in components)
    rendered = "".join(
        f";{name}={value}" if isinstance(value, int) else f';{name}="{value}"'
        for name, value in params
    )
    return f"({items}){rendered}"


def signature_base(
    lines: list[tuple[str, str]], components: tuple[str, ...], params: list[tuple[str, int | str]]
) -> bytes:
    """RFC 9421 §2.5: one ``"name": value`` line per covered component, then the
    ``"@signature-params"`` line (no final LF)."""
    out = "".join(f'"{name}": {value}\n' for name, value in lines)
    return f'{out}"@signature-params": {params_text(components, params)}'.encode()


def sign_request(
    key: SigningKey,
    request: Request,
    now_s: int,
    *,
    lifetime_s: int = DEFAULT_LIFETIME_S,
    nonce: str | None = None,
) -> dict[str, str]:
    """The header fields that sign ``request`` with ``key`` at ``now_s``."""
    components = _WITH_BODY if request.body or request.method.upper() == "POST" else _COMPONENTS
    digest = content_digest(request.body)
    params: list[tuple[str, int | str]] = [
        ("created", now_s),
        ("expires", now_s + lifetime_s),
        ("nonce", nonce or secrets.token_urlsafe(24)),
        ("alg", ALG),
        ("keyid", base64.b64encode(key.public_key).decode()),
    ]
    lines = [(c, _value(request, c, digest)) for c in components]
    signature = key.sign(signature_base(lines, components, params))
    headers = {
        "Signature-Input": f"{LABEL}={params_text(components, params)}",
        "Signature": f"{LABEL}=:{base64.b64encode(signature).decode()}:",
    }
    if "content-digest" in components:
        headers["Content-Digest"] = digest
    return headers


def verify_request(request: Request, headers: Mapping[str, str], now_s: int) -> Signed:
    """Check the signature of ``request`` (``headers``: its fields, names lower-case).
    Raises SignatureRefused naming what is wrong."""
    signature_input = headers.get("signature-input")
    signature_field = headers.get("signature")
    if signature_input is None or signature_field is None:
        raise SignatureRefused("the request is not signed (RFC 9421 Signature-Input, Signature)")
    shape = _INPUT.match(signature_input.strip())
    if shape is None:
        raise SignatureRefused(
            'Signature-Input is not one signature "sig1" with quoted components and parameters'
        )
    components = tuple(c.strip('"') for c in shape.group(1).split(" ") if c)
    needed = _WITH_BODY if request.body or request.method.upper() == "POST" else _COMPONENTS
    if components != needed:
        raise SignatureRefused(f"the signature must cover exactly {' '.join(needed)}")
    params: list[tuple[str, int | str]] = [
        (name, value.strip('"') if value.startswith('"') else int(value))
        for name, value in _PARAM.findall(shape.group(2))
    ]
    named = dict(params)
    if len(named) != len(params) or set(named) != {"created", "expires", "nonce", "alg", "keyid"}:
        raise SignatureRefused("signature parameters must be created, expires, nonce, alg, keyid")
    created, expires, nonce, alg = (named[n] for n in ("created", "expires", "nonce", "alg"))
    if alg != ALG:
        raise SignatureRefused(f'alg must be "{ALG}"')
    if not isinstance(created, int) or not isinstance(expires, int):
        raise SignatureRefused("created and expires must be integers (POSIX seconds)")
    if not isinstance(nonce, str) or not _NONCE.match(nonce):
        raise SignatureRefused("nonce must be 16 to 64 characters of base64url")
    if not created < expires <= created + MAX_SIGNATURE_LIFETIME_S:
        raise SignatureRefused(
            f"expires must follow created by at most {MAX_SIGNATURE_LIFETIME_S} s"
        )
    if created > now_s + MAX_SIGNATURE_SKEW_S:
        raise SignatureRefused("the signature is created in the future (check the clock)")
    if now_s > expires:
        raise SignatureRefused("the signature has expired")
    public_key = _key(named["keyid"])
    digest = content_digest(request.body)
    if "content-digest" in components and headers.get("content-digest", "").strip() != digest:
        raise SignatureRefused("Content-Digest does not match the body (RFC 9530, sha-256)")
    found = _SIGNATURE.match(signature_field.strip())
    if found is None:
        raise SignatureRefused('Signature is not one "sig1" byte sequence of 64 bytes')
    signature = base64.b64decode(found.group(1))
    lines = [(c, _value(request, c, digest)) for c in components]
    if not verify(public_key, signature_base(lines, components, params), signature):
        raise SignatureRefused("the signature does not verify under its keyid")
    return Signed(public_key, nonce, expires)


def _key(keyid: int | str) -> bytes:
    """The public key a ``keyid`` names (standard base64 of the 32 bytes)."""
    try:
        raw = base64.b64decode(str(keyid), validate=True)
    except binascii.Error as exc:
        raise SignatureRefused("keyid is not base64") from exc
    if len(raw) != 32:
        raise SignatureRefused("keyid is not a 32-byte Ed25519 public key")
    return raw


def sign_url(
    key: SigningKey,
    method: str,
    url: str,
    body: bytes,
    now_s: int,
    *,
    lifetime_s: int = DEFAULT_LIFETIME_S,
    nonce: str | None = None,
) -> dict[str, str]:
    """``sign_request`` for a request to ``url`` as urllib sends it (``Host``: the URL's
    host[:port]; the path and query as written)."""
    parts = urllib.parse.urlsplit(url)
    request = Request(method, parts.netloc, parts.path or "/", parts.query, body)
    return sign_request(key, request, now_s, lifetime_s=lifetime_s, nonce=nonce)
