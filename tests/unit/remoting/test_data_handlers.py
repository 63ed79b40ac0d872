"""The data handlers' pure parts: subscriptions as FilterAPI reads them, refusals as
RocketMQ's codes, and the V2 send header's one-letter keys."""

from __future__ import annotations

import pytest
from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.data_handlers import V2_FIELDS, SendHeader
from mockbroker.fronts.remoting.errors import refusal
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import Fields, RemotingError
from sdk._remoting.subscription import parse_subscription


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        (None, None),
        ("", None),
        ("*", None),
        ("TagA", {b"TagA"}),
        (" TagA || TagB ", {b"TagA", b"TagB"}),
        ("A||B||A", {b"A", b"B"}),
        ("A|||B", {b"A", b"|B"}),  # "||" splits first, as Java's regex does
        ("A | B", {b"A | B"}),
        (" * ", {b"*"}),  # only "*" exactly means every tag
        ("A||", {b"A"}),
        ("|| ||", set()),  # parts, all blank: a set that matches nothing
        ("\tA\x01||B\n", {b"A", b"B"}),  # Java's trim takes every character up to U+0020
        ("é||ü", {"é".encode(), "ü".encode()}),
    ],
)
def test_subscriptions_parse_as_filter_api_does(
    expression: str | None, tags: set[bytes] | None
) -> None:
    parsed = parse_subscription(expression)
    assert (None if parsed is None else set(parsed)) == tags


@pytest.mark.parametrize("expression", ["||", "||||"])
def test_a_subscription_of_separators_only_does_not_parse(expression: str) -> None:
    with pytest.raises(RemotingError) as caught:
        parse_subscription(expression)
    assert caught.value.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED


@pytest.mark.parametrize(
    ("status", "reason", "code"),
    [
        (StatusCode.INVALID_ARGUMENT, "EMPTY_BODY", ResponseCode.MESSAGE_ILLEGAL),
        (StatusCode.INVALID_ARGUMENT, "BODY_TOO_LARGE", ResponseCode.MESSAGE_ILLEGAL),
        (StatusCode.INVALID_ARGUMENT, "PROPERTIES_TOO_LARGE", ResponseCode.MESSAGE_ILLEGAL),
        (StatusCode.INVALID_ARGUMENT, "MALFORMED_FRAME", ResponseCode.MESSAGE_ILLEGAL),
        (StatusCode.INVALID_ARGUMENT, "INVALID_DELIVERY_TIME", ResponseCode.MESSAGE_ILLEGAL),
        (StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", ResponseCode.TOPIC_NOT_EXIST),
        (StatusCode.UNAVAILABLE, "DISK_FULL", ResponseCode.SERVICE_NOT_AVAILABLE),
        (StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", ResponseCode.SERVICE_NOT_AVAILABLE),
        (StatusCode.UNAVAILABLE, "ANYTHING_ELSE", ResponseCode.SERVICE_NOT_AVAILABLE),
        (StatusCode.INVALID_ARGUMENT, "INVALID_TOPIC", ResponseCode.SYSTEM_ERROR),
        (StatusCode.OUT_OF_RANGE, "INVALID_QUEUE", ResponseCode.SYSTEM_ERROR),
        (StatusCode.DATA_LOSS, "FLUSH_FAILED", ResponseCode.SYSTEM_ERROR),
        (StatusCode.DATA_LOSS, "CORRUPT_RECORD", ResponseCode.SYSTEM_ERROR),
    ],
)
def test_core_refusals_become_rocketmqs_codes_with_the_cores_reason(
    status: StatusCode, reason: str, code: int
) -> None:
    error = refusal(BrokerError(status, reason, f"why: {reason}"))
    assert (error.code, error.remark) == (code, f"why: {reason}")


def test_v2_keys_name_the_v1_fields() -> None:
    assert V2_FIELDS["b"] == "topic" and V2_FIELDS["l"] == "maxReconsumeTimes"
    assert len(set(V2_FIELDS.values())) == len(V2_FIELDS) == 14


def test_a_send_header_reads_required_and_optional_fields() -> None:
    fields = Fields({
        "producerGroup": "pg", "topic": "t", "queueId": "-1", "sysFlag": "769",
        "bornTimestamp": "1700000000000", "flag": "3",
    })  # fmt: skip
    header = SendHeader.read(fields)
    assert (header.queue_id, header.sys_flag, header.flag, header.properties) == (-1, 769, 3, "")
    assert (header.reconsume_times, header.max_reconsume_times) == (0, None)
    with pytest.raises(RemotingError, match="'bornTimestamp' is missing"):
        SendHeader.read(Fields({k: v for k, v in fields.values.items() if k != "bornTimestamp"}))
    with pytest.raises(RemotingError, match="'queueId' is not an integer"):
        SendHeader.read(Fields({**fields.values, "queueId": "first"}))
