"""gridledger: metering and settlement for shared GPU capacity (the CLI glue)."""

__version__ = "0.1.0"
