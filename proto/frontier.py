"""The right frontier of an RFC 9162 tree: append leaves, get the root, in O(log n) state.

A witness keeps, per log, the roots of the perfect subtrees that make up the tree it
last cosigned (a compact range from 0 to n). Appending the leaf hashes of the new
records and comparing the root with the new checkpoint proves, without any proof from
the log, that the new tree extends the old one (SPEC.md §8.3, check 3).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proto.merkle import leaf_hash, node_hash, root_from_leaf_hashes

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

    def consistency_proof(self, new_leaves: Sequence[bytes]) -> list[bytes]:
        """RFC 9162 PROOF(m, D[n]) from this frontier (size m > 0) and the leaf hashes of
        records m..n-1, in O(log m + (n - m)) hashing: every node of the proof inside the
        first m leaves is a run of this frontier's subtrees (folded), every other one lies
        wholly in the new leaves. Equals ``merkle.consistency_proof`` over all n leaves."""
        m = self.size
        if m <= 0:
            raise ValueError("a consistency proof starts from a tree of at least one leaf")
        starts = []
        at = 0
        for h in self.hashes:
            size = 1 << (len(bin(m - at)) - 3)  # the largest power of 2 <= what is left
            starts.append((at, size, h))
            at += size

        def old(lo: int, hi: int) -> bytes:
            run = [h for start, size, h in starts if lo <= start and start + size <= hi]
            covered = sum(size for start, size, _ in starts if lo <= start and start + size <= hi)
            if covered != hi - lo or not run:
                raise ValueError(f"[{lo}, {hi}) is not a run of the frontier's subtrees")
            acc = run[-1]
            for h in reversed(run[:-1]):
                acc = node_hash(h, acc)
            return acc

        def new(lo: int, hi: int) -> bytes:
            return root_from_leaf_hashes(new_leaves[lo - m : hi - m])

        def sub(lo: int, hi: int, mm: int, whole: bool) -> list[bytes]:
            n = hi - lo
            if mm == n:
                return [] if whole else [old(lo, hi)]
            k = 1 << ((n - 1).bit_length() - 1)  # the largest power of 2 < n
            if mm <= k:
                return [*sub(lo, lo + k, mm, whole), new(lo + k, hi)]
            return [*sub(lo + k, hi, mm - k, False), old(lo, lo + k)]

        return sub(0, m + len(new_leaves), m, True)
