"""Message construction: what users may and may not build."""

from __future__ import annotations

import copy
import json
import math
import pickle
import re
from datetime import UTC, datetime

import pytest

from sdk import Message, MessageQueue, _validation
from sdk._validation import check_topic
from sdk._wire import MAX_BODY_BYTES, encode_properties
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
    "topic",
    ["", "has space", "a" * 128, "rmq_sys_x", "%RETRY%g", "tab\t", "dot.ted", "newline\n"],
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
        ({"tags": "A,B"}, "contains ','"),
        ({"tags": "A | B"}, "contains '|'"),
        ({"tags": " paid"}, "white space"),
        ({"tags": " "}, "empty"),
        ({"keys": [""]}, "empty"),
        ({"sharding_key": "a\x00b"}, "NUL"),
        ({"delay_seconds": 0}, "delay"),
        ({"delay_seconds": 41 * 86400}, "delay"),
        ({"delay_seconds": 5, "deliver_at": 10.0}, "not both"),
        ({"deliver_at": datetime(2030, 1, 1)}, "timezone"),
        # Before, these were kept: the send then failed with ValueError or OverflowError.
        ({"deliver_at": math.nan}, r"deliver_at must be .*\(a finite number\)"),
        ({"deliver_at": math.inf}, r"deliver_at must be .*\(a finite number\)"),
        ({"deliver_at": "2030-01-01"}, "deliver_at must be"),
        ({"deliver_at": True}, "deliver_at must be"),
        ({"delay_seconds": True}, "delay"),
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


def test_a_topic_checked_once_is_still_checked_as_a_name_after() -> None:
    assert Message("cached-topic", b"x").topic == "cached-topic"
    assert Message("cached-topic", b"y").topic == "cached-topic"
    for bad in ("cached-topic ", "cached-topic.", "rmq_sys_cached-topic"):
        with pytest.raises(InvalidTopicError):
            Message(bad, b"x")


@pytest.mark.parametrize("topic", [None, 5, b"orders", ["orders"]])
def test_topics_that_are_not_str_are_refused_even_when_cached(topic: object) -> None:
    Message("orders", b"x")
    with pytest.raises(InvalidTopicError, match=re.escape(f"topic {topic!r} must match")):
        Message(topic, b"x")  # type: ignore[arg-type]


def test_a_str_subclass_topic_is_checked_and_kept_as_given() -> None:
    class Name(str):
        pass

    Message("orders", b"x")
    topic = Name("orders")
    assert Message(topic, b"x").topic is topic
    with pytest.raises(InvalidTopicError):
        Message(Name("rmq_sys_x"), b"x")


def test_the_cache_of_valid_topics_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_validation, "_VALID_TOPICS", set())
    for i in range(_validation._VALID_TOPICS_MAX + 10):
        assert check_topic(f"bounded-{i}") == f"bounded-{i}"
    assert len(_validation._VALID_TOPICS) == _validation._VALID_TOPICS_MAX
    assert check_topic("bounded-over") == "bounded-over"
    with pytest.raises(InvalidTopicError):
        check_topic("bounded over")


@pytest.mark.parametrize("field", ["sharding_key", "tags", "keys"])
@pytest.mark.parametrize(
    ("value", "error"),
    [
        ("x" * 65535, None),
        ("x" * 65536, "is over 65535 bytes"),
        ("é" * 32767, None),  # 2 bytes each: 65534
        ("é" * 32768, "is over 65535 bytes"),
        ("\U0001f600" * 16383, None),  # 4 bytes each: 65532
        ("\U0001f600" * 16384, "is over 65535 bytes"),  # 65536 bytes in 16 384 characters
        ("a\x00b", "must not contain NUL characters"),
        ("é\x00", "must not contain NUL characters"),
        (5, "must be a str, not int"),
        (b"k", "must be a str, not bytes"),
    ],
)
def test_text_fields_are_limited_to_65535_utf8_bytes_without_nul(
    field: str, value: object, error: str | None
) -> None:
    what = "key" if field == "keys" else field
    kwargs = {field: [value] if field == "keys" else value}
    if error is None:
        m = Message("orders", b"x", **kwargs)  # type: ignore[arg-type]
        assert getattr(m, field) == ((value,) if field == "keys" else value)
    else:
        with pytest.raises(InvalidMessageError, match=f"^{what} {error}$"):
            Message("orders", b"x", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("field", ["sharding_key", "tags", "keys"])
def test_text_with_a_lone_surrogate_is_refused_with_an_invalid_message_error(field: str) -> None:
    what = "key" if field == "keys" else field
    with pytest.raises(
        InvalidMessageError,
        match=f"^{what} is not UTF-8 text: it holds a lone surrogate at index 2$",
    ):
        Message("orders", b"x", **{field: "ok\ud800"})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("properties", "error"),
    [
        (
            {"a\udc00": "v"},
            "a property name is not UTF-8 text: it holds a lone surrogate at index 1",
        ),
        ({"k": "\ud800"}, "property 'k' is not UTF-8 text: it holds a lone surrogate at index 0"),
        ({"k": "x" * 70_000}, "properties are 70005 bytes encoded, over the limit of 16384"),
    ],
)
def test_a_property_that_cannot_be_encoded_is_refused_with_an_invalid_message_error(
    properties: dict[str, str], error: str
) -> None:
    with pytest.raises(InvalidMessageError, match=f"^{re.escape(error)}$"):
        Message("orders", b"x", properties=properties)


