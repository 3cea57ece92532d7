"""Party profiles (SPEC §12): who a party is on paper, signed by the party's own key.

A profile file is the JSON object ``{"format": "gridledger-profile/v1", "payload":
BASE64(signed bytes), "keyid": HEX16, "sig": BASE64}`` where the signed bytes are
``"gridledger/profile/v1" LF CANONICAL-JSON(profile)`` (SPEC §2). It is pinned like a
key: it counts only when ``keyid`` and the signature are those of the key the trust file
pins for ``party_id`` in a party role (operator, buyer, desk).
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path
from typing import Annotated, Final

import msgspec
from msgspec import Meta, Struct

from proto.canonical import canonical_json
from proto.durable_io import read_at_most
from proto.keys import SigningKey, key_id, verify
from proto.records import Identifier
from proto.trust import TrustFile

PROFILE_FORMAT: Final = "gridledger-profile/v1"
PROFILE_PREFIX: Final = b"gridledger/profile/v1\n"
MAX_PROFILE_BYTES: Final = 16_384
PARTY_ROLES: Final = ("operator", "buyer", "desk")

Text = Annotated[str, Meta(max_length=200)]


class PartyProfile(
    Struct, frozen=True, forbid_unknown_fields=True, tag="profile", tag_field="type"
):
    """What every invoice shows of a party (SPEC §12)."""

    party_id: Identifier
    legal_name: Annotated[str, Meta(min_length=1, max_length=200)]
    address: Annotated[list[Text], Meta(max_length=8)]
    tax_id: Annotated[str, Meta(max_length=64)]
    net_days: Annotated[int, Meta(ge=0, le=365)]
    remit_to: Annotated[str, Meta(max_length=500)]
    issued_at_ms: Annotated[int, Meta(ge=0, le=2**53 - 1)]


class ProfileFile(Struct, frozen=True, forbid_unknown_fields=True):
    format: str
    payload: str
    keyid: str
    sig: str


class ProfileError(ValueError):
    """A profile that cannot be used, with what was wrong."""


def profile_bytes(profile: PartyProfile) -> bytes:
    """The signed bytes of ``profile``."""
    return PROFILE_PREFIX + canonical_json(profile)


def sign_profile(profile: PartyProfile, key: SigningKey) -> bytes:
    """The profile file of ``profile`` signed by ``key`` (the party's key)."""
    payload = profile_bytes(profile)
    return msgspec.json.encode(
        ProfileFile(
            format=PROFILE_FORMAT,
            payload=base64.b64encode(payload).decode(),
            keyid=key_id(key.public_key),
            sig=base64.b64encode(key.sign(payload)).decode(),
        )
    )


def open_profile(raw: bytes, trust: TrustFile, where: str) -> PartyProfile:
    """The profile in ``raw`` if it is canonical and signed by its party's pinned key."""
    try:
        file = msgspec.json.decode(raw, type=ProfileFile)
        payload = base64.b64decode(file.payload, validate=True)
        sig = base64.b64decode(file.sig, validate=True)
    except (msgspec.MsgspecError, binascii.Error, ValueError) as exc:
        raise ProfileError(f"{where}: not a profile file ({PROFILE_FORMAT}): {exc}") from exc
    if file.format != PROFILE_FORMAT:
        raise ProfileError(f"{where}: format {file.format!r}, expected {PROFILE_FORMAT!r}")
    if not payload.startswith(PROFILE_PREFIX):
        raise ProfileError(f"{where}: payload does not start with gridledger/profile/v1")
    try:
        profile = msgspec.json.decode(payload[len(PROFILE_PREFIX) :], type=PartyProfile)
    except msgspec.MsgspecError as exc:
        raise ProfileError(f"{where}: profile: {exc}") from exc
    if profile_bytes(profile) != payload:
        raise ProfileError(f"{where}: profile bytes are not canonical (SPEC §2)")
    pinned = [k for k in trust.keys if k.id == profile.party_id and k.role in PARTY_ROLES]
    if not pinned:
        raise ProfileError(f"{where}: party {profile.party_id} has no key pinned in the trust file")
    for trusted in pinned:
        if key_id(trusted.key) == file.keyid and verify(trusted.key, payload, sig):
            return profile
    raise ProfileError(f"{where}: not signed by the key pinned for {profile.party_id}")


def load_profiles(directory: Path, trust: TrustFile) -> dict[str, PartyProfile]:
    """Every ``*.profile.json`` in ``directory``, by party id; one per party."""
    if not directory.is_dir():
        raise ProfileError(f"--profiles {directory}: not a directory")
    out: dict[str, PartyProfile] = {}
    for path in sorted(directory.glob("*.profile.json"))[:1000]:
        raw = read_at_most(path, MAX_PROFILE_BYTES)
        if len(raw) > MAX_PROFILE_BYTES:
            raise ProfileError(f"{path}: larger than {MAX_PROFILE_BYTES} bytes")
        profile = open_profile(raw, trust, str(path))
        if profile.party_id in out:
            raise ProfileError(f"{path}: a second profile for {profile.party_id}")
        out[profile.party_id] = profile
    return out
