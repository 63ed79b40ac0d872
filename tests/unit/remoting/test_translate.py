"""RocketMQ messages <-> ordermq frames and records: what survives the trip, both ways."""

from __future__ import annotations

import zlib

import pytest

from mockbroker.store.records import build_records, check_frames
from sdk import Message, MessageQueue
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingError
from sdk._remoting.message_ids import SocketAddress
from sdk._remoting.message_layout import decode_records, encode_record
from sdk._remoting.translate import (
    IncomingMessage,
    compressed,
    encode_served,
    from_frame,
    msg_id_for_uniq_key,
    rocketmq_uniq_key,
    to_frame,
    to_message_ext,
    to_record,
)
from sdk._transport.codec import encode_message
from sdk._wire import (
    StoredRecord,
    decode_properties,
    encode_frame,
    encode_properties,
    iter_records,
)

NOW_MS = 1_700_000_000_000
UNIQ = "7F0000010FA01B6D35860ABCDEF00001"
STORE_HOST = SocketAddress.parse("127.0.0.1:10911")


def stored(frame: bytes, topic: str = "orders", queue_id: int = 2, offset: int = 5) -> StoredRecord:
    """The frame stored as the broker stores it, read back."""
    records, _ = build_records(
        frame, check_frames(frame, NOW_MS), topic=topic.encode(), queue_id=queue_id,
        first_offset=offset, store_timestamp_ms=NOW_MS + 1, base_position=4096,
    )  # fmt: skip
    [record] = iter_records(records)
    return record


def frame_of(message: IncomingMessage, **kwargs: bool) -> bytes:
    return to_frame(message, now_ms=NOW_MS, new_uniq_key=lambda: "0" * 32, **kwargs)


def java_message(**overrides: object) -> IncomingMessage:
    message = IncomingMessage(
        topic="orders",
        body=b"hello",
        properties={
            "TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ, "WAIT": "true", "color": "red",
        },
        flag=7,
        born_timestamp_ms=NOW_MS - 5,
        born_host=SocketAddress.parse("10.0.0.9:53000"),
    )  # fmt: skip
    for name, value in overrides.items():
        setattr(message, name, value)
    return message


def refusal(message: IncomingMessage) -> RemotingError:
    with pytest.raises(RemotingError) as caught:
        frame_of(message)
    return caught.value


def test_a_java_message_becomes_ordermq_fields_and_reserved_properties() -> None:
    record = stored(frame_of(java_message()))
    assert record.msg_id == bytes.fromhex(UNIQ)
    assert (record.tags, record.keys, record.body) == (b"TagA", b"k1\x00k2", b"hello")
    assert record.born_timestamp_ms == NOW_MS - 5
    assert (record.delay_level, record.deliver_at_ms, record.sharding_key) == (0, 0, b"")
    assert decode_properties(record.properties) == {
        "color": "red",
        "__rmq.flag": "7",
        "__rmq.bornHost": "10.0.0.9:53000",
    }


def test_the_same_message_is_served_back_to_rocketmq_as_it_was_sent() -> None:
    record = stored(frame_of(java_message()))
    served = to_record(record, physical_offset=4096, store_host=STORE_HOST)
    assert served.properties == {"UNIQ_KEY": UNIQ, "TAGS": "TagA", "KEYS": "k1 k2", "color": "red"}
    assert (served.flag, str(served.born_host), served.sys_flag) == (7, "10.0.0.9:53000", 0)
    assert (served.topic, served.queue_id, served.queue_offset) == ("orders", 2, 5)
    assert (served.physical_offset, served.store_timestamp_ms) == (4096, NOW_MS + 1)
    assert served.born_timestamp_ms == NOW_MS - 5
    assert served.offset_msg_id == "7F00000100002A9F0000000000001000"


def test_wait_false_and_system_properties_are_kept_verbatim() -> None:
    props = {"WAIT": "false", "MAX_RECONSUME_TIMES": "3", "CLUSTER": "c1", "UNIQ_KEY": UNIQ}
    record = stored(frame_of(java_message(properties=props)))
    served = to_record(record, physical_offset=0, store_host=STORE_HOST).properties
    assert served == {
        "UNIQ_KEY": UNIQ,
        "WAIT": "false",
        "MAX_RECONSUME_TIMES": "3",
        "CLUSTER": "c1",
    }


