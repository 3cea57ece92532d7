"""Persistent (immutable, structure-sharing) collections for the fold state.

The fold's state is immutable: ``decide`` returns a new state and never changes the one
it was given. A placement's set of seen input hashes and its held inputs grow by one per
input, so copying them on every change would make a long stream quadratic. These share
structure instead, as a binary counter of immutable layers: adding one element makes a
one-element layer and merges equal-sized layers at the end, so an add costs amortised
O(log n) and a lookup probes at most log2(n) + 1 frozensets. Old versions stay valid.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Final, Generic, TypeVar

H = TypeVar("H", bound=Hashable)
T = TypeVar("T")


class PSet(Generic[H]):
    """An immutable set with a cheap ``add`` (returns a new set)."""

    __slots__ = ("_layers", "_len")

    def __init__(self, items: Iterable[H] = ()) -> None:
        layer = frozenset(items)
        self._layers: tuple[frozenset[H], ...] = (layer,) if layer else ()
        self._len = len(layer)

    @classmethod
    def _of(cls, layers: tuple[frozenset[H], ...], length: int) -> PSet[H]:
        new = cls.__new__(cls)
        new._layers = layers
        new._len = length
        return new

    def __contains__(self, item: object) -> bool:
        for layer in self._layers:  # noqa: SIM110 (not any(genexpr): this runs per input)
            if item in layer:
                return True
        return False

    def add(self, item: H) -> PSet[H]:
        """This set with ``item`` (``self`` when it is already in)."""
        if item in self:
            return self
        layers = list(self._layers)
        new: frozenset[H] = frozenset((item,))
        while layers and len(layers[-1]) <= len(new):
            new = layers.pop() | new
        layers.append(new)
        return PSet._of(tuple(layers), self._len + 1)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[H]:
        for layer in self._layers:
            yield from layer

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PSet):
            return NotImplemented
        return self._len == other._len and all(item in other for item in self)

    def __hash__(self) -> int:
        return hash(frozenset(self))

    def __repr__(self) -> str:
        return f"PSet({sorted(map(repr, self))})"


class PLog(Generic[T]):
    """An immutable sequence with a cheap ``append`` (returns a new sequence).

    ``weight``: the sum of the weights its appends gave (the held inputs' bytes, SPEC
    §6.2), kept beside the items so the sum costs nothing; not part of equality."""

    __slots__ = ("_layers", "_len", "weight")

    def __init__(self, items: Iterable[T] = (), weight: int = 0) -> None:
        layer = tuple(items)
        self._layers: tuple[tuple[T, ...], ...] = (layer,) if layer else ()
        self._len = len(layer)
        self.weight = weight

    def append(self, item: T, weight: int = 0) -> PLog[T]:
        """This sequence with ``item`` (of ``weight``) at the end."""
        layers = list(self._layers)
        new: tuple[T, ...] = (item,)
        while layers and len(layers[-1]) <= len(new):
            new = layers.pop() + new
        layers.append(new)
        log: PLog[T] = PLog.__new__(PLog)
        log._layers = tuple(layers)
        log._len = self._len + 1
        log.weight = self.weight + weight
        return log

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[T]:
        for layer in self._layers:
            yield from layer

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PLog):
            return NotImplemented
        return self._len == other._len and list(self) == list(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"PLog({list(self)!r})"


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# A key deleted in a newer layer than the one that holds it.
_GONE: Final = object()


class PMap(Mapping[K, V]):
    """An immutable mapping with a cheap ``set`` and ``delete`` (each returns a new map).

    The same binary counter of immutable layers as ``PSet``: newer layers override older
    ones, and a deletion is a marker in a new layer; merging into the oldest layer drops
    the markers. ``set`` and ``delete`` cost amortised O(log n), a lookup probes at most
    log2(n) + 1 dicts; iterating merges the layers (O(n)). Layers are never changed once
    built (dicts, but private), so old versions stay valid.

    ``weight``: the sum of the weights ``set`` gave and ``delete`` took back (as ``PLog``);
    not part of equality.
    """

    __slots__ = ("_layers", "_len", "weight")

    def __init__(self, items: Iterable[tuple[K, V]] | Mapping[K, V] = (), weight: int = 0) -> None:
        layer: dict[K, object] = dict(items)
        self._layers: tuple[dict[K, object], ...] = (layer,) if layer else ()
        self._len = len(layer)
        self.weight = weight

    def _find(self, key: object) -> object:
        for layer in reversed(self._layers):
            found = layer.get(key, _MISSING)  # type: ignore[arg-type]
            if found is not _MISSING:
                return found
        return _GONE

    def __getitem__(self, key: K) -> V:
        found = self._find(key)
        if found is _GONE:
            raise KeyError(key)
        return found  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return self._find(key) is not _GONE

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        return iter(self._merged())

    def _merged(self) -> dict[K, V]:
        merged: dict[K, object] = {}
        for layer in self._layers:
            merged.update(layer)
        return {k: v for k, v in merged.items() if v is not _GONE}  # type: ignore[misc]

    def _with(self, key: K, value: object, length: int, weight: int) -> PMap[K, V]:
        layers = list(self._layers)
        new: dict[K, object] = {key: value}
        while layers and len(layers[-1]) <= len(new):
            new = {**layers.pop(), **new}
        if not layers:  # the oldest layer: nothing older left to delete from
            new = {k: v for k, v in new.items() if v is not _GONE}
        if new:
            layers.append(new)
        out: PMap[K, V] = PMap.__new__(PMap)
        out._layers = tuple(layers)
        out._len = length
        out.weight = weight
        return out

    def set(self, key: K, value: V, weight: int = 0) -> PMap[K, V]:
        """This map with ``key`` -> ``value``; ``weight`` is added to the map's."""
        return self._with(key, value, self._len + (key not in self), self.weight + weight)

    def delete(self, key: K, weight: int = 0) -> PMap[K, V]:
        """This map without ``key`` (``self`` when it is not in); ``weight`` (the one its
        ``set`` gave) is taken back."""
        if key not in self:
            return self
        return self._with(key, _GONE, self._len - 1, self.weight - weight)

    def __repr__(self) -> str:
        return f"PMap({self._merged()!r})"


_MISSING: Final = object()
