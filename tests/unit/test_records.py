"""check_frames and build_records against the documented layouts, batch by batch."""

from __future__ import annotations

import zlib
from typing import Any

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.consumequeue import ENTRY
from mockbroker.store.records import (
    _HEADER,
    CheckedFrames,
    IdKeyEntries,
    as_checked,
    build_records,
    check_frames,
    lay_out_parts,
    lay_out_records,
    rebase_entries,
)
from sdk._wire import (
    FRAME_FIELDS,
    FRAME_LEN_PREFIX,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    RECORD,
    RECORD_MAGIC,
    encode_frame,
    encode_properties,
    iter_records,
)

NOW_MS = 1_700_000_000_000


def mixed(i: int) -> bytes:
    """Frame i of a batch mixing tags, keys, sharding keys and properties."""
    return encode_frame(
        msg_id=i.to_bytes(16, "big"),
        born_timestamp_ms=NOW_MS - i,
        body=b"body-%d" % i * (1 + i % 4),
        tags=(b"TagA", b"", "Tägé".encode())[i % 3],
        sharding_key=b"key-%04d" % i if i % 2 else b"",
        keys=[b"order-%d" % i, b"k2"][: i % 3],
        properties=encode_properties({"p": str(i)}) if i % 5 == 0 else b"",
    )


def good(i: int) -> bytes:
    return encode_frame(msg_id=i.to_bytes(16, "big"), born_timestamp_ms=NOW_MS, body=b"x" * 100)


def test_the_header_unpack_is_the_prefix_then_frame_fields() -> None:
    assert _HEADER.size == FRAME_LEN_PREFIX.size + FRAME_FIELDS.size
    for i in range(30):
        frame = mixed(i)
        (length,) = FRAME_LEN_PREFIX.unpack_from(frame)
        _id, _born, *rest = FRAME_FIELDS.unpack_from(frame, FRAME_LEN_PREFIX.size)
        assert _HEADER.unpack_from(frame) == (length, *rest)


def test_a_mixed_batch_gives_each_frame_its_own_tag_hash_and_keys() -> None:
    frames = [mixed(i) for i in range(100)]
    checked = check_frames(b"".join(frames), NOW_MS)
    assert len(checked) == 100
    joined = b"".join(frames)
    pos = 0
    for i, (frame, c) in enumerate(zip(frames, checked, strict=True)):
        tags = (b"TagA", b"", "Tägé".encode())[i % 3]
        keys = b"\0".join([b"order-%d" % i, b"k2"][: i % 3])
        assert (c.start, c.end) == (pos + 4, pos + len(frame))
        assert c.tag_hash == (zlib.crc32(tags) if tags else 0)
        assert joined[c.keys_at : c.keys_at + c.keys_len] == keys
        assert c.due_ms == 0
        pos += len(frame)


@pytest.mark.parametrize("topic", [b"t", b"orders", b"x" * 127, b"%RETRY%" + b"g" * 127])
def test_records_and_entries_match_the_documented_layout(topic: bytes) -> None:
    frames = [mixed(i) for i in range(100)]
    joined = b"".join(frames)
    checked = check_frames(joined, NOW_MS)
    records, entries = build_records(
        joined,
        checked,
        topic=topic,
        queue_id=7,
        first_offset=41,
        store_timestamp_ms=NOW_MS + 5,
        base_position=1000,
        reconsume_times=2,
    )
    expected_records, expected_entries = [], []
    position = 1000
    for i, (frame, c) in enumerate(zip(frames, checked, strict=True)):
        size = RECORD.size + len(topic) + len(frame) - 4
        after_crc = RECORD.pack(size, 0, RECORD_MAGIC, 7, 41 + i, NOW_MS + 5, 2, len(topic))[8:]
        after_crc += topic + frame[4:]
        expected_records.append(RECORD.pack(size, zlib.crc32(after_crc), 0, 0, 0, 0, 0, 0)[:8])
        expected_records.append(after_crc)
        expected_entries.append(ENTRY.pack(position, size, c.tag_hash))
        position += size
    assert records == b"".join(expected_records)
    assert entries == b"".join(expected_entries)
    parsed = list(iter_records(records))  # verifies every CRC
    assert [r.queue_offset for r in parsed] == list(range(41, 141))
    assert [r.tags for r in parsed] == [(b"TagA", b"", "Tägé".encode())[i % 3] for i in range(100)]


