"""Test and development harnesses: never product code, not in the wheel.

* ``kafka_fetch`` / ``kafka_broker`` — real Apache Kafka for the tests: the Maven fetch of
  the pinned release, and the single-node KRaft broker process on 127.0.0.1;
* ``kafka_tls`` — the same broker with a TLS + SASL/SCRAM listener and a throwaway PKI;
* ``builders`` — records signed with keys derived from seed text (tests, vectors, benches);
* ``scenario`` — a meter's files (keys, signed terms, meter.toml) from a seeded cast;
* ``faults`` — the seeded fault harness (kills, restarts, outages, then every check).

The tests and ``bench/`` import it from the checkout (``pyproject.toml`` puts the
repository root on pytest's path; the bench scripts insert it).
"""
