"""Every decoder of bytes fed generated input: mutated valid encodings and random bytes.

Each decoder either returns what a valid input means or raises the project's own error
for it (BrokerError for message frames, RecordFormatError for stored records, ValueError
for properties; corrupt files are refused or set aside as their loader documents), never
IndexError, struct.error, UnicodeDecodeError or MemoryError; and a declared length is
never allocated before it is checked against the bytes that are really there.

Mutations: bit flips, truncation, deletion, duplication, random bytes spliced in, and
integers (huge, negative, zero, near the length) written over length fields; for CRC-
guarded layouts also with the CRCs recomputed afterwards, so that the parsing behind the
CRC check is reached. Rows of the fault suite's table: one per decoder family.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import struct
import tempfile
import tracemalloc
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mockbroker.errors import BrokerError
from mockbroker.lock_manager import RebalanceLockManager
from mockbroker.offsets import ConsumerOffsets
from mockbroker.pop import PopService
from mockbroker.store.checkpoint import (
    Checkpoint,
    read_checkpoint,
    read_positions,
    write_checkpoint,
    write_positions,
)
from mockbroker.store.commitlog import CommitLog
from mockbroker.store.consumequeue import ENTRY, ConsumeQueue
from mockbroker.store.message_store import MessageStore, parse_tag_expression
from mockbroker.store.records import (
    CheckedFrame,
    build_records,
    check_frames,
    check_frames_in_python,
)
from mockbroker.store.recovery import recover
from mockbroker.topics import TopicRegistry
from sdk._transport.codec import decode_records
from sdk._wire import (
    FRAME_FIELDS,
    RECORD,
    RecordFormatError,
    decode_properties,
    encode_frame,
    encode_properties,
    iter_records,
)
from sdk.consumer.local_offsets import LocalFileOffsetStore
from sdk.errors import CorruptFileError, CorruptRecordError, OrderMQError
from sdk.producer.spool import Spool
from sdk.testing import FakeClock
from tests.chaos_report import ChaosRecorder
from tests.fuzzing import fix_crcs, fuzz_settings, mutated
from tests.support import assert_decoders_agree

pytestmark = pytest.mark.chaos

NOW_MS = 1_700_000_000_000
FRAME_REASONS = {
    "MALFORMED_FRAME", "EMPTY_BODY", "BODY_TOO_LARGE", "PROPERTIES_TOO_LARGE",
    "INVALID_DELIVERY_TIME",
}  # fmt: skip


def mixed(i: int) -> bytes:
    """Frame i of a batch mixing tags, keys, sharding keys, properties and a schedule."""
    return encode_frame(
        msg_id=i.to_bytes(16, "big"),
        born_timestamp_ms=NOW_MS - i,
        body=b"body-%d" % i,
        tags=(b"TagA", b"", "Tägé".encode())[i % 3],
        sharding_key=b"key-%d" % i if i % 2 else b"",
        keys=[b"order-%d" % i, "ключ".encode()][: i % 3],
        properties=encode_properties({"p": str(i), "é": "ü"}) if i % 2 == 0 else b"",
    )


FRAMES = b"".join(mixed(i) for i in range(4))
SCHEDULED = encode_frame(
    msg_id=b"s" * 16, born_timestamp_ms=NOW_MS, body=b"later", deliver_at_ms=NOW_MS + 60_000
)


def stored(frames: bytes, topic: bytes = b"orders") -> bytes:
    records, _ = build_records(
        frames, check_frames(frames, NOW_MS), topic=topic, queue_id=1, first_offset=7,
        store_timestamp_ms=NOW_MS, base_position=0,
    )  # fmt: skip
    return records


RECORDS = stored(FRAMES)

#: Frames laid out consistently from arbitrary bytes: what a client that skips the SDK's
#: checks can send (tags, keys and properties that are not UTF-8 or do not parse).
raw_frame_lists = st.lists(
    st.builds(
        lambda body, tags, sharding, keys, props, level: encode_frame(
            msg_id=b"\x01" * 16,
            born_timestamp_ms=NOW_MS,
            body=body,
            tags=tags,
            sharding_key=sharding,
            keys=keys,
            properties=props,
            delay_level=level,
        ),
        st.binary(max_size=8),
        st.binary(max_size=6),
        st.binary(max_size=6),
        st.lists(st.binary(max_size=4), max_size=3),
        st.one_of(
            st.binary(max_size=12),
            st.dictionaries(st.text(max_size=3), st.text(max_size=3)).map(encode_properties),
        ),
        st.sampled_from((0, 0, 0, 1, 18, 19, 255)),
    ),
    min_size=1,
    max_size=3,
)
raw_frames = raw_frame_lists.map(b"".join)


def unchecked_records(frames: list[bytes], topic: bytes = b"t") -> bytes:
    """Records laid out around `frames` as they are, without check_frames."""
    checked, pos = [], 0
    for frame in frames:
        checked.append(CheckedFrame(pos + 4, pos + len(frame), 0))
        pos += len(frame)
    records, _ = build_records(
        b"".join(frames), checked, topic=topic, queue_id=0, first_offset=0,
        store_timestamp_ms=NOW_MS, base_position=0,
    )  # fmt: skip
    return records


def record_row(report: ChaosRecorder, fault: str, rounds: int, note: str) -> None:
    report.record(
        fault=fault, rounds=rounds, acked=0, lost=0, order_violations=0, duplicates=0, note=note
    )


# ---------------------------------------------------------------------------- frames
def check_frames_oracle(data: bytes) -> None:
    """Refused with a frame reason, or stored and read back (broker and SDK) unchanged.

    check_frames (in C for the usual frames, where built) agrees with its Python version.
    """
    reference: object
    try:
        reference = check_frames_in_python(data, NOW_MS)
    except BrokerError as exc:
        reference = exc.message
    try:
        checked = check_frames(data, NOW_MS)
        assert checked == reference
    except BrokerError as exc:
        assert exc.message == reference
        assert exc.status.name == "INVALID_ARGUMENT", exc.status
        assert exc.reason in FRAME_REASONS, exc.reason
        assert exc.message.startswith(("frame ", "the request")), exc.message
        return
    records, entries = build_records(
        data, checked, topic=b"t", queue_id=0, first_offset=0, store_timestamp_ms=NOW_MS,
        base_position=0,
    )  # fmt: skip
    assert len(entries) == ENTRY.size * len(checked)
    parsed = list(iter_records(records))
    consumed = decode_records(records, "b")
    assert len(parsed) == len(consumed) == len(checked)
    for frame, record, message in zip(checked, parsed, consumed, strict=True):
        assert record.body == message.body == data[frame.end - len(record.body) : frame.end]


#: Tags b"\xc3" and sharding key b"\xa9" are UTF-8 together ("é") but not apart: the
#: broker stored such a frame, and every consumer then failed to decode the record.
SPLIT_UTF8 = encode_frame(
    msg_id=b"\x01" * 16, born_timestamp_ms=NOW_MS, body=b"x", tags=b"\xc3", sharding_key=b"\xa9"
)


def test_message_frames_are_refused_with_a_reason_or_stored_and_read_back(
    chaos_report: ChaosRecorder,
) -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(300, 20_000)
    @example(SPLIT_UTF8)
    @given(
        st.one_of(st.sampled_from((FRAMES, SCHEDULED)).flatmap(mutated), raw_frames, st.binary())
    )
    def run(data: bytes) -> None:
        seen["examples"] += 1
        check_frames_oracle(data)

    run()
    record_row(chaos_report, "fuzz: message frames", seen["examples"], "no crash")


# ---------------------------------------------------------------------------- records
def records_oracle(data: bytes) -> None:
    """Both record decoders raise RecordFormatError (a CorruptRecordError) or agree.

    decode_records (in C where built) also gives what the Python one gives, messages or
    the same error.
    """
    assert_decoders_agree(data)
    outcomes: list[list[tuple[bytes, bytes]] | None] = []
    for decode in (
        lambda: [(r.msg_id, r.body) for r in iter_records(data)],
        lambda: [(bytes.fromhex(m.msg_id), m.body) for m in decode_records(data, "b")],
    ):
        try:
            outcomes.append(decode())
        except RecordFormatError as exc:
            assert isinstance(exc, CorruptRecordError) and isinstance(exc, OrderMQError)
            outcomes.append(None)
    with contextlib.suppress(RecordFormatError):
        list(iter_records(data, verify_crc=False))
    if outcomes[0] is not None and outcomes[1] is not None:
        assert outcomes[0] == outcomes[1]


def bad_text_record(at: str) -> bytes:
    """A record with a good CRC whose `at` is not UTF-8 (what a broken broker could serve)."""
    frame = encode_frame(
        msg_id=b"\x02" * 16, born_timestamp_ms=NOW_MS, body=b"x",
        tags=b"\xff" if at == "tags" else b"t", keys=[b"\xfe"] if at == "keys" else [],
        properties=b"\x01\x00\xff\x00\x00" if at == "properties" else b"",
    )  # fmt: skip
    return unchecked_records([frame], topic=b"\xc3" if at == "topic" else b"t")


records_inputs = st.one_of(
    st.just(RECORDS).flatmap(mutated),
    st.just(RECORDS).flatmap(mutated).map(lambda d: fix_crcs(d, size_includes_head=True)),
    raw_frame_lists.map(unchecked_records),
    st.binary(),
)


def test_stored_records_decode_or_raise_record_format_error(chaos_report: ChaosRecorder) -> None:
    seen: Counter[str] = Counter()

    @fuzz_settings(300, 20_000)
    @example(bad_text_record("topic"))
    @example(bad_text_record("tags"))
    @example(bad_text_record("keys"))
    @example(bad_text_record("properties"))
    @given(records_inputs)
    def run(data: bytes) -> None:
        seen["examples"] += 1
        records_oracle(data)

    run()
    record_row(chaos_report, "fuzz: stored records (SDK, broker)", seen["examples"], "no crash")


def properties_oracle(data: bytes) -> None:
    """Properties decode to text, or raise ValueError (as documented)."""
    try:
        out = decode_properties(data)
    except ValueError:
        return
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in out.items())


def test_properties_decode_or_raise_value_error(chaos_report: ChaosRecorder) -> None:
    seen: Counter[str] = Counter()
    valid = encode_properties({"key": "value", "ключ": "", "": "x"})

    @fuzz_settings(200, 10_000)
    @given(st.one_of(st.just(valid).flatmap(mutated), st.binary()))
    def run(data: bytes) -> None:
        seen["examples"] += 1
        properties_oracle(data)

    run()
    record_row(chaos_report, "fuzz: message properties", seen["examples"], "no crash")


def test_declared_lengths_are_checked_before_anything_is_allocated() -> None:
    huge_frame = bytearray(mixed(0))
    struct.pack_into("<I", huge_frame, 0, 0xFFFF_FFFF)  # the frame's length prefix
    huge_body = bytearray(mixed(0))
    struct.pack_into("<I", huge_body, 4 + FRAME_FIELDS.size - 4, 0xFFFF_FFFF)  # body length
    huge_record = bytearray(RECORDS)
    struct.pack_into("<I", huge_record, 0, 0xFFFF_FFFF)
    huge_topic = fix_crcs(
        bytes(RECORDS[: RECORD.size - 2]) + b"\xff\xff" + bytes(RECORDS[RECORD.size :]),
        size_includes_head=True,
    )
    cases: list[tuple[Callable[[bytes], object], bytes]] = [
        (lambda d: check_frames(d, NOW_MS), bytes(huge_frame)),
        (lambda d: check_frames(d, NOW_MS), bytes(huge_body)),
        (lambda d: list(iter_records(d)), bytes(huge_record)),
        (lambda d: decode_records(d, "b"), bytes(huge_record)),
        (lambda d: list(iter_records(d)), huge_topic),
        (lambda d: decode_records(d, "b"), huge_topic),
        (decode_properties, b"\xff\xff" + b"k" * 10),
    ]
    for decode, data in cases:
        tracemalloc.start()
        try:
            with pytest.raises((BrokerError, ValueError)):
                decode(data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 64 * 1024, (decode, peak)


# ---------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cleanly closed store: 2 topics, tagged and keyed messages, scheduled ones."""
    path = tmp_path_factory.mktemp("template")
    loop = asyncio.new_event_loop()
    store = _store(path)
    store.open()
    loop.run_until_complete(store.start())
    orders, _ = store.create_topic("orders", 2)
    other, _ = store.create_topic("other", 1)
    for i in range(12):
        loop.run_until_complete(store.put((orders, other)[i % 2], i % 3 % (2 - i % 2), mixed(i)))
    loop.run_until_complete(store.close())
    loop.close()
    return path


