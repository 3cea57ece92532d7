"""Signed scenarios shared by the ledger tests, and the local-transport round trip.

``build_scenario`` makes placements with terms and contiguous usage streams (proto
builders, deterministic keys); the ledger tests publish them to spools or to Kafka.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest

from devtools.builders import Cast, StreamWriter, gpu, make_cast, make_terms, sample, signed_terms
from ledger.service import LedgerService, fixed_clock
from ledger.store import Store
from proto.envelope import open_envelope
from proto.keys import SigningKey, write_key_pair
from proto.records import PlacementTerms, Statement
from transport.local import node_source, publish_local, publisher_source

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW_MS = 3_600_000
INTERVAL_MS = 60_000
GRACE_MS = 300_000
EARLY_CLOCK_MS = T0_MS + WINDOW_MS  # before any close is due
LATE_CLOCK_MS = T0_MS + WINDOW_MS + GRACE_MS + 1  # every placement is due


@dataclass
class Scenario:
    """Signed inputs of several placements, in the order they are published."""

    cast: Cast
    terms: dict[str, PlacementTerms] = field(default_factory=dict)
    # (placement_id, source name for the local transport, envelope), publish order
    inputs: list[tuple[str, str, bytes]] = field(default_factory=list)

    @property
    def placement_ids(self) -> list[str]:
        """Placements in creation order."""
        return list(self.terms)

    def keyed(self) -> list[tuple[str, bytes]]:
        """(placement_id, envelope) pairs for Kafka."""
        return [(pid, env) for pid, _, env in self.inputs]

    def expected_delivered_mgms(self, placement_id: str) -> int:
        """What the usage events of a placement deliver (all allocated, healthy, whole)."""
        count = sum(
            1
            for pid, _, env in self.inputs
            if pid == placement_id and open_envelope(env).kind == "usage"
        )
        return count * INTERVAL_MS * 1000


def build_scenario(
    seed: str, *, placements: int = 3, nodes: int = 2, events: int = 5, start_event: int = 0
) -> Scenario:
    """Terms first, then ``events`` intervals per node, placements interleaved."""
    cast = make_cast(seed)
    scenario = Scenario(cast)
    per_placement: list[list[tuple[str, str, bytes]]] = []
    for i in range(placements):
        pid = f"{seed}-p{i}"
        gpus = [gpu(f"{pid}-n{j}", 0) for j in range(nodes)]
        terms = make_terms(cast, pid, gpus, T0_MS, T0_MS + WINDOW_MS, late_grace_ms=GRACE_MS)
        scenario.terms[pid] = terms
        stream: list[tuple[str, str, bytes]] = [
            (pid, publisher_source("desk"), signed_terms(cast, terms))
        ]
        writers = [(StreamWriter(cast.node_key(g.node_id), pid, g.node_id), g) for g in gpus]
        for e in range(start_event, start_event + events):
            start = T0_MS + e * INTERVAL_MS
            for writer, g in writers:
                envelope = writer.event(start, start + INTERVAL_MS, [sample(g)])
                stream.append((pid, node_source(g.node_id), envelope))
        per_placement.append(stream)
    # Round-robin, so partitions and spools carry many placements mixed together.
    longest = max(len(s) for s in per_placement)
    for k in range(longest):
        for stream in per_placement:
            if k < len(stream):
                scenario.inputs.append(stream[k])
    return scenario


def publish_scenario_local(local_dir: Path, inputs: list[tuple[str, str, bytes]]) -> None:
    """Write inputs into their spools under ``local_dir`` (one spool per source)."""
    by_source: dict[str, list[bytes]] = defaultdict(list)
    for _, source, envelope in inputs:
        by_source[source].append(envelope)
    for source, envelopes in sorted(by_source.items()):
        publish_local(local_dir, source, envelopes)


def ledger_key_file(directory: Path, cast: Cast) -> Path:
    """Write the cast's ledger key to ``directory`` (0600) and return its path."""
    private, _ = write_key_pair(cast.ledger, directory)
    return private


def chain_heads(db: Path | Store) -> dict[str, tuple[int, str]]:
    """placement_id -> (last index, record hash) of a store."""
    if isinstance(db, Store):
        return db.heads()
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT placement_id, max(chain_index), arg_max(record_hash, chain_index) "
            "FROM records GROUP BY 1"
        ).fetchall()
    return {str(p): (int(i), str(h)) for p, i, h in rows}


def final_statements(store: Store) -> dict[str, bytes]:
    """placement_id -> envelope of its final statement."""
    rows = store.query("SELECT placement_id, envelope FROM statements WHERE final")
    return {str(p): bytes(e) for p, e in rows}


