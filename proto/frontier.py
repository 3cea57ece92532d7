"""The right frontier of an RFC 9162 tree: append leaves, get the root, in O(log n) state.

A witness keeps, per log, the roots of the perfect subtrees that make up the tree it
last cosigned (a compact range from 0 to n). Appending the leaf hashes of the new
records and comparing the root with the new checkpoint proves, without any proof from
the log, that the new tree extends the old one (SPEC.md §8.3, check 3).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from proto.merkle import leaf_hash, node_hash

EMPTY_ROOT = bytes.fromhex("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")


@dataclass(frozen=True, slots=True)
class Frontier:
    """Tree size and the roots of its perfect subtrees, largest (leftmost) first."""

    size: int
    hashes: tuple[bytes, ...]

    @staticmethod
    def empty() -> Frontier:
        """The frontier of the empty tree."""
        return Frontier(0, ())

    def append_leaf_hash(self, leaf: bytes) -> Frontier:
        """The frontier after one more leaf (given as its leaf hash)."""
        stack = list(self.hashes)
        merged = leaf
        size = self.size
        # Each trailing 1 bit of the old size is a perfect subtree that the new leaf completes.
        while size & 1:
            merged = node_hash(stack.pop(), merged)
            size >>= 1
        stack.append(merged)
        return Frontier(self.size + 1, tuple(stack))

    def extend(self, entries: Iterable[bytes]) -> Frontier:
        """The frontier after appending ``entries`` (leaf data, hashed as RFC 9162 leaves)."""
        frontier = self
        for entry in entries:
            frontier = frontier.append_leaf_hash(leaf_hash(entry))
        return frontier

    def root(self) -> bytes:
        """The RFC 9162 root of the tree: subtrees folded right to left."""
        if not self.hashes:
            return EMPTY_ROOT
        acc = self.hashes[-1]
        for h in reversed(self.hashes[:-1]):
            acc = node_hash(h, acc)
        return acc

    def well_formed(self) -> bool:
        """True when the number of subtrees matches the binary form of the size."""
        return len(self.hashes) == bin(self.size).count("1") and all(
            len(h) == 32 for h in self.hashes
        )
