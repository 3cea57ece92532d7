"""Ed25519 keys (SPEC.md, "Keys"): key ids, signing, verification, key files.

Signing and verification use pynacl (libsodium): about twice as fast as OpenSSL here
(LIMITS.md). Private keys can also be read from PKCS#8 PEM files through
``cryptography``, for operators who keep keys that way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import os
import stat
import threading
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, Final, Literal

import msgspec
import nacl.bindings
import nacl.exceptions
import nacl.signing

from proto.errors import KeyFileError

KEYID_PREFIX: Final = b"gridledger/keyid/v1\n"
PRIVATE_FORMAT: Final = "gridledger-ed25519-private/v1"
PUBLIC_FORMAT: Final = "gridledger-ed25519-public/v1"


@lru_cache(maxsize=65536)
def key_id(public_key: bytes) -> str:
    """Key id: first 8 bytes of SHA-256(``gridledger/keyid/v1\\n`` || raw public key), hex."""
    if len(public_key) != 32:
        raise ValueError(f"an Ed25519 public key is 32 bytes, got {len(public_key)}")
    return hashlib.sha256(KEYID_PREFIX + public_key).digest()[:8].hex()


@lru_cache(maxsize=4096)
def _verify_key(public_key: bytes) -> nacl.signing.VerifyKey:
    return nacl.signing.VerifyKey(public_key)


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True when ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    The check is libsodium's ``crypto_sign_open``, the function pynacl's
    ``VerifyKey.verify`` calls, called directly with this thread's reusable output buffer
    (pynacl allocates two per call). Arguments that are not plain ``bytes``, or a key that
    is not 32 bytes, go through ``VerifyKey`` itself, which raises as it always did.
    """
    if len(signature) != 64:
        return False
    if (
        type(public_key) is bytes
        and type(message) is bytes
        and type(signature) is bytes
        and len(public_key) == 32
    ):
        signed = signature + message
        size = len(signed)
        local = _SODIUM_LOCAL
        out = getattr(local, "out", None)
        if out is None or local.size < size:
            out = _sodium_buffers(size)
        return bool(_SODIUM_LIB.crypto_sign_open(out, local.out_len, signed, size, public_key) == 0)
    try:
        _verify_key(public_key).verify(message, signature)
    except nacl.exceptions.BadSignatureError:
        return False
    return True


# pynacl's compiled libsodium binding (initialised by importing ``nacl.bindings``, as
# ``nacl.signing`` does); untyped, hence Any.
_SODIUM: Any = importlib.import_module("nacl._sodium")
_SODIUM_LIB: Any = _SODIUM.lib
# Per thread (the thread pool verifies concurrently, the GIL released): the buffer
# crypto_sign_open writes the opened message to, its size, and the length it writes.
_SODIUM_LOCAL: Any = threading.local()


def _sodium_buffers(size: int) -> Any:
    """This thread's output buffers, grown to hold ``size`` bytes (at least 4 KiB)."""
    local = _SODIUM_LOCAL
    size = max(size, 4096, 2 * getattr(local, "size", 0))
    local.out = _SODIUM.ffi.new("unsigned char[]", size)
    local.size = size
    local.out_len = _SODIUM.ffi.new("unsigned long long *")
    return local.out


def signer(key: SigningKey) -> Callable[[bytes], bytes]:
    """``key.sign``: the same Ed25519 signatures (deterministic: byte for byte;
    tests/test_meter_agent.py), by libsodium's ``crypto_sign`` called directly into this
    thread's reusable buffer (``_sodium_buffers``, as ``verify``), the secret key derived
    once — pynacl's ``SigningKey.sign`` allocates two buffers and three objects per call
    and ``key.sign`` looks the pynacl key up in a cache each time (~2 of its ~18 us; a
    meter agent signs every event)."""
    _, secret = nacl.bindings.crypto_sign_seed_keypair(key.seed)
    crypto_sign, null, buffer = _SODIUM_LIB.crypto_sign, _SODIUM.ffi.NULL, _SODIUM.ffi.buffer
    local = _SODIUM_LOCAL

    def sign(message: bytes) -> bytes:
        size = len(message) + 64
        out = getattr(local, "out", None)
        if out is None or local.size < size:
            out = _sodium_buffers(size)
        if crypto_sign(out, null, message, len(message), secret) != 0:
            raise RuntimeError("libsodium crypto_sign failed")
        signature: bytes = buffer(out, 64)[:]
        return signature

    return sign


