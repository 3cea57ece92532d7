"""Hardware evidence for node keys (SPEC §6.9): the wire form of an attestation token.

A NodeKeyBinding may carry ``evidence``: a compact JWS (RFC 7515 §7.1,
``BASE64URL(header) "." BASE64URL(claims) "." BASE64URL(signature)``, no padding) whose
claims are an Entity Attestation Token (RFC 9711) in the shape NVIDIA's remote
attestation service (NRAS) returns (docs/adr/0004-hardware-evidence-for-node-keys.md).
It is signed by an attestation service with ``ES384`` (ECDSA P-384, SHA-384; the
signature is ``R || S``, 48 bytes each — what NRAS uses) or ``EdDSA`` (Ed25519 — what
the tests' attestation service uses).

This module decodes the token, computes the two values a token must carry to be bound
to one key of one node of one placement (the nonce and the key hash), and checks a
signature against one root. The rules that compare the claims with the terms are SPEC
§6.9, written once in the ledger and once in the verifier. ``issue_evidence`` is the
attestation service of the tests and vectors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import (
    decode_dss_signature,
    encode_dss_signature,
)
from msgspec import Meta, Struct

from proto import limits
from proto.keys import SigningKey, verify

Alg = Literal["EdDSA", "ES384"]
ALGS: Final[tuple[Alg, ...]] = ("EdDSA", "ES384")

# SPEC §6.9: the nonce a token for (placement, node, key) must echo in ``eat_nonce``.
NONCE_PREFIX: Final = b"gridledger/attestation-nonce/v1\n"
# The claim binding the token to the node key: hex SHA-256 of the 32 key bytes.
KEY_HASH_CLAIM: Final = "x-gridledger-node-key-sha256"
OVERALL_RESULT_CLAIM: Final = "x-nvidia-overall-att-result"
# Public key sizes: Ed25519 raw, P-384 SEC1 uncompressed point (0x04 || X || Y).
KEY_BYTES: Final[dict[str, int]] = {"EdDSA": 32, "ES384": 97}
_SIG_BYTES: Final[dict[str, int]] = {"EdDSA": 64, "ES384": 96}

Hex64 = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
Short = Annotated[str, Meta(min_length=1, max_length=limits.MAX_TEXT_CHARS)]
GpuId = Annotated[str, Meta(min_length=1, max_length=limits.MAX_ID_CHARS)]


class EvidenceError(ValueError):
    """Evidence that is not a well-formed token (SPEC §6.9 (1)): EVIDENCE_INVALID."""


class Header(Struct, frozen=True):
    """The JWS protected header; other members (``typ``, ``x5c``...) are allowed."""

    alg: Alg
    kid: Short


class GpuClaims(Struct, frozen=True):
    """One attested device (an NRAS per-GPU claim set): ``ueid`` is the GPU uuid,
    ``hwmodel`` its model. Other claims (driver, VBIOS, measurements) are carried."""

    ueid: GpuId
    hwmodel: GpuId


class Claims(Struct, frozen=True):
    """The token's claims that SPEC §6.9 reads; other claims are allowed and carried."""

    iss: Short
    iat: Annotated[int, Meta(ge=0, le=limits.MAX_SAFE_INTEGER)]
    eat_nonce: Hex64
    node_key_sha256: Hex64 = msgspec.field(name=KEY_HASH_CLAIM)
    overall_result: bool = msgspec.field(name=OVERALL_RESULT_CLAIM)
    submods: Annotated[
        dict[GpuId, GpuClaims], Meta(min_length=1, max_length=limits.MAX_EVIDENCE_GPUS)
    ]


class Evidence(Struct, frozen=True):
    """A decoded token: header, claims, the bytes the signature covers, the signature."""

    header: Header
    claims: Claims
    signing_input: bytes
    signature: bytes

    def gpus(self) -> dict[str, str]:
        """GPU uuid -> model, as the token attests them."""
        return {g.ueid: g.hwmodel for g in self.claims.submods.values()}