def lengths_off(frame: bytes) -> bytes:
    return FRAME_LEN_PREFIX.pack(len(frame) - 3) + frame[4:]


@pytest.mark.parametrize(
    ("bad", "reason", "message"),
    [
        (lengths_off(good(57)), "MALFORMED_FRAME", "frame 57: lengths do not add up"),
        (
            encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b""),
            "EMPTY_BODY",
            "frame 57: message body is empty",
        ),
        (
            encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b" * (MAX_BODY_BYTES + 1)),
            "BODY_TOO_LARGE",
            f"frame 57: body is {MAX_BODY_BYTES + 1} bytes, over the limit of {MAX_BODY_BYTES}",
        ),
        (
            encode_frame(
                msg_id=bytes(16),
                born_timestamp_ms=1,
                body=b"b",
                tags=b"\xff",  # the size is checked before the text
                properties=b"p" * (MAX_PROPERTIES_BYTES + 1),
            ),
            "PROPERTIES_TOO_LARGE",
            f"frame 57: properties are {MAX_PROPERTIES_BYTES + 1} bytes, "
            f"over the limit of {MAX_PROPERTIES_BYTES}",
        ),
        (
            encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b", delay_level=19),
            "INVALID_DELIVERY_TIME",
            "frame 57: delay level 19 is outside 1..18",
        ),
        (
            encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b", tags=b"T\xc3"),
            "MALFORMED_FRAME",
            "frame 57: tags are not UTF-8",
        ),
        (
            encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b", keys=[b"k", b"\xe2"]),
            "MALFORMED_FRAME",
            "frame 57: keys are not UTF-8",
        ),
        (
            # UTF-8 only together ("é" split across tags and sharding key): consumers
            # decode each apart, and failed on every pull of the queue.
            encode_frame(
                msg_id=bytes(16), born_timestamp_ms=1, body=b"b", tags=b"\xc3", sharding_key=b"\xa9"
            ),
            "MALFORMED_FRAME",
            "frame 57: tags are not UTF-8",
        ),
        (
            encode_frame(
                msg_id=bytes(16), born_timestamp_ms=1, body=b"b", properties=b"\x05\x00ab"
            ),
            "MALFORMED_FRAME",
            "frame 57: properties: properties truncated in a key",
        ),
    ],
)
def test_a_bad_frame_in_a_batch_is_named_by_its_index(
    bad: bytes, reason: str, message: str
) -> None:
    frames = b"".join([*map(good, range(57)), bad, *map(good, range(58, 100))])
    with pytest.raises(BrokerError) as info:
        check_frames(frames, NOW_MS)
    assert (info.value.reason, info.value.status.name) == (reason, "INVALID_ARGUMENT")
    assert info.value.message == message


def test_a_truncated_last_header_is_named_with_its_byte() -> None:
    frames = b"".join(map(good, range(57)))
    with pytest.raises(BrokerError) as info:
        check_frames(frames + good(57)[:50], NOW_MS)
    assert info.value.message == f"frame 57: header truncated at byte {len(frames)}"


def test_the_half_message_property_is_refused_except_in_a_transactional_send() -> None:
    # Recovery indexes a record carrying it in the half queue (store/recovery.py).
    half = encode_frame(msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"b",
                        properties=encode_properties({"a": "1", "TRAN_MSG": "true"}))  # fmt: skip
    with pytest.raises(BrokerError) as info:
        check_frames(good(0) + half, NOW_MS)
    assert (info.value.reason, info.value.message) == (
        "INVALID_ARGUMENT",
        "frame 1: the property TRAN_MSG is reserved for transactional messages "
        "(send them with sdk.TransactionProducer)",
    )
    assert len(check_frames(half, NOW_MS, half=True)) == 1


