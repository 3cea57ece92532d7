"""What a seed describes (pure, seeded): placements, terms, nodes and their agents' runs.

For a seed, ``generate_scenario`` draws a small scenario (1-3 placements on 1-3 nodes,
terms within the SPEC bounds, GPUs unhealthy or vanishing for a while, maybe a reclaim,
a key rotation by NodeKeyBinding, adjustments, a clock-skewed node whose last intervals
arrive after the close, late records after the close, terms that arrive mid-stream so
inputs are held). ``write_node_configs`` writes each node's keys, terms and meter.toml.

Determinism: the scenario, the keys (``devtools.builders`` seed text) and the readings
come from ``random.Random`` seeded by the seed.

Time (SPEC §6.6): the runs are simulations on a compressed clock, so their ledgers take
each input's arrival from the time its sender states (``arrival = "sender"``, a
``CreateTime`` topic). The senders state simulated times fixed by the scenario, the same
on both transports and for every re-send: records published before the agents start
(``pre``, the terms arriving mid-stream too) at ``early_clock_ms``; those after the usage
(``post``) at ``post_clock_ms``; those after the close (``late``) at ``late_clock_ms``; a
usage event when its interval ended (``meter.shipper.simulated_send_ms``: its end, plus
the clock skew of a node whose clock runs behind); the ledger's closes at their
``closed_at_ms``.
"""

from __future__ import annotations

import random
import tomllib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import tomli_w

from devtools import builders
from proto.keys import SigningKey, write_key_pair
from proto.limits import MAX_SAFE_INTEGER
from proto.records import GpuSpec, PlacementTerms
from proto.terms import CURRENCY_MINOR_UNITS, validate_terms

__all__ = [
    "BASE_MS",
    "INTERVAL_MS",
    "MAX_NODES",
    "MAX_PLACEMENTS",
    "NodePlan",
    "Phase",
    "Scenario",
    "Segment",
    "generate_scenario",
    "rotated_key",
    "write_node_configs",
]

INTERVAL_MS: Final = 60_000
"""Usage interval of every simulated agent: one event per stream per simulated minute."""

BASE_MS: Final = 1_767_225_600_000
"""2026-01-01T00:00:00Z: windows start within a day after it."""

MAX_PLACEMENTS: Final = 3
"""Placements per scenario (at least one)."""

MAX_NODES: Final = 3
"""Nodes per scenario (at least one)."""

Phase = Literal["early", "late"]


# ---- the scenario (pure, seeded) ------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One run of a node's agent: signing with ``key`` up to ``until_ms``, in ``phase``."""

    key: Literal["k0", "k1"]
    until_ms: int
    phase: Phase


@dataclass(frozen=True)
class NodePlan:
    """What one node's agent does: its simulator spec and its runs in order."""

    node_id: str
    sim_spec: str
    segments: tuple[Segment, ...]
    rotation_ms: int | None
    skew_ms: int


@dataclass(frozen=True)
class Scenario:
    """Everything one seed describes before any process runs."""

    seed: int
    cast: builders.Cast
    terms: tuple[PlacementTerms, ...]
    nodes: tuple[NodePlan, ...]
    pre: tuple[tuple[str, bytes], ...]
    post: tuple[tuple[str, bytes], ...]
    late: tuple[tuple[str, bytes], ...]
    late_terms: str | None
    early_clock_ms: int
    late_clock_ms: int
    post_clock_ms: int
    partitions: int
    segment_max_bytes: int
    batch_max_records: int
    features: tuple[str, ...]

    @property
    def placement_ids(self) -> list[str]:
        """The placements, in order."""
        return [t.placement_id for t in self.terms]

    def nodes_of(self, placement_id: str) -> list[str]:
        """The nodes hosting GPUs of a placement."""
        terms = next(t for t in self.terms if t.placement_id == placement_id)
        return sorted({g.node_id for g in terms.gpus})

    def single_source(self, placement_id: str) -> bool:
        """True when one agent produces all of the placement's usage (one ordered source)."""
        return len(self.nodes_of(placement_id)) == 1

    def node_terms(self, node_id: str) -> list[PlacementTerms]:
        """The terms of the placements a node hosts."""
        return [t for t in self.terms if any(g.node_id == node_id for g in t.gpus)]

    def rotated_key(self, node_id: str) -> SigningKey:
        """The key a node rotates to (``Segment.key == "k1"``)."""
        return rotated_key(self.seed, node_id)

    def describe(self) -> str:
        """One line for logs and failures."""
        nodes = ",".join(
            f"{n.node_id}[{'+'.join(f'{s.key}<={s.until_ms}/{s.phase}' for s in n.segments)}]"
            for n in self.nodes
        )
        return (
            f"seed {self.seed}: {len(self.terms)} placement(s), nodes {nodes}, "
            f"{self.partitions} partition(s); {', '.join(self.features) or 'plain'}"
        )


