"""RFC 9162 tree heads over a stream of leaves, in O(log n) memory.

A compact range keeps one hash per set bit of the leaf count: the roots of the perfect
subtrees the tree of size n splits into, largest first. The RFC 9162 root of the first n
leaves folds them right to left. So the verifier checks every checkpoint while it streams
a million records, without holding a million leaf hashes.
"""

from __future__ import annotations

import hashlib

from proto.merkle import node_hash


class CompactRange:
    """Perfect-subtree roots of the leaves appended so far."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[tuple[int, bytes]] = []  # (subtree leaf count, hash), largest first

    def append(self, leaf: bytes) -> None:
        """Add the next leaf hash (``proto.merkle.leaf_hash`` of an entry)."""
        count, node = 1, leaf
        while self._stack and self._stack[-1][0] == count:
            left_count, left = self._stack.pop()
            count, node = left_count + count, node_hash(left, node)
        self._stack.append((count, node))
        self.size += 1

    def root(self) -> bytes:
        """MTH of the leaves so far (SHA-256 of nothing for an empty tree)."""
        if not self._stack:
            return hashlib.sha256(b"").digest()
        node = self._stack[-1][1]
        for _, left in reversed(self._stack[:-1]):
            node = node_hash(left, node)
        return node