class AttestationRoot(Struct, frozen=True, forbid_unknown_fields=True):
    """An attestation service key a party pins (trust file role ``attestation``, or a
    ledger.toml ``[[attestation_roots]]`` entry)."""

    id: Annotated[str, Meta(min_length=1, max_length=limits.MAX_ID_CHARS)]
    alg: Alg
    key: bytes


def _b64url_decode(part: str) -> bytes:
    if "=" in part:
        raise EvidenceError("base64url with padding")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError) as exc:
        raise EvidenceError(f"not base64url: {exc}") from exc


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def parse_evidence(token: str) -> Evidence:
    """Decode a compact JWS; EvidenceError says what is wrong (SPEC §6.9 (1))."""
    if len(token) > limits.MAX_EVIDENCE_CHARS:
        raise EvidenceError(f"{len(token)} characters, at most {limits.MAX_EVIDENCE_CHARS}")
    parts = token.split(".")
    if len(parts) != 3 or not all(parts):
        raise EvidenceError("not a compact JWS: three base64url parts separated by '.'")
    header_b, claims_b, sig = (_b64url_decode(p) for p in parts)
    try:
        header = msgspec.json.decode(header_b, type=Header)
    except msgspec.MsgspecError as exc:
        raise EvidenceError(f"header: {exc}") from exc
    try:
        claims = msgspec.json.decode(claims_b, type=Claims)
    except msgspec.MsgspecError as exc:
        raise EvidenceError(f"claims: {exc}") from exc
    if len(sig) != _SIG_BYTES[header.alg]:
        raise EvidenceError(f"{header.alg} signature of {len(sig)} bytes")
    signing_input = f"{parts[0]}.{parts[1]}".encode("ascii")
    return Evidence(header, claims, signing_input, sig)


def evidence_nonce(placement_id: str, node_id: str, key: bytes) -> str:
    """SPEC §6.9: SHA-256(prefix || placement_id LF node_id LF || key), hex."""
    data = NONCE_PREFIX + f"{placement_id}\n{node_id}\n".encode() + key
    return hashlib.sha256(data).hexdigest()


def node_key_hash(key: bytes) -> str:
    """SPEC §6.9: hex SHA-256 of the node key's 32 bytes."""
    return hashlib.sha256(key).hexdigest()


def root_key_ok(alg: str, key: bytes) -> bool:
    """True when ``key`` is a public key of the size ``alg`` uses (and, for ES384, a
    point on P-384)."""
    if len(key) != KEY_BYTES.get(alg, -1):
        return False
    if alg == "ES384":
        try:
            ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP384R1(), key)
        except ValueError:
            return False
    return True


def signature_ok(evidence: Evidence, alg: str, key: bytes) -> bool:
    """True when the token's signature verifies under ``key`` with ``alg`` (the header's
    ``alg`` must be the root's: a root signs with one algorithm)."""
    if evidence.header.alg != alg or not root_key_ok(alg, key):
        return False
    if alg == "EdDSA":
        return verify(key, evidence.signing_input, evidence.signature)
    public = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP384R1(), key)
    r = int.from_bytes(evidence.signature[:48], "big")
    s = int.from_bytes(evidence.signature[48:], "big")
    try:
        public.verify(encode_dss_signature(r, s), evidence.signing_input, ec.ECDSA(hashes.SHA384()))
    except InvalidSignature:
        return False
    return True


def attested_by(evidence: Evidence, roots: tuple[AttestationRoot, ...]) -> str | None:
    """The id of the first root (in the order given) whose key verifies the token."""
    for root in roots:
        if signature_ok(evidence, root.alg, root.key):
            return root.id
    return None


# ---- the tests' attestation service ----------------------------------------------------


def claims_for(
    placement_id: str,
    node_id: str,
    key: bytes,
    gpus: dict[str, str],
    *,
    iss: str = "https://attestation.test.gridledger",
    iat: int = 0,
) -> dict[str, object]:
    """Claims an attestation service would issue for (placement, node, key) and these GPUs
    (uuid -> model), in the NRAS shape: one ``submods`` entry per GPU."""
    return {
        "iss": iss,
        "iat": iat,
        "eat_nonce": evidence_nonce(placement_id, node_id, key),
        KEY_HASH_CLAIM: node_key_hash(key),
        OVERALL_RESULT_CLAIM: True,
        "submods": {
            f"GPU-{i}": {"ueid": uuid, "hwmodel": model}
            for i, (uuid, model) in enumerate(sorted(gpus.items()))
        },
    }


