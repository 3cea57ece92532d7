"""SPEC §6.5 rule 6: the releases a restarted shard owes, from its store's committed
decisions against the claims the capacity log still grants it (``ledger/capacity_owed.py``).
The real-broker kill and restart is in tests/test_capacity_shards.py."""

from __future__ import annotations

from ledger.capacity_log import Granted, PendingRelease
from ledger.capacity_owed import Committed, owed_releases
from proto.records import ReclaimNotice

KEY = b"\x01" * 32
T0 = 1_767_225_600_000
H1, H2, H3 = "1" * 64, "2" * 64, "3" * 64


def _claim(pid: str, terms_hash: str, end: int = T0 + 60_000) -> Granted:
    return Granted(pid, terms_hash, KEY, 0, T0, end, 1000)


def _reclaim(pid: str, at: int, gpus: list[str]) -> ReclaimNotice:
    return ReclaimNotice(pid, "r1", T0, at, gpus, "maintenance")


def test_rejected_amended_and_reclaimed_claims_are_owed_and_nothing_else() -> None:
    committed = {
        "rej": [Committed(1, H1, "terms", "rejected", "rec-rej")],
        "amd": [
            Committed(1, H1, "terms", "accepted", "rec-1"),
            Committed(2, H2, "terms", "accepted", "rec-2"),
        ],
        "rcl": [
            Committed(1, H1, "terms", "accepted", "rec-t"),
            Committed(
                2, "x" * 64, "reclaim", "rejected", "rec-bad", _reclaim("rcl", T0, ["GPU-a-0"])
            ),
            Committed(
                3,
                "y" * 64,
                "reclaim",
                "accepted",
                "rec-r",
                _reclaim("rcl", T0 + 20_000, ["gpu-A-0"]),
            ),
        ],
        # a duplicate of accepted terms is rejected: the terms still stand
        "dup": [
            Committed(1, H3, "terms", "accepted", "rec-d1"),
            Committed(2, H3, "terms", "rejected", "rec-d2"),
        ],
    }
    claims = [
        ("GPU-a-0", _claim("rej", H1)),
        ("GPU-a-0", _claim("amd", H1)),
        ("GPU-a-0", _claim("amd", H2)),  # the terms in force: kept
        ("GPU-a-0", _claim("rcl", H1)),
        ("GPU-b-0", _claim("rcl", H1)),  # not reclaimed: kept
        ("GPU-a-0", _claim("dup", H3)),
        ("GPU-a-0", _claim("gone", H1)),  # terms not committed here: left to their batch
    ]
    assert owed_releases(claims, committed) == [
        PendingRelease("rej", H1, ("GPU-a-0",), 0, "rejected", "rec-rej"),
        PendingRelease("amd", H1, ("GPU-a-0",), 0, "amended", "rec-2"),
        PendingRelease("rcl", H1, ("GPU-a-0",), T0 + 20_000, "reclaimed", "rec-r"),
    ]
    # once the log has read the reclaim's release, the claim ends there: nothing owed
    released = [("GPU-a-0", _claim("rcl", H1, end=T0 + 20_000))]
    assert owed_releases(released, committed) == []
