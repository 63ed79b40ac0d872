"""The frame and record layouts: round trips and rejection of malformed input."""

from __future__ import annotations

import threading

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.records import build_records, check_frames
from sdk import Message, MessageExt, MessageQueue
from sdk._transport.codec import MessageIdGenerator, decode_records, encode_message
from sdk._wire import (
    GRPC_CLIENT_CHANNEL_OPTIONS,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    RecordFormatError,
    decode_properties,
    encode_frame,
    encode_properties,
    iter_records,
)

MSG_ID = bytes(range(16))
NOW_MS = 1_700_000_000_000


def frame(body: bytes = b"body", **kw: object) -> bytes:
    return encode_frame(msg_id=MSG_ID, born_timestamp_ms=1_700_000_000_000, body=body, **kw)  # type: ignore[arg-type]


def stored(
    frames: bytes, first_offset: int = 0, *, topic: bytes = b"orders", queue_id: int = 3
) -> bytes:
    records, _ = build_records(
        frames,
        check_frames(frames, NOW_MS),
        topic=topic,
        queue_id=queue_id,
        first_offset=first_offset,
        store_timestamp_ms=1_700_000_000_123,
        base_position=0,
    )
    return records


def test_properties_round_trip_including_unicode_and_empty_values() -> None:
    props = {"a": "1", "ключ": "значение", "empty": ""}
    assert decode_properties(encode_properties(props)) == props


def test_truncated_properties_are_rejected() -> None:
    data = encode_properties({"key": "value"})
    for cut in range(1, len(data)):
        with pytest.raises(ValueError):
            decode_properties(data[:cut])


def test_frame_to_record_round_trip_keeps_every_field() -> None:
    frames = frame(
        b"\x00\xffbinary",
        tags=b"TagA",
        sharding_key=b"order-1",
        keys=[b"k1", b"k2"],
        properties=encode_properties({"p": "v"}),
    ) + frame(b"second")
    [first, second] = list(iter_records(stored(frames, first_offset=41)))
    assert (first.topic, first.queue_id, first.queue_offset) == ("orders", 3, 41)
    assert first.body == b"\x00\xffbinary"
    assert (first.tags, first.sharding_key, first.keys) == (b"TagA", b"order-1", b"k1\x00k2")
    assert decode_properties(first.properties) == {"p": "v"}
    assert first.msg_id == MSG_ID and first.born_timestamp_ms == 1_700_000_000_000
    assert first.store_timestamp_ms == 1_700_000_000_123
    assert (second.queue_offset, second.body, second.tags) == (42, b"second", b"")


def test_a_flipped_bit_anywhere_in_a_record_fails_its_crc() -> None:
    record = bytearray(stored(frame(b"payload", tags=b"T")))
    for byte in range(8, len(record)):
        damaged = bytearray(record)
        damaged[byte] ^= 0x10
        with pytest.raises(RecordFormatError):
            list(iter_records(bytes(damaged)))


def test_decode_records_reads_records_of_several_topics_and_queues_in_one_buffer() -> None:
    # A pull's records share a topic, and after the first are read in one unpack each;
    # a topic of the same length or another one, or another queue, must not be taken
    # for the previous one.
    parts = [
        (b"orders", 3, frame(b"a", tags=b"T", keys=[b"k"]) + frame(b"b")),
        (b"orderz", 3, frame(b"c", sharding_key=b"s")),
        (b"orders", -1, frame(b"d", properties=encode_properties({"p": "v"}))),
        (b"o", 0, frame(b"e") + frame(b"f")),
        (b"orders", 3, frame(b"g")),
    ]
    records = b"".join(stored(f, 10, topic=t, queue_id=q) for t, q, f in parts)
    messages = decode_records(records, "broker-a")
    expected = list(iter_records(records))
    assert [
        (m.topic, m.queue.topic, m.queue.queue_id, m.queue_offset, m.body) for m in messages
    ] == [(r.topic, r.topic, r.queue_id, r.queue_offset, r.body) for r in expected]
    assert [m.body for m in messages] == [b"a", b"b", b"c", b"d", b"e", b"f", b"g"]
    assert {m.queue.broker_name for m in messages} == {"broker-a"}
    assert (messages[0].tags, messages[0].keys, messages[2].sharding_key) == ("T", ("k",), "s")
    assert messages[3].properties == {"p": "v"} and messages[3].queue.queue_id == -1


