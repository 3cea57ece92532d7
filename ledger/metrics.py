"""Prometheus metrics of one ledger process, on a registry of its own.

A registry per service (not the global default) so two ledgers in one process — two
shards in a test — count apart.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ledger.limits import BATCH_LATENCY_BUCKETS_S


class LedgerMetrics:
    """The counters the HTTP API exposes at /metrics."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.inputs = Counter(
            "gridledger_ledger_inputs",
            "Inputs consumed, by decision (chained, dropped, quarantined, held).",
            ["decision"],
            registry=self.registry,
        )
        self.records = Counter(
            "gridledger_ledger_records_folded",
            "LedgerRecords chained, by status (accepted, rejected).",
            ["status"],
            registry=self.registry,
        )
        self.rejected = Counter(
            "gridledger_ledger_rejected",
            "Chained inputs rejected, by reason code.",
            ["reason"],
            registry=self.registry,
        )
        self.quarantined = Counter(
            "gridledger_ledger_quarantined",
            "Inputs quarantined (not attributable to a chain), by reason code.",
            ["reason"],
            registry=self.registry,
        )
        self.duplicates = Counter(
            "gridledger_ledger_duplicates_dropped",
            "Exact re-deliveries dropped.",
            registry=self.registry,
        )
        self.closes = Counter(
            "gridledger_ledger_closes_published",
            "PlacementClosed records published into the stream.",
            registry=self.registry,
        )
        self.lag = Gauge(
            "gridledger_ledger_consumer_lag",
            "Inputs available at the source and not consumed yet.",
            ["source"],
            registry=self.registry,
        )
        self.batch_seconds = Histogram(
            "gridledger_ledger_batch_seconds",
            "Time to fold and commit one batch.",
            buckets=BATCH_LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.open_placements = Gauge(
            "gridledger_ledger_open_placements",
            "Placements with accepted terms that are not closed.",
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