@pytest.mark.parametrize(
    "foreign",
    ["7f0000010fa01b6d35860abcdef00001", "AC11000200012A9F0000000000000001AC110002", "a-b-c"],
)
def test_a_foreign_uniq_key_is_kept_verbatim_under_a_stable_id(foreign: str) -> None:
    record = stored(frame_of(java_message(properties={"UNIQ_KEY": foreign})))
    assert record.msg_id == msg_id_for_uniq_key(foreign) != msg_id_for_uniq_key(foreign + "x")
    assert len(record.msg_id) == 16
    assert rocketmq_uniq_key(record) == foreign
    served = to_record(record, physical_offset=0, store_host=STORE_HOST)
    assert served.properties["UNIQ_KEY"] == foreign


def test_a_message_without_uniq_key_gets_a_new_one() -> None:
    message = java_message(properties={"TAGS": "T"})
    frame = to_frame(message, now_ms=NOW_MS, new_uniq_key=lambda: "ABCDEF" + "0" * 26)
    record = stored(frame)
    assert rocketmq_uniq_key(record) == "ABCDEF" + "0" * 26
    assert record.msg_id == bytes.fromhex("ABCDEF" + "0" * 26)
    served = to_record(record, physical_offset=0, store_host=STORE_HOST)
    assert served.properties["UNIQ_KEY"] == "ABCDEF" + "0" * 26


def test_a_zlib_body_is_stored_plain() -> None:
    plain = b"compressible " * 1000
    message = java_message(body=zlib.compress(plain, 5), sys_flag=0x301)
    record = stored(frame_of(message))
    assert record.body == plain
    assert to_record(record, physical_offset=0, store_host=STORE_HOST).sys_flag == 0


@pytest.mark.parametrize(
    ("body", "sys_flag", "remark"),
    [
        (b"\x04\x22\x4d\x18", 0x101, "LZ4"),
        (b"not zlib at all", 0x1, "does not inflate"),
        (zlib.compress(b"\0" * (4 * 1024 * 1024 + 1)), 0x1, "more than 4194304 bytes"),
        (b"x", 0x401, "does not define"),
    ],
)
def test_a_body_that_cannot_be_read_is_illegal(body: bytes, sys_flag: int, remark: str) -> None:
    error = refusal(java_message(body=body, sys_flag=sys_flag))
    assert error.code == ResponseCode.MESSAGE_ILLEGAL and remark in error.remark


@pytest.mark.parametrize(
    "message",
    [
        java_message(properties={"TRAN_MSG": "true", "PGROUP": "g"}),
        java_message(properties={"TRAN_MSG": "TRUE"}),
        java_message(sys_flag=0x4),
    ],
)
def test_transactional_messages_are_refused_with_no_permission(message: IncomingMessage) -> None:
    error = refusal(message)
    assert error.code == ResponseCode.NO_PERMISSION and "transactional" in error.remark


def test_reserved_property_names_are_refused() -> None:
    error = refusal(java_message(properties={"__rmq.flag": "1", "__rmq.x": "2"}))
    assert error.code == ResponseCode.MESSAGE_ILLEGAL
    assert "__rmq.flag, __rmq.x" in error.remark


@pytest.mark.parametrize(
    ("delay", "level"), [("3", 3), (" 18 ", 18), ("99", 18), ("0", 0), ("-2", 0)]
)
def test_delay_levels_are_read_and_clamped_as_rocketmq_does(delay: str, level: int) -> None:
    record = stored(frame_of(java_message(properties={"DELAY": delay})))
    assert record.delay_level == level
    served = to_record(record, physical_offset=0, store_host=STORE_HOST).properties
    assert served.get("DELAY") == (str(level) if level else None)


def test_a_dead_lettered_message_loses_its_delay() -> None:
    record = stored(frame_of(java_message(properties={"DELAY": "3"}), unscheduled=True))
    assert record.delay_level == 0


