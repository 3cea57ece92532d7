"""The placement cache around ``decide``: states in memory, what changed, what to reload.

* ``get`` returns a placement's state: from memory, else the stored snapshot of a
  placement evicted earlier (``load_state``), else a new empty state;
* ``put`` records the state ``decide`` returned and the usage events it accepted, and
  marks the placement dirty (its snapshot must be stored with the batch);
* ``accepted_at`` answers ``decide``'s one question about the past: the accepted usage
  event at an old seq — from the events accepted since the last commit, else the store;
* once the batch's snapshots are taken, ``clear_dirty``; after it commits,
  ``forget_accepted``; ``evict`` drops a saved placement from memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ledger.rules import AcceptedEvent, Verdict
from ledger.snapshot import decode
from ledger.state import PlacementState, empty
from proto.invariant import InvariantViolation
from proto.records import UsageEvent

# (placement_id, node_id, seq) -> (input_hash, record_hash) of the accepted usage event at
# that seq in the store, or None.
UsageLookup = Callable[[str, str, int], AcceptedEvent | None]
# placement_id -> stored snapshot bytes, or None.
StateLoader = Callable[[str], bytes | None]


class PlacementCache:
    """Fold states by placement; see the module docstring."""

    def __init__(
        self, lookup: UsageLookup | None = None, load_state: StateLoader | None = None
    ) -> None:
        self._lookup = lookup
        self._load_state = load_state
        self._states: dict[str, PlacementState] = {}
        self._dirty: set[str] = set()
        # Usage events accepted since the last commit (not in the store yet).
        self._recent: dict[tuple[str, str, int], AcceptedEvent] = {}
        # Whether ``_recent`` holds every usage event ever accepted (no store behind the
        # cache, nothing forgotten or restored): then an event it lacks was not accepted
        # (a seq taken by a content rejection, SPEC §6.3 usage).
        self._complete = lookup is None and load_state is None

    def get(self, placement_id: str) -> PlacementState:
        """The placement's state (loaded from the store if it was evicted)."""
        state = self._states.get(placement_id)
        if state is None:
            data = self._load_state(placement_id) if self._load_state is not None else None
            state = empty(placement_id) if data is None else decode(placement_id, data)
            self._states[placement_id] = state
        return state

    def peek(self, placement_id: str) -> PlacementState | None:
        """The placement's state if it is in memory (never loads)."""
        return self._states.get(placement_id)

    def put(self, state: PlacementState, verdicts: Iterable[Verdict]) -> None:
        """Keep the state ``decide`` returned for its verdicts; the placement is dirty."""
        placement_id = state.placement_id
        self._states[placement_id] = state
        self._dirty.add(placement_id)
        for verdict in verdicts:
            opened = verdict.opened
            if verdict.status == "accepted" and opened is not None:
                event = opened.record
                if isinstance(event, UsageEvent):
                    key = (placement_id, event.node_id, event.seq)
                    self._recent[key] = (opened.input_hash, opened.record_hash)

    def restore(self, state: PlacementState) -> None:
        """Load a stored state (on start, before any input)."""
        self._complete = False
        self._states[state.placement_id] = state

    def accepted_at(self, placement_id: str, node_id: str, seq: int) -> AcceptedEvent | None:
        """(input_hash, record_hash) of the accepted usage event at ``seq``, or None."""
        recent = self._recent.get((placement_id, node_id, seq))
        if recent is not None:
            return recent
        lookup = self._lookup
        if lookup is None:
            if self._complete:
                return None
            raise InvariantViolation(
                f"usage {placement_id}/{node_id}/{seq} was accepted before this cache: "
                "it needs the store's lookup"
            )
        return lookup(placement_id, node_id, seq)

    def dirty(self) -> set[str]:
        """Placements whose state changed since the last ``clear_dirty``."""
        return set(self._dirty)

    def clear_dirty(self) -> None:
        """The dirty states are taken into their batch (stored with it)."""
        self._dirty.clear()

    def forget_accepted(self) -> None:
        """The events accepted so far are in the store (``accepted_at`` asks it)."""
        self._complete = False
        self._recent.clear()

    def evict(self, placement_id: str) -> None:
        """Drop a saved placement from memory (``get`` reloads it from the store)."""
        if placement_id in self._dirty:
            raise RuntimeError(f"placement {placement_id} has unsaved state; store it first")
        self._states.pop(placement_id, None)

    def states(self) -> Iterable[PlacementState]:
        """The states in memory."""
        return self._states.values()