def test_decode_records_builds_messages_equal_to_constructed_ones_in_every_field() -> None:
    # decode_records sets MessageExt's fields without its __init__: a field it missed
    # (one added to MessageExt later) would be unset, and the comparison would raise.
    frames = frame(
        b"payload",
        tags=b"TagA",
        sharding_key=b"order-1",
        keys=[b"k1", b"k2"],
        properties=encode_properties({"p": "v"}),
        deliver_at_ms=NOW_MS + 5,
    ) + frame(b"plain")
    first, second = decode_records(stored(frames, 7), "broker-a")
    queue = MessageQueue("orders", "broker-a", 3)
    msg_id = MSG_ID.hex().upper()
    assert first == MessageExt(
        "orders", b"payload", "TagA", ("k1", "k2"), {"p": "v"}, "order-1", msg_id, queue, 7,
        0, NOW_MS, 1_700_000_000_123, NOW_MS + 5,
    )  # fmt: skip
    assert second == MessageExt(
        "orders", b"plain", None, (), {}, None, msg_id, queue, 8, 0, NOW_MS, 1_700_000_000_123
    )
    assert (second.delivery_attempt, second.receipt, second.commit_log_offset) == (0, None, -1)


def test_decode_records_refuses_a_damaged_record_after_good_ones_of_its_topic() -> None:
    good = stored(frame(b"first") + frame(b"second", tags=b"T"))
    second = len(stored(frame(b"first")))
    for byte in range(second, len(good)):
        damaged = bytearray(good)
        damaged[byte] ^= 0x10
        with pytest.raises(RecordFormatError):
            decode_records(bytes(damaged), "b")
    for cut in range(second + 1, len(good)):
        with pytest.raises(RecordFormatError):
            decode_records(good[:cut], "b")


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        (b"", "MALFORMED_FRAME"),
        (frame()[:-1], "MALFORMED_FRAME"),
        (frame() + b"\x01\x02", "MALFORMED_FRAME"),
        (frame(b""), "EMPTY_BODY"),
        (frame(b"x" * (MAX_BODY_BYTES + 1)), "BODY_TOO_LARGE"),
        (frame(properties=b"p" * (MAX_PROPERTIES_BYTES + 1)), "PROPERTIES_TOO_LARGE"),
        (frame(properties=b"\x05\x00ab"), "MALFORMED_FRAME"),
        (frame(tags=b"\xff\xfe"), "MALFORMED_FRAME"),
        (frame(keys=[b"\xc3"]), "MALFORMED_FRAME"),
    ],
)
def test_bad_frames_are_refused_with_a_specific_reason(frames: bytes, reason: str) -> None:
    with pytest.raises(BrokerError) as info:
        check_frames(frames, NOW_MS)
    assert info.value.reason == reason


def test_a_bad_frame_after_good_ones_is_named_by_its_index() -> None:
    with pytest.raises(BrokerError, match="frame 2"):
        check_frames(frame() + frame() + frame(b""), NOW_MS)