def _store(path: Path) -> MessageStore:
    return MessageStore(
        path, sync_flush=False, segment_bytes=1 << 20, flush_interval_seconds=60,
        sync_flush_timeout_seconds=5, clock=FakeClock(),
    )  # fmt: skip


@pytest.fixture
def scratch() -> Iterator[Callable[[Path], Path]]:
    """Fresh copies of a directory, one per hypothesis example."""
    with tempfile.TemporaryDirectory() as root:
        n = Counter[str]()

        def copy(src: Path) -> Path:
            n["copies"] += 1
            dst = Path(root) / str(n["copies"])
            shutil.copytree(src, dst)
            return dst

        yield copy


def read_everything(store: MessageStore, *, crafted: bool) -> int:
    """Every read the broker serves, over every queue; how many records came back.

    Only refusals with a status (BrokerError) may come out, and what is served verifies:
    it decodes, unless the damage was crafted to keep every CRC good (then decoding it may
    raise RecordFormatError, which consumers handle like DATA_LOSS).
    """
    served = 0

    def decoded(records: bytes) -> int:
        try:
            return len(list(iter_records(records)))
        except RecordFormatError:
            if not crafted:
                raise
            return 0

    tags = (None, parse_tag_expression("TagA"), parse_tag_expression("nothing"))
    for topic in store.topics.all():
        for qid in range(topic.queue_count):
            cq = store.queue(topic, qid)
            expect_status(store.last_store_timestamp_ms, topic, qid)
            expect_status(store.offset_for_timestamp, topic, qid, NOW_MS)
            for offset in range(cq.min_offset - 1, cq.max_offset + 2):
                for tag in tags:
                    got = expect_status(
                        store.get, topic, qid, offset, max_messages=3, max_bytes=1 << 20, tags=tag
                    )
                    if got is not None:
                        served += decoded(got.records)
                record = expect_status(store.read_record, topic, qid, offset)
                if record is not None:
                    assert decoded(record) in (0, 1)
    for i in range(14):
        for found in (store.find_by_id(i.to_bytes(16, "big")), store.find_by_key("orders", "k")):
            assert all(decoded(r) == 1 for r in found)
    return served


