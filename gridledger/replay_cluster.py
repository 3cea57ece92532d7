"""The replayed cluster's node agents: the real ``meter.agent.Agent``, one per node.

Choice: the replay drives the meter's own Agent (spool-first, fsync per tick, heads
recovered from the spool on restart) with the deterministic ``meter.sim.Simulator`` as
its GPU source and one shared ``meter.clock.SimClock``, rather than a lean generator of
its own. Measured on this machine the Agent emits ~6,000 events/s on one core with
placements whose intervals do not line up (the simulator draws readings per interval),
so the ~3.2M events of the whole OpenB trace take ~9 minutes: slower than a bare
generator, but every event of the replay is then exactly what a production agent would
sign, and the replay exercises the meter as well as the ledger. Events are streamed to
the transport step by step, never held for the whole trace.

Interval rule (``meter.stream.due_intervals``): each (node, placement) stream emits
[window_start + k x interval, min(window_start + (k + 1) x interval, window_end)) for
k = 0, 1, ...: the intervals tile the window exactly, the last one clipped at the
window end. With every GPU healthy and allocated (the trace records no failures) a
placement delivers share x (window_end - window_start) exactly, with no rounding.

Agents are created with the clock at the replay's start, so every stream starts at its
window start. A restarted replay creates them the same way: each agent recovers its
heads from its spool and continues after the last durable event (never a gap, never a
second copy).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gridledger.placement_plan import Placement, Plan
from gridledger.replay_limits import MAX_AGENT_TICKS_PER_STEP, SEND_WINDOW_RECORDS
from gridledger.replay_terms import PriceTable, ReplayCast
from meter.agent import Agent, AgentConfig
from meter.clock import SimClock
from meter.shipper import Shipper, simulated_send_ms
from meter.sim import SimDevice, Simulator, parse_sim_spec
from proto.records import PlacementTerms
from transport.kafka import KafkaSettings
from transport.positions import SpoolPosition

__all__ = ["NodeAgent", "ReplayCluster"]


@dataclass
class NodeAgent:
    """One node's agent, the windows of its placements, and its spool directory."""

    node_id: str
    agent: Agent
    spool_dir: Path
    windows: tuple[tuple[int, int], ...]

    def active(self, after_ms: int, until_ms: int) -> bool:
        """Whether any window has an interval ending in (after_ms, until_ms]."""
        return any(start < until_ms and end > after_ms for start, end in self.windows)

    @property
    def end_position(self) -> SpoolPosition:
        """Where the next spooled event will go."""
        return self.agent.spool.end_position()


class ReplayCluster:
    """Every node agent of a plan, on one simulated clock (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        terms: dict[str, PlacementTerms],
        cast: ReplayCast,
        prices: PriceTable,
        spool_root: Path,
        *,
        interval_ms: int,
        start_ms: int,
        sim_seed: int = 0,
        collect_read: bool = False,
    ) -> None:
        self.clock = SimClock(start_ms)
        self.agents: list[NodeAgent] = []
        by_node: dict[str, list[Placement]] = {}
        for placement in plan.placements:
            by_node.setdefault(placement.node_id, []).append(placement)
        spec = parse_sim_spec(f"seed={sim_seed}")
        try:
            for node in plan.nodes:
                placements = by_node.get(node.sn)
                if not placements:
                    continue
                memory_mib = prices.price(node.model).memory_mib
                devices = [
                    SimDevice(f"GPU-{node.sn}-{i}", node.model, memory_mib)
                    for i in range(node.gpus)
                ]
                spool_dir = spool_root / f"node-{node.sn}"
                config = AgentConfig(
                    node_id=node.sn,
                    signing_key=cast.node_key(node.sn),
                    terms=tuple(terms[p.placement_id] for p in placements),
                    spool_dir=spool_dir,
                    interval_ms=interval_ms,
                    collect_read=collect_read,
                )
                agent = Agent(
                    config, Simulator(spec, devices, start_ms, node_id=node.sn), self.clock
                )
                self.agents.append(
                    NodeAgent(
                        node.sn,
                        agent,
                        spool_dir,
                        tuple((p.window_start_ms, p.window_end_ms) for p in placements),
                    )
                )
        except BaseException:
            self.close()
            raise

    def tick_to(self, after_ms: int, until_ms: int) -> Iterator[tuple[NodeAgent, list[bytes]]]:
        """Move the clock to ``until_ms`` and tick every agent with intervals due since
        ``after_ms`` until it has nothing left; yield each tick's (durable) envelopes."""
        self.clock.set(until_ms)
        for node in self.agents:
            if not node.active(after_ms, until_ms):
                continue
            for _ in range(MAX_AGENT_TICKS_PER_STEP):
                envelopes = node.agent.tick()
                if not envelopes:
                    break
                yield node, envelopes
            else:
                raise RuntimeError(
                    f"agent of {node.node_id} still had events after "
                    f"{MAX_AGENT_TICKS_PER_STEP} ticks at {until_ms}"
                )

    def nodes(self) -> Sequence[NodeAgent]:
        """The node agents, in node-list order."""
        return tuple(self.agents)

    def shippers(self, settings: KafkaSettings, producer: Any) -> dict[str, Shipper]:
        """One meter Shipper per node spool, all on ``producer``, stamping each record with
        the simulated time it is sent at (``simulated_send_ms``), taking the events its
        agent spooled from the agent (``Agent.hand_off``) rather than opening them again.
        Each starts from its spool's acknowledged position: events spooled by an earlier
        run but never acknowledged are sent again first."""
        return {
            node.node_id: Shipper(
                node.spool_dir,
                settings,
                producer=producer,
                collect_garbage=node.agent.collect_garbage,
                now_ms=self.clock.now_ms,
                batch_max_records=SEND_WINDOW_RECORDS,
                stamp=simulated_send_ms,
                handed_off=node.agent.hand_off(),
            )
            for node in self.nodes()
        }

    def close(self) -> None:
        """Release every spool."""
        for node in self.agents:
            node.agent.close()