_MODELS: Final = ("A100-80GB", "H100-80GB", "L40S")


def rotated_key(seed: int, node_id: str) -> SigningKey:
    """The key node ``node_id`` of seed ``seed`` rotates to (deterministic)."""
    return SigningKey.from_seed_text(f"{node_id}-k1", f"faults-{seed}/rotated/{node_id}")


def _grid(t0: int, k: int) -> int:
    return t0 + k * INTERVAL_MS


def _currency(rng: random.Random) -> tuple[str, int]:
    currency = rng.choice(sorted(CURRENCY_MINOR_UNITS))
    minor = CURRENCY_MINOR_UNITS[currency]
    return currency, rng.randint(minor, min(9, minor + 3))


def _terms(
    rng: random.Random,
    cast: builders.Cast,
    placement_id: str,
    gpus: list[GpuSpec],
    start_ms: int,
    end_ms: int,
) -> PlacementTerms:
    window_ms = end_ms - start_ms
    currency, scale = _currency(rng)
    increment_ms = min(window_ms, rng.choice([1, 1000, 60_000, 900_000, 3_600_000]))
    terms = builders.make_terms(
        cast,
        placement_id,
        gpus,
        start_ms,
        end_ms,
        rate_per_gpu_hour_minor=rng.choice([0, 1, 250, 99_999, rng.randint(1, 10**8)]),
        currency=currency,
        currency_scale=scale,
        increment_ms=increment_ms,
        minimum_duration_ms=rng.choice([0, rng.randint(0, window_ms)]),
        desk_fee_bps=rng.choice([0, 250, 500, rng.randint(0, 10_000)]),
        fee_payer=rng.choice(["operator", "buyer"]),
        interruptible=rng.random() < 0.5,
        reclaim_notice_ms=rng.choice([0, 300_000, 600_000, rng.randint(0, window_ms)]),
        reclaim_penalty_bps=rng.randint(0, 10_000),
        sla_availability_target_bps=rng.choice([0, 9_000, 9_900, 10_000]),
        sla_credit_bps=rng.randint(0, 10_000),
        settlement_period_ms=rng.choice([3_600_000, window_ms]),
        late_grace_ms=rng.choice([0, 60_000, 300_000]),
    )
    problems = validate_terms(terms)
    if problems:  # the generator's own bug: the scenario must be valid
        raise AssertionError(f"generated invalid terms for {placement_id}: {problems}")
    return terms


def _adjustment(
    rng: random.Random, cast: builders.Cast, placement_id: str, number: int, when_ms: int
) -> bytes:
    return builders.adjustment(
        cast,
        placement_id,
        f"{placement_id}-adj{number}",
        rng.choice(["credit", "charge"]),
        rng.randint(1, 50_000),
        when_ms,
        reference=f"{placement_id}/statement",
    )


