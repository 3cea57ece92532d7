"""What a replay did and found: ``ReplayReport`` (``to_json`` / ``render``) and its sums."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from gridledger.replay_limits import UNPLACEABLE_SHOWN
from gridledger.trace import TraceUsage
from proto.money import format_gpu_hours, format_minor

REPORT_FORMAT: Final = "gridledger-replay-report/v1"


# The money fields of a placement's final totals that a replay adds up (minor units).
MONEY_FIELDS: Final = (
    "gross_minor",
    "credits_minor",
    "net_minor",
    "fee_minor",
    "buyer_owes_minor",
    "operator_receives_minor",
    "desk_receives_minor",
)


@dataclass
class Money:
    """Sums of one currency at one scale, in minor units."""

    currency: str
    scale: int
    gross_minor: int = 0
    credits_minor: int = 0
    net_minor: int = 0
    fee_minor: int = 0
    buyer_owes_minor: int = 0
    operator_receives_minor: int = 0
    desk_receives_minor: int = 0

    def add(self, totals: dict[str, int]) -> None:
        """Add one placement's final totals."""
        for name in MONEY_FIELDS:
            setattr(self, name, getattr(self, name) + totals[name])

    def to_json(self) -> dict[str, Any]:
        """Exact integers and their decimal rendering."""
        out: dict[str, Any] = {"currency": self.currency, "currency_scale": self.scale}
        for name in MONEY_FIELDS:
            value = getattr(self, name)
            out[name] = value
            out[name.removesuffix("_minor")] = format_minor(value, self.scale)
        return out


VERIFIER_SIZE_CLASSES: Final = (
    ("<=256", 256),  # one chain read (verifier.pricing.CHAIN_ROWS_MAX)
    ("<=4096", 4_096),  # compact files (COMPACT_MAX_RECORDS)
    ("<=10000", 10_000),  # ~20,000 rows: the verifier's threads above (MIN_ROWS_FOR_POOL)
    (">10000", 2**62),
)
"""Export size classes (LedgerRecords at most) the report splits the verifier's CPU by."""


