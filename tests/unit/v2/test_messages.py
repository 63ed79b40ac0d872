"""RocketMQ 5 (v2) messages <-> ordermq frames and records: what survives, both ways."""

from __future__ import annotations

import gzip
import hashlib
import zlib

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker.fronts.v2.messages import from_ms, timestamp_ms, to_frame, to_v2
from mockbroker.fronts.v2.status import V2Error
from mockbroker.store.records import build_records, check_frames
from sdk._remoting.message_ids import SocketAddress
from sdk._remoting.translate import msg_id_for_uniq_key, to_record
from sdk._wire import (
    MAX_BODY_BYTES,
    StoredRecord,
    decode_properties,
    encode_frame,
    encode_properties,
    iter_records,
)

NOW_MS = 1_700_000_000_000
V2_ID = "0102FC0000000126DF0B16580600000001"  # rocketmq-python-client's layout
STORE_HOST = "127.0.0.1:8090"


def stored(frame: bytes, topic: str = "orders", queue_id: int = 3, offset: int = 7) -> StoredRecord:
    """The frame stored as the broker stores it, read back."""
    records, _ = build_records(
        frame, check_frames(frame, NOW_MS), topic=topic.encode(), queue_id=queue_id,
        first_offset=offset, store_timestamp_ms=NOW_MS + 1, base_position=4096,
    )  # fmt: skip
    [record] = iter_records(records)
    return record


