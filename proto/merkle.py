"""RFC 9162 Merkle tree hashing, inclusion and consistency proofs (section 2.1).

Leaves are hashed as SHA-256(0x00 || data), interior nodes as SHA-256(0x01 || left ||
right); the split point of n > 1 leaves is the largest power of two smaller than n.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


def leaf_hash(data: bytes) -> bytes:
    """The RFC 9162 hash of one leaf."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """The RFC 9162 hash of an interior node."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """Largest power of two strictly smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def root_from_leaf_hashes(leaves: Sequence[bytes]) -> bytes:
    """MTH over already-hashed leaves."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    return _subtree(leaves, 0, len(leaves))


def _subtree(leaves: Sequence[bytes], lo: int, hi: int) -> bytes:
    n = hi - lo
    if n == 1:
        return leaves[lo]
    k = _split(n)
    return node_hash(_subtree(leaves, lo, lo + k), _subtree(leaves, lo + k, hi))


def root(entries: Sequence[bytes]) -> bytes:
    """MTH(D[n]) of the raw entries."""
    return root_from_leaf_hashes([leaf_hash(e) for e in entries])


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(index, D[n]) over already-hashed leaves."""
    if not 0 <= index < len(leaves):
        raise ValueError(f"leaf index {index} outside tree of size {len(leaves)}")
    proof: list[bytes] = []
    lo, hi = 0, len(leaves)
    # Walk from the root down; collect siblings, then reverse to leaf-to-root order.
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            proof.append(_subtree(leaves, lo + k, hi))
            hi = lo + k
        else:
            proof.append(_subtree(leaves, lo, lo + k))
            lo = lo + k
    proof.reverse()
    return proof


def verify_inclusion(
    leaf: bytes, index: int, tree_size: int, proof: Sequence[bytes], expected_root: bytes
) -> bool:
    """RFC 9162 2.1.3.2: is the leaf hash ``leaf`` at ``index`` in the tree with this root?"""
    if index >= tree_size or index < 0:
        return False
    fn, sn, r = index, tree_size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == expected_root


def consistency_proof(leaves: Sequence[bytes], first: int) -> list[bytes]:
    """PROOF(first, D[n]) over already-hashed leaves (0 < first <= n)."""
    n = len(leaves)
    if not 0 < first <= n:
        raise ValueError(f"first size {first} outside 1..{n}")
    return _subproof(leaves, 0, n, first, True)


def _subproof(leaves: Sequence[bytes], lo: int, hi: int, m: int, whole: bool) -> list[bytes]:
    n = hi - lo
    if m == n:
        return [] if whole else [_subtree(leaves, lo, hi)]
    k = _split(n)
    if m <= k:
        return [*_subproof(leaves, lo, lo + k, m, whole), _subtree(leaves, lo + k, hi)]
    return [*_subproof(leaves, lo + k, hi, m - k, False), _subtree(leaves, lo, lo + k)]


def verify_consistency(
    first: int, second: int, first_root: bytes, second_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 2.1.4.2: is the tree of size ``second`` an append-only extension of ``first``?"""
    if first < 0 or second < first:
        return False
    if first == second:
        return not proof and first_root == second_root
    if first == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if first & (first - 1) == 0:
        path.insert(0, first_root)
    fn, sn = first - 1, second - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return fr == first_root and sr == second_root and sn == 0
