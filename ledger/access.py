"""Who is asking, and what they may see (SPEC §13).

Every API request is signed with the caller's own Ed25519 key (``proto/httpsig.py``,
RFC 9421). The key decides what the caller sees:

* the ledger's own key and each auditor key of ``ledger.toml`` (``api_auditors``): every
  placement;
* a key pinned in a placement's accepted terms (operator, buyer, desk): that placement,
  with that role's views;
* the new buyer of an accepted assignment (SPEC §6.8): that placement's witness API, its
  export, and only its own page (its obligation, not the seller's economics).

A valid signature by any other key sees no placement (404, as for an unknown one, so a
placement's existence does not leak). A nonce is accepted once while its signature is
valid; the memory of nonces is bounded (MAX_NONCES; past it a request is refused as busy,
never let through).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ledger.store import Store
from proto.envelope import open_envelope
from proto.httpsig import Request, SignatureRefused, verify_request
from proto.records import Assignment, PlacementTerms

# Nonces remembered at once: each for at most MAX_SIGNATURE_LIFETIME_S (300 s), so this
# bounds the signed requests the API takes to ~333 a second on average.
MAX_NONCES: Final = 100_000
# Requests one key may make: a bucket of RATE_BURST, refilled at RATE_PER_S a second
# (past it: 429, Retry-After). Keys remembered at once: MAX_NONCES (a key signs a nonce).
RATE_PER_S: Final = 50.0
RATE_BURST: Final = 500.0
ROLES: Final = ("operator", "buyer", "desk")


class Unauthenticated(Exception):
    """401: no valid signature (the message says why)."""


class Busy(Exception):
    """503: the nonce memory is full; try again shortly."""


class RateLimited(Exception):
    """429: this key asked more often than RATE_PER_S (after a burst of RATE_BURST)."""


@dataclass(frozen=True, slots=True)
class Caller:
    """An authenticated caller: its key, and whether it sees every placement."""

    public_key: bytes
    everything: bool


@dataclass(frozen=True, slots=True)
class Roles:
    """What a caller is in one placement: its roles of the terms, and the ids of the new
    buyers (accepted assignments) it signs as."""

    roles: tuple[str, ...] = ()
    new_buyer_ids: tuple[str, ...] = ()
    everything: bool = False

    @property
    def any(self) -> bool:
        """Whether the caller may see the placement at all."""
        return self.everything or bool(self.roles or self.new_buyer_ids)

    @property
    def full(self) -> bool:
        """Whether the caller sees the placement's whole bill (a party of the terms)."""
        return self.everything or bool(self.roles)

    def pages(self) -> list[str]:
        """The statement pages the caller may read: its roles, then its new-buyer ids."""
        if self.everything:
            return []  # any page
        return [*self.roles, *self.new_buyer_ids]


@dataclass
class Access:
    """Authenticates requests and answers which placements a key may see."""

    store: Store
    ledger_key: bytes
    auditors: frozenset[bytes] = frozenset()
    clock_s: Callable[[], int] = field(default=lambda: 0)
    _nonces: dict[tuple[bytes, str], int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _buckets: dict[bytes, tuple[float, float]] = field(default_factory=dict)  # tokens, at
    monotonic: Callable[[], float] = time.monotonic

    def authenticate(self, request: Request, headers: Mapping[str, str]) -> Caller:
        """The caller of a signed request, its nonce spent; Unauthenticated or Busy."""
        now_s = self.clock_s()
        try:
            signed = verify_request(request, headers, now_s)
        except SignatureRefused as exc:
            raise Unauthenticated(str(exc)) from exc
        with self._lock:
            if (signed.public_key, signed.nonce) in self._nonces:
                raise Unauthenticated("the nonce was used before: a replayed request")
            if len(self._nonces) >= MAX_NONCES:
                self._nonces = {k: e for k, e in self._nonces.items() if e >= now_s}
                if len(self._nonces) >= MAX_NONCES:
                    raise Busy(f"more than {MAX_NONCES} signed requests in flight; retry")
            self._nonces[(signed.public_key, signed.nonce)] = signed.expires
            self._take(signed.public_key)
        key = signed.public_key
        return Caller(key, key == self.ledger_key or key in self.auditors)

    def _take(self, key: bytes) -> None:
        """One token of ``key``'s bucket (under the lock); RateLimited when it is empty."""
        now = self.monotonic()
        if len(self._buckets) >= MAX_NONCES:  # full buckets forget nothing they limit
            self._buckets = {
                k: (t, at) for k, (t, at) in self._buckets.items() if t < RATE_BURST - 1
            }
        tokens, at = self._buckets.get(key, (RATE_BURST, now))
        tokens = min(RATE_BURST, tokens + (now - at) * RATE_PER_S)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            raise RateLimited(f"more than {RATE_PER_S:g} requests a second from this key")
        self._buckets[key] = (tokens - 1, now)

    def roles(self, caller: Caller, placement_id: str) -> Roles:
        """What ``caller`` is in ``placement_id`` (no roles: it may not see it)."""
        if caller.everything:
            return Roles(everything=True)
        terms = self.store.terms(placement_id)
        if terms is None:
            return Roles()
        rows = self.store.placement_query(
            "SELECT envelope FROM inputs WHERE {rows} AND kind = 'assignment' "
            "AND status = 'accepted' ORDER BY chain_index",
            placement_id,
        )
        return _roles_of(caller.public_key, terms, (bytes(r[0]) for r in rows))

    def visible(self, caller: Caller) -> dict[str, Roles]:
        """placement id -> the caller's roles, for every placement it may see (the caller
        who sees everything: an empty dict, meaning all)."""
        if caller.everything:
            return {}
        terms: dict[str, PlacementTerms] = {}
        for pid, envelope in self.store.query(
            "SELECT placement_id, envelope FROM inputs WHERE kind = 'terms' "
            "AND status = 'accepted' ORDER BY placement_id, chain_index"
        ):
            record = open_envelope(bytes(envelope)).record
            if isinstance(record, PlacementTerms):
                terms[str(pid)] = record  # the last accepted: an amendment replaces one
        assignments: dict[str, list[bytes]] = {}
        for pid, envelope in self.store.query(
            "SELECT placement_id, envelope FROM inputs WHERE kind = 'assignment' "
            "AND status = 'accepted' ORDER BY placement_id, chain_index"
        ):
            assignments.setdefault(str(pid), []).append(bytes(envelope))
        out: dict[str, Roles] = {}
        for pid, t in terms.items():
            roles = _roles_of(caller.public_key, t, assignments.get(pid, []))
            if roles.any:
                out[pid] = roles
        return out


def _roles_of(key: bytes, terms: PlacementTerms, assignments: Iterable[bytes]) -> Roles:
    roles = tuple(role for role in ROLES if getattr(terms, role).key == key)
    new_buyers: list[str] = []
    for envelope in assignments:
        record = open_envelope(envelope).record
        if not isinstance(record, Assignment) or record.new_buyer.key != key:
            continue
        if record.new_buyer.id not in new_buyers:
            new_buyers.append(record.new_buyer.id)
    return Roles(roles, tuple(new_buyers))