def test_str_subclasses_are_accepted_as_text() -> None:
    class Text(str):
        pass

    m = Message("orders", b"x", sharding_key=Text("k"), tags=Text("t"), keys=[Text("a")])
    assert (m.sharding_key, m.tags, m.keys) == ("k", "t", ("a",))
    with pytest.raises(InvalidMessageError, match="NUL"):
        Message("orders", b"x", sharding_key=Text("a\x00"))


@pytest.mark.parametrize(
    ("keys", "expected"),
    [((), ()), ("k", ("k",)), (["a", "b"], ("a", "b")), (("a",), ("a",)), (iter(["g"]), ("g",))],
)
def test_keys_become_a_tuple(keys: object, expected: tuple[str, ...]) -> None:
    m = Message("orders", b"x", keys=keys)  # type: ignore[arg-type]
    assert m.keys == expected and type(m.keys) is tuple


def test_bodies_of_other_bytes_types_are_copied_to_bytes() -> None:
    data = bytearray(b"ab")
    m = Message("orders", data)  # type: ignore[arg-type]
    data[0] = ord("z")
    assert m.body == b"ab" and type(m.body) is bytes
    assert Message("orders", memoryview(b"abcd")[::2]).body == b"ac"  # type: ignore[arg-type]


def test_each_message_has_its_own_properties_dict() -> None:
    given = {"k": "v"}
    a, b = Message("orders", b"x", properties=given), Message("orders", b"x", properties=given)
    assert a.properties is not given and a.properties is not b.properties
    given["k"] = "changed"
    assert a.properties == {"k": "v"} and a.encoded_properties == encode_properties({"k": "v"})


def test_properties_are_read_only_and_a_new_mapping_is_checked_and_encoded_again() -> None:
    # A change in place was kept in the dict but not in the encoding the send carries:
    # over gRPC the message was stored without it, silently.
    m = Message("orders", b"x", properties={"k": "v"})
    changes = [
        lambda p: p.__setitem__("mine", "1"), lambda p: p.update(mine="1"),
        lambda p: p.setdefault("mine", "1"), lambda p: p.pop("k"), lambda p: p.popitem(),
        lambda p: p.clear(), lambda p: p.__delitem__("k"), lambda p: p.__ior__({"a": "b"}),
    ]  # fmt: skip
    for change in changes:
        with pytest.raises(TypeError, match=r"read-only .* assign a new mapping"):
            change(m.properties)
    empty = Message("orders", b"x")
    with pytest.raises(TypeError, match="read-only"):
        empty.properties["mine"] = "1"  # type: ignore[index]
    assert m.properties == {"k": "v"} and empty.properties == {}
    assert isinstance(m.properties, dict) and json.dumps(m.properties) == '{"k": "v"}'
    m.properties = {**m.properties, "mine": "1"}
    assert m.properties == {"k": "v", "mine": "1"}
    assert m.encoded_properties == encode_properties({"k": "v", "mine": "1"})
    with pytest.raises(InvalidMessageError, match="non-empty str to str"):
        m.properties = {"k": 1}  # type: ignore[dict-item]
    with pytest.raises(InvalidMessageError, match="mapping of str to str, not list"):
        m.properties = [("k", "v")]  # type: ignore[assignment]
    assert m.properties == {"k": "v", "mine": "1"}, "a refused mapping changes nothing"
    m.properties = None
    assert m.properties == {} and m.encoded_properties == b""
    original = Message("o", b"x", properties={"k": "v"})
    copies = [copy.copy(original), copy.deepcopy(original), pickle.loads(pickle.dumps(original))]
    for copied in copies:  # read-only, yet made again whole
        assert copied.properties == {"k": "v"}
        assert copied.encoded_properties == original.encoded_properties
