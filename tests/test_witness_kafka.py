"""Witnessing end to end on real Kafka (SPEC §8.3): two meters ship through the broker, the
ledger folds and closes, the operator's and the buyer's witnesses cosign through the
ledger's API, and the export verifies FINAL with both cosignatures. A ledger that drops
one event — holding only its own key — is refused by the operator's witness, which names
the node, the seq and the input hash.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from devtools import builders
from gridledger.cli import main as gridledger_main
from ledger.config import KafkaConfig
from ledger.export import export_placement
from ledger.http import LedgerApi, LedgerHttpServer
from ledger.metrics import LedgerMetrics
from ledger.service import KafkaLedgerService, LedgerService
from ledger.store import Store
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.shipper import Shipper, simulated_send_ms
from meter.sim import SimDevice, Simulator, parse_sim_spec
from meter.stream import node_gpus
from proto.delivery import DELIVERY_LOG_FILE, read_delivered
from proto.envelope import sha256_hex
from proto.keys import SigningKey, write_key_pair
from proto.trust import dump_trust
from transport.kafka import SIMULATION_TOPIC_CONFIG, KafkaSettings, create_topic, publish_kafka
from transport.local import publish_local
from witness.known import keep
from witness.runner import EXIT_OK, EXIT_REFUSED, WitnessResult, witness_once

pytestmark = pytest.mark.kafka

MINUTE = 60_000
# A simulation: the agents, the ledger and the witnesses run the window through in seconds
# on one simulated clock, which the broker's does not follow. So the topic keeps the time
# each sender states (CreateTime) and the ledger takes arrival from it (SPEC §6.6
# ``arrival = "sender"``): each shipper states its events' simulated send time, records
# it in its delivery log, and the operator's witness owes before the close what was
# delivered before the deadline by that clock (SPEC §8.3).
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
WINDOW = 20 * MINUTE
GRACE = 2 * MINUTE
PID = "pl-witnessed"
NODES = ("n1", "n2")


def _serve(store: Store, key: SigningKey) -> LedgerHttpServer:
    server = LedgerHttpServer(LedgerApi(store, key, LedgerMetrics()), "127.0.0.1", 0)
    server.start()
    return server


def test_witnesses_cosign_an_honest_run_and_catch_a_dropped_event(
    kafka_bootstrap: str, tmp_topic: Callable[..., str], tmp_path: Path
) -> None:
    topic = tmp_topic(2, create=False)
    create_topic(kafka_bootstrap, topic, 2, config=SIMULATION_TOPIC_CONFIG)
    cast = builders.make_cast("witness-kafka")
    gpus = [builders.gpu("n1", 0), builders.gpu("n2", 0, share_milli=500)]
    terms = builders.make_terms(cast, PID, gpus, T0, T0 + WINDOW, late_grace_ms=GRACE)
    terms_raw = builders.signed_terms(cast, terms)
    keys = tmp_path / "keys"
    for party in (cast.operator, cast.buyer, cast.ledger):
        write_key_pair(party, keys)
    terms_file = tmp_path / "terms.signed.json"
    terms_file.write_bytes(terms_raw)
    buyer_known = tmp_path / "buyer-known"
    buyer_known.mkdir()
    keep(buyer_known, terms_raw, T0, name="terms.signed.json")
    settings = KafkaSettings(bootstrap=kafka_bootstrap, topic=topic)
    clock = SimClock(T0)
    store = Store(tmp_path / "ledger.duckdb", ledger_public_key=cast.ledger.public_key)

    async def run() -> None:
        await publish_kafka(settings, [(PID, terms_raw)], timestamps_ms=[T0])
        agents, shippers = [], []
        for node in NODES:
            devices = [SimDevice(g.uuid, g.model, g.memory_mib) for g in node_gpus(terms, node)]
            config = AgentConfig(node, cast.node_key(node), (terms,), tmp_path / f"spool-{node}")
            agents.append(Agent(config, Simulator(parse_sim_spec("seed=1"), devices, T0), clock))
            shippers.append(
                Shipper(config.spool_dir, settings, now_ms=clock.now_ms, stamp=simulated_send_ms)
            )
        service = KafkaLedgerService(
            store, cast.ledger, KafkaConfig(settings), clock=clock.now_ms, arrival="sender"
        )
        await service.start()
        try:
            for minute in range(0, 24):
                clock.set(T0 + minute * MINUTE)
                for agent, shipper in zip(agents, shippers, strict=True):
                    agent.tick()
                    await shipper.ship_available()
                await service.run_until(deadline_s=60.0)
            await service.run_until(lambda: store.close_index(PID) is not None, deadline_s=60.0)
        finally:
            for agent, shipper in zip(agents, shippers, strict=True):
                await shipper.close()
                agent.close()
            await service.stop()

    asyncio.run(run())
    logs = [tmp_path / f"spool-{n}" / DELIVERY_LOG_FILE for n in NODES]
    delivered = [d for log in logs for d in read_delivered(log)]
    assert len(delivered) == 2 * (WINDOW // MINUTE)

    # Every event is logged delivered at the simulated time its shipper stated.
    assert sorted(d.delivered_at_ms for d in delivered if d.node_id == "n1") == [
        T0 + (m + 1) * MINUTE for m in range(WINDOW // MINUTE)
    ]

    def witnesses(url: str, tag: str) -> tuple[WitnessResult, WitnessResult]:
        now_s = (T0 + 24 * MINUTE) // 1000  # the simulated clock
        operator = witness_once(
            ledger_url=url,
            terms_path=terms_file,
            key_path=keys / f"{cast.operator.name}.key",
            state_dir=tmp_path / f"{tag}-operator",
            delivery_logs=logs,
            now_s=now_s,
        )
        buyer = witness_once(
            ledger_url=url,
            terms_path=terms_file,
            key_path=keys / f"{cast.buyer.name}.key",
            state_dir=tmp_path / f"{tag}-buyer",
            known_dir=buyer_known,
            now_s=now_s,
        )
        return operator, buyer

    server = _serve(store, cast.ledger)
    try:
        operator, buyer = witnesses(server.url, "honest")
    finally:
        server.stop()
    assert operator.code == EXIT_OK and "(closed)" in operator.line, operator.line
    assert buyer.code == EXIT_OK, buyer.line
    export = tmp_path / f"{PID}.duckdb"
    export_placement(store, PID, export, key=cast.ledger)
    inputs = store.query(
        "SELECT envelope FROM inputs WHERE placement_id = ? ORDER BY chain_index", [PID]
    )
    store.close()
    trust = tmp_path / "trust.json"
    trust.write_bytes(dump_trust(cast.trust(simulations=True)))  # arrival = "sender"
    assert gridledger_main(["verify", str(export), "--trust", str(trust)]) == 0

    # A dishonest ledger (its key only) folds everything but n2's seq 7 and closes.
    dropped = next(d for d in delivered if d.node_id == "n2" and d.seq == 7)
    local = tmp_path / "dishonest-local"
    kept = [bytes(e) for (e,) in inputs]
    publish_local(local, "ledger-inputs", [e for e in kept if sha256_hex(e) != dropped.input_hash])
    bad_store = Store(tmp_path / "dishonest.duckdb", ledger_public_key=cast.ledger.public_key)
    service = LedgerService(
        bad_store,
        cast.ledger,
        ledger_id="dishonest",
        local_dir=local,
        clock=lambda: T0 + WINDOW + GRACE + MINUTE,
        close=False,
    )
    try:
        service.run_until_idle()
        assert bad_store.close_index(PID) is not None
        server = _serve(bad_store, cast.ledger)
        try:
            operator, buyer = witnesses(server.url, "dishonest")
        finally:
            server.stop()
    finally:
        service.close()
    assert operator.code == EXIT_REFUSED, operator.line
    assert "W_MISSING" in operator.line
    assert f"node n2 seq 7 input {dropped.input_hash}" in operator.line
    assert buyer.code == EXIT_OK  # the buyer knows of no usage: it cannot tell
    refusals = list((tmp_path / "dishonest-operator" / "refusals").glob("*.json"))
    assert len(refusals) == 1
