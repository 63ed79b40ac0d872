"""sdk._speedups: decoding, frame checks and record layout in C give what Python gives."""

from __future__ import annotations

import string
import struct
import types
from typing import Any

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mockbroker.errors import BrokerError
from mockbroker.store import message_index
from mockbroker.store.consumequeue import ENTRY
from mockbroker.store.records import (
    IdKeyEntries,
    build_records,
    check_frames,
    check_frames_in_python,
    check_usual_parts,
    lay_out_parts,
    lay_out_parts_in_python,
    rebase_entries,
    rebase_entries_in_python,
)
from mockbroker.topics import HALF_PROPERTY
from sdk import Message, MessageExt, MessageQueue
from sdk._accel import speedups
from sdk._crc import crc32
from sdk._transport import codec
from sdk._transport.codec import encode_message, encode_message_in_python, encode_messages
from sdk._wire import (
    FRAME_LEN_PREFIX,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    RECORD_HEAD,
    RECORD_MAGIC,
    RECORD_TAIL,
    RecordFormatError,
    decode_properties,
    encode_frame,
    encode_properties,
)
from sdk.message import SendResult, SendStatus, build_send_results, message_ids_in_python
from sdk.producer import core
from sdk.producer.core import ProducerCore
from sdk.selector import shard_index
from tests.support import assert_decoders_agree

# Each test compares the C build with the Python versions, or tests the C one alone.
pytestmark = pytest.mark.skipif(speedups is None, reason="sdk._speedups was not built")

NOW_MS = 1_700_000_000_000

