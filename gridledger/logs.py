"""One log format for every process (``--log-format json|console``, ``--log-level``).

structlog renders every line: our own events and, through the standard library's
``logging`` (``structlog.stdlib.ProcessorFormatter``), those of aiokafka and any other
library, so a meter, a ledger or a witness writes one format to stderr and nothing in
between. ``json`` (one object per line: ``event``, ``level``, ``timestamp``, the event's
fields, and ``logger`` for library lines) is the default when stderr is not a terminal;
``console`` (aligned, readable) when it is. aiokafka's own lines are kept at warning and
above unless ``--log-level debug``: its reconnect chatter is summarised by our events, and
its line per failed bootstrap connection is left out (our event for the attempt says it).
"""

from __future__ import annotations

import logging
import sys
from typing import Final, Literal

import structlog

FORMATS: Final = ("json", "console")
LEVELS: Final = ("debug", "info", "warning", "error")
Format = Literal["json", "console"]
_HANDLER_NAME: Final = "gridledger-structlog"


# aiokafka's line for each failed connection to a bootstrap address: our own event for the
# attempt (kafka_unavailable, ship_failed) says it once, in words; --log-level debug keeps it.
_BOOTSTRAP_CHATTER: Final = ('Unable connect to "', "Unable to bootstrap from ")


def _said_by_our_events(record: logging.LogRecord) -> bool:
    """False for a library line that repeats what one of our events already says."""
    if not record.name.startswith("aiokafka"):
        return True
    return not str(record.msg).startswith(_BOOTSTRAP_CHATTER)


def default_format() -> Format:
    """console on a terminal, json otherwise."""
    return "console" if sys.stderr.isatty() else "json"


def configure_logging(fmt: str | None = None, level: str | None = None) -> None:
    """Route structlog and the standard library's logging to stderr in one format."""
    chosen = fmt or default_format()
    numeric = getattr(logging, (level or "info").upper())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if chosen == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.types.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared],
        )
    )
    handler.set_name(_HANDLER_NAME)
    if numeric > logging.DEBUG:
        handler.addFilter(_said_by_our_events)
    root = logging.getLogger()
    # Replace only our own handler (a second call, tests calling main again); others stay.
    root.handlers = [h for h in root.handlers if h.get_name() != _HANDLER_NAME] + [handler]
    root.setLevel(numeric)
    logging.getLogger("aiokafka").setLevel(max(numeric, logging.WARNING))
    logging.getLogger("kafka").setLevel(max(numeric, logging.WARNING))
