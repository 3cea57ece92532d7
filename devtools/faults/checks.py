"""The invariants: after every cycle, and at the end of a run.

A *cycle* is one injected fault, its recovery and a check: after a meter kill the spool
must hold a byte-exact, contiguous run of what the fault-free agent signs and the
acknowledged position must not move back; after a ledger kill every chain in the store
must be whole (indices 0..n-1, prev links, record hashes, sources matching the chained
inputs), no input chained twice, and every decision equal to the fault-free run's; after
an outage every agent must ship again. At the end of a run (``compare_final``):

(a) every event that reached a spool (all spool contents seen across the run) is one the
    fault-free agent signs, and every one of those is chained exactly once in the store,
    accepted or rejected with the same reason as in the fault-free run; per placement,
    messages in the topic = chained inputs + dropped duplicates (nothing lost, nothing
    counted twice, nothing quarantined);
(b) chain heads, final statements and dropped counts equal those of a fault-free ledger
    over the same stream, and decisions and final totals equal those of the fault-free
    run of the seed (``reference.py`` says why this comparison is sound);
(c) ``verify`` accepts the export of every placement (exit 0; ``runner.py`` runs it, and
    the operator's and buyer's witnesses, after ``compare_final``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

from devtools.faults.reference import LedgerState, Reference, read_ledger_state
from devtools.faults.scenario import Scenario
from devtools.faults.topic import TopicMessage
from ledger.store import Store
from proto.envelope import open_envelope, sha256_hex
from proto.errors import ProtoError
from proto.records import LedgerRecord, UsageEvent
from transport.spool import SpoolError, read_spool

__all__ = [
    "check_spool",
    "check_store",
    "compare_final",
]


def check_store(db: Path, reference: Reference) -> tuple[list[str], LedgerState | None]:
    """Problems of a stopped ledger's store (whole chains, inputs once, decisions as in
    the fault-free run), and its state. Used after every ledger kill and at the end."""
    problems: list[str] = []
    if not db.exists():
        return problems, None
    try:
        with Store(db) as store:
            records = store.query(
                "SELECT placement_id, chain_index, envelope, record_hash FROM records "
                "ORDER BY placement_id, chain_index"
            )
            inputs = {
                (str(p), int(i)): (str(h), str(k), str(s), str(r))
                for p, i, h, k, s, r in store.query(
                    "SELECT placement_id, chain_index, input_hash, kind, status, reason FROM inputs"
                )
            }
            input_rows = int(store.query("SELECT count(*) FROM inputs")[0][0])
    except Exception as exc:  # a store a kill -9 made unreadable is the finding itself
        return [f"the store cannot be read: {type(exc).__name__}: {exc}"], None
    if input_rows != len(inputs):
        problems.append(f"{input_rows} input rows for {len(inputs)} (placement, index) pairs")
    expected_index: dict[str, int] = defaultdict(int)
    previous: dict[str, str] = {}
    for placement_id, index, envelope, record_hash in records:
        pid = str(placement_id)
        where = f"{pid}[{index}]"
        if index != expected_index[pid]:
            problems.append(f"{where}: index {index}, expected {expected_index[pid]}")
        expected_index[pid] = int(index) + 1
        try:
            opened = open_envelope(bytes(envelope))
        except ProtoError as exc:
            problems.append(f"{where}: record does not open: {exc}")
            continue
        record = opened.record
        if not isinstance(record, LedgerRecord):
            problems.append(f"{where}: a {opened.kind} in the records table")
            continue
        if opened.record_hash != record_hash:
            problems.append(f"{where}: record_hash column differs from the payload's hash")
        if record.prev != previous.get(pid, "0" * 64):
            problems.append(f"{where}: prev does not link to the previous record")
        previous[pid] = opened.record_hash
        chained = inputs.get((pid, int(index)))
        if chained is None:
            problems.append(f"{where}: no chained input")
            continue
        input_hash, kind, status, reason = chained
        if (record.source, record.kind, record.status, record.reason) != (
            input_hash,
            kind,
            status,
            reason,
        ):
            problems.append(f"{where}: record and input row disagree")
        expected = reference.ledger.decisions.get(f"{pid}/{input_hash}")
        if expected is None:
            problems.append(
                f"{where}: chained input {input_hash[:16]} the fault-free run never saw"
            )
        elif (expected.kind, expected.status, expected.reason) != (kind, status, reason):
            problems.append(
                f"{where}: {kind} {input_hash[:16]} {status} {reason or '-'}; the fault-free "
                f"run: {expected.status} {expected.reason or '-'}"
            )
    seen: Counter[str] = Counter(f"{pid}/{h}" for (pid, _), (h, *_r) in inputs.items())
    problems.extend(f"input {key} chained {n} times" for key, n in seen.items() if n > 1)
    if len(inputs) != sum(expected_index.values()):
        problems.append(f"{len(inputs)} chained inputs for {sum(expected_index.values())} records")
    if problems:
        return problems, None
    return problems, read_ledger_state(db)


def check_spool(
    spool_dir: Path, node_id: str, reference: Reference
) -> tuple[list[str], list[bytes]]:
    """Problems of a stopped agent's spool (only events the fault-free agent signs, each
    stream a contiguous run), and the envelopes it holds."""
    problems: list[str] = []
    try:
        held = [e.data for e in read_spool(spool_dir)] if spool_dir.exists() else []
    except SpoolError as exc:
        return [f"spool of {node_id} cannot be read: {exc}"], []
    signed = reference.nodes[node_id]
    known = set(signed.envelopes)
    last_seq: dict[tuple[str, str], int] = {}
    for data in held:
        if data not in known:
            problems.append(
                f"spool of {node_id} holds {sha256_hex(data)[:16]}, which the fault-free agent "
                "never signs (re-signed or damaged event)"
            )
            continue
        event = open_envelope(data).record
        assert isinstance(event, UsageEvent)
        stream = (event.placement_id, event.node_id)
        if stream in last_seq and event.seq != last_seq[stream] + 1:
            problems.append(
                f"spool of {node_id}: {stream} seq {event.seq} after {last_seq[stream]}"
            )
        last_seq[stream] = event.seq
    return problems, held


def compare_final(
    scenario: Scenario,
    reference: Reference,
    faulty: LedgerState,
    same_stream: LedgerState,
    messages: Sequence[TopicMessage],
    observed: set[bytes],
) -> list[str]:
    """The end-of-run invariants (a) and (b) of the module docstring, as problems."""
    problems: list[str] = []
    canonical = reference.ledger
    signed = reference.events()
    # (a) every spooled event is one the fault-free agent signs ...
    for data in observed:
        if data not in signed:
            problems.append(f"a spooled event {sha256_hex(data)[:16]} no fault-free agent signs")
    # ... and every one of those is chained exactly once, decided as without faults.
    for data, node in signed.items():
        event = open_envelope(data).record
        assert isinstance(event, UsageEvent)
        key = f"{event.placement_id}/{sha256_hex(data)}"
        if faulty.chained[key] != 1:
            problems.append(
                f"usage {event.placement_id}/{node} seq {event.seq} chained "
                f"{faulty.chained[key]} times"
            )
    more = sorted(set(faulty.decisions) - set(canonical.decisions))
    fewer = sorted(set(canonical.decisions) - set(faulty.decisions))
    problems.extend(f"chained, but not by the fault-free run: {k}" for k in more[:10])
    problems.extend(f"chained by the fault-free run only: {k}" for k in fewer[:10])
    for key in sorted(set(faulty.decisions) & set(canonical.decisions)):
        if faulty.decisions[key] != canonical.decisions[key]:
            problems.append(
                f"decision on {key}: {faulty.decisions[key]} vs {canonical.decisions[key]}"
            )
    problems.extend(f"input {k} chained {n} times" for k, n in faulty.chained.items() if n > 1)
    if faulty.quarantined:
        problems.append(f"{faulty.quarantined} inputs quarantined (none are malformed)")
    per_placement: Counter[str] = Counter(m.key.decode() for m in messages if m.key is not None)
    chained_per: Counter[str] = Counter(d.placement_id for d in faulty.decisions.values())
    for placement_id in scenario.placement_ids:
        accounted = chained_per[placement_id] + faulty.dropped.get(placement_id, 0)
        if per_placement[placement_id] != accounted:
            problems.append(
                f"{placement_id}: {per_placement[placement_id]} messages in the topic, "
                f"{chained_per[placement_id]} chained + "
                f"{faulty.dropped.get(placement_id, 0)} dropped"
            )
    # (b) the same stream folded without faults: byte-identical results.
    if faulty.heads != same_stream.heads:
        problems.append(f"heads {faulty.heads} != same-stream heads {same_stream.heads}")
    if faulty.final_statements != same_stream.final_statements:
        problems.append("final statements differ from the same-stream fold")
    if faulty.dropped != same_stream.dropped:
        problems.append(f"dropped {faulty.dropped} != same-stream dropped {same_stream.dropped}")
    # (b) the fault-free run of the seed: totals for all, bytes for one-source placements.
    for placement_id in scenario.placement_ids:
        got, want = faulty.final_totals.get(placement_id), canonical.final_totals.get(placement_id)
        if got != want:
            problems.append(f"{placement_id}: final (index, totals) {got} != fault-free {want}")
        got_len = faulty.heads.get(placement_id, (-1, ""))[0]
        want_len = canonical.heads.get(placement_id, (-1, ""))[0]
        if got_len != want_len:
            problems.append(f"{placement_id}: head index {got_len} != fault-free {want_len}")
        if scenario.single_source(placement_id):
            if faulty.heads.get(placement_id) != canonical.heads.get(placement_id):
                problems.append(f"{placement_id}: head differs from the fault-free run")
            if faulty.final_statements.get(placement_id) != canonical.final_statements.get(
                placement_id
            ):
                problems.append(f"{placement_id}: final statement differs from the fault-free run")
    return problems
