"""The transport (docs/architecture.md): how records travel from the meters to the ledger.

Imports ``proto/`` only; ``meter/`` and ``ledger/`` use it. Modules:

* ``spool`` — the durable, checksummed, segmented log on local disk (the frame format);
* ``positions`` — the one codec of spool and Kafka positions;
* ``local`` — the embedded transport: one directory of spools, read in name order;
* ``kafka`` — settings, client arguments, producer, consumer, topic creation, sending;
* ``limits`` — every named bound of the spool and the Kafka sends.
"""