def test_text_is_checked_per_frame_not_across_frames() -> None:
    # Each half of a two-byte character, in two frames, is invalid on its own.
    first = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b", tags=b"\xc3")
    second = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"b", tags=b"\xa9")
    with pytest.raises(BrokerError, match="frame 0: tags"):
        check_frames(first + second, NOW_MS)


def test_checked_frames_are_columns_that_read_as_one_checked_frame_each() -> None:
    frames = [mixed(i) for i in range(10)]
    frames.insert(3, encode_frame(msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"later",
                                  deliver_at_ms=NOW_MS + 60_000))  # fmt: skip
    joined = b"".join(frames)
    checked = check_frames(joined, NOW_MS)
    assert isinstance(checked, CheckedFrames) and len(checked) == 11
    one_by_one = list(checked)
    assert [c.start for c in one_by_one] == checked.starts
    assert [c.end for c in one_by_one] == checked.ends
    assert [c.tag_hash for c in one_by_one] == checked.tag_hashes
    assert [c.keys_at for c in one_by_one] == checked.keys_at
    assert [c.keys_len for c in one_by_one] == checked.keys_lens
    assert [c.due_ms for c in one_by_one] == [0, 0, 0, NOW_MS + 60_000] + [0] * 7
    assert checked.scheduled == 1
    assert checked[3] == one_by_one[3] and checked[-1] == one_by_one[-1]
    with pytest.raises(IndexError):
        checked[11]
    assert checked.frame_bytes() == sum(len(f) - FRAME_LEN_PREFIX.size for f in frames)
    # In parts, as the fair store checks a large batch: the parts add up to the whole.
    first = check_frames(joined, NOW_MS, max_frames=4)
    rest = check_frames(joined, NOW_MS, start=first[-1].end, first_index=4)
    first += rest
    assert first == checked and first.scheduled == 1
    assert checked[2:5] == one_by_one[2:5] and as_checked(one_by_one) == checked
    # A plain list of CheckedFrame lays out the same records as the columns.
    kw = dict(topic=b"t", queue_id=1, first_offset=5, store_timestamp_ms=NOW_MS, base_position=9)
    assert build_records(joined, one_by_one, **kw) == build_records(joined, checked, **kw)  # type: ignore[arg-type]


def test_a_batch_laid_out_in_sections_from_position_0_then_moved_is_the_batch_laid_out_whole() -> (
    None
):
    frames = [mixed(i) for i in range(10)]
    joined = b"".join(frames)
    checked = check_frames(joined, NOW_MS)
    kw = dict(topic=b"t", queue_id=1, store_timestamp_ms=NOW_MS)
    whole: list[bytes | memoryview] = []
    whole_index = IdKeyEntries()
    whole_entries = lay_out_records(
        joined,
        checked,
        whole,
        first_offset=5,
        base_position=900,
        index=whole_index,
        **kw,  # type: ignore[arg-type]
    )
    pieces: list[bytes | memoryview] = []
    entries: list[bytes] = []
    index = IdKeyEntries()
    done = size = 0
    while done < len(checked):
        section = checked.section(done, done + 4, max_bytes=1 << 20)
        entries.append(
            lay_out_records(
                joined, section, pieces, first_offset=5 + done, base_position=size,
                index=index, **kw,  # type: ignore[arg-type]
            )
        )  # fmt: skip
        done += len(section)
        size = sum(len(p) for p in pieces)
    moved = IdKeyEntries()
    moved.take(index, 900)
    assert b"".join(pieces) == b"".join(whole)
    assert rebase_entries(b"".join(entries), 900) == whole_entries
    assert rebase_entries(whole_entries, 0) == whole_entries
    assert (moved.positions, moved.ids, moved.keyed) == (
        whole_index.positions,
        whole_index.ids,
        whole_index.keyed,
    )
    assert moved.keyed, "the batch has keyed messages"