def message(**system: object) -> v2.Message:
    """A message as rocketmq-python-client 5.1.2 builds one, with `system` overridden."""
    props: dict[str, object] = {
        "message_id": V2_ID,
        "message_type": v2.NORMAL,
        "born_timestamp": Timestamp(seconds=NOW_MS // 1000 - 1),
        "born_host": "10.0.0.9",
        "body_encoding": v2.IDENTITY,
        "tag": "TagA",
        "keys": ["k1", "k2"],
    }
    props.update(system)
    body = props.pop("body", b"hello")
    user = props.pop("user", {"color": "red"})
    return v2.Message(
        topic=v2.Resource(name="orders"),
        user_properties=user,
        system_properties=v2.SystemProperties(**{k: v for k, v in props.items() if v is not None}),
        body=body,
    )


def refused(msg: v2.Message) -> V2Error:
    with pytest.raises(V2Error) as caught:
        to_frame(msg, now_ms=NOW_MS)
    return caught.value


def test_a_normal_message_becomes_ordermq_fields_and_properties() -> None:
    out = to_frame(message(trace_context="00-abc-01"), now_ms=NOW_MS)
    assert (out.message_id, out.message_group, out.scheduled) == (V2_ID, "", False)
    record = stored(out.frame)
    assert record.msg_id == msg_id_for_uniq_key(V2_ID)
    assert (record.tags, record.keys, record.body) == (b"TagA", b"k1\x00k2", b"hello")
    assert (record.sharding_key, record.deliver_at_ms, record.delay_level) == (b"", 0, 0)
    assert record.born_timestamp_ms == NOW_MS - 1000
    assert decode_properties(record.properties) == {
        "color": "red",
        "UNIQ_KEY": V2_ID,
        "__rmq.bornHost": "10.0.0.9:0",
        "TRACE_CONTEXT": "00-abc-01",
    }


def test_served_back_it_is_the_message_that_was_sent() -> None:
    sent = message(trace_context="00-abc-01")
    served = to_v2(stored(to_frame(sent, now_ms=NOW_MS).frame), store_host=STORE_HOST)
    sp = served.system_properties
    assert served.topic.name == "orders" and served.body == b"hello"
    assert dict(served.user_properties) == {"color": "red"}
    assert (sp.message_id, sp.tag, list(sp.keys)) == (V2_ID, "TagA", ["k1", "k2"])
    assert (sp.message_type, sp.born_host, sp.trace_context) == (v2.NORMAL, "10.0.0.9", "00-abc-01")
    assert timestamp_ms(sp.born_timestamp) == NOW_MS - 1000
    assert timestamp_ms(sp.store_timestamp) == NOW_MS + 1
    assert (sp.store_host, sp.queue_id, sp.queue_offset) == (STORE_HOST, 3, 7)
    assert not sp.HasField("message_group") and not sp.HasField("delivery_timestamp")
    assert sp.body_encoding == v2.IDENTITY
    assert sp.body_digest == v2.Digest(
        type=v2.MD5, checksum=hashlib.md5(b"hello").hexdigest().upper()
    )


def test_a_fifo_message_group_is_the_sharding_key_both_ways() -> None:
    out = to_frame(message(message_type=v2.FIFO, message_group="order-42"), now_ms=NOW_MS)
    assert out.message_group == "order-42"
    record = stored(out.frame)
    assert record.sharding_key == b"order-42"
    sp = to_v2(record, store_host=STORE_HOST).system_properties
    assert (sp.message_type, sp.message_group) == (v2.FIFO, "order-42")


def test_an_ordermq_message_is_served_with_its_own_id_and_its_sharding_key_as_group() -> None:
    msg_id = bytes(range(16))
    frame = encode_frame(
        msg_id=msg_id, born_timestamp_ms=NOW_MS, body=b"from ordermq", tags=b"T",
        sharding_key=b"user-7", keys=[b"a"], properties=b"",
    )  # fmt: skip
    served = to_v2(stored(frame), store_host=STORE_HOST)
    sp = served.system_properties
    assert sp.message_id == msg_id.hex().upper()
    assert (sp.message_type, sp.message_group, sp.tag, list(sp.keys)) == (
        v2.FIFO, "user-7", "T", ["a"],
    )  # fmt: skip
    assert sp.born_host == "" and dict(served.user_properties) == {}


def test_an_ordermq_style_message_id_is_stored_as_the_message_id_itself() -> None:
    native = bytes(range(16)).hex().upper()
    record = stored(to_frame(message(message_id=native), now_ms=NOW_MS).frame)
    assert record.msg_id == bytes(range(16))
    assert "UNIQ_KEY" not in decode_properties(record.properties)
    assert to_v2(record, store_host=STORE_HOST).system_properties.message_id == native


def test_the_remoting_front_sees_the_same_message() -> None:
    record = stored(to_frame(message(), now_ms=NOW_MS).frame)
    seen = to_record(record, physical_offset=0, store_host=SocketAddress.parse(STORE_HOST))
    assert seen.properties["UNIQ_KEY"] == V2_ID
    assert (seen.properties["TAGS"], seen.properties["KEYS"]) == ("TagA", "k1 k2")
    assert str(seen.born_host) == "10.0.0.9:0"


def test_a_host_name_as_born_host_is_kept_as_it_is() -> None:
    record = stored(to_frame(message(born_host="builder-7"), now_ms=NOW_MS).frame)
    assert decode_properties(record.properties)["__rmq.bornHost"] == "builder-7"
    assert to_v2(record, store_host=STORE_HOST).system_properties.born_host == "builder-7"


def test_an_ipv6_born_host_survives() -> None:
    record = stored(to_frame(message(born_host="::1"), now_ms=NOW_MS).frame)
    assert decode_properties(record.properties)["__rmq.bornHost"] == "[::1]:0"
    assert to_v2(record, store_host=STORE_HOST).system_properties.born_host == "::1"


def test_a_delay_message_is_scheduled_at_its_delivery_time() -> None:
    due = NOW_MS + 60_000
    out = to_frame(message(message_type=v2.DELAY, delivery_timestamp=from_ms(due)), now_ms=NOW_MS)
    assert out.scheduled
    record = stored(out.frame)
    assert record.deliver_at_ms == due
    sp = to_v2(record, store_host=STORE_HOST).system_properties
    assert sp.message_type == v2.DELAY and timestamp_ms(sp.delivery_timestamp) == due


def test_python_client_5_1_2_milliseconds_in_the_seconds_field_are_read_as_milliseconds() -> None:
    due = NOW_MS + 60_000
    quirky = Timestamp(seconds=due)  # what rocketmq-python-client 5.1.2 writes
    assert timestamp_ms(quirky) == due
    assert timestamp_ms(Timestamp(seconds=due // 1000, nanos=500_000_000)) == due + 500
    out = to_frame(message(message_type=v2.DELAY, delivery_timestamp=quirky), now_ms=NOW_MS)
    assert stored(out.frame).deliver_at_ms == due


def test_a_message_without_a_type_is_typed_by_its_fields() -> None:
    typed = to_frame(message(message_type=None, message_group="g"), now_ms=NOW_MS)
    assert typed.message_group == "g"
    delayed = to_frame(
        message(message_type=None, delivery_timestamp=from_ms(NOW_MS + 1000)), now_ms=NOW_MS
    )
    assert delayed.scheduled


def test_a_message_without_born_time_is_born_now() -> None:
    record = stored(to_frame(message(born_timestamp=None), now_ms=NOW_MS).frame)
    assert record.born_timestamp_ms == NOW_MS


def test_a_gzip_body_is_stored_plain() -> None:
    body = b"x" * 10_000
    sent = message(body=gzip.compress(body), body_encoding=v2.GZIP)
    record = stored(to_frame(sent, now_ms=NOW_MS).frame)
    assert record.body == body
    assert to_v2(record, store_host=STORE_HOST).system_properties.body_encoding == v2.IDENTITY


@pytest.mark.parametrize(
    ("body", "code", "words"),
    [
        (b"not gzip at all", v2.MESSAGE_CORRUPTED, "does not inflate"),
        (gzip.compress(b"y" * 100, mtime=0)[:-12], v2.MESSAGE_CORRUPTED, "truncated"),
        (gzip.compress(b"\0" * (MAX_BODY_BYTES + 1)), v2.MESSAGE_BODY_TOO_LARGE, "inflates"),
    ],
)
def test_a_gzip_body_that_does_not_inflate_within_the_limit_is_refused(
    body: bytes, code: int, words: str
) -> None:
    error = refused(message(body=body, body_encoding=v2.GZIP))
    assert error.code == code and words in error.message


def test_a_gzip_bomb_is_not_inflated_past_the_limit() -> None:
    bomb = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    body = bomb.compress(b"\0" * (64 * MAX_BODY_BYTES)) + bomb.flush()
    assert refused(message(body=body, body_encoding=v2.GZIP)).code == v2.MESSAGE_BODY_TOO_LARGE


@pytest.mark.parametrize(
    ("system", "code", "words"),
    [
        ({"message_id": ""}, v2.ILLEGAL_MESSAGE_ID, "no message_id"),
        ({"message_id": "x" * 129}, v2.ILLEGAL_MESSAGE_ID, "over 128"),
        ({"tag": ""}, v2.ILLEGAL_MESSAGE_TAG, "blank"),
        ({"tag": "a|b"}, v2.ILLEGAL_MESSAGE_TAG, "'|'"),
        ({"tag": "a\0b"}, v2.ILLEGAL_MESSAGE_TAG, "'\\x00'"),
        ({"keys": ["ok", " "]}, v2.ILLEGAL_MESSAGE_KEY, "blank"),
        ({"keys": ["a\0b"]}, v2.ILLEGAL_MESSAGE_KEY, "'\\x00'"),
        ({"message_type": v2.FIFO, "message_group": ""}, v2.ILLEGAL_MESSAGE_GROUP, "blank"),
        (
            {"message_type": v2.FIFO},
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "needs a message_group",
        ),
        ({"message_type": v2.DELAY}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "delivery_timestamp"),
        ({"message_group": "g"}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, "send it as FIFO"),
        (
            {"message_type": v2.FIFO, "message_group": "g", "delivery_timestamp": from_ms(NOW_MS)},
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "either a message group",
        ),
        ({"message_type": v2.TRANSACTION}, v2.UNSUPPORTED, "TRANSACTION messages"),
        ({"message_type": v2.PRIORITY, "priority": 3}, v2.UNSUPPORTED, "PRIORITY messages"),
        ({"message_type": v2.LITE, "lite_topic": "x"}, v2.UNSUPPORTED, "LITE messages"),
        ({"user": {"UNIQ_KEY": "x"}}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "'UNIQ_KEY' is reserved"),
        ({"user": {"TAGS": "x"}}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "reserved"),
        ({"user": {"__rmq.flag": "1"}}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "reserved"),
        ({"user": {"": "x"}}, v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "empty name"),
    ],
)
def test_what_cannot_be_stored_is_refused_with_its_own_code(
    system: dict[str, object], code: int, words: str
) -> None:
    error = refused(message(**system))
    assert error.code == code, (v2.Code.Name(error.code), error.message)
    assert words in error.message


def test_reserved_and_field_properties_written_by_others_are_not_served_as_user_properties() -> (
    None
):
    props = encode_properties({"__rmq.flag": "3", "TAGS": "t", "DELAY": "2", "mine": "1"})
    frame = encode_frame(msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"b", properties=props)
    assert dict(to_v2(stored(frame), store_host=STORE_HOST).user_properties) == {"mine": "1"}


def test_a_dead_letter_names_where_it_came_from() -> None:
    props = encode_properties({"ORIGIN_TOPIC": "orders"})
    frame = encode_frame(msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"b", properties=props)
    sp = to_v2(stored(frame, topic="%DLQ%g1"), store_host=STORE_HOST).system_properties
    assert sp.dead_letter_queue == v2.DeadLetterQueue(
        topic="orders", message_id=bytes(16).hex().upper()
    )