@pytest.mark.parametrize(
    ("message", "now_s", "fields"),
    [
        (Message("t", b"body"), 1.5, {"born_timestamp_ms": 1500}),
        (
            Message("t", b"b", sharding_key="o-1", tags="Tag", keys=["k1", "ключ"]),
            2.0,
            {
                "born_timestamp_ms": 2000,
                "sharding_key": b"o-1",
                "tags": b"Tag",
                "keys": [b"k1", "ключ".encode()],
            },
        ),
        (
            Message("t", b"b", keys="k", properties={"p": "v"}, delay_seconds=3),
            10.0,
            {
                "born_timestamp_ms": 10_000,
                "keys": [b"k"],
                "properties": encode_properties({"p": "v"}),
                "deliver_at_ms": 13_000,
            },
        ),
        (
            Message("t", b"b", deliver_at=20.25),
            10.0,
            {"born_timestamp_ms": 10_000, "deliver_at_ms": 20_250},
        ),
    ],
)
def test_encode_message_lays_out_the_frame_encode_frame_describes(
    message: Message, now_s: float, fields: dict[str, object]
) -> None:
    expected = encode_frame(msg_id=MSG_ID, body=message.body, **fields)  # type: ignore[arg-type]
    assert encode_message(message, MSG_ID, now_s) == expected


def test_a_trace_context_joins_the_properties_unless_it_breaks_the_limit() -> None:
    m = Message("t", b"b", properties={"p": "v"})
    with_trace = encode_message(m, MSG_ID, 1.0, {"traceparent": "00-ab"})
    assert with_trace == encode_frame(
        msg_id=MSG_ID, born_timestamp_ms=1000, body=b"b",
        properties=encode_properties({"p": "v", "traceparent": "00-ab"}),
    )  # fmt: skip
    full = Message("t", b"b", properties={"p": "v" * (MAX_PROPERTIES_BYTES - 10)})
    assert encode_message(full, MSG_ID, 1.0, {"traceparent": "00-ab"}) == encode_message(
        full, MSG_ID, 1.0
    )


def test_message_ids_share_a_random_prefix_and_count_from_zero() -> None:
    a, b = MessageIdGenerator(), MessageIdGenerator()
    first = [a.next(), a.next(), *a.take(3), a.next()]
    assert all(len(i) == 16 and i[:8] == first[0][:8] for i in first)
    assert [int.from_bytes(i[8:], "big") for i in first] == [0, 1, 2, 3, 4, 5]
    assert a.take(0) == [] and b.next()[:8] != first[0][:8]


def test_message_ids_taken_from_many_threads_at_once_are_each_taken_once() -> None:
    ids = MessageIdGenerator()
    taken: list[list[bytes]] = [[] for _ in range(8)]

    def take(into: list[bytes]) -> None:
        for n in range(200):
            into.extend(ids.take(n % 7) if n % 2 else [ids.next()])

    threads = [threading.Thread(target=take, args=(t,)) for t in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    counters = sorted(int.from_bytes(i[8:], "big") for got in taken for i in got)
    assert counters == list(range(len(counters)))  # none twice, none skipped


def test_the_frame_of_a_full_message_is_byte_for_byte_the_documented_layout() -> None:
    m = Message(
        "t", b"body", tags="T", keys=["a", "b"], sharding_key="s", properties={"p": "v"},
        delay_seconds=1,
    )  # fmt: skip
    assert encode_message(m, MSG_ID, 1.0) == bytes.fromhex(
        "3e000000"  # length of what follows: 62
        "000102030405060708090a0b0c0d0e0f"  # msg id
        "e803000000000000"  # born 1000 ms
        "d007000000000000"  # deliver at 2000 ms
        "00"  # delay level
        "0100" "0100" "0300" "06000000" "04000000"  # tags, key, keys, properties, body lengths
        "54" "73" "610062" "010070010076" "626f6479"
    )  # fmt: skip


def test_a_client_connection_attempt_gets_seconds_not_the_reconnect_backoff() -> None:
    # gRPC core gives each connection attempt max(its backoff, min_reconnect_backoff_ms):
    # at 100 ms a busy machine's handshake timed out (test_reconnect.py has it for real).
    options = dict(GRPC_CLIENT_CHANNEL_OPTIONS)
    assert options["grpc.min_reconnect_backoff_ms"] >= 2000
    assert options["grpc.initial_reconnect_backoff_ms"] <= 100  # reconnects stay prompt
    assert options["grpc.max_reconnect_backoff_ms"] <= 2000