def expect_status(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`call`'s answer; None when it refused with DATA_LOSS or OUT_OF_RANGE."""
    try:
        return call(*args, **kwargs)
    except BrokerError as exc:
        assert exc.status.name in ("DATA_LOSS", "OUT_OF_RANGE"), exc.status
        return None


def queue_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "consumequeue").rglob("*") if p.is_file())


STORE_FILES = ("commitlog/00000000000000000000", "consumequeue/orders/0",
               "consumequeue/orders/1", "consumequeue/other/0", "index/ids", "index/keys",
               "checkpoint")  # fmt: skip


def test_store_files_damaged_anywhere_are_recovered_or_refused_per_read(
    template: Path, scratch: Callable[[Path], Path], chaos_report: ChaosRecorder
) -> None:
    """A damaged commit log, consume queue, id or key index, or checkpoint: the store
    opens (recovering when the last run crashed), and every read answers with records
    that verify or with DATA_LOSS, never an unexpected exception."""
    seen: Counter[str] = Counter()

    @fuzz_settings(80, 3000)
    @given(
        st.sampled_from(STORE_FILES),
        st.booleans(),
        st.booleans(),
        st.data(),
    )
    def run(name: str, crashed: bool, fix: bool, data: st.DataObject) -> None:
        seen["examples"] += 1
        path = scratch(template)
        target = path / name
        content = data.draw(mutated(target.read_bytes(), max_steps=3), label="content")
        crafted = fix and name.startswith("commitlog")
        if crafted:
            content = fix_crcs(content, size_includes_head=True)
        target.write_bytes(content)
        if crashed:
            (path / "running").touch()
        store = _store(path)
        store.open()
        try:
            # Recovery adds at most one entry per record the commit log can hold.
            log_bytes = (path / STORE_FILES[0]).stat().st_size
            most = log_bytes // (RECORD.size + FRAME_FIELDS.size) * ENTRY.size
            assert queue_bytes(path) <= queue_bytes(template) + most
            read_everything(store, crafted=crafted)
        finally:
            asyncio.run(store.close())

    run()
    record_row(chaos_report, "fuzz: store files (log, queues, indexes)", seen["examples"],
               "no crash")  # fmt: skip


