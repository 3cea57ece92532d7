"""RFC 9162 tree heads over a stream of leaves, in O(log n) memory.

A compact range keeps one hash per set bit of the leaf count: the roots of the perfect
subtrees the tree of size n splits into, largest first. The RFC 9162 root of the first n
leaves folds them right to left. So the verifier checks every checkpoint while it streams
a million records, without holding a million leaf hashes. ``CheckpointRoots`` keeps the
roots at the sizes the checkpoints name, for step 8 (``verifier/step8_merkle.py``).
"""

from __future__ import annotations

import hashlib
from typing import Final

from proto.merkle import leaf_hash, node_hash


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


MISSING_LEAF: Final = leaf_hash(b"")  # stands in for a record that is missing or unreadable


class CheckpointRoots:
    """The record leaves streamed in chain order, and the root at every checkpoint size."""

    def __init__(self) -> None:
        self.sizes: set[int] = set()
        self.roots: dict[int, bytes] = {}
        self.compact = CompactRange()
        self.max_size = 0

    def want(self, sizes: set[int]) -> None:
        """Keep the roots at these tree sizes (and stop hashing past the largest)."""
        self.sizes = sizes
        self.max_size = max(sizes, default=0)
        if 0 in sizes:
            self.roots[0] = self.compact.root()

    def leaf(self, index: int, leaf: bytes) -> None:
        """Append the leaf of ``index`` (filling holes) while a checkpoint still needs it."""
        compact = self.compact
        while compact.size <= index and compact.size < self.max_size:
            compact.append(leaf if compact.size == index else MISSING_LEAF)
            if compact.size in self.sizes:
                self.roots[compact.size] = compact.root()
