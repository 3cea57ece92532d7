"""The Kafka service's pipeline (issue 15): batch N+1 opened and its signatures checked in
a worker process while batch N folds and commits.

* A pre-check is made with the key known when its batch is opened (bound, or named by
  terms or a key binding of this batch or of the batch before it, not folded yet);
  ``decide`` uses it only when that key is the one bound to the node when it folds the
  input, and verifies inline otherwise. Pipelined batches decide exactly what one input
  at a time decides, also across a key binding, a rejected binding and a revocation in
  batch N with the events they concern in batch N+1.
* A dead or stopped worker is a named error (``CryptoWorkerError``) within its bounds,
  the Ingestor refuses further batches, and nothing of the failed batch is stored.
* Through real Kafka: a batch polled ahead is never committed with the one before it
  (offsets move with records only); a service stopped with a batch ahead resumes from
  the store's offsets and reaches the heads of an uninterrupted run.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support import ledger_toml
from test_ledger_kafka import resign_badly
from test_ledger_scenario import ledger_key_file

from devtools import builders
from devtools.builders import StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from ledger import crypto
from ledger.config import ConfigError, KafkaConfig, load_config
from ledger.crypto import CryptoWorker, CryptoWorkerError
from ledger.fold import Fold, Outcome
from ledger.ingest import IngestBroken, Ingestor
from ledger.inputs import Item
from ledger.rules import CheckedSignature, decide
from ledger.service import KafkaLedgerService, fixed_clock
from ledger.store import Store
from proto.envelope import open_envelope
from proto.keys import SigningKey
from transport.kafka import KafkaSettings, publish_kafka

PID = "pipe-1"
T0 = 1_767_225_600_000
MIN = 60_000
HOUR = 60 * MIN
NEW_KEY = SigningKey.from_seed_text("pipe-new", "pipeline/new-node-key")
ROGUE = SigningKey.from_seed_text("pipe-rogue", "pipeline/rogue-node-key")


def _two_batches() -> tuple[builders.Cast, list[bytes], list[bytes]]:
    """Batch N: terms, events, a key rotation of n1 (accepted), a binding of n1 signed by
    the operator alone (introduces a key: rejected), a revocation of n2's key. Batch N+1:
    events of n1 by the new key (one badly signed), by the rogue key, of n2 by its
    revoked key, and of n1 by its old key (still bound)."""
    cast = make_cast("pipeline")
    g1, g2 = gpu("n1", 0), gpu("n2", 0)
    terms = make_terms(cast, PID, [g1, g2], T0, T0 + HOUR)
    n1 = StreamWriter(cast.node_key("n1"), PID, "n1")
    n2 = StreamWriter(cast.node_key("n2"), PID, "n2")
    first = [signed_terms(cast, terms)]
    for i in range(3):
        first.append(n1.event(T0 + i * MIN, T0 + (i + 1) * MIN, [sample(g1)]))
        first.append(n2.event(T0 + i * MIN, T0 + (i + 1) * MIN, [sample(g2)]))
    first.append(builders.key_binding(cast, PID, "n1", NEW_KEY, T0, T0 + HOUR, T0))
    first.append(
        builders.key_binding(cast, PID, "n1", ROGUE, T0, T0 + HOUR, T0, signers=[cast.operator])
    )
    first.append(
        builders.key_binding(
            cast, PID, "n2", cast.node_key("n2"), 0, T0 + 3 * MIN, T0, signers=[cast.operator]
        )
    )
    second = []
    n1.key = NEW_KEY
    second.append(n1.event(T0 + 3 * MIN, T0 + 4 * MIN, [sample(g1)]))
    second.append(n1.event(T0 + 4 * MIN, T0 + 5 * MIN, [sample(g1)]))
    # At n1's next seq: a bad signature by the new key, one by the rogue key (both
    # rejected before the stream position), then the old key's event (accepted there).
    bad = StreamWriter(NEW_KEY, PID, "n1", seq=n1.seq, prev=n1.prev)
    second.append(resign_badly(bad.event(T0 + 5 * MIN, T0 + 6 * MIN, [sample(g1)])))
    rogue = StreamWriter(ROGUE, PID, "n1", seq=n1.seq, prev=n1.prev)
    second.append(rogue.event(T0 + 5 * MIN, T0 + 6 * MIN, [sample(g1)]))
    second.append(n2.event(T0 + 3 * MIN, T0 + 4 * MIN, [sample(g2)]))
    n1.key = cast.node_key("n1")
    second.append(n1.event(T0 + 5 * MIN, T0 + 6 * MIN, [sample(g1)]))
    return cast, first, second


def _items(raws: list[bytes], start: int) -> list[tuple[bytes, str, str | None, int | None]]:
    return [(raw, f"p:{start + i}", None, None) for i, raw in enumerate(raws)]


def test_pipelined_batches_equal_one_by_one() -> None:
    cast, first, second = _two_batches()
    one = Fold(cast.ledger)
    expected: list[Outcome] = [
        o for i, raw in enumerate(first + second) for o in one.apply(raw, f"p:{i}", None)
    ]
    reasons = [(o.kind, o.status, o.reason.value if o.reason else None) for o in expected]
    # The case is the one the brief names: each of these depends on batch N's bindings.
    assert reasons[-6:] == [
        ("usage", "accepted", None),
        ("usage", "accepted", None),
        ("usage", "rejected", "SIG_INVALID"),
        ("usage", "rejected", "NODE_KEY_UNKNOWN"),
        ("usage", "rejected", "NODE_KEY_REVOKED"),
        ("usage", "accepted", None),
    ]
    worker = CryptoWorker()
    try:
        piped = Fold(cast.ledger)
        items_n, items_n1 = _items(first, 0), _items(second, len(first))
        # Batch N+1 is opened (its checks sent) before batch N is folded.
        opening_n = piped.open_batch(items_n, worker)
        opening_n1 = piped.open_batch(items_n1, worker, ahead_of=[opening_n])
        got = piped.apply_batch(items_n, opening=opening_n)
        got += piped.apply_batch(items_n1, opening=opening_n1)
    finally:
        worker.close()
    assert got == expected
    assert piped.head(PID) == one.head(PID)
    # The new key's events were checked ahead with the key bound in batch N (a guess the
    # fold confirmed), the rogue's with the rogue key (never bound: not used).
    checked = [c.result().public_key if c is not None else None for c in opening_n1.checks]
    assert checked[:4] == [NEW_KEY.public_key] * 3 + [ROGUE.public_key]


def test_decide_uses_a_pre_check_only_when_made_with_the_key_bound_now() -> None:
    cast, first, second = _two_batches()
    fold = Fold(cast.ledger)
    for i, raw in enumerate(first + second[:2]):  # the new key bound, n1 at seq 5
        fold.apply(raw, f"p:{i}", None)
    state = fold.state(PID)
    assert state is not None
    bad = open_envelope(second[2])  # signed with a flipped bit by NEW_KEY, now bound

    def verdict(checked: CheckedSignature | None) -> tuple[str | None, str | None]:
        v, _ = decide(state, bad, "p:x", ledger_key=cast.ledger.public_key, checked=checked)
        return v.status, v.reason.value if v.reason else None

    # Made with another key: ignored, verified inline.
    assert verdict(CheckedSignature(ROGUE.public_key, True)) == ("rejected", "SIG_INVALID")
    assert verdict(None) == ("rejected", "SIG_INVALID")
    # Made with the key bound now: used as it is (which is why it must be right).
    assert verdict(CheckedSignature(NEW_KEY.public_key, True)) == ("accepted", None)


def _kafka_items(raws: list[bytes], start: int) -> list[Item]:
    return [
        Item(
            data=raw,
            position=f"kafka:t:0:{start + i}",
            stream_key=PID,
            source="kafka:t:0",
            next_position=str(start + i + 1),
        )
        for i, raw in enumerate(raws)
    ]


def test_a_dead_worker_is_a_named_error_not_a_hang(tmp_path: Path) -> None:
    cast, first, second = _two_batches()
    with Store(tmp_path / "l.duckdb", ledger_public_key=cast.ledger.public_key) as store:
        heads: dict[str, tuple[int, str]] = {}
        ingestor = Ingestor(store, cast.ledger, crypto_worker=True)
        worker = ingestor.crypto_worker
        assert worker is not None
        try:
            ingestor.ingest(_kafka_items(first, 0))
            heads = store.heads()
            os.kill(worker.pid(), signal.SIGKILL)
            # Once the worker's death is seen (a chunk queued before it would be checked
            # by the fold itself, correctly, and the death found at the next batch): a
            # chunk sent to it fails, named, at the end of its output.
            opened = open_envelope(first[1])
            job = (
                cast.node_key("n1").public_key,
                opened.payload,
                opened.envelope.signatures[0].sig,
            )
            with pytest.raises(CryptoWorkerError, match="died"):
                worker.submit([job]).result(timeout=30)
            items = _kafka_items(second, len(first))
            with pytest.raises(CryptoWorkerError, match="worker process is gone"):
                ingestor.prepare(items)  # nothing folded yet: the Ingestor is intact
            with pytest.raises(CryptoWorkerError, match="worker process is gone"):
                ingestor.ingest(items)
            with pytest.raises(IngestBroken):
                ingestor.ingest(items)
        finally:
            ingestor.close()
        # Batch N is stored, nothing of the failed batch N+1.
        assert store.offsets() == {"kafka:t:0": str(len(first))}
        assert store.heads() == heads


def test_a_stopped_worker_times_out_and_is_killed_on_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cast, first, _ = _two_batches()
    worker = CryptoWorker()
    pid = worker.pid()  # started and ready (a loaded machine may take over 0.5 s for that)
    monkeypatch.setattr(crypto, "CRYPTO_WAIT_S", 0.5)
    monkeypatch.setattr(crypto, "CRYPTO_STOP_S", 0.5)
    os.kill(pid, signal.SIGSTOP)
    try:
        opened = open_envelope(first[1])
        job = (cast.node_key("n1").public_key, opened.payload, opened.envelope.signatures[0].sig)
        # A chunk the worker has (its future running) is waited for, never taken back;
        # a stopped worker never answers: the named error after CRYPTO_WAIT_S.
        chunk = crypto._Chunk(worker.submit([job]), [job])
        for _ in range(1000):  # bounded: the pool hands the chunk to its process at once
            if chunk._future.running():
                break
            threading.Event().wait(0.01)
        assert chunk._future.running()
        with pytest.raises(CryptoWorkerError, match=r"did not finish within 0\.5 s"):
            chunk.results()
    finally:
        worker.close()  # kills the stopped process after CRYPTO_STOP_S
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _publish(bootstrap: str, topic: str, raws: list[bytes]) -> None:
    asyncio.run(
        publish_kafka(KafkaSettings(bootstrap=bootstrap, topic=topic), [(PID, r) for r in raws])
    )


def _stream(events: int) -> tuple[builders.Cast, list[bytes]]:
    cast = make_cast("pipeline-kafka")
    g1 = gpu("n1", 0)
    terms = make_terms(cast, PID, [g1], T0, T0 + (events + 1) * MIN)
    writer = StreamWriter(cast.node_key("n1"), PID, "n1")
    raws = [signed_terms(cast, terms)]
    raws += [writer.event(T0 + i * MIN, T0 + (i + 1) * MIN, [sample(g1)]) for i in range(events)]
    return cast, raws


def test_kafka_pipeline_commits_offsets_only_with_records(
    tmp_path: Path, kafka_bootstrap: str, tmp_topic: Callable[..., str]
) -> None:
    topic = tmp_topic(1)
    cast, raws = _stream(120)
    _publish(kafka_bootstrap, topic, raws)
    batch = 25

    def service(db: Path) -> KafkaLedgerService:
        store = Store(db, ledger_public_key=cast.ledger.public_key)
        kafka = KafkaConfig(settings=KafkaSettings(bootstrap=kafka_bootstrap, topic=topic))
        return KafkaLedgerService(
            store, cast.ledger, kafka, clock=fixed_clock(T0), batch_max_records=batch
        )

    async def first_steps(db: Path) -> tuple[int, dict[str, str], int]:
        svc = service(db)
        await svc.start()
        try:
            assert svc.ingestor.crypto_worker is not None  # pytest's process is no daemon
            folded = 0
            for _ in range(20):  # bounded: the first batch, with the next one polled ahead
                report = await svc.step(1000)
                folded += 0 if report is None else report.inputs
                if folded and svc.pending_ahead():
                    break
            assert svc.pending_ahead() > 0
            return folded, svc.store.offsets(), svc.store.heads()[PID][0]
        finally:
            await svc.stop()
            svc.close()

    async def to_the_end(db: Path) -> dict[str, tuple[int, str]]:
        svc = service(db)
        await svc.start()
        try:
            await svc.run_until(deadline_s=60.0, idle_poll_ms=100)
            return svc.store.heads()
        finally:
            await svc.stop()
            svc.close()

    db = tmp_path / "stopped.duckdb"
    folded, offsets, records = asyncio.run(first_steps(db))
    # Only what was folded is stored, offsets with it; the batch ahead is not.
    assert 0 < folded < len(raws)
    assert offsets == {f"kafka:{topic}:0": str(folded)}
    assert records == folded - 1  # the head's index: one record per input folded
    resumed = asyncio.run(to_the_end(db))
    reference = asyncio.run(to_the_end(tmp_path / "reference.duckdb"))
    assert resumed == reference
    assert reference[PID][0] == len(raws) - 1


def test_the_fold_checks_the_chunks_a_busy_worker_has_not_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cast, first, second = _two_batches()
    one = Fold(cast.ledger)
    expected = [o for i, raw in enumerate(first + second) for o in one.apply(raw, f"p:{i}", None)]
    monkeypatch.setattr(crypto, "CRYPTO_CHUNK", 2)  # several chunks per batch
    monkeypatch.setattr(crypto, "CRYPTO_WAIT_S", 5.0)  # a wait would fail, not hang
    release = threading.Event()
    with ThreadPoolExecutor(1) as busy:
        # The pool's one thread is taken until the fold is done: no chunk starts there.
        blocker = busy.submit(release.wait, 30.0)
        try:
            fold = Fold(cast.ledger)
            items = _items(first + second, 0)
            opening = fold.open_batch(items, busy)
            got = fold.apply_batch(items, opening=opening)
            assert not blocker.done()
        finally:
            release.set()
    assert got == expected
    taken = [c._chunk._future for c in opening.checks if c is not None]
    assert len(taken) > 2 and all(f.cancelled() for f in taken)


def test_ctrl_c_reaches_the_ledger_not_its_worker() -> None:
    """Ctrl-C goes to the whole process group; the ledger stops its worker itself."""
    cast, first, _ = _two_batches()
    worker = CryptoWorker()
    try:
        os.kill(worker.pid(), signal.SIGINT)
        fold = Fold(cast.ledger)
        outcomes = fold.apply_batch(_items(first, 0), worker)
        assert [o.status for o in outcomes][:7] == ["accepted"] * 7
        # Still the same process, alive and answering.
        assert worker.submit([]).result(timeout=30) == []
    finally:
        worker.close()


def test_ledger_toml_chooses_the_worker_or_threads(tmp_path: Path) -> None:
    """``crypto_worker`` in ledger.toml (default true) is what ``ledger run`` builds the
    Kafka service with; anything but a boolean is refused, naming the key."""
    cast = make_cast("pipeline-config")
    key_file = ledger_key_file(tmp_path, cast)
    kafka = {"bootstrap": "127.0.0.1:9", "topic": "never-connected"}  # not started here

    def toml(name: str, **top: object) -> Path:
        return ledger_toml(
            tmp_path / f"{name}.toml",
            key_file,
            db=f"{name}.duckdb",
            transport="kafka",
            kafka=kafka,
            http="off",
            **top,
        )

    assert load_config(toml("default")).crypto_worker is True
    for name, chosen in (("worker", True), ("threads", False)):
        config = load_config(toml(name, crypto_worker=chosen))
        assert config.crypto_worker is chosen
        service = KafkaLedgerService.from_config(config)
        try:
            assert (service.ingestor.crypto_worker is not None) is chosen
        finally:
            service.close()
    with pytest.raises(ConfigError, match="crypto_worker must be true or false"):
        load_config(toml("bad", crypto_worker="yes"))