@dataclass
class ReplayReport:
    """What a replay did and found (``to_json`` / ``render``)."""

    trace_dir: str
    transport: str
    interval_s: int
    tasks: int = 0
    trace: TraceUsage | None = None
    subset: str = ""  # how a bounded run's tasks relate to the trace ("": all of it)
    placements: int = 0
    unplaceable: list[tuple[str, str]] = field(default_factory=list)
    nodes: int = 0
    events_generated: int = 0
    events_accepted: int = 0
    inputs_rejected: int = 0
    delivered_mgms: int = 0
    delivered_by_qos_mgms: dict[str, int] = field(default_factory=dict)
    delivered_by_model_mgms: dict[str, int] = field(default_factory=dict)
    money: dict[str, Money] = field(default_factory=dict)
    verified: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    exports_kept: int = 0
    """Export files left in DIR/exports (all with keep_exports, else the failed ones)."""
    seconds: dict[str, float] = field(default_factory=dict)
    peak_rss_mib: float = 0.0
    peak_rss_mib_by_process: dict[str, float] = field(default_factory=dict)
    """The replay process's own peak and, over Kafka, its ledger process's; and
    ``ledger_duckdb``: the most DuckDB memory the ledger's store held after a step."""
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    """CPU (user + system) by process over Kafka: ``replay`` (agents, shippers, this
    process's own work), ``ledger`` (the ledger process; of it ``ledger_fold`` and
    ``ledger_export``, the process's CPU during its steps and its exports),
    ``ledger_workers`` (its signature worker), ``verifier`` (the verifier's workers, per
    export verified). Where the trace's CPU goes when both cores are full."""

    verifier_by_records: dict[str, list[float]] = field(default_factory=dict)
    """The verifier's CPU by the export's size: for each class of VERIFIER_SIZE_CLASSES
    (records at most), [exports, records, CPU-seconds]: which exports the verifier's
    CPU goes to."""

    verifier_batches: dict[int, int] = field(default_factory=dict)
    """Small exports handed to the verifier together: batch size -> batches (a batch of
    one is verified alone)."""

    def count_verifier_cpu(self, records: int, cpu_s: float) -> None:
        """Add one export's verification CPU to its size class."""
        label = next(
            (name for name, most in VERIFIER_SIZE_CLASSES if records <= most),
            VERIFIER_SIZE_CLASSES[-1][0],
        )
        row = self.verifier_by_records.setdefault(label, [0, 0, 0.0])
        row[0] += 1
        row[1] += records
        row[2] += cpu_s

    @property
    def delivered_equals_trace(self) -> bool:
        """The delivered total equals the trace's own weighted total, exactly."""
        return self.trace is not None and self.delivered_mgms == self.trace.weighted_mgms

    @property
    def ok(self) -> bool:
        """Every export verified and the delivered total equals the trace's."""
        return (
            self.delivered_equals_trace
            and not self.failed
            and not self.unplaceable
            and self.verified == self.placements
        )

    def rate(self, phase: str) -> float:
        """Accepted events per second of a phase (0 when it took no time)."""
        seconds = self.seconds.get(phase, 0.0)
        return self.events_accepted / seconds if seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """The machine-readable report."""
        trace = self.trace
        return {
            "format": REPORT_FORMAT,
            "trace_dir": self.trace_dir,
            "subset": self.subset,
            "transport": self.transport,
            "interval_s": self.interval_s,
            "tasks": self.tasks,
            "trace": None
            if trace is None
            else {
                "gpu_tasks": trace.gpu_tasks,
                "gpu_tasks_by_qos": trace.gpu_tasks_by_qos,
                "ran_tasks": trace.ran_tasks,
                "whole_mgms": trace.whole_mgms,
                "whole_gpu_hours": format_gpu_hours(trace.whole_mgms),
                "weighted_mgms": trace.weighted_mgms,
                "weighted_gpu_hours": format_gpu_hours(trace.weighted_mgms),
            },
            "placements": self.placements,
            "unplaceable": [{"task": t, "reason": r} for t, r in self.unplaceable],
            "nodes": self.nodes,
            "events_generated": self.events_generated,
            "events_accepted": self.events_accepted,
            "inputs_rejected": self.inputs_rejected,
            "delivered_mgms": self.delivered_mgms,
            "delivered_gpu_hours": format_gpu_hours(self.delivered_mgms),
            "delivered_by_qos": _hours_json(self.delivered_by_qos_mgms),
            "delivered_by_model": _hours_json(self.delivered_by_model_mgms),
            "delivered_equals_trace": self.delivered_equals_trace,
            "money": [m.to_json() for _, m in sorted(self.money.items())],
            "verdicts": {"verified": self.verified, "failed": len(self.failed)},
            "exports_kept": self.exports_kept,
            "failed": [{"placement": p, "why": w} for p, w in self.failed],
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "events_per_s": {
                "ledger": round(self.rate("ledger"), 1),
                "verifier_busy": round(self.rate("verify_busy"), 1),
                "agents": round(self.rate("agents"), 1),
            },
            "cpu_seconds": {k: round(v, 3) for k, v in sorted(self.cpu_seconds.items())},
            "verifier_cpu_by_records": {
                label: {"exports": int(n), "records": int(r), "cpu_s": round(c, 3)}
                for label, _ in VERIFIER_SIZE_CLASSES
                if label in self.verifier_by_records
                for n, r, c in [self.verifier_by_records[label]]
            },
            "verifier_batches": {str(k): v for k, v in sorted(self.verifier_batches.items())},
            "cpu_us_per_event": {
                k: round(v / self.events_accepted * 1e6, 1)
                for k, v in sorted(self.cpu_seconds.items())
                if self.events_accepted > 0
            },
            "peak_rss_mib": round(self.peak_rss_mib, 1),
            "peak_rss_mib_by_process": {
                k: round(v, 1) for k, v in sorted(self.peak_rss_mib_by_process.items())
            },
            "ok": self.ok,
        }

    def render(self) -> list[str]:
        """The human report, one line per fact."""
        lines = [f"replay of {self.trace_dir} ({self.transport}, interval {self.interval_s} s)"]
        trace = self.trace
        if trace is not None:
            what = f"replayed {self.subset}: " if self.subset else "trace: "
            lines.append(
                f"{what}{self.tasks} tasks, {trace.gpu_tasks} GPU tasks, {trace.ran_tasks} ran; "
                f"GPU-hours whole {format_gpu_hours(trace.whole_mgms)}, "
                f"weighted {format_gpu_hours(trace.weighted_mgms)} "
                f"({trace.weighted_mgms} milli-GPU-ms)"
            )
        lines.append(
            f"placements: {self.placements} on {self.nodes} nodes; "
            f"unplaceable: {len(self.unplaceable)}"
        )
        for task, reason in self.unplaceable[:UNPLACEABLE_SHOWN]:
            lines.append(f"  unplaceable {task}: {reason}")
        lines.append(
            f"events: {self.events_generated} signed by the agents this run, "
            f"{self.events_accepted} accepted by the ledger, {self.inputs_rejected} rejected"
        )
        lines.append(
            f"delivered: {format_gpu_hours(self.delivered_mgms)} GPU-hours "
            f"({self.delivered_mgms} milli-GPU-ms)"
        )
        for qos, mgms in sorted(self.delivered_by_qos_mgms.items()):
            lines.append(f"  QoS {qos}: {format_gpu_hours(mgms)} GPU-hours")
        for model, mgms in sorted(self.delivered_by_model_mgms.items()):
            lines.append(f"  model {model}: {format_gpu_hours(mgms)} GPU-hours")
        for _, m in sorted(self.money.items()):
            lines.append(
                f"money ({m.currency}): gross {format_minor(m.gross_minor, m.scale)}, "
                f"credits {format_minor(m.credits_minor, m.scale)}, "
                f"fees {format_minor(m.fee_minor, m.scale)}; "
                f"buyers owe {format_minor(m.buyer_owes_minor, m.scale)}, "
                f"operator receives {format_minor(m.operator_receives_minor, m.scale)}, "
                f"desk receives {format_minor(m.desk_receives_minor, m.scale)}"
            )
        lines.append(
            f"verdicts: {self.verified} verified, {len(self.failed)} failed; "
            f"{self.exports_kept} export(s) kept in exports/"
            + ("" if self.exports_kept == self.placements else " (--keep-exports keeps all)")
        )
        for placement, why in self.failed[:UNPLACEABLE_SHOWN]:
            lines.append(f"  FAIL {placement}: {why}")
        lines.append(f"delivered_equals_trace: {str(self.delivered_equals_trace).lower()}")
        timing = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        by_process = ", ".join(
            f"{k} {v:.0f} MiB" for k, v in sorted(self.peak_rss_mib_by_process.items())
        )
        lines.append(
            f"time: {timing}; peak RSS {self.peak_rss_mib:.0f} MiB"
            + (f" ({by_process})" if by_process else "")
        )
        lines.append(
            ("OK: " if self.ok else "FAIL: ")
            + "replay "
            + ("checks out" if self.ok else "does not check out")
        )
        return lines


def _hours_json(by: dict[str, int]) -> dict[str, dict[str, Any]]:
    return {k: {"mgms": v, "gpu_hours": format_gpu_hours(v)} for k, v in sorted(by.items())}
