"""The frame and record layouts: round trips and rejection of malformed input."""

from __future__ import annotations

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.records import build_records, check_frames
from sdk import Message
from sdk._transport.codec import MessageIdGenerator, encode_message
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


def stored(frames: bytes, first_offset: int = 0) -> bytes:
    records, _ = build_records(
        frames,
        check_frames(frames, NOW_MS),
        topic=b"orders",
        queue_id=3,
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