def generate_scenario(seed: int) -> Scenario:
    """The scenario of ``seed``: a pure function of the seed (same seed, same bytes)."""
    rng = random.Random(f"gridledger-faults/{seed}/scenario")
    cast = builders.make_cast(f"faults-{seed}")
    node_ids = [f"f{seed}-n{j}" for j in range(rng.randint(1, MAX_NODES))]
    t0 = _grid(BASE_MS, rng.randrange(0, 24 * 60))
    features: list[str] = []
    gpu_index: Counter[str] = Counter()
    terms_list: list[PlacementTerms] = []
    for i in range(rng.randint(1, MAX_PLACEMENTS)):
        placement_id = f"f{seed}-p{i}"
        hosts = sorted(rng.sample(node_ids, rng.randint(1, len(node_ids))))
        gpus = []
        for node_id in hosts:
            for _ in range(rng.randint(1, 2)):
                gpus.append(
                    builders.gpu(
                        node_id,
                        gpu_index[node_id],
                        model=rng.choice(_MODELS),
                        share_milli=rng.choice([1000, 1000, 500, 250, rng.randint(1, 1000)]),
                    )
                )
                gpu_index[node_id] += 1
        start_ms = _grid(t0, rng.randint(0, 10))
        # Most windows end on the agents' grid; some end inside an interval (clipped).
        end_ms = _grid(start_ms, rng.randint(30, 75)) + rng.choice([0, 0, 12_345])
        terms_list.append(_terms(rng, cast, placement_id, gpus, start_ms, end_ms))
    by_id = {t.placement_id: t for t in terms_list}
    late_clock_ms = max(t.window_end_ms + t.late_grace_ms for t in terms_list) + 1_000
    early_clock_ms = min(t.window_start_ms for t in terms_list)

    pre: list[tuple[str, bytes]] = []
    post: list[tuple[str, bytes]] = []
    late: list[tuple[str, bytes]] = []
    for terms in terms_list:
        pre.append((terms.placement_id, builders.signed_terms(cast, terms)))

    # Nodes: simulator faults, a key rotation, a skewed clock.
    rotated = rng.choice(node_ids) if rng.random() < 0.4 else None
    skewed = rng.choice(node_ids) if rng.random() < 0.4 else None
    plans: list[NodePlan] = []
    for node_id in node_ids:
        mine = [t for t in terms_list if any(g.node_id == node_id for g in t.gpus)]
        if not mine:
            continue
        epoch_ms = min(t.window_start_ms for t in mine)
        end_ms = max(t.window_end_ms for t in mine)
        span_ms = end_ms - epoch_ms
        uuids = sorted(g.uuid for t in mine for g in t.gpus if g.node_id == node_id)
        spec = [f"seed={rng.randint(0, 10**6)}"]
        if rng.random() < 0.6:
            a = rng.randrange(0, span_ms // 2)
            spec.append(f"unhealthy={rng.choice(uuids)}@{a}-{a + rng.randint(1, span_ms // 3)}")
            features.append(f"{node_id} GPU unhealthy")
        if rng.random() < 0.3:
            a = rng.randrange(span_ms // 3, span_ms)
            until = f"-{a + rng.randint(1, span_ms)}" if rng.random() < 0.5 else ""
            spec.append(f"vanish={rng.choice(uuids)}@{a}{until}")
            features.append(f"{node_id} GPU vanishes")
        rotation_ms: int | None = None
        if node_id == rotated:
            rotation_ms = _grid(epoch_ms, rng.randint(3, max(3, span_ms // INTERVAL_MS - 3)))
            features.append(f"{node_id} key rotated at {rotation_ms}")
            key0, key1 = cast.node_key(node_id), rotated_key(seed, node_id)
            for t in mine:
                # Bind the new key from the rotation on (before any usage); revoke the
                # terms' key once its last event is in (SPEC §6.6: a revocation takes
                # effect at its arrival): after the usage, with the records of ``post``.
                post.append(
                    (
                        t.placement_id,
                        builders.key_binding(
                            cast, t.placement_id, node_id, key0, 0, rotation_ms, t.created_at_ms
                        ),
                    )
                )
                pre.append(
                    (
                        t.placement_id,
                        builders.key_binding(
                            cast,
                            t.placement_id,
                            node_id,
                            key1,
                            rotation_ms,
                            MAX_SAFE_INTEGER,
                            t.created_at_ms,
                        ),
                    )
                )
        skew_ms = 0
        early_until = end_ms
        if node_id == skewed:
            grace = max(t.late_grace_ms for t in terms_list)
            skew_ms = grace + rng.randint(1, 12) * INTERVAL_MS + rng.choice([0, 7_000])
            early_until = min(end_ms, late_clock_ms - skew_ms)
            if early_until < end_ms:
                features.append(f"{node_id} clock {skew_ms} ms behind: late usage")
        segments: list[Segment] = []
        key: Literal["k0", "k1"] = "k0"
        if rotation_ms is not None and rotation_ms < early_until:
            segments.append(Segment("k0", rotation_ms, "early"))
            key = "k1"
        segments.append(Segment(key, early_until, "early"))
        if rotation_ms is not None and early_until <= rotation_ms < end_ms:
            segments.append(Segment("k0", rotation_ms, "late"))
            key = "k1"
        if early_until < end_ms:
            segments.append(Segment(key, end_ms, "late"))
        if skew_ms:
            # The agent's clock runs skew_ms behind: it states its sends that much later
            # in true time (meter.shipper.simulated_send_ms).
            spec.append(f"skew_ms=-{skew_ms}")
        plans.append(NodePlan(node_id, ",".join(spec), tuple(segments), rotation_ms, skew_ms))

    # Operator and desk records around the usage.
    for terms in terms_list:
        pid = terms.placement_id
        window_intervals = (terms.window_end_ms - terms.window_start_ms) // INTERVAL_MS
        adjustments = 0

        reclaimed = False
        if rng.random() < 0.3:
            effective = _grid(terms.window_start_ms, rng.randint(1, window_intervals - 1))
            issued = max(0, effective - rng.randint(0, 2 * max(1, terms.reclaim_notice_ms)))
            pre.append((pid, builders.reclaim(cast, terms, issued, effective, f"{pid}-r1")))
            features.append(f"{pid} reclaimed")
            reclaimed = True
        if rng.random() < 0.3:
            adjustments += 1
            pre.append((pid, _adjustment(rng, cast, pid, adjustments, terms.window_start_ms)))
        if not reclaimed and rng.random() < 0.25:
            # Issued after the usage was folded: RECLAIM_BEHIND_USAGE unless none was.
            effective = _grid(terms.window_start_ms, 1)
            post.append((pid, builders.reclaim(cast, terms, effective, effective, f"{pid}-r2")))
            features.append(f"{pid} reclaim behind usage")
        if rng.random() < 0.35:
            adjustments += 1
            post.append((pid, _adjustment(rng, cast, pid, adjustments, terms.window_end_ms)))
        if rng.random() < 0.5:
            adjustments += 1  # folded after the close:
            late.append((pid, _adjustment(rng, cast, pid, adjustments, late_clock_ms)))
            features.append(f"{pid} late adjustment")
            if rng.random() < 0.3:
                # the same adjustment_id again, other bytes: ADJUSTMENT_DUPLICATE
                again = _adjustment(rng, cast, pid, adjustments, late_clock_ms + 1)
                late.append((pid, again))
        if rng.random() < 0.25:
            late.append(
                (
                    pid,
                    builders.reclaim(
                        cast, terms, late_clock_ms, terms.window_end_ms - 1, f"{pid}-late"
                    ),
                )
            )
            features.append(f"{pid} reclaim after close")
        if rng.random() < 0.2:
            node_id = terms.gpus[0].node_id
            late.append(
                (
                    pid,
                    builders.key_binding(
                        cast, pid, node_id, cast.node_key(node_id), 0, 1, late_clock_ms
                    ),
                )
            )
            features.append(f"{pid} key binding after close")
    late_terms = rng.choice(list(by_id)) if rng.random() < 0.3 else None
    if late_terms is not None:
        features.append(f"{late_terms} terms arrive mid-stream (inputs held)")
    return Scenario(
        seed=seed,
        cast=cast,
        terms=tuple(terms_list),
        nodes=tuple(plans),
        pre=tuple(pre),
        post=tuple(post),
        late=tuple(late),
        late_terms=late_terms,
        early_clock_ms=early_clock_ms,
        late_clock_ms=late_clock_ms,
        post_clock_ms=max(t.window_end_ms for t in terms_list),
        partitions=rng.randint(1, 4),
        segment_max_bytes=rng.choice([4096, 16_384, 1 << 20]),
        batch_max_records=rng.choice([1, 3, 8, 32]),
        features=tuple(features),
    )


def write_node_configs(
    scenario: Scenario, directory: Path, bootstrap: str, topic: str
) -> dict[str, dict[str, Path]]:
    """Each node's key files, signed terms and meter.toml files (Kafka transport):
    ``result[node]["k0"]`` signs with the terms' key, ``["k1"]`` with the rotated key."""
    from devtools.scenario import write_meter_setup

    configs: dict[str, dict[str, Path]] = {}
    for plan in scenario.nodes:
        k0 = write_meter_setup(
            directory,
            scenario.cast,
            plan.node_id,
            scenario.node_terms(plan.node_id),
            transport="kafka",
            interval_s=INTERVAL_MS / 1000,
            kafka={"bootstrap": bootstrap, "topic": topic},
            segment_max_bytes=scenario.segment_max_bytes,
        )
        node_dir = k0.parent
        private, _ = write_key_pair(scenario.rotated_key(plan.node_id), node_dir / "keys")
        data = tomllib.loads(k0.read_text())
        data["key_file"] = str(private.relative_to(node_dir))
        data["key_rebound"] = True  # bound by the scenario's NodeKeyBinding
        k1 = node_dir / "meter-k1.toml"
        k1.write_text(tomli_w.dumps(data))
        configs[plan.node_id] = {"k0": k0, "k1": k1}
    return configs
