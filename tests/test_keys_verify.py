"""proto.keys.verify calls libsodium's crypto_sign_open directly (reusable buffers): it must
agree with pynacl's VerifyKey.verify, the path it replaced, on every kind of signature."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

import ed25519_edges
import nacl.exceptions
import nacl.signing
import pytest

from devtools import builders as b
from ledger.fold import Fold
from proto.canonical import signed_bytes
from proto.envelope import Envelope, Signature, encode_envelope, open_envelope
from proto.keys import SigningKey, verify
from proto.reasons import Reason
from proto.records import UsageEvent
from verifier.opener import SIG_INVALID, open_one

WS = 1_767_225_600_000
MINUTE = 60_000

# The order of the Ed25519 group (S must be below it: RFC 8032 §5.1.7).
L = ed25519_edges.L
# Encodings of points of small order (SPEC §3 rules 2-3: the identity, points of order 2,
# 4 and 8, and the two non-canonical encodings of 0 and 1).
SMALL_ORDER = ed25519_edges.SMALL_ORDER_ENCODINGS


def nacl_says(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """What pynacl's VerifyKey.verify concludes (a wrong-length signature: False, as
    proto.keys.verify has always answered without asking)."""
    if len(signature) != 64:
        return False
    try:
        nacl.signing.VerifyKey(public_key).verify(message, signature)
    except nacl.exceptions.BadSignatureError:
        return False
    return True


def both(public_key: bytes, message: bytes, signature: bytes) -> bool:
    ours = verify(public_key, message, signature)
    assert ours is nacl_says(public_key, message, signature), (public_key, message, signature)
    return ours


KEY = SigningKey.from_seed_text("k", "test-keys-verify")
OTHER = SigningKey.from_seed_text("o", "test-keys-verify-other")
MESSAGES = [b"", b"x", b"gridledger/usage/v1\n{}", bytes(range(256)) * 40]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: f"len{len(m)}")
def test_valid_and_flipped_bits(message: bytes) -> None:
    signature = KEY.sign(message)
    assert both(KEY.public_key, message, signature) is True
    for bit in (0, 7, 255, 256, 300, 511):  # in R, then in S
        flipped = bytearray(signature)
        flipped[bit // 8] ^= 1 << (bit % 8)
        assert both(KEY.public_key, message, bytes(flipped)) is False
    if message:
        for at in (0, len(message) // 2, len(message) - 1):
            changed = bytearray(message)
            changed[at] ^= 0x01
            assert both(KEY.public_key, bytes(changed), signature) is False
    key = bytearray(KEY.public_key)
    key[3] ^= 0x10
    assert both(bytes(key), message, signature) is False


def test_wrong_key() -> None:
    message = b"signed by KEY"
    assert both(OTHER.public_key, message, KEY.sign(message)) is False
    assert both(KEY.public_key, message, OTHER.sign(message)) is False


@pytest.mark.parametrize("length", [0, 1, 32, 63, 65, 128])
def test_wrong_length_signature(length: int) -> None:
    message = b"m"
    signature = (KEY.sign(message) * 3)[:length]
    assert verify(KEY.public_key, message, signature) is False
    assert both(KEY.public_key, message, signature) is False


def test_non_canonical_s() -> None:
    """S + L verifies the same equation; libsodium rejects it (S >= L), and so do we."""
    message = b"malleable?"
    signature = KEY.sign(message)
    s = int.from_bytes(signature[32:], "little")
    for bigger in (s + L, s + 2 * L):
        if bigger < 2**256:
            forged = signature[:32] + bigger.to_bytes(32, "little")
            assert both(KEY.public_key, message, forged) is False
    forged = signature[:32] + bytes([0xFF]) * 32
    assert both(KEY.public_key, message, forged) is False


@pytest.mark.parametrize("point", SMALL_ORDER, ids=lambda p: p[:4].hex())
def test_small_order_key_and_r(point: bytes) -> None:
    """A small-order public key or R: libsodium refuses them, for any message."""
    for message in (b"", b"anything"):
        # R = the point, S = 0: valid for the identity key under the bare equation
        assert both(point, message, point + bytes(32)) is False
        assert both(point, message, KEY.sign(message)) is False
        assert both(KEY.public_key, message, point + KEY.sign(message)[32:]) is False


def test_random_signatures_agree() -> None:
    """A spread of deterministic garbage signatures and keys: the same answers."""
    for i in range(300):
        seed = hashlib.sha512(i.to_bytes(4, "big")).digest()
        key = hashlib.sha256(seed).digest()
        assert both(key, seed[: i % 50], seed) is False
    message = b"the real one"
    assert both(KEY.public_key, message, KEY.sign(message)) is True


def test_arguments_that_are_not_bytes_behave_as_before() -> None:
    message = b"m"
    signature = KEY.sign(message)
    assert verify(KEY.public_key, bytearray(message), signature) is True  # fallback path
    with pytest.raises(TypeError):
        verify(KEY.public_key, message, bytearray(signature))
    for bad_key in (KEY.public_key[:31], KEY.public_key + b"\0"):
        with pytest.raises(ValueError):
            verify(bad_key, message, signature)


def test_threads_share_nothing() -> None:
    """Verifying on several threads at once (the thread pool's case): each answer right."""
    message = bytes(5000)
    good = KEY.sign(message)
    bad = good[:-1] + bytes([good[-1] ^ 1])
    errors: list[str] = []

    def work(n: int) -> None:
        for k in range(200):
            big = bytes([n]) * (100 + 97 * k)  # grows this thread's buffer as it goes
            if verify(KEY.public_key, big, KEY.sign(big)) is not True:
                errors.append(f"thread {n}: valid rejected")
            if verify(KEY.public_key, message, bad if k % 2 else good) is not (k % 2 == 0):
                errors.append(f"thread {n}: wrong answer at {k}")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    assert errors == []


def test_a_signature_only_the_cofactored_equation_accepts_is_refused_everywhere() -> None:
    """SPEC §3: a node signs a usage event with R = rB + T8 (a part of order 8 added) —
    valid for a cofactored or batch verifier. The ledger's fold (one by one and batched)
    rejects it SIG_INVALID and the verifier's opener says the same, while the node's
    honest next event is accepted."""
    cast = b.make_cast("torsion-r")
    g = b.gpu("tr-node", 0)
    terms = b.make_terms(cast, "tr-1", [g], WS, WS + 60 * MINUTE)
    node = cast.node_key(g.node_id)
    writer = b.StreamWriter(node, "tr-1", g.node_id)
    honest = writer.event(WS, WS + MINUTE, [b.sample(g)])
    event = open_envelope(honest).record
    assert isinstance(event, UsageEvent)
    payload = signed_bytes(event)
    forged = ed25519_edges.torsion_r_signature(node.seed, payload)
    assert (
        ed25519_edges.encode(
            ed25519_edges.mul(ed25519_edges.secret_scalar(node.seed), ed25519_edges.B)
        )
        == node.public_key
    )
    assert ed25519_edges.cofactored(node.public_key, payload, forged)
    assert not ed25519_edges.cofactorless(node.public_key, payload, forged)
    raw = encode_envelope(Envelope(payload, [Signature(keyid=node.key_id, sig=forged)]))
    assert verify(node.public_key, payload, forged) is False

    items = [
        (b.signed_terms(cast, terms), "t:0:0", "tr-1", WS),
        (raw, "t:0:1", "tr-1", WS + MINUTE),
        (honest, "t:0:2", "tr-1", WS + MINUTE),
    ]
    inline = Fold(cast.ledger)
    folded = [o for r, pos, key, at in items for o in inline.apply(r, pos, key, at)]
    with ThreadPoolExecutor(2) as pool:
        batched = Fold(cast.ledger).apply_batch(items, pool)
    for outcomes in (folded, batched):
        assert [(o.status, o.reason) for o in outcomes] == [
            ("accepted", None),
            ("rejected", Reason.SIG_INVALID),
            ("accepted", None),
        ]
    opened = open_one(0, raw, {node.key_id: [node.public_key]})
    assert opened.error == "" and opened.sigs[0].outcome == SIG_INVALID