def test_rocketmq5_timer_properties_set_the_delivery_time() -> None:
    later = stored(frame_of(java_message(properties={"TIMER_DELAY_SEC": "30"})))
    assert later.deliver_at_ms == NOW_MS + 30_000
    assert to_record(later, physical_offset=0, store_host=STORE_HOST).properties[
        "TIMER_DELIVER_MS"
    ] == str(NOW_MS + 30_000)
    at = stored(frame_of(java_message(properties={"TIMER_DELIVER_MS": str(NOW_MS + 9)})))
    assert at.deliver_at_ms == NOW_MS + 9
    assert stored(frame_of(java_message(properties={"TIMER_DELAY_MS": "250"}))).deliver_at_ms == (
        NOW_MS + 250
    )


@pytest.mark.parametrize(
    ("props", "remark"),
    [
        ({"DELAY": "soon"}, "DELAY='soon' is not an integer"),
        ({"TIMER_DELIVER_MS": "1", "TIMER_DELAY_SEC": "1"}, "give one of"),
        ({"KEYS": "a\x00b"}, "NUL"),
        ({"big": "x" * 40_000}, "over RocketMQ's limit of 32767"),
        ({"big": "x" * 20_000}, "over its limit of 16384"),
    ],
)
def test_properties_ordermq_cannot_store_are_illegal(props: dict[str, str], remark: str) -> None:
    error = refusal(java_message(properties=props))
    assert error.code == ResponseCode.MESSAGE_ILLEGAL and remark in error.remark


def test_the_sharding_key_travels_as_rocketmq5s_property() -> None:
    record = stored(frame_of(java_message(properties={"__SHARDINGKEY": "order-7"})))
    assert record.sharding_key == b"order-7"
    served = to_record(record, physical_offset=0, store_host=STORE_HOST)
    assert served.properties["__SHARDINGKEY"] == "order-7"


def test_keys_are_split_on_spaces() -> None:
    record = stored(frame_of(java_message(properties={"KEYS": " a  b "})))
    assert record.keys == b"a\x00b"


def grpc_record(properties: dict[str, str], **fields: object) -> StoredRecord:
    frame = encode_frame(
        msg_id=bytes(range(16)),
        born_timestamp_ms=NOW_MS,
        body=b"from grpc",
        properties=encode_properties(properties),
        **fields,  # type: ignore[arg-type]
    )
    return stored(frame)


def test_a_grpc_message_is_served_with_its_fields_as_rocketmq_properties() -> None:
    record = grpc_record(
        {"TAGS": "not the tag", "k": "v", "bad\x01name": "x", "empty": "", "two": "a\x02b"},
        tags=b"TagB",
        keys=[b"k1", b"k 2"],
        sharding_key=b"user-1",
    )
    served = to_record(record, physical_offset=77, store_host=STORE_HOST)
    assert served.properties == {
        "UNIQ_KEY": "000102030405060708090A0B0C0D0E0F",
        "TAGS": "TagB",
        "__SHARDINGKEY": "user-1",
        "KEYS": "k1 k 2",
        "k": "v",
    }
    assert (str(served.born_host), served.flag, served.body) == ("0.0.0.0:0", 0, b"from grpc")


def test_malformed_reserved_properties_from_grpc_are_ignored() -> None:
    record = grpc_record({"__rmq.flag": "x", "__rmq.bornHost": "nowhere", "__rmq.other": "1"})
    served = to_record(record, physical_offset=0, store_host=STORE_HOST)
    assert (served.flag, str(served.born_host)) == (0, "0.0.0.0:0")
    assert set(served.properties) == {"UNIQ_KEY"}


def test_properties_too_big_for_rocketmq_are_left_out_least_important_first() -> None:
    record = grpc_record({"huge": "x" * 16_000, "small": "y"}, tags=b"T" * 20_000)
    served = to_record(record, physical_offset=0, store_host=STORE_HOST)
    assert set(served.properties) == {"UNIQ_KEY", "TAGS", "small"}