def test_recovery_of_a_damaged_log_never_indexes_more_than_the_log_holds(
    tmp_path: Path,
) -> None:
    """A record with a good CRC whose queue offset is huge is not a gap of 2**62 offsets."""
    log = CommitLog(tmp_path / "log", 1 << 20)
    log.open()
    record = bytearray(RECORDS[: struct.unpack_from("<I", RECORDS)[0]])
    struct.pack_into("<q", record, 16, 2**62)  # the queue offset
    log.append(fix_crcs(bytes(record), size_includes_head=True))
    cq = ConsumeQueue(tmp_path / "cq")
    tracemalloc.start()
    try:
        recover(log, lambda t, q: cq if (t, q) == ("orders", 1) else None, [cq], 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert cq.count <= 1 and peak < 1 << 20
    cq.close()
    log.close()


def crc_at_end(data: bytes) -> bytes:
    """`data` with its last 4 bytes replaced by the CRC32 of the rest (past the check)."""
    return data[:-4] + struct.pack("<I", zlib.crc32(data[:-4])) if len(data) >= 4 else data


def test_a_checkpoint_of_any_content_reads_as_a_checkpoint_or_position_zero(
    tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    seen: Counter[str] = Counter()
    path = tmp_path / "checkpoint"
    write_checkpoint(path, Checkpoint(123_456, {"orders/0": 3, "orders/1": 0, "%RETRY%g/0": 9}))
    valid = path.read_bytes()
    mutations = st.just(valid).flatmap(mutated)

    @fuzz_settings(150, 8000)
    @given(st.one_of(mutations, mutations.map(crc_at_end), st.binary(max_size=40)))
    def run(data: bytes) -> None:
        seen["examples"] += 1
        path.write_bytes(data)
        checkpoint = read_checkpoint(path)
        assert 0 <= checkpoint.position < 2**64
        counts = checkpoint.counts or {}
        assert all(isinstance(q, str) and 0 <= n < 2**64 for q, n in counts.items())
        assert len(counts) <= len(data) // 10  # each takes 10 bytes or more in the file

    run()
    record_row(chaos_report, "fuzz: checkpoint", seen["examples"], "no crash")


@pytest.mark.parametrize("count", [1, 2], ids=["floor", "schedule-mark"])
def test_a_positions_file_of_any_content_reads_as_its_positions_or_none(
    tmp_path: Path, count: int, chaos_report: ChaosRecorder
) -> None:
    """commitlog/floor holds one position, the schedule-mark two."""
    seen: Counter[str] = Counter()
    path = tmp_path / "positions"
    write_positions(path, (123_456, 7)[:count])
    valid = path.read_bytes()

    @fuzz_settings(100, 5000)
    @given(st.one_of(st.just(valid).flatmap(mutated), st.binary(max_size=30)))
    def run(data: bytes) -> None:
        seen["examples"] += 1
        path.write_bytes(data)
        positions = read_positions(path, count)
        assert positions is None or (
            len(positions) == count and all(0 <= p < 2**64 for p in positions)
        )

    run()
    name = "commitlog/floor" if count == 1 else "schedule-mark"
    record_row(chaos_report, f"fuzz: {name}", seen["examples"], "no crash")


# ---------------------------------------------------------------------------- JSON files
_json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)


def _json_nested(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)


#: Any JSON value, nested up to two levels.
json_values = _json_leaves | _json_nested(_json_leaves | _json_nested(_json_leaves))


@st.composite
def json_near(draw: st.DrawFn, valid: Any) -> bytes:
    """`valid` with one value somewhere replaced by any JSON value; or its text mutated."""
    if draw(st.booleans()):
        return draw(mutated(json.dumps(valid).encode()))
    doc = json.loads(json.dumps(valid))
    node = doc
    while isinstance(node, dict | list) and node:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        key = draw(st.sampled_from(keys))
        if draw(st.booleans()) or not isinstance(node[key], dict | list):
            node[key] = draw(json_values)
            break
        node = node[key]
    return json.dumps(doc).encode()


LOCKS = {"format": 1, "next_epoch": 9, "groups": {"g": [
    {"topic": "orders", "queue": 0, "granted": 5, "owner": "c1"},
    {"topic": "orders", "queue": 1, "granted": 8, "owner": None}]}}  # fmt: skip
OFFSETS = {"offsets": {"g": {"orders": {"0": 3, "1": 0}}, "h": {"%RETRY%h": {"0": 1}}}}
TOPICS = {"topics": {"orders": 2, "%RETRY%h": 1}}
LOCAL_OFFSETS = {"offsets": [{"topic": "orders", "broker": "b", "queue_id": 0, "offset": 4}]}
POP_STATE = {"format": 1, "generation": 0, "state": {"groups": {"g": {
    "fifo": False, "max_attempts": 16, "queues": [["orders", 0, {
        "base": 3, "entries": [[4, "QQ==", 1, 12345, 1_800_000_000_000]],
        "settled": [[5, 99]]}]]}}}}  # fmt: skip
DEEP = b"[" * 3000


def load_locks(path: Path) -> None:
    locks = RebalanceLockManager(FakeClock(), path=path)
    locks.load()  # sets an unreadable file aside: never raises for content
    assert path.exists()


def load_offsets(path: Path) -> None:
    offsets = ConsumerOffsets(path)
    try:
        offsets.load()
    except CorruptFileError as exc:
        assert str(path) in str(exc)
        return
    for group, topic, qid in offsets.committed():
        assert isinstance(group, str) and isinstance(topic, str) and isinstance(qid, int)
        assert (offsets.get(group, topic, qid) or 0) >= 0


def load_topics(path: Path) -> None:
    registry = TopicRegistry(path)
    try:
        registry.load()
    except CorruptFileError as exc:
        assert str(path) in str(exc)
        return
    for topic in registry.all():
        assert 1 <= topic.queue_count <= 1024 and "/" not in topic.name


def load_local_offsets(path: Path) -> None:
    try:
        store = LocalFileOffsetStore(path.parent)
    except CorruptFileError as exc:
        assert str(path) in str(exc)
        return
    assert store.path == path


def bare_pop(directory: Path) -> PopService:
    """A PopService for reading its files only (it reaches no store)."""
    nothing: Any = None
    return PopService(
        directory, store=nothing, offsets=nothing, retry=nothing, holder=nothing,
        clock=FakeClock(), max_in_flight=8, max_attempts=16, commit_interval_seconds=1,
    )  # fmt: skip


def check_pop(pop: PopService) -> None:
    """What a pop state loaded from a file must be: consistent windows a snapshot can hold."""
    json.dumps(pop._state())
    for g in pop._groups.values():
        for window in g.windows.values():
            assert all(o >= window.base for o in window.entries)
            assert window.unleased == sum(1 for e in window.entries.values() if not e.nonce)


def load_pop_state(path: Path) -> None:
    pop = bare_pop(path.parent)
    try:
        pop.journal.open(pop._restore, pop._replay)
    except CorruptFileError as exc:
        assert str(path) in str(exc)
        return
    check_pop(pop)


JSON_FILES: dict[str, tuple[Any, str, Callable[[Path], None]]] = {
    "locks.json": (LOCKS, "locks.json", load_locks),
    "offsets.json": (OFFSETS, "offsets.json", load_offsets),
    "topics.json": (TOPICS, "topics.json", load_topics),
    "consumer offsets.json": (LOCAL_OFFSETS, "offsets.json", load_local_offsets),
    "pop state.json": (POP_STATE, "state.json", load_pop_state),
}


@pytest.mark.parametrize("kind", sorted(JSON_FILES))
def test_json_files_load_or_are_refused_with_a_clear_error(
    kind: str, tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    valid, name, load = JSON_FILES[kind]
    seen: Counter[str] = Counter()
    path = tmp_path / name

    @fuzz_settings(100, 5000)
    @example(DEEP)
    @example(b'{"topics": {"../../escaped": 1}}')  # a topic's queues are directories
    @example(b"\xff\xfe")
    @example(b"")
    @given(st.one_of(json_near(valid), st.binary(max_size=30)))
    def run(data: bytes) -> None:
        seen["examples"] += 1
        for stale in tmp_path.iterdir():
            stale.unlink()
        path.write_bytes(data)
        load(path)

    path.write_bytes(json.dumps(valid).encode())
    load(path)  # the valid file loads
    run()
    record_row(chaos_report, f"fuzz: {kind} on load", seen["examples"], "no crash")


POP_RECORDS = [
    {"op": "lease", "g": "g", "t": "orders", "q": 1, "b": 2, "f": True, "m": 3,
     "e": [[2, "QQ==", 1, 77, 1_800_000_001_000], [3, "", 2, 78, 1_800_000_002_000]]},
    {"op": "change", "g": "g", "t": "orders", "q": 1, "o": 3, "n": 79, "d": 1_800_000_009_000},
    {"op": "settle", "g": "g", "t": "orders", "q": 1, "o": 2, "n": 77, "b": 3},
    {"op": "reset", "g": "h", "t": "orders", "q": 0, "b": 5},
]  # fmt: skip


def journal_line(record: Any) -> bytes:
    text = record if isinstance(record, bytes) else json.dumps(record, separators=(",", ":"))
    raw = text if isinstance(text, bytes) else text.encode()
    return b"%08x %s\n" % (zlib.crc32(raw), raw)


@st.composite
def pop_journals(draw: st.DrawFn) -> bytes:
    """A valid journal with one record changed (CRC made good again), or its bytes mutated."""
    valid = b"".join(journal_line(r) for r in POP_RECORDS)
    if draw(st.booleans()):
        return draw(mutated(valid))
    records = list(POP_RECORDS)
    at = draw(st.integers(0, len(records) - 1))
    changed = draw(json_near(records[at]))  # JSON text, or not even that
    return b"".join(journal_line(changed if i == at else r) for i, r in enumerate(records))


def test_a_pop_journal_replays_or_is_refused_naming_it(
    tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    """A record whose CRC is good but whose content is not a change is refused whole
    (CorruptFileError naming the journal); a torn or damaged one ends the replay."""
    seen: Counter[str] = Counter()
    path = tmp_path / "journal-0.log"

    @fuzz_settings(150, 5000)
    @example(journal_line(POP_RECORDS[0])[:-9])  # torn: never synced, ignored
    @example(journal_line({"op": "lease", "g": "g", "t": "t", "q": 0, "b": 0, "f": False,
                           "m": 1, "e": [[0, "", 1, 2**64, 1]]}))  # fmt: skip
    @given(pop_journals())
    def run(data: bytes) -> None:
        seen["examples"] += 1
        for stale in tmp_path.iterdir():
            stale.unlink()
        path.write_bytes(data)
        pop = bare_pop(tmp_path)
        try:
            pop.journal.open(pop._restore, pop._replay)
        except CorruptFileError as exc:
            assert str(path) in str(exc)
            return
        check_pop(pop)

    path.write_bytes(b"".join(journal_line(r) for r in POP_RECORDS))
    pop = bare_pop(tmp_path)
    pop.journal.open(pop._restore, pop._replay)
    assert pop.journal.replayed == len(POP_RECORDS)  # the valid journal replays whole
    run()
    record_row(chaos_report, "fuzz: pop journal on load", seen["examples"], "no crash")


# ---------------------------------------------------------------------------- spool
@pytest.fixture(scope="module")
def spool_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("spool")

    async def fill() -> None:
        spool = Spool(path)
        spool.open()
        spool.start()
        seqs = await spool.append([("orders", "k", mixed(0)), ("orders", None, mixed(1))])
        await spool.ack(seqs[:1])
        await spool.append([("other", "é", mixed(2))])
        await spool.close()

    asyncio.run(fill())
    return path


def test_a_damaged_spool_opens_with_its_intact_messages_pending(
    spool_template: Path, scratch: Callable[[Path], Path], chaos_report: ChaosRecorder
) -> None:
    seen: Counter[str] = Counter()
    valid = (spool_template / "spool.log").read_bytes()

    @fuzz_settings(150, 5000)
    @example(valid + bytes(8))  # a zero-filled tail, as a file system may leave after a crash
    @example(valid + struct.pack("<II", 1, 0xD202EF8D) + b"\x01")  # a short, CRC-valid payload
    @given(
        st.one_of(
            st.just(valid).flatmap(mutated),
            st.just(valid).flatmap(mutated).map(lambda d: fix_crcs(d, size_includes_head=False)),
        )
    )
    def run(data: bytes) -> None:
        seen["examples"] += 1
        path = scratch(spool_template)
        (path / "spool.log").write_bytes(data)
        spool = Spool(path)
        spool.open()
        pending = spool.take(100)
        assert len(pending) == spool.recovered <= 3
        assert all(isinstance(m.topic, str) and isinstance(m.frame, bytes) for m in pending)
        asyncio.run(spool.close())

    run()
    record_row(chaos_report, "fuzz: producer spool", seen["examples"], "no crash")


def test_a_long_stretch_of_corrupt_offsets_does_not_exhaust_the_stack(
    template: Path, scratch: Callable[[Path], Path]
) -> None:
    """Recovery marks every offset of a damaged stretch corrupt; looking up a time across
    thousands of them used to recurse once per offset (RecursionError: UNKNOWN answers to
    DescribeTopic and QueryQueueOffsets)."""
    path = scratch(template)
    cq_file = path / "consumequeue" / "other" / "0"
    cq_file.write_bytes(cq_file.read_bytes() + ENTRY.pack(0, -1, 0) * 5000)
    store = _store(path)
    store.open()
    try:
        other = store.topics.get("other")
        assert store.last_store_timestamp_ms(other, 0) == NOW_MS
        assert store.offset_for_timestamp(other, 0, NOW_MS + 1) == 5006
    finally:
        asyncio.run(store.close())


def _with_entry(path: Path, name: str, entry: bytes) -> None:
    """Add the newest id index entry; or overwrite the start of a consume queue or log."""
    target = path / name
    old = target.read_bytes()
    target.write_bytes(old + entry if name.startswith("index") else entry + old[len(entry) :])


@pytest.mark.parametrize(
    ("name", "entry"),
    [
        ("consumequeue/orders/0", ENTRY.pack(-(2**63), 115, 0)),  # before the log
        ("consumequeue/orders/0", ENTRY.pack(10**6, 115, 0)),  # past its end
        ("consumequeue/orders/0", ENTRY.pack(0, 0, 0)),  # an empty record
        # The first record is 115 bytes (so says the index); its size field, which the CRC
        # does not cover, says 116: a reader would cut the answer apart wrongly.
        ("commitlog/00000000000000000000", struct.pack("<I", 116)),
        ("index/ids", struct.pack("<16sq", (0).to_bytes(16, "big"), -5)),
        # Inside a record, at 4 zero bytes (a stale entry after a crash cut the log): a
        # record of size 0, which was read as b"" and failed to unpack.
        ("index/ids", struct.pack("<16sq", (0).to_bytes(16, "big"), 12)),
    ],
)
def test_index_entries_that_point_at_no_record_are_refused_as_corrupt(
    template: Path, scratch: Callable[[Path], Path], name: str, entry: bytes
) -> None:
    path = scratch(template)
    _with_entry(path, name, entry)
    store = _store(path)
    store.open()
    try:
        orders = store.topics.get("orders")
        if not name.startswith("index"):
            # Offset 0 is never served: refused as corrupt, or (an entry before the log's
            # start) dropped at open like those retention deleted.
            got = expect_status(store.get, orders, 0, 0, max_messages=3, max_bytes=1 << 20)
            assert got is None or got.status == "OFFSET_ILLEGAL"
            assert expect_status(store.read_record, orders, 0, 0) is None
        else:
            assert [len(list(iter_records(r))) for r in store.find_by_id(bytes(16))] == [1]
        read_everything(store, crafted=False)
    finally:
        asyncio.run(store.close())
