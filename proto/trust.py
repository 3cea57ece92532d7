"""Trust files (SPEC.md, "Trust"): which public keys a user accepts for which role.

A verifier trusts nothing in an export but envelope bytes and this file, which the user
pins: the operator, buyer and desk keys that may sign terms, and the ledger keys that
may sign records, statements and checkpoints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta, Struct

from proto.attestation import Alg, AttestationRoot, root_key_ok
from proto.durable_io import read_at_most
from proto.keys import PRIVATE_FORMAT, PUBLIC_FORMAT, key_id
from proto.limits import MAX_ATTESTATION_ROOTS, MAX_WITNESS_INTERVAL_S
from proto.records import Identifier

TRUST_FORMAT: Final = "gridledger-trust/v1"
# A trust file is read whole; past these it is refused unread.
MAX_TRUST_FILE_BYTES: Final = 4 * 1024 * 1024
MAX_TRUSTED_KEYS: Final = 10_000
Role = Literal["operator", "buyer", "desk", "ledger", "witness", "attestation"]
# The witness policy when a trust file names none (SPEC §9): the operator's and the
# buyer's witnesses must both have cosigned the checkpoint a verdict rests on.
DEFAULT_COSIGNERS: Final = ("operator", "buyer")
# The policy entry for every accepted assignment's new buyer (SPEC §8.2, §9).
NEW_BUYERS: Final = "new-buyers"
PARTY_ROLES: Final = ("operator", "buyer", "desk")


class TrustedKey(Struct, frozen=True, forbid_unknown_fields=True):
    """One pinned key: who holds it and in which role."""

    id: Identifier
    role: Role
    # 32 bytes (Ed25519); an ``attestation`` root's key has the size of its ``alg``
    # (SPEC §9: 32 for EdDSA, a 97-byte P-384 point for ES384).
    key: Annotated[bytes, Meta(min_length=32, max_length=97)]
    # SPEC §9: only on role ``attestation`` (required there): how the root signs.
    alg: Alg | None = None


class TrustFile(Struct, frozen=True, forbid_unknown_fields=True):
    """The whole trust file."""

    format: str
    keys: Annotated[list[TrustedKey], Meta(max_length=MAX_TRUSTED_KEYS)]
    # Witness policy (SPEC §9): "operator" | "buyer" | "desk" (that party of the placement)
    # or the id of a key pinned with role "witness". None: DEFAULT_COSIGNERS.
    cosigners: Annotated[list[Identifier], Meta(max_length=64)] | None = None
    # SPEC §6.6, §9: whether a verdict may be FINAL for a simulation (arrival times stated
    # by the senders, ``arrival = "sender"``). False (omitted): never; production.
    simulations: bool = False
    # SPEC §9: how often the policy's witnesses cosign, in seconds; when set, FINAL needs
    # every record's time witnessed within it (§6.6: the backdating bound). None: not checked.
    witness_interval_s: Annotated[int, Meta(ge=1, le=MAX_WITNESS_INTERVAL_S)] | None = None

    def cosigner_policy(self) -> tuple[str, ...]:
        """The cosigners a final verdict requires."""
        return DEFAULT_COSIGNERS if self.cosigners is None else tuple(self.cosigners)

    def roles_of(self, public_key: bytes) -> set[str]:
        """Every role this key is trusted for."""
        return {k.role for k in self.keys if k.key == public_key}

    def party_of(self, public_key: bytes, role: str) -> str | None:
        """The id of the party trusted with this key in this role, if any."""
        for k in self.keys:
            if k.key == public_key and k.role == role:
                return k.id
        return None

    def keys_for(self, role: str) -> dict[str, bytes]:
        """Key id -> public key of every key trusted in ``role``."""
        return {key_id(k.key): k.key for k in self.keys if k.role == role}

    def attestation_roots(self) -> tuple[AttestationRoot, ...]:
        """The attestation services pinned (SPEC §6.9, §9), in file order."""
        return tuple(
            AttestationRoot(k.id, k.alg, k.key)
            for k in self.keys
            if k.role == "attestation" and k.alg is not None
        )


class TrustError(Exception):
    """A trust file that cannot be used."""


def load_trust(path: Path) -> TrustFile:
    """Read and check a trust file."""
    try:
        raw = read_at_most(path, MAX_TRUST_FILE_BYTES)
    except OSError as exc:
        raise TrustError(f"cannot read trust file {path}: {exc.strerror}") from exc
    if len(raw) > MAX_TRUST_FILE_BYTES:
        raise TrustError(f"trust file {path} is larger than {MAX_TRUST_FILE_BYTES} bytes")
    try:
        trust = msgspec.json.decode(raw, type=TrustFile)
    except msgspec.MsgspecError as exc:
        what = _what_else(raw)
        if what is not None:
            raise TrustError(
                f"{path} is {what}, not a trust file (gridledger trust init writes one)"
            ) from exc
        raise TrustError(f"trust file {path} is malformed: {exc}") from exc
    if trust.format != TRUST_FORMAT:
        raise TrustError(f"trust file {path}: format {trust.format!r}, want {TRUST_FORMAT!r}")
    problem = key_problem(trust)
    if problem is not None:
        raise TrustError(f"trust file {path}: {problem}")
    return trust


def _what_else(raw: bytes) -> str | None:
    """What a file given as a trust file holds instead, when it is one of ours."""
    try:
        data = msgspec.json.decode(raw, type=dict[str, object])
    except msgspec.MsgspecError:
        return None
    if "payload" in data and "signatures" in data:
        return "a signed record (terms, or a record signed after them)"
    kinds = {PUBLIC_FORMAT: "a public key file", PRIVATE_FORMAT: "a private key file"}
    return kinds.get(str(data.get("format")))


def key_problem(trust: TrustFile) -> str | None:
    """What is wrong with a key of the file (SPEC §9), or None: a party, ledger or witness
    key is 32 bytes without ``alg``; an attestation root has an ``alg`` and a key of its
    size; at most MAX_ATTESTATION_ROOTS roots."""
    roots = 0
    for k in trust.keys:
        if k.role == "attestation":
            roots += 1
            if k.alg is None:
                return f"attestation key {k.id!r} has no alg (EdDSA or ES384)"
            if not root_key_ok(k.alg, k.key):
                return f"attestation key {k.id!r} is not a {k.alg} public key"
        elif k.alg is not None or len(k.key) != 32:
            return f"{k.role} key {k.id!r}: an Ed25519 key of 32 bytes, without alg"
    if roots > MAX_ATTESTATION_ROOTS:
        return f"{roots} attestation keys, at most {MAX_ATTESTATION_ROOTS}"
    return None


def dump_trust(trust: TrustFile) -> bytes:
    """Trust file bytes (pretty enough to read and edit); no ``cosigners`` when unset, no
    ``simulations`` when false."""
    data = msgspec.to_builtins(trust)
    if trust.cosigners is None:
        data.pop("cosigners", None)
    if not trust.simulations:
        data.pop("simulations", None)
    if trust.witness_interval_s is None:
        data.pop("witness_interval_s", None)
    for key in data["keys"]:
        if key.get("alg") is None:
            key.pop("alg", None)
    return msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n"