def test_retry_topics_carry_both_origin_names() -> None:
    sent = java_message(topic="%RETRY%g", properties={"RETRY_TOPIC": "orders"})
    record = stored(frame_of(sent), topic="%RETRY%g")
    assert decode_properties(record.properties)["ORIGIN_TOPIC"] == "orders"
    dead = stored(frame_of(java_message(topic="%DLQ%g", properties=sent.properties)), "%DLQ%g")
    assert decode_properties(dead.properties)["ORIGIN_TOPIC"] == "orders"
    plain = stored(frame_of(java_message(properties={"RETRY_TOPIC": "orders"})))
    assert "ORIGIN_TOPIC" not in decode_properties(plain.properties)
    ordermq_retry = grpc_record({"ORIGIN_TOPIC": "orders"})
    retried = stored(
        encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b",
                     properties=ordermq_retry.properties),
        topic="%RETRY%g",
    )  # fmt: skip
    served = to_record(retried, physical_offset=0, store_host=STORE_HOST)
    assert served.properties["RETRY_TOPIC"] == "orders"


def test_served_records_carry_their_commit_log_positions() -> None:
    frames = frame_of(java_message()) + frame_of(java_message(body=b"second"))
    records, _ = build_records(
        frames, check_frames(frames, NOW_MS), topic=b"orders", queue_id=1, first_offset=0,
        store_timestamp_ms=NOW_MS, base_position=0,
    )  # fmt: skip
    decoded = decode_records(encode_served(records, [100, 300], STORE_HOST))
    assert [(r.body, r.queue_offset, r.physical_offset) for r in decoded] == [
        (b"hello", 0, 100),
        (b"second", 1, 300),
    ]


# ------------------------------------------------------------------ the client's side
@pytest.mark.parametrize(
    "message",
    [
        Message("t", b"plain"),
        Message("t", b"x" * 5000, tags="T", keys=["k1", "k2"], properties={"a": "b", "c": "d"},
                sharding_key="order-1"),
        Message("t", "значение".encode(), keys="ключ", properties={"имя": "значение"}),
    ],
    ids=["bare", "every-field", "unicode"],
)  # fmt: skip
def test_a_frame_sent_over_remoting_is_stored_as_the_same_frame(message: Message) -> None:
    frame = encode_message(message, bytes(range(16)), 1_700_000_000.5, delay_level=0)
    sent = compressed(from_frame(frame[4:]))
    incoming = IncomingMessage(
        "t", sent.body, sent.properties, sys_flag=sent.sys_flag,
        born_timestamp_ms=sent.born_timestamp_ms,
    )  # fmt: skip
    assert to_frame(incoming, now_ms=0, new_uniq_key=lambda: "unused") == frame


def test_a_delay_level_travels_as_delay_and_a_delivery_time_is_refused() -> None:
    message = Message("t", b"x", delay_seconds=5)
    frame = encode_message(message, bytes(16), 1.0, delay_level=2)
    assert from_frame(frame[4:]).properties["DELAY"] == "2"
    timed = encode_message(Message("t", b"x", delay_seconds=5), bytes(16), 1.0)
    with pytest.raises(ValueError, match="delivery time"):
        from_frame(timed[4:])


def test_a_served_record_becomes_the_message_ext_grpc_would_give() -> None:
    frame = encode_message(
        Message("t", b"body", tags="T", keys=["k1", "k2"], properties={"p": "v"},
                sharding_key="s"),
        bytes(range(16)), 1.0,
    )  # fmt: skip
    record_of_t = stored(frame, topic="t", queue_id=3, offset=7)
    served = to_record(record_of_t, physical_offset=0, store_host=STORE_HOST)
    [record] = decode_records(encode_record(served))
    got = to_message_ext(record, "b")
    assert (got.topic, got.body, got.tags, got.keys, got.properties, got.sharding_key) == (
        "t", b"body", "T", ("k1", "k2"), {"p": "v"}, "s",
    )  # fmt: skip
    assert (got.msg_id, got.queue, got.queue_offset) == (
        bytes(range(16)).hex().upper(), MessageQueue("t", "b", 3), 7,
    )  # fmt: skip