#: Mostly ASCII, as usual sends are (the C checks take those), sometimes any text.
texts = st.one_of(
    st.text(alphabet=string.ascii_letters + string.digits + "-_.", max_size=12),
    st.text(max_size=12),
)
frames = st.builds(
    lambda msg_id, body, tags, key, keys, props, deliver: encode_frame(
        msg_id=msg_id,
        born_timestamp_ms=NOW_MS - 5,
        body=body,
        tags=tags.encode(),
        sharding_key=key.encode(),
        keys=[k.encode() for k in keys],
        properties=encode_properties(props),
        deliver_at_ms=deliver,
    ),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=1, max_size=64),
    texts,
    texts,
    st.lists(st.text(min_size=1, max_size=6).filter(lambda k: "\0" not in k), max_size=3),
    # Any name but the one stored frames may not carry (hypothesis draws it: it takes
    # string constants from the code under test).
    st.dictionaries(texts.filter(lambda name: name != HALF_PROPERTY), texts, max_size=3),
    st.sampled_from([0, NOW_MS + 1000]),
)
#: Batches of frames, each stored to a topic and queue: a buffer mixing both, as a pull
#: of one topic's queue does not, but decode_records must read.
batches = st.lists(
    st.tuples(
        st.sampled_from(["orders", "orderz", "o", "заказы"]),
        st.integers(min_value=-1, max_value=9),
        st.lists(frames, min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=5,
)


def stored(topic: str, queue_id: int, batch: list[bytes], offset: int) -> bytes:
    data = b"".join(batch)
    records, _ = build_records(
        data, check_frames(data, NOW_MS), topic=topic.encode(), queue_id=queue_id,
        first_offset=offset, store_timestamp_ms=NOW_MS, base_position=0,
    )  # fmt: skip
    return records


def test_the_c_decoder_is_built_and_in_use_here() -> None:
    # `make setup` builds it (a C compiler is there): without it every consumer decodes
    # about four times slower, and the parity tests below would compare Python with itself.
    assert codec._decode_in_c is not None


@settings(max_examples=150, deadline=None)
@given(batches)
def test_any_records_decode_to_the_same_messages_in_c_and_in_python(
    parts: list[tuple[str, int, list[bytes]]],
) -> None:
    records = b"".join(stored(t, q, b, 40 + i) for i, (t, q, b) in enumerate(parts))
    assert_decoders_agree(records)
    messages = codec.decode_records(records, "broker-a")
    assert sum(len(b) for _, _, b in parts) == len(messages)
    first = messages[0]
    assert first.queue == MessageQueue(parts[0][0], "broker-a", parts[0][1])
    assert (first.delivery_attempt, first.receipt, first.commit_log_offset) == (0, None, -1)


def test_every_cut_and_every_flipped_byte_gives_the_same_error_in_c_and_in_python() -> None:
    records = stored("orders", 3, [encode_frame(
        msg_id=bytes(range(16)), born_timestamp_ms=NOW_MS, body=b"body", tags=b"T",
        sharding_key=b"k", keys=[b"a", b"b"], properties=encode_properties({"p": "v"}),
    )] * 2, 0)  # fmt: skip
    for cut in range(len(records)):
        assert_decoders_agree(records[:cut])
    for at in range(len(records)):
        damaged = bytearray(records)
        damaged[at] ^= 0x41
        assert_decoders_agree(bytes(damaged))


@pytest.mark.parametrize("where", ["topic", "tags", "sharding key", "keys", "properties"])
def test_text_that_is_not_utf8_behind_a_good_crc_is_refused_alike(where: str) -> None:
    # What a broken broker could serve: the CRC covers the bytes, not their meaning.
    bad = b"\xff\xfe"
    frame = encode_frame(
        msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"x",
        tags=bad if where == "tags" else b"t",
        sharding_key=bad if where == "sharding key" else b"",
        keys=[bad] if where == "keys" else [],
        properties=b"\x01\x00\xff\x00\x00" if where == "properties" else b"",
    )  # fmt: skip
    records = unchecked_record(frame, b"\xc3" if where == "topic" else b"t")
    with pytest.raises(RecordFormatError, match="record at byte 0 does not decode"):
        codec.decode_records(records, "b")
    assert_decoders_agree(records)


def unchecked_record(frame: bytes, topic: bytes) -> bytes:
    """A record around `frame` with a good CRC, laid out without the broker's checks."""
    tail = RECORD_TAIL.pack(RECORD_MAGIC, 0, 0, NOW_MS, 0, len(topic)) + topic + frame[4:]
    return RECORD_HEAD.pack(RECORD_HEAD.size + len(tail), crc32(tail)) + tail


def test_configure_refuses_a_message_type_whose_fields_differ() -> None:
    speedups: Any = pytest.importorskip("sdk._speedups")

    class Other:
        __slots__ = ("body", "topic")

    with pytest.raises(TypeError, match="slots"):
        speedups.configure(Other, MessageQueue, RecordFormatError, len, decode_properties)
    # the module keeps the configuration it had
    assert codec.decode_records(stored("t", 0, [encode_frame(
        msg_id=bytes(16), born_timestamp_ms=0, body=b"x")], 0), "b")[0].body == b"x"  # fmt: skip
    assert isinstance(codec.decode_records(b"", "b"), list)
    assert MessageExt.__slots__  # the decoder relies on them


# ---------------------------------------------------------------------------- the send path
def check_outcome(check: Any, frames: bytes, **kw: Any) -> object:
    try:
        return check(frames, NOW_MS, **kw)._data
    except BrokerError as exc:
        return (exc.status, exc.reason, exc.message)


any_frames = st.builds(
    lambda msg_id, body, tags, key, keys, props, deliver, level: encode_frame(
        msg_id=msg_id, born_timestamp_ms=NOW_MS, body=body, tags=tags.encode(),
        sharding_key=key.encode(), keys=[k.encode() for k in keys],
        properties=encode_properties(props), deliver_at_ms=deliver, delay_level=level,
    ),
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=8),  # empty bodies are refused
    texts,
    texts,
    st.lists(st.text(min_size=1, max_size=6).filter(lambda k: "\0" not in k), max_size=3),
    st.dictionaries(st.sampled_from(["a", "TRAN_MSG", "ключ", "UNIQ_KEY"]), texts, max_size=2),
    st.sampled_from([0, 0, NOW_MS + 1000, NOW_MS - 10**9]),
    st.sampled_from([0, 0, 0, 3]),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.lists(any_frames, min_size=0, max_size=5).map(b"".join),
    st.integers(0, 3),
    st.one_of(st.none(), st.integers(1, 4)),
    st.one_of(st.none(), st.integers(1, 400)),
    st.booleans(),
    st.integers(0, 40),
)
def test_any_batch_is_checked_alike_in_c_and_in_python(
    frames: bytes,
    first_index: int,
    max_frames: int | None,
    max_bytes: int | None,
    half: bool,
    cut: int,
) -> None:
    for data in (frames, frames[: max(0, len(frames) - cut)]):
        kw = {"first_index": first_index, "max_frames": max_frames, "max_bytes": max_bytes,
              "half": half}  # fmt: skip
        assert check_outcome(check_frames, data, **kw) == check_outcome(
            check_frames_in_python, data, **kw
        )


def usual_batch(key_prefix: str, count: int) -> bytes:
    """`count` frames as the broker's usual send carries them: ASCII text, due now."""
    return b"".join(
        encode_frame(
            msg_id=bytes(16),
            born_timestamp_ms=NOW_MS,
            body=b"x" * 100,
            tags=b"T",
            sharding_key=f"{key_prefix}-{i}".encode(),
            keys=[b"k"],
            properties=encode_properties({"trace": "abc"}),
        )
        for i in range(count)
    )


def test_the_usual_batch_is_checked_in_c() -> None:
    # ASCII tags, keys and properties, due now: the broker's usual send. Falling back to
    # Python for it would cost every send, and nothing else would notice.
    assert speedups is not None
    frames = usual_batch("key", 5)
    data = speedups.scan_frames(
        frames, 0, 0, len(frames), len(frames), MAX_BODY_BYTES, MAX_PROPERTIES_BYTES,
        HALF_PROPERTY, False,
    )  # fmt: skip
    assert data is not None and data == check_frames_in_python(frames, NOW_MS)._data


def frame_count(frames: bytes) -> int:
    """How many frames `frames` holds, by their length prefixes."""
    count = pos = 0
    while pos < len(frames):
        pos += FRAME_LEN_PREFIX.size + FRAME_LEN_PREFIX.unpack_from(frames, pos)[0]
        count += 1
    return count


ascii_texts = st.text(alphabet=string.ascii_letters + string.digits + "-_.", max_size=12)
#: Frames as usual sends carry them (ASCII text, due now), which the C checks take.
usual_frames = st.builds(
    lambda msg_id, body, tags, key, keys, props: encode_frame(
        msg_id=msg_id, born_timestamp_ms=NOW_MS, body=body, tags=tags.encode(),
        sharding_key=key.encode(), keys=[k.encode() for k in keys],
        properties=encode_properties(props),
    ),
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=1, max_size=64),
    ascii_texts,
    ascii_texts,
    st.lists(ascii_texts.filter(bool), max_size=2),
    st.dictionaries(ascii_texts.filter(bool), ascii_texts, max_size=2),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            *[st.lists(usual_frames, min_size=1, max_size=4).map(b"".join)] * 8,
            st.lists(st.one_of(usual_frames, any_frames), max_size=4).map(b"".join),
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(-1, 3),
    st.integers(-40, 80),
)
def test_a_requests_parts_checked_in_one_call_are_checked_as_each_alone(
    parts: list[bytes], frames_over: int, bytes_over: int
) -> None:
    # the limits near the request's own size: within, just within, just over
    max_frames = max(1, sum(map(frame_count, parts)) + frames_over)
    max_bytes = max(1, sum(map(len, parts)) + bytes_over)
    assert speedups is not None
    got = check_usual_parts(parts, max_frames=max_frames, max_bytes=max_bytes)
    # Each part alone: scan_frames takes it (the usual part; checked against Python above)
    scans = [
        speedups.scan_frames(part, 0, 0, len(part), len(part), MAX_BODY_BYTES,
                             MAX_PROPERTIES_BYTES, HALF_PROPERTY, False) if part else None
        for part in parts
    ]  # fmt: skip
    datas = [scan for scan in scans if scan is not None]
    usual = len(datas) == len(parts)
    within = sum(map(len, parts)) <= max_bytes and sum(map(len, datas)) // 6 <= max_frames
    if not (usual and within):
        assert got is None
        return
    assert got is not None
    assert [checked._data for checked in got] == [
        check_outcome(check_frames_in_python, part) for part in parts
    ]


