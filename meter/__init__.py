"""The node agent (docs/architecture.md): measure GPUs, sign usage, spool first, ship.

The spool every record goes to first (fsync) is ``transport.spool``. Modules, by concept:

* ``stream`` — one (node, placement) stream as pure functions: intervals, samples, events;
* ``agent`` — ``Agent.tick()``: every due interval of every stream, signed and spooled;
* ``sources`` / ``nvml`` / ``sim`` — where readings come from: NVML or a seeded simulator;
* ``clock`` — injected time: the wall clock, a simulated clock, a skewed one;
* ``shipper`` — spool -> Kafka, acknowledged, at least once, with garbage collection;
* ``config`` / ``cli`` — meter.toml and ``gridledger meter run``;
* ``limits`` — every named bound of the agent; ``metrics`` — its Prometheus counters.
"""