def local_service(
    tmp: Path, scenario: Scenario, db_name: str = "ledger.duckdb", clock_ms: int = LATE_CLOCK_MS
) -> LedgerService:
    """A local-transport ledger over ``tmp/spool`` with the scenario's ledger key."""
    store = Store(tmp / db_name, ledger_public_key=scenario.cast.ledger.public_key)
    return LedgerService(
        store,
        scenario.cast.ledger,
        ledger_id="ledger-1",
        local_dir=tmp / "spool",
        clock=fixed_clock(clock_ms),
        batch_max_records=7,
    )


# ---- tests -----------------------------------------------------------------------------


def test_local_round_trip_folds_closes_and_states(tmp_path: Path) -> None:
    scenario = build_scenario("local-rt", placements=3, nodes=2, events=6)
    publish_scenario_local(tmp_path / "spool", scenario.inputs)
    service = local_service(tmp_path, scenario)
    try:
        run = service.run_until_idle()
        assert run.closes_published == 3
        assert sorted(run.closed) == scenario.placement_ids
        heads = service.store.heads()
        # terms + 12 usage + close per placement
        assert {pid: index for pid, (index, _) in heads.items()} == {
            pid: 1 + 12 for pid in scenario.placement_ids
        }
        statements = final_statements(service.store)
        assert sorted(statements) == scenario.placement_ids
        for pid, envelope in statements.items():
            statement = open_envelope(envelope).record
            assert isinstance(statement, Statement)
            assert statement.final
            assert statement.through_index == heads[pid][0]
            assert statement.head == heads[pid][1]
            assert statement.totals.delivered_mgms == scenario.expected_delivered_mgms(pid)
        # A second run finds nothing new: offsets were stored with the records.
        again = service.run_until_idle()
        assert (again.inputs, again.closes_published) == (0, 0)
    finally:
        service.close()


def _final_totals(store: Store) -> dict[str, tuple[int, object]]:
    out: dict[str, tuple[int, object]] = {}
    for pid, envelope in final_statements(store).items():
        statement = open_envelope(envelope).record
        assert isinstance(statement, Statement)
        out[pid] = (statement.through_index, statement.totals)
    return out


def test_local_resume_after_reopen_equals_one_run(tmp_path: Path) -> None:
    # Spools are separate streams: how the inputs of two spools interleave depends on when
    # they were read, so chain order (and heads) may differ from a one-shot run. What must
    # not differ: every input chained once, the same totals, the same chain lengths.
    scenario = build_scenario("local-resume", placements=2, nodes=2, events=4)
    first, second = scenario.inputs[:9], scenario.inputs[9:]
    publish_scenario_local(tmp_path / "spool", first)
    service = local_service(tmp_path, scenario, clock_ms=EARLY_CLOCK_MS)
    service.run_until_idle()
    assert final_statements(service.store) == {}
    service.close()
    publish_scenario_local(tmp_path / "spool", second)
    service = local_service(tmp_path, scenario)
    service.run_until_idle()
    resumed = _final_totals(service.store)
    resumed_inputs = sorted(r[0] for r in service.store.query("SELECT input_hash FROM inputs"))
    service.close()

    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    publish_scenario_local(reference_dir / "spool", scenario.inputs)
    reference = local_service(reference_dir, scenario)
    reference.run_until_idle()
    assert _final_totals(reference.store) == resumed
    assert len(resumed) == 2
    reference_inputs = sorted(r[0] for r in reference.store.query("SELECT input_hash FROM inputs"))
    assert reference_inputs == resumed_inputs
    assert len(set(resumed_inputs)) == len(resumed_inputs)
    reference.close()


def test_ledger_key_file_round_trip(tmp_path: Path) -> None:
    cast = make_cast("keyfile")
    path = ledger_key_file(tmp_path, cast)
    from proto.keys import load_signing_key

    loaded = load_signing_key(path)
    assert isinstance(loaded, SigningKey)
    assert loaded.public_key == cast.ledger.public_key


@pytest.mark.parametrize("placements", [1, 4])
def test_scenario_inputs_are_contiguous(placements: int) -> None:
    scenario = build_scenario("contig", placements=placements, nodes=2, events=3)
    assert len(scenario.inputs) == placements * (1 + 2 * 3)
    for pid in scenario.placement_ids:
        kinds = [open_envelope(e).kind for p, _, e in scenario.inputs if p == pid]
        assert kinds[0] == "terms"
        assert kinds.count("usage") == 6