def test_the_usual_request_over_several_queues_is_checked_in_one_call() -> None:
    parts = [usual_batch(f"key-{q}", 3) for q in range(8)]
    got = check_usual_parts(parts, max_frames=24, max_bytes=sum(map(len, parts)))
    assert got is not None, "the usual mixed-key request fell back to a check per part"
    assert [c._data for c in got] == [check_frames_in_python(p, NOW_MS)._data for p in parts]
    # over the limits in all: part by part (which slices them across turns)
    assert check_usual_parts(parts, max_frames=23, max_bytes=10**6) is None
    assert check_usual_parts(parts, max_frames=24, max_bytes=sum(map(len, parts)) - 1) is None
    assert check_usual_parts([*parts, b""], max_frames=99, max_bytes=10**6) is None


@settings(max_examples=100, deadline=None)
@given(batches, st.integers(0, 2), st.booleans())
def test_parts_are_laid_out_alike_in_c_and_in_python(
    parts: list[tuple[str, int, list[bytes]]], reconsume: int, indexed: bool
) -> None:
    laid = []
    for i, (_, queue_id, batch) in enumerate(parts):
        data = b"".join(batch)
        laid.append((data, check_frames(data, NOW_MS), queue_id, 10 * i))
    outcomes = []
    for lay_out in (lay_out_parts, lay_out_parts_in_python):
        into: list[bytes | memoryview] = []
        index = IdKeyEntries() if indexed else None
        entries = lay_out(
            laid, into, topic="заказы".encode(), store_timestamp_ms=NOW_MS,
            base_position=4096, reconsume_times=reconsume, index=index,
        )  # fmt: skip
        found = (index.positions, index.ids, index.keyed) if index is not None else None
        outcomes.append((b"".join(into), entries, found))
    assert outcomes[0] == outcomes[1]
    records = outcomes[0][0]
    assert_decoders_agree(records)
    assert len(codec.decode_records(records, "b")) == sum(len(b) for _, _, b in parts)


