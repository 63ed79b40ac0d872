"""Message construction: what users may and may not build."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from sdk import Message, MessageQueue
from sdk._wire import MAX_BODY_BYTES
from sdk.errors import InvalidArgumentError, InvalidMessageError, InvalidTopicError


def test_a_full_message_keeps_what_it_was_given() -> None:
    m = Message(
        "orders", b"x", tags="paid", keys=["a", "b"], properties={"k": "v"}, sharding_key="o-1"
    )
    assert (m.topic, m.body, m.tags, m.keys, m.properties, m.sharding_key) == (
        "orders", b"x", "paid", ("a", "b"), {"k": "v"}, "o-1",
    )  # fmt: skip


def test_a_single_key_string_is_one_key() -> None:
    assert Message("t", b"x", keys="order-1").keys == ("order-1",)


@pytest.mark.parametrize(
    "topic", ["", "has space", "a" * 128, "rmq_sys_x", "%RETRY%g", "tab\t", "dot.ted"]
)
def test_bad_topics_are_refused(topic: str) -> None:
    with pytest.raises(InvalidTopicError):
        Message(topic, b"x")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"body": b""}, "empty"),
        ({"body": b"x" * (MAX_BODY_BYTES + 1)}, "over the limit"),
        ({"body": "text"}, "bytes"),
        ({"properties": {"k": "v" * 20_000}}, "properties"),
        ({"properties": {"k": 1}}, "str"),
        ({"tags": "A || B"}, "one tag"),
        ({"tags": "*"}, "one tag"),
        ({"keys": [""]}, "empty"),
        ({"sharding_key": "a\x00b"}, "NUL"),
        ({"delay_seconds": 0}, "delay"),
        ({"delay_seconds": 41 * 86400}, "delay"),
        ({"delay_seconds": 5, "deliver_at": 10.0}, "not both"),
        ({"deliver_at": datetime(2030, 1, 1)}, "timezone"),
    ],
)
def test_invalid_messages_raise_value_errors(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"body": b"x", **kwargs}
    with pytest.raises(InvalidMessageError, match=match) as info:
        Message("orders", **args)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and isinstance(info.value, InvalidArgumentError)


def test_aware_deliver_at_becomes_epoch_seconds() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert Message("t", b"x", deliver_at=when).deliver_at == when.timestamp()


def test_message_queues_order_by_topic_broker_then_queue_id() -> None:
    queues = [MessageQueue("b", "x", 0), MessageQueue("a", "y", 1), MessageQueue("a", "x", 2)]
    assert sorted(queues) == [
        MessageQueue("a", "x", 2), MessageQueue("a", "y", 1), MessageQueue("b", "x", 0),
    ]  # fmt: skip
    assert len({MessageQueue("a", "x", 1), MessageQueue("a", "x", 1)}) == 1
