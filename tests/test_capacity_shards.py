"""SPEC §6.5 across shards, on a real broker: two shards decide terms through one capacity
topic (keyed by canonical GPU uuid, LogAppendTime).

* the operator sells one GPU through a second desk on the other shard: refused OVERSOLD,
  the detail naming the granted claim; disjoint windows on that GPU are accepted;
* terms whose other GPU was denied are rejected, their granted request released, and the
  GPU sold again;
* a shard killed after publishing, restarted (reading the topic from offset 0), and a
  fresh rebuild decide the same, and the claims read back are identical;
* the verifier re-derives every decision from the topic's records alone;
* a release of a shard's claim forged by another writer of the topic (the right
  ``ledger_key`` field, another signer) frees nothing;
* a request reaching the log past its deadline is CAPACITY_LATE.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs
from test_ledger_kafka import RUN_DEADLINE_S, publish, resign_badly

from devtools import builders as b
from devtools.faults.topic import read_topic
from ledger.capacity_gate import CapacityOutcome, KafkaCapacityLog, requests_for
from ledger.capacity_log import PendingRelease
from ledger.config import ConfigError, KafkaConfig, config_from_mapping
from ledger.service import KafkaLedgerService, fixed_clock
from ledger.store import Store
from proto.capacity_log import (
    CapEntry,
    CapRelease,
    entry_from_message,
    open_capacity,
    seal_capacity,
)
from proto.envelope import open_envelope
from proto.limits import MAX_CAPACITY_WAIT_MS
from proto.records import PlacementTerms
from transport.kafka import KafkaSettings
from verifier.capacity_log import decisions_for_terms, derive

PARTITIONS = 2
HOUR = 3_600_000
DECIDE_TIMEOUT_S = 30.0

DESK_1 = b.make_cast("capacity-shards")
DESK_2 = b.make_cast("capacity-shards", desk="desk-2", ledger="ledger-2")  # same operator
SECOND_DESK = b.make_cast("capacity-shards", desk="desk-2")  # same operator, same ledger
LEDGER_KEYS = (DESK_1.ledger.public_key, DESK_2.ledger.public_key)  # the shards' pinned keys


def _shard(settings: KafkaSettings, cast: b.Cast) -> KafkaCapacityLog:
    return KafkaCapacityLog(settings, cast.ledger, LEDGER_KEYS)


def _pid(entry: CapEntry) -> str:
    return getattr(open_capacity(entry.envelope), "placement_id", "")


def _terms(
    cast: b.Cast, pid: str, gpus: list[tuple[str, int]], start: int, end: int
) -> PlacementTerms:
    specs = [b.gpu(node, 0, share_milli=share) for node, share in gpus]
    return b.make_terms(cast, pid, specs, start, end)


def _hash(cast: b.Cast, terms: PlacementTerms) -> str:
    return open_envelope(b.signed_terms(cast, terms)).record_hash


async def _decide(
    shard: KafkaCapacityLog, cast: b.Cast, terms: PlacementTerms, arrived: int
) -> CapacityOutcome:
    async with asyncio.timeout(DECIDE_TIMEOUT_S):
        return await shard.decide(terms, _hash(cast, terms), arrived)


def _topic_entries(settings: KafkaSettings) -> list[CapEntry]:
    """Every record of the capacity topic, as a verifier reads it: by partition and offset."""
    return [
        entry_from_message(m.key, m.offset, m.timestamp_ms, m.value)
        for m in read_topic(settings, PARTITIONS)
        if m.key is not None
    ]


def _by_partition(entries: list[CapEntry], settings: KafkaSettings) -> list[list[CapEntry]]:
    parts: dict[int, list[CapEntry]] = {}
    for m, e in zip(read_topic(settings, PARTITIONS), entries, strict=True):
        parts.setdefault(m.partition, []).append(e)
    return list(parts.values())


def test_a_second_sale_on_another_shard_is_refused_naming_the_claim(
    kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=tmp_topic(PARTITIONS))
    now = time.time_ns() // 1_000_000
    start = now + HOUR
    a = _terms(DESK_1, "pl-a", [("node-a", 1000)], start, start + HOUR)
    b2 = _terms(DESK_2, "pl-b", [("node-a", 1000)], start + HOUR // 2, start + 2 * HOUR)
    c = _terms(DESK_2, "pl-c", [("node-a", 1000)], start + HOUR, start + 2 * HOUR)
    d = _terms(DESK_2, "pl-d", [("node-b", 1000), ("node-a", 500)], start, start + HOUR)
    e = _terms(DESK_1, "pl-e", [("node-b", 1000)], start, start + HOUR)

    async def run() -> list[CapacityOutcome]:
        one, two = _shard(settings, DESK_1), _shard(settings, DESK_2)
        await one.start()
        await two.start()
        try:
            got = [await _decide(one, DESK_1, a, now)]
            # shard 2 (or anyone who can write the topic) forges a's release: right
            # ledger_key field, its own signature. It frees nothing: b is still refused.
            forged = CapRelease(
                "pl-a", _hash(DESK_1, a), "GPU-node-a-0", 0, "rejected", "0" * 64, LEDGER_KEYS[0]
            )
            value = seal_capacity(forged, DESK_2.ledger)
            await two._producer.send_and_wait(settings.topic, value, key=b"GPU-node-a-0")
            got.append(await _decide(two, DESK_2, b2, now))
            got += [await _decide(two, DESK_2, c, now), await _decide(two, DESK_2, d, now)]
            # d was rejected (node-a denied): shard 2 releases what it was granted
            owed = PendingRelease(
                "pl-d", _hash(DESK_2, d), got[-1].granted, 0, "rejected", "0" * 64
            )
            await two.release(owed)
            got.append(await _decide(one, DESK_1, e, now))
            return got
        finally:
            await one.stop()
            await two.stop()

    ok_a, sold_b, ok_c, sold_d, ok_e = asyncio.run(run())
    assert ok_a.accepted and ok_c.accepted and ok_e.accepted  # touching windows, freed GPU
    assert sold_b.reason == "OVERSOLD" and not sold_b.granted
    assert "GPU GPU-node-a-0 is granted to placement pl-a" in sold_b.detail, sold_b.detail
    assert f"at {start + HOUR // 2}" in sold_b.detail
    assert sold_d.reason == "OVERSOLD" and sold_d.granted == ("GPU-node-b-0",)
    assert "placement pl-a" in sold_d.detail

    # The verifier re-derives each terms' decision from the topic alone.
    entries = _topic_entries(settings)
    for terms, cast, accepted in (
        (a, DESK_1, True),
        (b2, DESK_2, False),
        (c, DESK_2, True),
        (d, DESK_2, False),
        (e, DESK_1, True),
    ):
        derived = decisions_for_terms(
            entries, terms.placement_id, _hash(cast, terms), cast.ledger.public_key, LEDGER_KEYS
        )
        assert set(derived) == {g.uuid for g in terms.gpus}, terms.placement_id
        assert all(x.outcome == "GRANTED" for x in derived.values()) is accepted, terms.placement_id
    denial = decisions_for_terms(
        entries, "pl-b", _hash(DESK_2, b2), DESK_2.ledger.public_key, LEDGER_KEYS
    )
    granted_a = decisions_for_terms(
        entries, "pl-a", _hash(DESK_1, a), DESK_1.ledger.public_key, LEDGER_KEYS
    )
    assert denial["GPU-node-a-0"].collided == (granted_a["GPU-node-a-0"].offset,)


def test_a_restart_and_a_rebuild_decide_the_same(
    kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=tmp_topic(PARTITIONS))
    now = time.time_ns() // 1_000_000
    a = _terms(DESK_1, "pl-a", [("node-a", 600)], now, now + HOUR)
    b2 = _terms(DESK_2, "pl-b", [("node-a", 600), ("node-c", 1000)], now, now + HOUR)

    async def run() -> tuple[CapacityOutcome, CapacityOutcome, CapacityOutcome, list[object]]:
        one = _shard(settings, DESK_1)
        await one.start()
        try:
            await _decide(one, DESK_1, a, now)
        finally:
            await one.stop()
        # shard 2 publishes b's requests and is killed before it read any answer
        killed = _shard(settings, DESK_2)
        await killed.start()
        await killed._send(requests_for(b2, _hash(DESK_2, b2), now, DESK_2.ledger.public_key))
        await killed.stop()
        outcomes, claims = [], []
        for _ in range(3):  # the restarted shard, then two rebuilds from offset 0
            shard = _shard(settings, DESK_2)
            await shard.start()
            try:
                outcomes.append(await _decide(shard, DESK_2, b2, now))
                claims.append([shard.fold.claims(k) for k in ("GPU-node-a-0", "GPU-node-c-0")])
            finally:
                await shard.stop()
        return outcomes[0], outcomes[1], outcomes[2], claims

    first, second, third, claims = asyncio.run(run())
    assert first == second == third
    assert first.reason == "OVERSOLD" and first.granted == ("GPU-node-c-0",)
    assert claims[0] == claims[1] == claims[2]
    entries = _topic_entries(settings)
    # b's requests were published once by the killed shard; the restarts found them
    assert sum(1 for x in entries if _pid(x) == "pl-b") == 2
    for part in _by_partition(entries, settings):
        for entry, derived in zip(part, derive(part, LEDGER_KEYS), strict=True):
            assert derived.duplicate_of is None, entry


def test_a_request_past_its_deadline_is_late(
    kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=tmp_topic(PARTITIONS))
    now = time.time_ns() // 1_000_000
    arrived = now - MAX_CAPACITY_WAIT_MS - 5_000  # the terms arrived longer ago than the bound
    late = _terms(DESK_1, "pl-late", [("node-l", 1000)], now, now + HOUR)

    async def run() -> CapacityOutcome:
        shard = _shard(settings, DESK_1)
        await shard.start()
        try:
            return await _decide(shard, DESK_1, late, arrived)
        finally:
            await shard.stop()

    got = asyncio.run(run())
    assert got.reason == "CAPACITY_LATE" and not got.granted, got
    key = DESK_1.ledger.public_key
    entries = _topic_entries(settings)
    derived = decisions_for_terms(entries, "pl-late", _hash(DESK_1, late), key, LEDGER_KEYS)
    assert derived["GPU-node-l-0"].reason == "CAPACITY_LATE"


@pytest.mark.parametrize(
    "value", [b"not json", b'{"type":"capreq"}', b'{"payload":"eA==","signatures":[]}x']
)
def test_a_message_that_is_no_capacity_record_is_skipped_and_counted(value: bytes) -> None:
    from ledger.capacity_gate import entry_of

    class Message:
        key = b"GPU-x-0"
        offset = 3
        timestamp = 1

    message = Message()
    message.value = value  # type: ignore[attr-defined]
    assert entry_of(message) is None


# ---- the ledger service: two shards of one ledger --------------------------------------


def _partition_of(pid: str) -> int:
    from aiokafka.partitioner import DefaultPartitioner

    every = list(range(PARTITIONS))
    partition: int = DefaultPartitioner()(pid.encode(), every, every)
    return partition


def _on(partition: int, stem: str) -> str:
    """A placement id whose key lands on ``partition`` of the records topic."""
    return next(f"{stem}-{n}" for n in range(100) if _partition_of(f"{stem}-{n}") == partition)


def _run_shard(
    db: Path, shard: int, topic: str, capacity: str, bootstrap: str, now: int
) -> list[dict[str, Any]]:
    """Run shard ``shard`` of 2 until caught up; its terms_rejected log lines."""

    async def go() -> None:
        store = Store(db, ledger_public_key=DESK_1.ledger.public_key)
        kafka = KafkaConfig(
            settings=KafkaSettings(bootstrap=bootstrap, topic=topic),
            shard=shard,
            shards=PARTITIONS,
            capacity_topic=capacity,
        )
        service = KafkaLedgerService(store, DESK_1.ledger, kafka, clock=fixed_clock(now))
        await service.start()
        try:
            await service.run_until(deadline_s=RUN_DEADLINE_S, idle_poll_ms=100)
        finally:
            await service.stop()
            service.close()

    with capture_logs() as logs:
        asyncio.run(go())
    return [line for line in logs if line.get("event") == "terms_rejected"]


def _decisions(db: Path) -> dict[str, tuple[str, str]]:
    with Store(db) as store:
        rows = store.query("SELECT placement_id, status, reason FROM inputs WHERE kind = 'terms'")
    return {str(p): (str(s), str(r)) for p, s, r in rows}


def test_two_ledger_shards_refuse_the_second_sale_at_admission(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic, capacity = tmp_topic(PARTITIONS), tmp_topic(PARTITIONS)
    now = time.time_ns() // 1_000_000
    start = now + HOUR
    pa, pb, pc, pd, pe = (
        _on(0, "pl-a"),
        _on(1, "pl-b"),
        _on(1, "pl-c"),
        _on(1, "pl-d"),
        _on(0, "pl-e"),
    )
    a = _terms(DESK_1, pa, [("node-a", 1000)], start, start + HOUR)
    b2 = _terms(SECOND_DESK, pb, [("node-a", 1000)], start + HOUR // 2, start + 2 * HOUR)
    c = _terms(SECOND_DESK, pc, [("node-a", 1000)], start + HOUR, start + 2 * HOUR)
    publish(kafka_bootstrap, topic, [(pa, b.signed_terms(DESK_1, a))])
    assert _run_shard(tmp_path / "s0.duckdb", 0, topic, capacity, kafka_bootstrap, now) == []
    # d: node-b free, node-a sold to a: rejected, and node-b's grant released after it
    d = _terms(SECOND_DESK, pd, [("node-b", 1000), ("node-a", 500)], start, start + HOUR)
    e = _terms(DESK_1, pe, [("node-b", 1000)], start, start + HOUR)
    # f: node-c, its signature forged: rejected before any claim is requested
    pf = _on(1, "pl-f")
    f = _terms(SECOND_DESK, pf, [("node-c", 1000)], start, start + HOUR)
    second = [(pb, b2), (pc, c), (pd, d)]
    signed = [(p, b.signed_terms(SECOND_DESK, t)) for p, t in second]
    publish(kafka_bootstrap, topic, [*signed, (pf, resign_badly(b.signed_terms(SECOND_DESK, f)))])
    rejected = _run_shard(tmp_path / "s1.duckdb", 1, topic, capacity, kafka_bootstrap, now)

    publish(kafka_bootstrap, topic, [(pe, b.signed_terms(DESK_1, e))])
    assert _run_shard(tmp_path / "s0.duckdb", 0, topic, capacity, kafka_bootstrap, now) == []
    assert _decisions(tmp_path / "s0.duckdb") == {pa: ("accepted", ""), pe: ("accepted", "")}
    assert _decisions(tmp_path / "s1.duckdb") == {
        pb: ("rejected", "OVERSOLD"),
        pc: ("accepted", ""),
        pd: ("rejected", "OVERSOLD"),
        pf: ("rejected", "SIG_INVALID"),
    }
    assert [line["placement"] for line in rejected] == [pb, pd, pf]
    assert f"GPU GPU-node-a-0 is granted to placement {pa}" in rejected[0]["detail"]

    # shard 1 rebuilt from offset 0 on a fresh store decides the same, naming the same claim
    again = _run_shard(tmp_path / "s1-again.duckdb", 1, topic, capacity, kafka_bootstrap, now)
    assert _decisions(tmp_path / "s1-again.duckdb") == _decisions(tmp_path / "s1.duckdb")
    assert [line["detail"] for line in again] == [line["detail"] for line in rejected]

    # the verifier derives the same from the capacity topic: b denied naming a's grant
    entries = _topic_entries(KafkaSettings(bootstrap=kafka_bootstrap, topic=capacity))
    key, keys = DESK_1.ledger.public_key, [DESK_1.ledger.public_key]
    got_a = decisions_for_terms(entries, pa, _hash(DESK_1, a), key, keys)["GPU-node-a-0"]
    got_b = decisions_for_terms(entries, pb, _hash(SECOND_DESK, b2), key, keys)["GPU-node-a-0"]
    got_c = decisions_for_terms(entries, pc, _hash(SECOND_DESK, c), key, keys)["GPU-node-a-0"]
    assert (got_a.outcome, got_c.outcome) == ("GRANTED", "GRANTED")
    assert (got_b.outcome, got_b.reason, got_b.collided) == ("DENIED", "OVERSOLD", (got_a.offset,))
    assert not any(_pid(x) == pf for x in entries)
    # d's grant on node-b was released, and e granted after it
    got_d = decisions_for_terms(entries, pd, _hash(SECOND_DESK, d), key, keys)
    got_e = decisions_for_terms(entries, pe, _hash(DESK_1, e), key, keys)["GPU-node-b-0"]
    assert got_d["GPU-node-b-0"].outcome == "GRANTED" and got_d["GPU-node-a-0"].outcome == "DENIED"
    assert got_e.outcome == "GRANTED" and got_e.offset > got_d["GPU-node-b-0"].offset


def test_ledger_toml_capacity_topic(tmp_path: Path) -> None:
    base = {"ledger_id": "l", "key_file": "k", "db": "d", "transport": "kafka"}
    kafka = {"bootstrap": "127.0.0.1:9", "topic": "gl.records"}
    config = config_from_mapping({**base, "kafka": {**kafka, "capacity_topic": "gl.cap"}}, tmp_path)
    assert config.kafka is not None and config.kafka.capacity_topic == "gl.cap"
    plain = config_from_mapping({**base, "kafka": kafka}, tmp_path)
    assert plain.kafka is not None and plain.kafka.capacity_topic is None
    for bad in ("gl.records", "", 5):
        with pytest.raises(ConfigError, match="capacity_topic"):
            config_from_mapping({**base, "kafka": {**kafka, "capacity_topic": bad}}, tmp_path)
    keys = [base64.b64encode(k).decode() for k in LEDGER_KEYS]
    pinned = config_from_mapping(
        {**base, "kafka": {**kafka, "capacity_ledger_keys": keys}}, tmp_path
    )
    assert pinned.kafka is not None and pinned.kafka.capacity_ledger_keys == LEDGER_KEYS
    for wrong, named in (("k", "list"), (["!!"], "base64"), ([keys[0][:8]], "32")):
        with pytest.raises(ConfigError, match=named):
            config_from_mapping(
                {**base, "kafka": {**kafka, "capacity_ledger_keys": wrong}}, tmp_path
            )


def _releases(entries: list[CapEntry], pid: str) -> int:
    return sum(
        1 for x in entries if isinstance(open_capacity(x.envelope), CapRelease) and _pid(x) == pid
    )


def test_a_shard_killed_after_a_commit_releases_what_it_owes_at_start(
    tmp_path: Path,
    kafka_bootstrap: str,
    tmp_topic: Callable[..., str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shard 1 commits the batch that rejects d (node-a sold to a; node-b granted to d) and
    is killed before it publishes d's release: node-b stays claimed in the log. Restarted,
    it derives the release from its store's decision and the log's claims and publishes it
    before anything else; e on shard 0 then gets node-b. A third start owes nothing."""
    topic, capacity = tmp_topic(PARTITIONS), tmp_topic(PARTITIONS)
    cap = KafkaSettings(bootstrap=kafka_bootstrap, topic=capacity)
    now = time.time_ns() // 1_000_000
    start = now + HOUR
    pa, pd, pe = _on(0, "pl-a"), _on(1, "pl-d"), _on(0, "pl-e")
    a = _terms(DESK_1, pa, [("node-a", 1000)], start, start + HOUR)
    d = _terms(SECOND_DESK, pd, [("node-b", 1000), ("node-a", 500)], start, start + HOUR)
    e = _terms(DESK_1, pe, [("node-b", 1000)], start, start + HOUR)
    publish(kafka_bootstrap, topic, [(pa, b.signed_terms(DESK_1, a))])
    assert _run_shard(tmp_path / "s0.duckdb", 0, topic, capacity, kafka_bootstrap, now) == []
    publish(kafka_bootstrap, topic, [(pd, b.signed_terms(SECOND_DESK, d))])

    async def killed(*_: object) -> int:
        raise RuntimeError("killed after the commit")

    with monkeypatch.context() as patch:
        patch.setattr("ledger.service.release_owed", killed)
        with pytest.raises(RuntimeError, match="killed after the commit"):
            _run_shard(tmp_path / "s1.duckdb", 1, topic, capacity, kafka_bootstrap, now)
    assert _decisions(tmp_path / "s1.duckdb") == {pd: ("rejected", "OVERSOLD")}  # committed
    assert _releases(_topic_entries(cap), pd) == 0  # and its release never published

    # restarted (no new input for it: only the start can publish d's release)
    _run_shard(tmp_path / "s1.duckdb", 1, topic, capacity, kafka_bootstrap, now)
    entries = _topic_entries(cap)
    assert _releases(entries, pd) == 1
    keys = [DESK_1.ledger.public_key]
    got_d = decisions_for_terms(entries, pd, _hash(SECOND_DESK, d), keys[0], keys)
    assert got_d["GPU-node-b-0"].outcome == "GRANTED"  # granted, then released at start

    publish(kafka_bootstrap, topic, [(pe, b.signed_terms(DESK_1, e))])
    assert _run_shard(tmp_path / "s0.duckdb", 0, topic, capacity, kafka_bootstrap, now) == []
    assert _decisions(tmp_path / "s0.duckdb")[pe] == ("accepted", "")
    # started again: nothing owed, nothing published
    _run_shard(tmp_path / "s1.duckdb", 1, topic, capacity, kafka_bootstrap, now)
    assert _releases(_topic_entries(cap), pd) == 1