# ---------------------------------------------------------------------------- the producer
#: What a Message takes: text without NUL or lone surrogates.
message_texts = st.one_of(
    st.text(alphabet=string.ascii_letters, max_size=12),
    st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=12),
)
messages = st.builds(
    lambda body, tags, key, keys, props, delay: Message(
        "orders", body, tags=tags or None, sharding_key=key or None, keys=keys,
        properties=props, delay_seconds=delay,
    ),
    st.binary(min_size=1, max_size=64),
    st.sampled_from(["", "TagA", "標籤", "a-b_c"]),
    message_texts,
    st.lists(message_texts.filter(bool), max_size=3),
    st.dictionaries(st.sampled_from(["a", "ключ", "UNIQ_KEY"]), message_texts, max_size=2),
    st.sampled_from([None, None, None, 2.5]),
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(messages, min_size=1, max_size=6), st.floats(1.6e9, 1.9e9))
def test_messages_are_encoded_alike_in_c_and_in_python(batch: list[Message], now: float) -> None:
    ids = [bytes([i]) * 16 for i in range(len(batch))]
    expected = [encode_message_in_python(m, i, now) for m, i in zip(batch, ids, strict=True)]
    assert encode_messages(batch, ids, now) == expected
    assert [encode_message(m, i, now) for m, i in zip(batch, ids, strict=True)] == expected


def test_the_usual_message_is_encoded_in_c() -> None:
    assert speedups is not None

    def python_encode(*args: object) -> bytes:
        raise AssertionError(f"encoded in Python: {args}")

    usual = [Message("t", b"body", tags="T", keys=["k"], sharding_key="order-1",
                     properties={"p": "v"}), Message("t", b"x")]  # fmt: skip
    ids = [bytes(16), bytes(range(16))]
    frames = speedups.encode_frames(usual, ids, 1_700_000_000_000, 1.7e9, python_encode)
    assert frames == [
        encode_message_in_python(m, i, 1.7e9) for m, i in zip(usual, ids, strict=True)
    ]


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_the_c_shard_hash_is_murmur3_as_mmh3_computes_it(data: bytes) -> None:
    assert speedups is not None
    assert speedups.shard_hash(data) == mmh3.hash(data, 0, signed=False)


