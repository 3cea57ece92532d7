"""RFC 9162 Merkle hashing and proofs; C2SP signed notes and checkpoints."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto import merkle
from proto.cosign import Cosignature, cosign, cosignature_of
from proto.errors import ProtoError
from proto.keys import SigningKey
from proto.note import (
    checkpoint_body,
    checkpoint_origin,
    note_key_hash,
    parse_checkpoint_body,
    parse_note,
    sign_note,
)
from proto.records import Checkpoint

# The RFC 6962 / certificate-transparency reference tree of eight leaves and its roots.
CT_LEAVES = [
    b"",
    b"\x00",
    b"\x10",
    b"\x20\x21",
    b"\x30\x31",
    b"\x40\x41\x42\x43",
    bytes(range(0x50, 0x58)),
    bytes(range(0x60, 0x70)),
]
CT_ROOTS = {
    1: "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    2: "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    3: "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    4: "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    5: "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    6: "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    7: "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    8: "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
}


def test_reference_roots() -> None:
    assert merkle.root([]).hex() == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    for size, expected in CT_ROOTS.items():
        assert merkle.root(CT_LEAVES[:size]).hex() == expected


def test_reference_inclusion_proof() -> None:
    leaves = [merkle.leaf_hash(x) for x in CT_LEAVES]
    # RFC 6962 test data: leaf 0 in the tree of 8.
    proof = merkle.inclusion_proof(leaves, 0)
    assert [p.hex() for p in proof] == [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ]
    root = bytes.fromhex(CT_ROOTS[8])
    assert merkle.verify_inclusion(leaves[0], 0, 8, proof, root)
    assert not merkle.verify_inclusion(leaves[1], 0, 8, proof, root)
    assert not merkle.verify_inclusion(leaves[0], 1, 8, proof, root)
    assert not merkle.verify_inclusion(leaves[0], 8, 8, proof, root)


def test_reference_consistency_proof() -> None:
    leaves = [merkle.leaf_hash(x) for x in CT_LEAVES]
    proof = merkle.consistency_proof(leaves, 1)
    assert [p.hex() for p in proof] == [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ]
    assert merkle.verify_consistency(
        1, 8, bytes.fromhex(CT_ROOTS[1]), bytes.fromhex(CT_ROOTS[8]), proof
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.binary(max_size=8), min_size=1, max_size=70), st.data())
def test_every_proof_verifies_and_a_wrong_one_does_not(
    entries: list[bytes], data: st.DataObject
) -> None:
    leaves = [merkle.leaf_hash(e) for e in entries]
    n = len(leaves)
    root = merkle.root_from_leaf_hashes(leaves)
    index = data.draw(st.integers(0, n - 1))
    proof = merkle.inclusion_proof(leaves, index)
    assert merkle.verify_inclusion(leaves[index], index, n, proof, root)
    other = merkle.leaf_hash(b"not in the tree")
    assert not merkle.verify_inclusion(other, index, n, proof, root)
    first = data.draw(st.integers(1, n))
    first_root = merkle.root_from_leaf_hashes(leaves[:first])
    cproof = merkle.consistency_proof(leaves, first)
    assert merkle.verify_consistency(first, n, first_root, root, cproof)
    if first < n:
        assert not merkle.verify_consistency(first, n, root, root, cproof)


def test_checkpoint_note_sign_cosign_parse() -> None:
    ledger = SigningKey.from_seed_text("gridledger-ledger", "note-tests/ledger")
    buyer = SigningKey.from_seed_text("buyer-1", "note-tests/buyer")
    checkpoint = Checkpoint(origin=checkpoint_origin("pl-1"), size=8, root=bytes(range(32)))
    body = checkpoint_body(checkpoint)
    assert body.count("\n") == 3
    note = cosign(sign_note(body, "gridledger-ledger", ledger), "buyer-1", buyer, 1_700_000_000)
    text = note.text()
    parsed = parse_note(text)
    assert parsed.text() == text
    assert parsed.signed_by("gridledger-ledger", ledger.public_key)
    assert cosignature_of(parsed, "buyer-1", buyer.public_key) == Cosignature(
        "buyer-1", 1_700_000_000
    )
    assert cosignature_of(parsed, "buyer-1", ledger.public_key) is None
    # A cosignature is not a note signature, and the log's signature is not a cosignature.
    assert not parsed.signed_by("buyer-1", buyer.public_key)
    assert cosignature_of(parsed, "gridledger-ledger", ledger.public_key) is None
    assert parse_checkpoint_body(parsed.body) == checkpoint
    assert parsed.signatures[0].key_hash == note_key_hash("gridledger-ledger", ledger.public_key)
    # A changed body no longer carries valid signatures.
    forged = parse_note(text.replace("\n8\n", "\n9\n"))
    assert not forged.signed_by("gridledger-ledger", ledger.public_key)
    assert cosignature_of(forged, "buyer-1", buyer.public_key) is None


@pytest.mark.parametrize(
    "text",
    [
        "no blank line\n— a AAAA\n",
        "body\n\n— name not-base64!\n",
        "body\n\n- name AAAA\n",
        "body\n\n— name " + "QUFB" + "\n",
    ],
)
def test_malformed_notes_are_refused(text: str) -> None:
    with pytest.raises(ProtoError):
        parse_note(text)


@pytest.mark.parametrize(
    "body", ["o\n01\nAAAA\n", "o\n1\n", "o\n1\nnot base64\n", "\n1\n" + "A" * 43 + "=\n"]
)
def test_malformed_checkpoint_bodies_are_refused(body: str) -> None:
    with pytest.raises(ProtoError):
        parse_checkpoint_body(body)
