"""Ed25519 signatures at the edges of SPEC §3's verification rule, made on purpose.

Test and vector-generation code only: plain affine arithmetic on edwards25519 with Python
integers, slow and not constant-time, so that the vectors' edge cases (small-order and
mixed-order R and keys, S not reduced) can be built and both verification equations
evaluated independently of libsodium:

* cofactorless: the encoding of [S]B - [k]A equals R's bytes (SPEC §3 rule 5);
* cofactored: [8]([S]B - R - [k]A) is the identity (RFC 8032's alternative, ZIP-215,
  batch verification), which accepts more.

``SignatureCase`` is one vector; ``cases()`` makes the committed set deterministically.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import NamedTuple

P = 2**255 - 19
L = 2**252 + 27742317777372353535851937790883648493
D = (-121665 * pow(121666, P - 2, P)) % P
SQRT_M1 = pow(2, (P - 1) // 4, P)

Point = tuple[int, int]
IDENTITY: Point = (0, 1)


def _inv(value: int) -> int:
    return pow(value, P - 2, P)


def add(a: Point, b: Point) -> Point:
    """The sum on -x^2 + y^2 = 1 + d x^2 y^2 (complete: no special cases)."""
    (x1, y1), (x2, y2) = a, b
    t = D * x1 * x2 * y1 * y2 % P
    return ((x1 * y2 + y1 * x2) * _inv(1 + t) % P, (y1 * y2 + x1 * x2) * _inv(1 - t) % P)


def neg(a: Point) -> Point:
    return ((-a[0]) % P, a[1])


def mul(scalar: int, point: Point) -> Point:
    """[scalar]point, double and add."""
    out = IDENTITY
    while scalar > 0:
        if scalar & 1:
            out = add(out, point)
        point = add(point, point)
        scalar >>= 1
    return out


def encode(point: Point) -> bytes:
    """RFC 8032 §5.1.2: y little-endian, the sign of x in the top bit."""
    x, y = point
    return (y | ((x & 1) << 255)).to_bytes(32, "little")


def decode(data: bytes) -> Point | None:
    """RFC 8032 §5.1.3, but also accepting y >= p (reduced): None off the curve."""
    value = int.from_bytes(data, "little")
    sign, y = value >> 255, (value & ((1 << 255) - 1)) % P
    u, v = (y * y - 1) % P, (D * y * y + 1) % P
    x = u * pow(v, 3, P) * pow(u * pow(v, 7, P), (P - 5) // 8, P) % P
    if v * x * x % P == (-u) % P:
        x = x * SQRT_M1 % P
    if v * x * x % P != u:
        return None
    if x == 0 and sign:
        return None
    if x & 1 != sign:
        x = P - x
    return (x, y)


_BASE = decode((4 * _inv(5) % P).to_bytes(32, "little"))  # y = 4/5, x even (RFC 8032)
assert _BASE is not None
B: Point = _BASE
# A point of order 8 (one of libsodium's blocklisted encodings).
_ORDER_8 = decode(bytes.fromhex("c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"))
assert _ORDER_8 is not None
T8: Point = _ORDER_8
assert mul(8, T8) == IDENTITY and mul(4, T8) != IDENTITY


def _low_255(point: Point) -> bytes:
    """The encoding of ``point`` with its top (sign) bit cleared."""
    return (int.from_bytes(encode(point), "little") & ((1 << 255) - 1)).to_bytes(32, "little")


# SPEC §3 rules 2 and 3: the seven encodings (top bit ignored) of points of small order:
# y = 0 (order 4), 1 (the identity), the two y of the points of order 8 (T8 and [3]T8),
# p - 1 (order 2), and the non-canonical p (= 0) and p + 1 (= 1).
SMALL_ORDER_ENCODINGS: tuple[bytes, ...] = (
    _low_255(mul(2, T8)),
    _low_255(IDENTITY),
    _low_255(T8),
    _low_255(mul(3, T8)),
    _low_255(mul(4, T8)),
    P.to_bytes(32, "little"),
    (P + 1).to_bytes(32, "little"),
)
assert mul(L, B) == IDENTITY and encode(B).hex() == "58" + "66" * 31


def challenge(r: bytes, a: bytes, message: bytes) -> int:
    """k = SHA-512(R || A || M) mod L."""
    return int.from_bytes(hashlib.sha512(r + a + message).digest(), "little") % L


def cofactorless(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """SPEC §3 rule 5 alone (S as the integer it is, A reduced): the encoding of
    [S]B - [k]A equals R."""
    a = decode(public_key)
    s = int.from_bytes(signature[32:], "little")
    if a is None:
        return False
    k = challenge(signature[:32], public_key, message)
    return encode(add(mul(s, B), neg(mul(k, a)))) == signature[:32]


def cofactored(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """RFC 8032's [8][S]B = [8]R + [8][k]A alone (S as the integer it is, R and A
    reduced), for R and A on the curve."""
    a, r = decode(public_key), decode(signature[:32])
    s = int.from_bytes(signature[32:], "little")
    if a is None or r is None:
        return False
    k = challenge(signature[:32], public_key, message)
    return mul(8, add(mul(s, B), neg(add(r, mul(k, a))))) == IDENTITY


class SignatureCase(NamedTuple):
    name: str
    public_key: bytes
    message: bytes
    signature: bytes
    valid: bool  # what SPEC §3 says
    why: str


def _scalar(text: str) -> int:
    return int.from_bytes(hashlib.sha512(text.encode()).digest(), "little") % L


def _sign_with(
    a_scalar: int, a_point: Point, r_scalar: int, r_point: Point, message: bytes
) -> bytes:
    """R || S with S = r + k a mod L, for any R and A (torsion parts included)."""
    r_bytes, a_bytes = encode(r_point), encode(a_point)
    k = challenge(r_bytes, a_bytes, message)
    return r_bytes + ((r_scalar + k * a_scalar) % L).to_bytes(32, "little")


def _message_where(
    test: Callable[[bytes, bytes], bool], prefix: bytes, sign: Callable[[bytes], bytes]
) -> tuple[bytes, bytes]:
    """The first message ``prefix + n`` whose signature ``sign(message)`` passes
    ``test(message, signature)`` (k mod 8 is uniform: a few tries)."""
    for n in range(256):
        message = prefix + str(n).encode()
        signature = sign(message)
        if test(message, signature):
            return message, signature
    raise AssertionError("no message found")  # 1/8 a try: not reached


def cases() -> list[SignatureCase]:
    """The committed edge cases, deterministic (seeds are fixed texts)."""
    a = _scalar("gridledger/vector/ed25519/a")
    r = _scalar("gridledger/vector/ed25519/r")
    big_a = mul(a, B)
    key = encode(big_a)
    base = b"gridledger/usage/v1\n{}#"
    out: list[SignatureCase] = []

    message = base + b"honest"
    honest = _sign_with(a, big_a, r, mul(r, B), message)
    out.append(SignatureCase("honest", key, message, honest, True, "an ordinary signature"))

    s = int.from_bytes(honest[32:], "little")
    out.append(
        SignatureCase(
            "s_not_reduced",
            key,
            message,
            honest[:32] + (s + L).to_bytes(32, "little"),
            False,
            "S + L: both equations hold, but S >= L (a second signature of the same "
            "message: malleability)",
        )
    )

    # R of small order: S = k a makes [S]B - [k]A the identity, R - that = T8
    message = base + b"small-order-r"
    out.append(
        SignatureCase(
            "small_order_r",
            key,
            message,
            _sign_with(a, big_a, 0, T8, message),
            False,
            "R of order 8 (blocklisted): only the cofactored equation holds",
        )
    )

    # R = rB + T8, an honest key: cofactored holds, cofactorless never
    message = base + b"mixed-order-r"
    out.append(
        SignatureCase(
            "mixed_order_r",
            key,
            message,
            _sign_with(a, big_a, r, add(mul(r, B), T8), message),
            False,
            "R with a torsion part: only the cofactored equation holds",
        )
    )

    # A key of small order: [k]T8 = identity when k = 0 mod 8, so S = r, R = rB verifies
    # under the cofactorless equation
    small_key = encode(T8)

    def small_key_sign(_: bytes) -> bytes:
        return encode(mul(r, B)) + r.to_bytes(32, "little")

    message, signature = _message_where(
        lambda m, sig: cofactorless(small_key, m, sig), base + b"small-order-key-", small_key_sign
    )
    out.append(
        SignatureCase(
            "small_order_key",
            small_key,
            message,
            signature,
            False,
            "a key of order 8 (blocklisted): both equations hold, the key is refused",
        )
    )

    # A key with a torsion part: A = aB + T8
    mixed = add(big_a, T8)
    mixed_key = encode(mixed)

    def mixed_sign(m: bytes) -> bytes:
        return _sign_with(a, mixed, r, mul(r, B), m)

    message, signature = _message_where(
        lambda m, sig: not cofactorless(mixed_key, m, sig), base + b"mixed-key-no-", mixed_sign
    )
    out.append(
        SignatureCase(
            "mixed_order_key_refused",
            mixed_key,
            message,
            signature,
            False,
            "a key with a torsion part, k != 0 mod 8: only the cofactored equation holds",
        )
    )
    message, signature = _message_where(
        lambda m, sig: cofactorless(mixed_key, m, sig), base + b"mixed-key-yes-", mixed_sign
    )
    out.append(
        SignatureCase(
            "mixed_order_key_accepted",
            mixed_key,
            message,
            signature,
            True,
            "a key with a torsion part (not of small order), k = 0 mod 8: the "
            "cofactorless equation holds, so it verifies",
        )
    )

    # Non-canonical encodings: y = p + 1 (the identity) as R and as the key
    non_canonical = (P + 1).to_bytes(32, "little")
    message = base + b"non-canonical-r"
    out.append(
        SignatureCase(
            "non_canonical_r",
            key,
            message,
            non_canonical + honest[32:],
            False,
            "R is y = p + 1, a non-canonical encoding of the identity (blocklisted)",
        )
    )
    out.append(
        SignatureCase(
            "non_canonical_key",
            non_canonical,
            message,
            honest,
            False,
            "the key is y = p + 1, a non-canonical encoding of the identity: refused "
            "(rule 3) whatever the equations say",
        )
    )
    return out


def secret_scalar(seed: bytes) -> int:
    """RFC 8032 §5.1.5: the secret scalar of a 32-byte seed (pruned)."""
    low = int.from_bytes(hashlib.sha512(seed).digest()[:32], "little")
    return (low & ((1 << 254) - 8)) | (1 << 254)


def torsion_r_signature(seed: bytes, message: bytes) -> bytes:
    """A signature of ``message`` by the key of ``seed`` with R = rB + T8: what a signer
    makes to be accepted by cofactored verifiers and refused by cofactorless ones."""
    a = secret_scalar(seed)
    r = _scalar("gridledger/torsion-r/" + hashlib.sha256(message).hexdigest())
    return _sign_with(a, mul(a, B), r, add(mul(r, B), T8), message)