def issue_evidence(
    claims: dict[str, object],
    *,
    kid: str,
    ed25519: SigningKey | None = None,
    p384: ec.EllipticCurvePrivateKey | None = None,
) -> str:
    """A compact JWS over ``claims``: EdDSA with ``ed25519``, else ES384 with ``p384``."""
    alg = "EdDSA" if ed25519 is not None else "ES384"
    header = _b64url(msgspec.json.encode({"alg": alg, "kid": kid, "typ": "JWT"}))
    body = _b64url(msgspec.json.encode(claims))
    signing_input = f"{header}.{body}".encode("ascii")
    if ed25519 is not None:
        sig = ed25519.sign(signing_input)
    elif p384 is not None:
        r, s = decode_dss_signature(p384.sign(signing_input, ec.ECDSA(hashes.SHA384())))
        sig = r.to_bytes(48, "big") + s.to_bytes(48, "big")
    else:
        raise ValueError("issue_evidence needs a key")
    return f"{header}.{body}.{_b64url(sig)}"


def p384_public_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    """The SEC1 uncompressed point of a P-384 private key's public half (97 bytes)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return key.public_key().public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)


class RootKeyError(ValueError):
    """A file that holds no usable attestation root key."""


def load_root_key(path: Path) -> tuple[Alg, bytes]:
    """(alg, key bytes) of an attestation service's public key file: a PEM public key
    (P-384: ES384, Ed25519: EdDSA), a JWK (``kty`` EC/P-384 or OKP/Ed25519 — one key of
    a service's JWKS), or a gridledger ``.pub`` file (EdDSA)."""
    from cryptography.hazmat.primitives.asymmetric import ed25519
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    from proto.durable_io import read_at_most
    from proto.errors import KeyFileError
    from proto.keys import load_public_key

    try:
        raw = read_at_most(path, 64 * 1024)
    except OSError as exc:
        raise RootKeyError(f"cannot read {path}: {exc.strerror}") from exc
    text = raw.strip()
    if text.startswith(b"-----BEGIN"):
        try:
            public = load_pem_public_key(text)
        except ValueError as exc:
            raise RootKeyError(f"{path}: not a PEM public key") from exc
        if isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp384r1":
            return "ES384", public.public_bytes(Encoding.X962, PublicFormat.UncompressedPoint)
        if isinstance(public, ed25519.Ed25519PublicKey):
            return "EdDSA", public.public_bytes(Encoding.Raw, PublicFormat.Raw)
        raise RootKeyError(f"{path}: a P-384 or Ed25519 key is needed")
    try:
        jwk = msgspec.json.decode(text)
    except msgspec.DecodeError as exc:
        raise RootKeyError(f"{path}: neither PEM nor JSON") from exc
    if isinstance(jwk, dict) and "kty" in jwk:
        try:
            if jwk["kty"] == "EC" and jwk.get("crv") == "P-384":
                x, y = _b64url_decode(str(jwk["x"])), _b64url_decode(str(jwk["y"]))
                key = b"\x04" + x.rjust(48, b"\x00") + y.rjust(48, b"\x00")
                if root_key_ok("ES384", key):
                    return "ES384", key
            if jwk["kty"] == "OKP" and jwk.get("crv") == "Ed25519":
                key = _b64url_decode(str(jwk["x"]))
                if len(key) == 32:
                    return "EdDSA", key
        except (KeyError, EvidenceError) as exc:
            raise RootKeyError(f"{path}: a JWK without a usable x/y") from exc
        raise RootKeyError(f"{path}: a JWK of P-384 (EC) or Ed25519 (OKP) is needed")
    try:
        return "EdDSA", load_public_key(path).key
    except KeyFileError as exc:
        raise RootKeyError(str(exc)) from exc
