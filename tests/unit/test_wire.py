"""The frame and record layouts: round trips and rejection of malformed input."""

from __future__ import annotations

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.records import build_records, check_frames
from sdk._wire import (
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