def test_batches_laid_out_in_one_call_are_each_batch_s_records_one_after_another() -> None:
    """lay_out_parts (a request's parts, with keys, a plain list of CheckedFrame, a
    retry's reconsume count): each batch's records in its queue from its first offset,
    after the batch before; entries and id/key entries point at them."""
    frames = [mixed(i) for i in range(9)]
    batches = [b"".join(frames[n : n + size]) for n, size in ((0, 3), (3, 1), (4, 5))]
    checked: list[Any] = [check_frames(b, NOW_MS) for b in batches]
    checked[1] = list(checked[1])  # a plain list of CheckedFrame, as for a scheduled batch
    laid: list[bytes | memoryview] = []
    index = IdKeyEntries()
    entries = lay_out_parts(
        [(f, c, q, 10 * q) for q, (f, c) in enumerate(zip(batches, checked, strict=True))],
        laid, topic=b"topic", store_timestamp_ms=NOW_MS, base_position=700,
        reconsume_times=2, index=index,
    )  # fmt: skip
    data = b"".join(laid)
    records = list(iter_records(data))
    assert [(r.queue_id, r.queue_offset) for r in records] == [
        (0, 0), (0, 1), (0, 2), (1, 10), (2, 20), (2, 21), (2, 22), (2, 23), (2, 24)
    ]  # fmt: skip
    assert all(r.topic == "topic" and r.reconsume_times == 2 for r in records)
    assert [r.msg_id for r in records] == [i.to_bytes(16, "big") for i in range(9)]
    assert [r.body for r in records] == [b"body-%d" % i * (1 + i % 4) for i in range(9)]
    at = [ENTRY.unpack(e[n : n + ENTRY.size]) for e in entries
          for n in range(0, len(e), ENTRY.size)]  # fmt: skip
    assert [len(e) // ENTRY.size for e in entries] == [3, 1, 5]
    positions = [position for position, _, _ in at]
    assert positions[0] == 700 and sum(size for _, size, _ in at) == len(data)
    for (position, size, _), record in zip(at, records, strict=True):
        assert next(iter_records(data[position - 700 : position - 700 + size])) == record
    assert index.positions == positions
    assert index.ids == [r.msg_id for r in records]
    assert index.keyed == [(p, r.keys) for p, r in zip(positions, records, strict=True) if r.keys]
    assert index.keyed, "the batches have keyed messages"
    unindexed: list[bytes | memoryview] = []
    assert lay_out_parts([(batches[0], checked[0], 0, 0)], unindexed, topic=b"t",
                         store_timestamp_ms=NOW_MS, base_position=0)  # fmt: skip


def test_a_section_of_checked_frames_stops_at_its_byte_budget_but_takes_one_frame() -> None:
    later = encode_frame(msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"x" * 50,
                         deliver_at_ms=NOW_MS + 60_000)  # fmt: skip
    frames = [mixed(0), later, mixed(2), mixed(3)]
    checked = check_frames(b"".join(frames), NOW_MS)
    sizes = [end - start for start, end in zip(checked.starts, checked.ends, strict=True)]
    assert checked.section(1, 3, max_bytes=1 << 20) == checked[1:3]
    assert checked.section(1, 3, max_bytes=1 << 20).scheduled == 1
    assert checked.section(0, 4, max_bytes=sizes[0] + sizes[1]) == checked[0:2]
    assert checked.section(0, 4, max_bytes=sizes[0] + sizes[1] - 1) == checked[0:1]
    assert checked.section(0, 2, max_bytes=sizes[0] + sizes[1]) == checked[0:2], "just fits"
    assert checked.section(0, 4, max_bytes=sizes[0] + sizes[1]).scheduled == 1
    assert checked.section(0, 4, max_bytes=sizes[0]).scheduled == 0
    assert checked.section(2, 4, max_bytes=1) == checked[2:3], "one frame whatever its size"
    assert checked.section(3, 9, max_bytes=1 << 20) == checked[3:4]