class SigningKey:
    """An Ed25519 private key with the id it is known by (the person or node it belongs to).

    Deliberately not a dataclass or a Struct: nothing generic (``dataclasses.asdict``,
    msgspec, structlog's renderers, ``repr``) can serialize the seed by accident. Code
    that must write the seed asks for ``seed`` by name.
    """

    __slots__ = ("_seed", "name")

    def __init__(self, name: str, seed: bytes) -> None:
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        self.name = name
        self._seed = bytes(seed)

    @property
    def seed(self) -> bytes:
        """The 32-byte private seed. Only key files and key derivation read it."""
        return self._seed

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SigningKey):
            return NotImplemented
        return self.name == other.name and hmac.compare_digest(self._seed, other._seed)

    def __hash__(self) -> int:
        return hash((self.name, self.public_key))

    def __reduce__(self) -> tuple[type[SigningKey], tuple[str, bytes]]:
        # Pickling is for handing a key to this program's own worker processes.
        return (SigningKey, (self.name, self._seed))

    @classmethod
    def generate(cls, name: str) -> SigningKey:
        """A fresh random key."""
        return cls(name, bytes(nacl.signing.SigningKey.generate()))

    @classmethod
    def from_seed_text(cls, name: str, text: str) -> SigningKey:
        """A deterministic key from any text (tests, demo, replay): seed = SHA-256(text)."""
        return cls(name, hashlib.sha256(text.encode()).digest())

    @property
    def _nacl(self) -> nacl.signing.SigningKey:
        return _nacl_signing_key(self.seed)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte public key."""
        return bytes(self._nacl.verify_key)

    @property
    def key_id(self) -> str:
        """The key id of the public key."""
        return key_id(self.public_key)

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._nacl.sign(message).signature

    def __repr__(self) -> str:  # never print the seed
        return f"SigningKey(name={self.name!r}, key_id={self.key_id!r})"


@lru_cache(maxsize=256)
def _nacl_signing_key(seed: bytes) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(seed)


class _PrivateFile(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    id: str
    seed: bytes


class PublicKeyFile(msgspec.Struct, forbid_unknown_fields=True):
    """The public half as written to ``ID.pub``."""

    format: str
    id: str
    key: bytes
    keyid: str


def write_key_pair(key: SigningKey, out_dir: Path) -> tuple[Path, Path]:
    """Write ``out_dir/ID.key`` (mode 0600, refused if it exists) and ``out_dir/ID.pub``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    private_path = out_dir / f"{key.name}.key"
    public_path = out_dir / f"{key.name}.pub"
    data = msgspec.json.encode(_PrivateFile(PRIVATE_FORMAT, key.name, key.seed)) + b"\n"
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    public = PublicKeyFile(PUBLIC_FORMAT, key.name, key.public_key, key.key_id)
    public_path.write_bytes(msgspec.json.encode(public) + b"\n")
    return private_path, public_path


def load_signing_key(path: Path) -> SigningKey:
    """Read a private key file (ours or PKCS#8 PEM); refuse one readable by group or others."""
    try:
        mode = path.stat().st_mode
        raw = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from exc
    if _is_public_key_file(raw):
        raise _other_kind(path, "public")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"key file {path} is accessible by group or others (mode {stat.S_IMODE(mode):o});"
            " run: chmod 600 " + str(path)
        )
    if raw.lstrip().startswith(b"-----BEGIN"):
        return _load_pem(path, raw)
    try:
        parsed = msgspec.json.decode(raw, type=_PrivateFile)
    except msgspec.MsgspecError as exc:
        raise KeyFileError(f"key file {path} is not a gridledger private key: {exc}") from exc
    if parsed.format != PRIVATE_FORMAT:
        raise KeyFileError(f"key file {path}: format {parsed.format!r}, want {PRIVATE_FORMAT!r}")
    try:
        return SigningKey(parsed.id, parsed.seed)
    except ValueError as exc:
        raise KeyFileError(f"key file {path}: {exc}") from exc


# A key file of one kind given where the other is asked for: what to give instead, the
# suffix of that file, what to say when none is beside it.
_ASKED_INSTEAD: Final = {
    "public": ("sign with the private key", ".key", "ID.key, written beside it"),
    "private": ("give the public key", ".pub", "ID.pub"),
}


def _other_kind(path: Path, given: Literal["public", "private"]) -> KeyFileError:
    """``path`` holds a ``given`` key file where the other kind is asked for: the error
    names the file of the other kind beside it where there is one."""
    ask, suffix, otherwise = _ASKED_INSTEAD[given]
    other = path.with_suffix(suffix)
    named = other if other != path and other.exists() else otherwise
    return KeyFileError(f"{path} is a {given} key file; {ask} ({named})")


def _is_public_key_file(raw: bytes) -> bool:
    try:
        parsed = msgspec.json.decode(raw, type=PublicKeyFile)
    except msgspec.MsgspecError:
        return False
    return parsed.format == PUBLIC_FORMAT


def _is_private_key_file(raw: bytes) -> bool:
    """A gridledger private key file or a PEM private key (PKCS#8 or traditional)."""
    head = raw.lstrip()[:64]
    if head.startswith(b"-----BEGIN") and b"PRIVATE KEY-----" in head:
        return True
    try:
        parsed = msgspec.json.decode(raw, type=_PrivateFile)
    except msgspec.MsgspecError:
        return False
    return parsed.format == PRIVATE_FORMAT


def _load_pem(path: Path, raw: bytes) -> SigningKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        loaded = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"key file {path}: unreadable PEM private key: {exc}") from exc
    if not isinstance(loaded, Ed25519PrivateKey):
        raise KeyFileError(f"key file {path}: not an Ed25519 key ({type(loaded).__name__})")
    seed = loaded.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return SigningKey(path.stem, seed)


def load_public_key(path: Path) -> PublicKeyFile:
    """Read an ``ID.pub`` file; a private key file given instead is refused as such (and
    never echoed: its message names the file, not what it holds)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read public key {path}: {exc.strerror}") from exc
    if _is_private_key_file(raw):
        raise _other_kind(path, "private")
    try:
        parsed = msgspec.json.decode(raw, type=PublicKeyFile)
    except msgspec.MsgspecError as exc:
        raise KeyFileError(f"public key file {path} is malformed: {exc}") from exc
    if len(parsed.key) != 32 or parsed.keyid != key_id(parsed.key):
        raise KeyFileError(f"public key file {path}: key and keyid do not match")
    return parsed


def b64(data: bytes) -> str:
    """Standard base64 with padding, as msgspec writes bytes fields."""
    return base64.b64encode(data).decode("ascii")
