"""The exception tree and the reason table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sdk import errors

PROTO = Path(__file__).resolve().parents[2] / "proto" / "ordermq" / "v1" / "ordermq.proto"


def test_every_protocol_reason_maps_to_a_class() -> None:
    text = PROTO.read_text()
    block = text[text.index("enum ErrorReason") : text.index("}", text.index("enum ErrorReason"))]
    reasons = set(re.findall(r"^\s+([A-Z_]+) = \d+;", block, re.MULTILINE))
    reasons.discard("ERROR_REASON_UNSPECIFIED")
    assert reasons == set(errors.ERRORS_BY_REASON)


def test_every_exception_derives_from_the_root() -> None:
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, errors.OrderMQError)


@pytest.mark.parametrize(
    ("code", "reason", "cls"),
    [
        ("INVALID_ARGUMENT", "BODY_TOO_LARGE", errors.InvalidMessageError),
        ("NOT_FOUND", "TOPIC_NOT_FOUND", errors.TopicNotFoundError),
        ("DATA_LOSS", "CORRUPT_RECORD", errors.CorruptRecordError),
        ("UNAVAILABLE", None, errors.BrokerUnavailableError),
        ("DEADLINE_EXCEEDED", None, errors.RequestTimeoutError),
        ("INTERNAL", None, errors.BrokerError),
        ("RESOURCE_EXHAUSTED", "CLIENT_OVER_LIMIT", errors.BrokerBusyError),
    ],
)
def test_status_and_reason_pick_the_class_and_keep_the_broker_words(
    code: str, reason: str | None, cls: type[errors.OrderMQError]
) -> None:
    exc = errors.error_from_status(code, reason, "what the broker said")
    assert type(exc) is cls
    assert (exc.code, exc.reason, str(exc)) == (code, reason, "what the broker said")


def test_bad_input_errors_are_value_errors_and_transport_errors_are_retriable() -> None:
    assert issubclass(errors.InvalidTopicError, ValueError)
    assert errors.BrokerUnavailableError.retriable
    assert errors.error_from_status("RESOURCE_EXHAUSTED", "CLIENT_OVER_LIMIT", "busy").retriable
    assert not errors.InvalidMessageError.retriable
