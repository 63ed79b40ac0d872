"""Structured logs: stable event names, and the JSON formatter."""

from __future__ import annotations

import json
import logging

from sdk.log import EVENTS, JsonFormatter, log_event


def test_json_formatter_writes_the_event_and_its_fields() -> None:
    logger = logging.getLogger("ordermq.test")
    record = logger.makeRecord(
        "ordermq.test", logging.INFO, __file__, 1, "took %s", ("q1",), None,
        extra={"event": "queue.added", "fields": {"group": "g", "queue": 3}},
    )  # fmt: skip
    line = json.loads(JsonFormatter().format(record))
    assert line["event"] == "queue.added" and line["message"] == "took q1"
    assert (line["group"], line["queue"], line["level"]) == ("g", 3, "INFO")


def test_log_event_marks_the_record(caplog: object) -> None:
    import pytest

    cap: pytest.LogCaptureFixture = caplog  # type: ignore[assignment]
    with cap.at_level(logging.INFO, "ordermq.test"):
        log_event(logging.getLogger("ordermq.test"), logging.INFO, "rebalance", "moved", added=2)
    [record] = cap.records
    assert (record.event, record.fields) == ("rebalance", {"added": 2})  # type: ignore[attr-defined]
    assert "rebalance" in EVENTS