def grouped_in_python(batch: list[Message], count: int) -> dict[int, list[int]]:
    groups: dict[int, list[int]] = {}
    for i, m in enumerate(batch):
        assert m.sharding_key is not None
        groups.setdefault(shard_index(m.sharding_key, count), []).append(i)
    return groups


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(message_texts, st.none()),
            st.sampled_from(["orders"] * 8 + ["refunds"]),
            st.sampled_from([None] * 8 + [2.5]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 12),
)
def test_a_batch_is_grouped_by_queue_in_c_as_shard_index_groups_it_or_handed_back(
    shape: list[tuple[str | None, str, float | None]], count: int
) -> None:
    assert speedups is not None
    batch = [
        Message(topic, b"x", sharding_key=key or None, delay_seconds=delay)
        for key, topic, delay in shape
    ]
    usual = all(
        m.sharding_key is not None
        and m.sharding_key.isascii()
        and m.topic == "orders"
        and m.delay_seconds is None
        for m in batch
    )
    got = speedups.shard_groups(batch, "orders", count)
    if usual:
        assert got is not None
        assert list(got.items()) == list(grouped_in_python(batch, count).items())
    else:
        assert got is None


def test_batches_c_does_not_group_are_handed_back() -> None:
    assert speedups is not None

    class Subclass(Message):
        __slots__ = ()

    keyed = Message("orders", b"x", sharding_key="k")
    assert speedups.shard_groups([keyed], "orders", 0) is None  # shard_index's error
    assert speedups.shard_groups([Subclass("orders", b"x", sharding_key="k")], "orders", 4) is None
    assert (
        speedups.shard_groups([keyed, Message("orders", b"x", deliver_at=2e9)], "orders", 4) is None
    )
    assert speedups.shard_groups([keyed], "orders", 4) == {shard_index("k", 4): [0]}


def test_configuring_a_class_without_the_slots_is_refused_and_changes_nothing() -> None:
    assert speedups is not None

    class Other:
        __slots__ = ("status",)

    for configure in (speedups.configure_results, speedups.configure_encode):
        with pytest.raises(TypeError, match="is not an object slot"):
            configure(Other)
        with pytest.raises(TypeError, match="takes the"):
            configure(1)
    queue = MessageQueue("orders", "b", 0)
    [result] = speedups.send_results(SendStatus.SEND_OK, [bytes(16)], queue, 7, 1)
    assert result == SendResult(SendStatus.SEND_OK, "0" * 32, queue, 7)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.binary(min_size=16, max_size=16), max_size=8),
    st.integers(-1, 2**62),
    st.booleans(),
    st.sampled_from(list(SendStatus)),
)
def test_send_results_are_built_alike_in_c_and_in_python(
    ids: list[bytes], first: int, scheduled: bool, status: SendStatus
) -> None:
    assert speedups is not None
    queue = MessageQueue("orders", "broker-a", 3)
    offsets = [-1] * len(ids) if scheduled else range(first, first + len(ids))
    expected = build_send_results(status, ids, queue, offsets)
    got = speedups.send_results(
        status, ids, queue, -1 if scheduled else first, 0 if scheduled else 1
    )
    assert got == expected
    assert [type(r) for r in got] == [SendResult] * len(ids)
    assert [hash(r) for r in got] == [hash(r) for r in expected]
    with pytest.raises(ValueError, match="16 bytes"):
        speedups.send_results(status, [*ids, b"short"], queue, 0, 1)


def test_laying_out_frames_that_lie_outside_their_bytes_raises_rather_than_reads_past() -> None:
    # CheckedFrames come from the checks; a bad one (a bug) must not read other memory.
    assert speedups is not None
    frames = encode_frame(msg_id=bytes(16), born_timestamp_ms=NOW_MS, body=b"x")
    for start, end in [(4, len(frames) + 1), (4, 20), (-1, len(frames))]:
        with pytest.raises(ValueError, match="outside its frames"):
            speedups.lay_out_parts(
                [(frames, [start, end, 0, 0, 0, 0], 0, 0)], [], b"t", 0, 0, 0, None, None, None
            )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(min_size=16, max_size=16), st.integers(-(2**63), 2**63 - 1))))
def test_id_index_entries_are_packed_alike_in_c_and_in_python(
    entries: list[tuple[bytes, int]],
) -> None:
    assert speedups is not None
    ids, positions = [i for i, _ in entries], [p for _, p in entries]
    assert speedups.pack_id_entries(ids, positions) == message_index._id_entries_in_python(
        ids, positions
    )
    assert message_index._id_entries is speedups.pack_id_entries  # what the index writes with


