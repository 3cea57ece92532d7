"""The agent's counters, as Prometheus metrics in a registry of its own (also logged)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["MeterMetrics"]


class MeterMetrics:
    """Counters and gauges of one agent process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.events_emitted = Counter(
            "meter_events_emitted", "Usage events signed and spooled", registry=r
        )
        self.events_shipped = Counter(
            "meter_events_shipped", "Spooled records acknowledged by Kafka", registry=r
        )
        self.events_pending = Gauge(
            "meter_events_pending", "Spooled records not yet acknowledged by Kafka", registry=r
        )
        self.spool_bytes = Gauge("meter_spool_bytes", "Bytes of the spool's segments", registry=r)
        self.spool_full = Gauge(
            "meter_spool_full", "1 when the spool reached its bound (the agent stops)", registry=r
        )
        self.ship_failures = Counter(
            "meter_ship_failures", "Failed attempts to ship a batch to Kafka", registry=r
        )
        self.source_errors = Counter(
            "meter_source_errors", "Reads of the GPU source that failed", registry=r
        )
        self.records_skipped = Counter(
            "meter_records_skipped",
            "Spool records that could not be used, by reason",
            ["reason"],
            registry=r,
        )

    def snapshot(self) -> dict[str, float]:
        """Current values by metric name, for a log line."""
        values: dict[str, float] = {}
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                label = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{label}}}" if label else sample.name] = sample.value
        return values
