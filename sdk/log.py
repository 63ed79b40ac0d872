"""Structured logging: stable event names on log records, and a JSON formatter.

Log records that mark something an operator may want to alert on or count carry an
`event` attribute (one of EVENTS) and a `fields` dict. With the standard `logging`
setup they print as usual; with `JsonFormatter` each is one JSON object per line:

    handler.setFormatter(sdk.log.JsonFormatter())
"""

from __future__ import annotations

import json
import logging
from typing import Any

#: The event names, and what they mean. Names are stable: dashboards may rely on them.
EVENTS = {
    "queue.added": "a consumer took a queue (after its lock, for orderly consumers)",
    "queue.removed": "a consumer gave a queue up (offset persisted, lock released)",
    "rebalance": "a consumer's queue assignment changed",
    "lock.granted": "a consumer was granted a queue's lock (with its fencing epoch)",
    "lock.lost": "a consumer found it no longer holds a queue's lock",
    "offset.reset": "an operator moved a group's offsets",
    "client.expired": "the broker dropped a client that went silent, with its locks",
    "recovery": "the broker replayed its log after an unclean shutdown",
}


def log_event(logger: logging.Logger, level: int, event: str, message: str, **fields: Any) -> None:
    """Log `message` as the stable `event`, with `fields` kept structured."""
    logger.log(level, message, extra={"event": event, "fields": fields})


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and event + fields."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        out: dict[str, Any] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            out["event"] = event
            out.update(getattr(record, "fields", {}))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)