def test_packing_id_entries_refuses_what_the_index_never_holds() -> None:
    assert speedups is not None
    with pytest.raises(ValueError, match="16 bytes"):
        speedups.pack_id_entries([b"short"], [0])
    with pytest.raises(ValueError, match="one position per id"):
        speedups.pack_id_entries([bytes(16)], [])
    with pytest.raises(OverflowError):
        speedups.pack_id_entries([bytes(16)], [2**63])


INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(INT64, st.integers(-(2**31), 2**31 - 1), INT64)), INT64)
def test_laid_out_entries_are_moved_alike_in_c_and_in_python(
    entries: list[tuple[int, int, int]], delta: int
) -> None:
    assert speedups is not None
    packed = b"".join(ENTRY.pack(*e) for e in entries)
    try:
        expected: bytes | None = rebase_entries_in_python(packed, delta)
    except struct.error:  # a position past 64 bits: C leaves it to Python, which says so
        expected = None
    assert speedups.rebase_entries(packed, delta) == expected
    if expected is not None and delta:
        assert rebase_entries(packed, delta) == expected


def test_moving_entries_past_64_bits_is_refused_as_python_refuses_it() -> None:
    packed = ENTRY.pack(2**63 - 10, 1, 0)
    with pytest.raises(struct.error):
        rebase_entries(packed, 10)
    assert speedups is not None
    with pytest.raises(ValueError, match="20 bytes each"):
        speedups.rebase_entries(packed[:-1], 1)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**64), 2**64)), INT64)
def test_index_positions_are_shifted_alike_in_c_and_in_python(
    positions: list[int], delta: int
) -> None:
    assert speedups is not None
    expected = [p + delta for p in positions]
    fits = all(-(2**63) <= p < 2**63 for p in (*positions, *expected))
    assert speedups.shifted(positions, delta) == (expected if fits else None)
    taken = IdKeyEntries()
    other = IdKeyEntries()
    other.positions, other.ids = positions, [bytes(16)] * len(positions)
    taken.take(other, delta)
    assert taken.positions == expected, "past 64 bits too, by way of Python"


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=8, max_size=8), st.lists(st.integers(0, 2**64 - 1), max_size=40))
def test_message_ids_are_built_alike_in_c_and_in_python(prefix: bytes, numbers: list[int]) -> None:
    assert speedups is not None
    assert speedups.message_ids(prefix, numbers) == message_ids_in_python(prefix, numbers)


def test_a_producer_takes_its_batches_ids_in_c() -> None:
    assert speedups is not None
    transport = types.SimpleNamespace(prepare=encode_message)  # what a core reads at once
    assert ProducerCore(transport)._ids._make is speedups.message_ids  # type: ignore[arg-type]


def test_message_ids_refuse_a_prefix_or_number_out_of_shape() -> None:
    assert speedups is not None
    with pytest.raises(ValueError, match="8 bytes"):
        speedups.message_ids(b"short", [0])
    for number in (-1, 2**64):
        with pytest.raises(OverflowError):
            speedups.message_ids(bytes(8), [number])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(), max_size=30), st.data())
def test_a_batchs_parts_are_picked_and_put_back_alike_in_c_and_in_python(
    items: list[int], data: st.DataObject
) -> None:
    assert speedups is not None
    indexes = data.draw(st.lists(st.integers(0, len(items) - 1), max_size=30)) if items else []
    assert speedups.pick(items, indexes) == core._pick_in_python(items, indexes)
    values = [object() for _ in indexes]
    into_c: list[Any] = [None] * len(items)
    into_python: list[Any] = [None] * len(items)
    speedups.put_at(into_c, indexes, values)
    core._put_at_in_python(into_python, indexes, values)
    assert into_c == into_python
    assert core._pick is speedups.pick and core._put_at is speedups.put_at


def test_picking_and_putting_refuse_an_index_outside_the_list() -> None:
    assert speedups is not None
    for index in (-1, 3, 2**70):
        with pytest.raises((IndexError, OverflowError)):
            speedups.pick([1, 2, 3], [index])
        with pytest.raises((IndexError, OverflowError)):
            speedups.put_at([1, 2, 3], [index], [0])
    with pytest.raises(ValueError, match="one value per index"):
        speedups.put_at([1, 2, 3], [0, 1], [0])
