"""MessageStore on a temporary directory: appends, reads, statuses, flush failure."""

from __future__ import annotations

import asyncio
import errno
import os
import struct
import threading
import zlib
from pathlib import Path

import pytest

from mockbroker.errors import BrokerError
from mockbroker.long_polling import PullHolder
from mockbroker.store import consumequeue as consumequeue_module
from mockbroker.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from mockbroker.store.consumequeue import CORRUPT_SIZE, ENTRY
from mockbroker.store.message_store import Batch, MessageStore, parse_tag_expression
from mockbroker.topics import Topic
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock


def frames(*bodies: bytes, tags: bytes = b"") -> bytes:
    return b"".join(
        encode_frame(msg_id=i.to_bytes(16, "big"), born_timestamp_ms=1, body=b, tags=tags)
        for i, b in enumerate(bodies)
    )


def make_store(path: Path, *, sync: bool = False, segment: int = 1 << 20) -> MessageStore:
    return MessageStore(
        path,
        sync_flush=sync,
        segment_bytes=segment,
        flush_interval_seconds=0.05,
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
    )


def opened(loop: asyncio.AbstractEventLoop, path: Path, **kw: object) -> MessageStore:
    store = make_store(path, **kw)  # type: ignore[arg-type]
    store.open()
    loop.run_until_complete(store.start())
    return store


def bodies(data: bytes) -> list[bytes]:
    return [r.body for r in iter_records(data)]


def test_offsets_are_dense_from_zero_per_queue(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 2)
    r1 = loop.run_until_complete(store.put(topic, 0, frames(b"a", b"b")))
    r2 = loop.run_until_complete(store.put(topic, 1, frames(b"x")))
    r3 = loop.run_until_complete(store.put(topic, 0, frames(b"c")))
    assert [(r.first_offset, r.count) for r in (r1, r2, r3)] == [(0, 2), (0, 1), (2, 1)]
    got = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (got.status, got.next_offset, got.max_offset) == ("FOUND", 3, 3)
    assert bodies(got.records) == [b"a", b"b", b"c"]
    assert [r.store_timestamp_ms for r in iter_records(got.records)] == [1_700_000_000_000] * 3
    loop.run_until_complete(store.close())


def test_pull_statuses_follow_rocketmq(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    empty = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (empty.status, empty.next_offset) == ("NO_NEW_MESSAGE", 0)
    loop.run_until_complete(store.put(topic, 0, frames(b"a", b"b", b"c")))
    at_max = store.get(topic, 0, 3, max_messages=10, max_bytes=1 << 20)
    assert (at_max.status, at_max.next_offset) == ("NO_NEW_MESSAGE", 3)
    beyond = store.get(topic, 0, 9, max_messages=10, max_bytes=1 << 20)
    assert (beyond.status, beyond.next_offset) == ("OFFSET_ILLEGAL", 3)
    below = store.get(topic, 0, -1, max_messages=10, max_bytes=1 << 20)
    assert (below.status, below.next_offset) == ("OFFSET_ILLEGAL", 0)
    limited = store.get(topic, 0, 1, max_messages=1, max_bytes=1 << 20)
    assert (limited.status, limited.next_offset, bodies(limited.records)) == ("FOUND", 2, [b"b"])
    loop.run_until_complete(store.close())


def test_max_bytes_bounds_a_pull_but_serves_at_least_one(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    loop.run_until_complete(store.put(topic, 0, frames(*[b"x" * 1000] * 10)))
    one = store.get(topic, 0, 0, max_messages=10, max_bytes=10)
    assert (one.count, one.next_offset) == (1, 1)
    some = store.get(topic, 0, 0, max_messages=10, max_bytes=3500)
    assert 1 < some.count < 10 and some.next_offset == some.count
    loop.run_until_complete(store.close())


def test_tag_filtering_skips_without_losing_the_place(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    for tag, body in [(b"A", b"1"), (b"B", b"2"), (b"A", b"3"), (b"C", b"4")]:
        loop.run_until_complete(store.put(topic, 0, frames(body, tags=tag)))
    only_c = parse_tag_expression("C")
    found = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20, tags=only_c)
    assert (found.status, bodies(found.records), found.next_offset) == ("FOUND", [b"4"], 4)
    a_or_b = parse_tag_expression(" A||B ")
    got = store.get(topic, 0, 0, max_messages=2, max_bytes=1 << 20, tags=a_or_b)
    assert (bodies(got.records), got.next_offset) == ([b"1", b"2"], 2)
    none = store.get(
        topic, 0, 3, max_messages=10, max_bytes=1 << 20, tags=parse_tag_expression("Z")
    )
    assert (none.status, none.next_offset) == ("NO_MATCHED_MESSAGE", 4)
    loop.run_until_complete(store.close())


@pytest.mark.parametrize(
    "expression", ["A ||", "|| B", "A || * ", "A||||B", "TagA | TagB", "TagA,TagB", "A|||B"]
)
def test_malformed_tag_expressions_are_refused(expression: str) -> None:
    with pytest.raises(BrokerError) as info:
        parse_tag_expression(expression)
    assert info.value.reason == "INVALID_TAG_EXPRESSION"


def test_reads_span_segment_rolls_and_survive_a_clean_reopen(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path, segment=1 << 20)
    topic, _ = store.create_topic("t", 1)
    batch = [os.urandom(100_000) for _ in range(5)]
    for _ in range(5):
        loop.run_until_complete(store.put(topic, 0, frames(*batch)))
    assert len(list((tmp_path / "commitlog").iterdir())) > 1
    loop.run_until_complete(store.close())
    assert not (tmp_path / "running").exists()

    again = opened(loop, tmp_path)
    assert not again.recovery.crashed
    topic2 = again.topics.get("t")
    got = again.get(topic2, 0, 0, max_messages=100, max_bytes=32 << 20)
    assert bodies(got.records) == batch * 5
    loop.run_until_complete(again.close())


def test_queue_out_of_range_is_refused(loop: asyncio.AbstractEventLoop, tmp_path: Path) -> None:
    store = opened(loop, tmp_path)
    topic = Topic("t", 2)
    store.create_topic("t", 2)
    with pytest.raises(BrokerError) as info:
        loop.run_until_complete(store.put(topic, 2, frames(b"a")))
    assert info.value.reason == "INVALID_QUEUE"
    loop.run_until_complete(store.close())


def test_after_a_failed_fsync_nothing_is_acknowledged(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opened(loop, tmp_path, sync=True)
    topic, _ = store.create_topic("t", 1)
    loop.run_until_complete(store.put(topic, 0, frames(b"durable")))

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)
    with pytest.raises(BrokerError) as first:
        loop.run_until_complete(store.put(topic, 0, frames(b"not acknowledged")))
    assert (first.value.reason, first.value.status.name) == ("FLUSH_FAILED", "DATA_LOSS")
    monkeypatch.undo()  # even once fsync works again, the store stays read-only
    with pytest.raises(BrokerError) as later:
        loop.run_until_complete(store.put(topic, 0, frames(b"refused")))
    assert later.value.reason == "STORE_UNAVAILABLE"
    loop.run_until_complete(store.close())
    assert (tmp_path / "running").exists(), "a failed store must not claim a clean shutdown"


def test_sync_mode_shares_one_fsync_among_concurrent_senders(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opened(loop, tmp_path, sync=True)
    topic, _ = store.create_topic("t", 1)
    calls: list[int] = []
    real = os.fdatasync

    def counting(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)

    async def burst() -> None:
        await asyncio.gather(*(store.put(topic, 0, frames(b"m")) for _ in range(50)))

    loop.run_until_complete(burst())
    assert 1 <= len(calls) < 50 / 2, f"{len(calls)} fsyncs for 50 concurrent sends"
    loop.run_until_complete(store.close())


def test_a_batch_with_one_bad_frame_stores_nothing(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    good = [encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"x", keys=[b"k"])] * 100
    bad = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"x", tags=b"\xff")
    end = store.commitlog.end
    with pytest.raises(BrokerError) as info:
        loop.run_until_complete(store.put(topic, 0, b"".join([*good[:57], bad, *good[58:]])))
    assert info.value.message == "frame 57: tags are not UTF-8"
    assert (store.commitlog.end, store.queue(topic, 0).count) == (end, 0)
    assert [(tmp_path / "index" / f).stat().st_size for f in ("ids", "keys")] == [0, 0]
    assert store.find_by_key("t", "k") == []
    loop.run_until_complete(store.close())


def test_batches_for_several_queues_are_one_commit_log_write_in_the_order_given(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 3)
    appends: list[int] = []
    real_append = store.commitlog.append

    def counting(data: bytes) -> int:
        appends.append(len(data))
        return real_append(data)

    monkeypatch.setattr(store.commitlog, "append", counting)
    requested = [(0, frames(b"a0", b"a1")), (2, frames(b"c0")), (0, frames(b"a2"))]
    written = store.write_parts(topic, [Batch(q, f, store.check(f)) for q, f in requested])
    assert len(appends) == 1
    assert [(w.first_offset, w.count) for w in written] == [(0, 2), (0, 1), (2, 1)]
    assert {w.end for w in written} == {store.commitlog.end}
    assert store.stats.messages_stored == 4

    def read(queue_id: int) -> list[tuple[int, int, bytes]]:
        got = store.get(topic, queue_id, 0, max_messages=10, max_bytes=1 << 20)
        return [(r.queue_id, r.queue_offset, r.body) for r in iter_records(got.records)]

    assert read(0) == [(0, 0, b"a0"), (0, 1, b"a1"), (0, 2, b"a2")]
    assert read(1) == []
    assert read(2) == [(2, 0, b"c0")]
    assert len(store.find_by_id((1).to_bytes(16, "big"))) == 1  # "a1": indexed by id too
    loop.run_until_complete(store.close())


def test_one_batch_mixing_tagged_and_untagged_messages_filters_by_tag(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    tags = [b"A", b"", b"B", b"", b"A"]
    batch = b"".join(
        encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"%d" % i, tags=t)
        for i, t in enumerate(tags)
    )
    loop.run_until_complete(store.put(topic, 0, batch))
    hashes = [h for _, _, h in store.queue(topic, 0).read(0, 10)]
    assert hashes == [zlib.crc32(t) if t else 0 for t in tags]
    only_a = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20, tags=frozenset([b"A"]))
    assert bodies(only_a.records) == [b"0", b"4"]
    loop.run_until_complete(store.close())


@pytest.mark.parametrize("damage", ["crc", "size field"])
def test_a_read_of_one_stretch_serves_the_records_before_a_corrupt_one(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, damage: str
) -> None:
    """Records are served from the pread in runs: a skipped or corrupt one ends a run.

    The two tags share a CRC32, so the index's tag hashes leave the others in the read.
    """
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    a, b = b"plumless", b"buckeroo"
    assert zlib.crc32(a) == zlib.crc32(b)
    tags = [a, b, a, a, b, a, a]
    batch = b"".join(
        encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"%d" % i, tags=t)
        for i, t in enumerate(tags)
    )
    loop.run_until_complete(store.put(topic, 0, batch))
    position, size, _ = store.queue(topic, 0).entry(5)
    segment = next((store.data_dir / "commitlog").iterdir())
    fd = os.open(segment, os.O_WRONLY)
    try:
        if damage == "crc":
            os.pwrite(fd, b"\xff", position + size - 1)  # the last body byte
        else:  # the CRC does not cover it; the index's size must agree
            os.pwrite(fd, struct.pack("<I", size + 1), position)
    finally:
        os.close(fd)
    only_a = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20, tags=frozenset([a]))
    assert (only_a.status, only_a.count, only_a.next_offset) == ("FOUND", 3, 5)
    assert bodies(only_a.records) == [b"0", b"2", b"3"]
    every = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (every.count, every.next_offset) == (5, 5)
    assert bodies(every.records) == [b"0", b"1", b"2", b"3", b"4"]
    after = store.get(topic, 0, 6, max_messages=10, max_bytes=1 << 20)
    assert bodies(after.records) == [b"6"]
    with pytest.raises(BrokerError) as caught:
        store.get(topic, 0, 5, max_messages=10, max_bytes=1 << 20)
    assert caught.value.reason == "CORRUPT_RECORD"
    loop.run_until_complete(store.close())


def test_messages_are_found_by_id_and_by_each_of_their_keys(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    orders, _ = store.create_topic("orders", 1)
    other, _ = store.create_topic("other", 1)

    def batch(keys: list[list[bytes]], first_id: int) -> bytes:
        return b"".join(
            encode_frame(
                msg_id=(first_id + i).to_bytes(16, "big"),
                born_timestamp_ms=1,
                body=b"m%d" % (first_id + i),
                keys=k,
            )
            for i, k in enumerate(keys)
        )

    loop.run_until_complete(store.put(orders, 0, batch([[b"a"], [], [b"b", b"a"], []], 0)))
    loop.run_until_complete(store.put(other, 0, batch([[b"a"], [b"c"]], 10)))
    loop.run_until_complete(store.put(orders, 0, batch([[], [b"a", b"c"]], 20)))

    def found(records: list[bytes]) -> list[bytes]:
        return [r.body for data in records for r in iter_records(data)]

    assert found(store.find_by_key("orders", "a")) == [b"m21", b"m2", b"m0"]
    assert found(store.find_by_key("orders", "b")) == [b"m2"]
    assert found(store.find_by_key("orders", "c")) == [b"m21"]
    assert found(store.find_by_key("other", "a")) == [b"m10"]
    assert found(store.find_by_key("orders", "zz")) == []
    for i in (0, 1, 3, 11, 20):
        [record] = store.find_by_id(i.to_bytes(16, "big"))
        assert found([record]) == [b"m%d" % i]
    loop.run_until_complete(store.close())


def test_a_scheduled_send_cancelled_during_its_sync_flush_is_still_scheduled(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    from mockbroker.schedule import Scheduler

    store = opened(loop, tmp_path, sync=True)
    scheduler = Scheduler(store, FakeClock())
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    data = encode_frame(msg_id=b"d" * 16, born_timestamp_ms=1, body=b"later", delay_level=1)

    async def cancel_during_flush() -> int:
        scheduling = asyncio.ensure_future(scheduler.schedule(topic, 0, data, store.check(data)))
        await asyncio.sleep(0)  # it stored the record and now waits for the fsync
        assert not scheduling.done()
        scheduling.cancel()  # as a passed deadline or an Exchange cancel would
        with pytest.raises(asyncio.CancelledError):
            await scheduling
        deadline = loop.time() + 5
        while scheduler.pending == 0 and loop.time() < deadline:
            await asyncio.sleep(0.001)  # the fsync completes in a worker thread
        return scheduler.pending

    try:
        assert loop.run_until_complete(cancel_during_flush()) == 1
    finally:
        loop.run_until_complete(store.close())


def test_sync_mode_serves_nothing_before_its_fsync(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path, sync=True)
    topic, _ = store.create_topic("t", 1)
    woken: list[tuple[str, int]] = []
    store.on_append = lambda name, queue_id: woken.append((name, queue_id))

    def get(offset: int) -> tuple[str, int, int]:
        got = store.get(topic, 0, offset, max_messages=10, max_bytes=1 << 20)
        return got.status, got.next_offset, got.max_offset

    async def scenario() -> None:
        await store.append(topic, 0, frames(b"a"), store.check(frames(b"a")))
        data = frames(b"b", b"c")
        appending = asyncio.ensure_future(store.append(topic, 0, data, store.check(data)))
        await asyncio.sleep(0)  # b and c are in the log; their fsync has not run yet
        assert get(0) == ("FOUND", 1, 1), "only a is durable"
        assert get(1) == ("NO_NEW_MESSAGE", 1, 1)
        assert woken == [("t", 0)], "held pulls wake once b and c are synced, not before"
        await appending
        assert get(1) == ("FOUND", 3, 3)
        assert woken == [("t", 0), ("t", 0)]

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(store.close())


def test_sync_mode_wakes_a_held_pull_once_its_message_is_synced_not_before(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only group commits flush: no periodic flush may cover the second append by chance.
    store = MessageStore(
        tmp_path,
        sync_flush=True,
        segment_bytes=1 << 20,
        flush_interval_seconds=3600,
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
    )
    store.open()
    loop.run_until_complete(store.start())
    topic, _ = store.create_topic("t", 2)
    clock = FakeClock()  # never advanced: a held pull ends only when woken
    holder = PullHolder(clock)
    wakes: list[tuple[int, str]] = []

    def notify(name: str, queue_id: int) -> None:
        got = store.get(topic, queue_id, 0, max_messages=10, max_bytes=1 << 20)
        wakes.append((queue_id, got.status))
        holder.notify(name, queue_id)

    store.on_append = notify
    in_fsync, release = threading.Event(), threading.Event()
    real = os.fdatasync

    def first_fsync_waits(fd: int) -> None:
        if not in_fsync.is_set():
            in_fsync.set()
            release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", first_fsync_waits)

    async def held_pull(queue_id: int) -> str:
        """The broker's pull loop: read, and while caught up, wait for a wake-up."""
        while True:
            got = store.get(topic, queue_id, 0, max_messages=10, max_bytes=1 << 20)
            if got.status == "FOUND":
                return got.status
            await holder.wait(("t", queue_id), deadline=clock.now() + 30)

    async def scenario() -> None:
        pull = asyncio.ensure_future(held_pull(1))
        first = asyncio.ensure_future(store.put(topic, 0, frames(b"a")))
        while not in_fsync.is_set():  # the fsync covering a (only) has started
            await asyncio.sleep(0.001)
        second = asyncio.ensure_future(store.put(topic, 1, frames(b"b")))
        await asyncio.sleep(0)  # b is in the log, after the running fsync's target
        release.set()
        await asyncio.gather(first, second)
        assert await asyncio.wait_for(pull, 5) == "FOUND", "the pull must not wait for its deadline"

    try:
        loop.run_until_complete(scenario())
    finally:
        release.set()
        loop.run_until_complete(store.close())
    assert (1, "NO_NEW_MESSAGE") not in wakes, f"queue 1 was woken before b was synced: {wakes}"
    assert (0, "FOUND") in wakes and (1, "FOUND") in wakes


# ---------------------------------------------------------------------- power cuts
def zero_entries(path: Path, first: int, last: int) -> None:
    """A hole where a power cut lost the pages of index entries first..last."""
    with path.open("r+b") as f:
        f.seek(first * ENTRY.size)
        f.write(bytes((last + 1 - first) * ENTRY.size))


def test_recovery_keeps_only_the_index_entries_its_checkpoint_covers(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    # A power cut keeps any subset of the index pages written after the last checkpoint:
    # holes of zeros, and entries torn at a page boundary (here the low bytes of a position
    # lost, so that it points below the checkpoint). None of them may be served.
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    sent = [f"m{i}".encode() for i in range(60)]
    for body in sent[:40]:
        loop.run_until_complete(store.put(topic, 0, frames(body)))
    assert store.flusher is not None
    loop.run_until_complete(store.flusher.flush(checkpoint=True))
    checkpoint = (tmp_path / "checkpoint").read_bytes()
    for body in sent[40:]:
        loop.run_until_complete(store.put(topic, 0, frames(body)))
    later, _ = store.create_topic("u", 1)  # after the checkpoint: its index is all unsynced
    for body in sent[:5]:
        loop.run_until_complete(store.put(later, 0, frames(body)))
    loop.run_until_complete(store.close())
    # What the cut left: the older checkpoint, and damaged index entries past it.
    (tmp_path / "checkpoint").write_bytes(checkpoint)
    (tmp_path / "running").touch()
    index = tmp_path / "consumequeue" / "t" / "0"
    zero_entries(index, 44, 49)
    with index.open("r+b") as f:
        f.seek(52 * ENTRY.size)
        f.write(bytes(3))
    zero_entries(tmp_path / "consumequeue" / "u" / "0", 0, 4)

    again = opened(loop, tmp_path)
    assert again.recovery.crashed and again.recovery.corrupt_records == 0
    got = again.get(again.topics.get("t"), 0, 0, max_messages=100, max_bytes=1 << 20)
    assert bodies(got.records) == sent
    got = again.get(again.topics.get("u"), 0, 0, max_messages=100, max_bytes=1 << 20)
    assert bodies(got.records) == sent[:5]
    loop.run_until_complete(again.close())


@pytest.mark.parametrize("position", [-(2**40), -1])
def test_recovery_opens_past_an_index_entry_marked_corrupt_that_points_before_the_log(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, position: int
) -> None:
    # An entry recovery marked corrupt keeps its record's place, and the next recovery
    # reads that record's size there. A damaged one may name a place before the log
    # (found by the long fuzz of damaged store files): nothing there can reach past the
    # checkpoint, so it moves nothing, and the store opens instead of failing to start.
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    for i in range(10):
        loop.run_until_complete(store.put(topic, 0, frames(f"m{i}".encode())))
    end = store.commitlog.end
    loop.run_until_complete(store.close())
    (tmp_path / "running").touch()
    with (tmp_path / "consumequeue" / "t" / "0").open("r+b") as f:
        f.seek(9 * ENTRY.size)
        f.write(ENTRY.pack(position, CORRUPT_SIZE, 0))

    again = opened(loop, tmp_path)
    assert again.recovery.crashed
    assert again.recovery.replayed_from == end  # from the checkpoint, as if undamaged
    # ... and the entries before it still serve their messages (the start-up's trim below
    # the log's start took the damaged last entry's word that they all point below it).
    got = again.get(again.topics.get("t"), 0, 0, max_messages=9, max_bytes=1 << 20)
    assert bodies(got.records) == [f"m{i}".encode() for i in range(9)]
    with pytest.raises(BrokerError) as lost:
        again.get(again.topics.get("t"), 0, 9, max_messages=1, max_bytes=1 << 20)
    assert lost.value.status.name == "DATA_LOSS"
    loop.run_until_complete(again.close())


def one_frame(msg_id: bytes) -> bytes:
    return encode_frame(msg_id=msg_id, born_timestamp_ms=1, body=b"x")


def test_records_whose_id_index_entries_a_cut_lost_are_found_by_id_after_recovery(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    # The id index is another file than the commit log: a power cut may keep a record and
    # lose its entries (here the last five, and half of the one before). Recovery indexes
    # what it replays again; a lookup answers each record once.
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    assert store.flusher is not None
    loop.run_until_complete(store.flusher.flush(checkpoint=True))
    checkpoint = (tmp_path / "checkpoint").read_bytes()
    ids = [i.to_bytes(16, "big") for i in range(1, 11)]
    for msg_id in ids:
        loop.run_until_complete(store.put(topic, 0, one_frame(msg_id)))
    loop.run_until_complete(store.close())
    (tmp_path / "checkpoint").write_bytes(checkpoint)  # what the cut left
    (tmp_path / "running").touch()
    entries = tmp_path / "index" / "ids"
    with entries.open("r+b") as f:
        f.truncate(entries.stat().st_size - 5 * 24 - 10)

    again = opened(loop, tmp_path)
    assert again.recovery.crashed
    for msg_id in ids:
        assert len(again.find_by_id(msg_id)) == 1, msg_id.hex()
    loop.run_until_complete(again.put(topic, 0, one_frame(bytes(range(16)))))
    assert len(again.find_by_id(bytes(range(16)))) == 1  # the torn entry skews no later one
    loop.run_until_complete(again.close())


@pytest.mark.parametrize("damage", ["zeros", "past the log's end"])
def test_a_damaged_index_entry_is_corrupt_not_an_empty_message_or_a_crash(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, damage: str
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    loop.run_until_complete(store.put(topic, 0, frames(b"a", b"b", b"c")))
    loop.run_until_complete(store.close())
    index = tmp_path / "consumequeue" / "t" / "0"
    if damage == "zeros":
        zero_entries(index, 1, 1)
    else:
        with index.open("r+b") as f:
            f.seek(ENTRY.size)
            f.write(struct.pack("<q", 1 << 40))

    again = opened(loop, tmp_path)
    topic = again.topics.get("t")
    got = again.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (bodies(got.records), got.next_offset) == ([b"a"], 1), "served up to the damage"
    with pytest.raises(BrokerError) as info:
        again.get(topic, 0, 1, max_messages=10, max_bytes=1 << 20)
    assert info.value.reason == "CORRUPT_RECORD"
    with pytest.raises(BrokerError):
        again.read_record(topic, 0, 1)
    loop.run_until_complete(again.close())


def test_a_checkpoint_holds_each_queues_entry_count_and_older_ones_still_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint"
    write_checkpoint(path, Checkpoint(1234, {"t/0": 7, "t/1": 0, "orders-é/15": 99}))
    assert read_checkpoint(path) == Checkpoint(1234, {"t/0": 7, "t/1": 0, "orders-é/15": 99})
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    assert read_checkpoint(path) == Checkpoint(0, None), "a damaged one: replay everything"
    head = struct.pack("<Q", 555)
    path.write_bytes(head + struct.pack("<I", zlib.crc32(head)))  # before entry counts
    assert read_checkpoint(path) == Checkpoint(555, None)
    path.unlink()
    assert read_checkpoint(path) == Checkpoint(0, None)


@pytest.mark.parametrize("hole", ["a whole page", "the rest of a page"])
def test_pages_a_power_cut_lost_end_the_log_like_a_torn_tail(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, hole: str
) -> None:
    # Past the last fsync a disk may keep a later page and lose an earlier one: the lost
    # one reads as zeros. What follows it was never acknowledged in sync mode (nor synced
    # in async mode): recovery cuts the log at the hole rather than calling it corruption.
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    sent = [f"m{i}|".encode() + bytes([65 + i % 26]) * 400 for i in range(60)]
    for body in sent[:10]:
        loop.run_until_complete(store.put(topic, 0, frames(body)))
    assert store.flusher is not None
    loop.run_until_complete(store.flusher.flush(checkpoint=True))
    checkpoint = (tmp_path / "checkpoint").read_bytes()
    ends = []
    for body in sent[10:]:
        loop.run_until_complete(store.put(topic, 0, frames(body)))
        ends.append(store.commitlog.end)
    loop.run_until_complete(store.close())
    (tmp_path / "checkpoint").write_bytes(checkpoint)
    (tmp_path / "running").touch()
    # Zeros from the hole to the end of page 3; the pages after it were written back.
    start = 3 * 4096 if hole == "a whole page" else min(e for e in ends if e > 3 * 4096)
    segment = tmp_path / "commitlog" / f"{0:020d}"
    with segment.open("r+b") as f:
        f.seek(start)
        f.write(bytes(4 * 4096 - start))
    before_hole = [end for end in ends if end <= start]
    whole = 10 + len(before_hole)  # the records before the hole

    again = opened(loop, tmp_path)
    report = again.recovery
    assert (report.corrupt_records, report.skipped_bytes) == (0, 0)
    assert report.truncated_bytes == ends[-1] - before_hole[-1]
    topic = again.topics.get("t")
    got = again.get(topic, 0, 0, max_messages=100, max_bytes=1 << 20)
    assert bodies(got.records) == sent[:whole]
    result = loop.run_until_complete(again.put(topic, 0, frames(b"next")))
    assert result.first_offset == whole
    loop.run_until_complete(again.close())


def test_a_topic_that_runs_out_of_file_descriptors_is_refused_whole_and_clearly(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = opened(loop, tmp_path)
    real_open = consumequeue_module.open_durably
    opened_files: list[Path] = []

    def third_fails(path: Path, flags: int) -> int:
        if len(opened_files) == 2:
            raise OSError(errno.EMFILE, "Too many open files")
        opened_files.append(path)
        return real_open(path, flags)

    with monkeypatch.context() as patched:
        patched.setattr(consumequeue_module, "open_durably", third_fails)
        with pytest.raises(BrokerError) as refused:
            store.create_topic("many", 4)
    assert (refused.value.status.name, refused.value.reason) == (
        "RESOURCE_EXHAUSTED",
        "TOO_MANY_OPEN_FILES",
    )
    assert "ulimit -n" in refused.value.message
    assert store.topics.find("many") is None, "nothing of the topic remains"
    topic, created = store.create_topic("many", 4)  # once descriptors are free again
    assert created and topic.queue_count == 4
    loop.run_until_complete(store.close())
    reopened = opened(loop, tmp_path)
    assert reopened.topics.find("many") == topic
    loop.run_until_complete(reopened.close())


def test_read_at_finds_only_records_their_queue_points_at(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    from mockbroker.store.records import build_records, check_frames

    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("t", 1)
    # A message whose body is a well-formed record of t queue 0 offset 0, CRC and all.
    forged, _ = build_records(
        frames(b"forged"), check_frames(frames(b"forged"), 0), topic=b"t", queue_id=0,
        first_offset=0, store_timestamp_ms=1, base_position=0,
    )  # fmt: skip
    loop.run_until_complete(store.put(topic, 0, frames(forged)))
    position = store.queue(topic, 0).entry(0)[0]
    real = store.read_at(position)
    assert real is not None and bodies(real) == [forged]
    inside = position + len(real) - len(forged)
    assert store.commitlog.read(inside, len(forged)) == forged
    assert store.read_at(inside) is None, "a record inside a body is not a stored message"
    for nowhere in (-1, position + 1, store.commitlog.end, 1 << 40):
        assert store.read_at(nowhere) is None
    loop.run_until_complete(store.close())


def test_read_at_hides_a_waiting_scheduled_message_and_an_unsynced_one(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    from mockbroker.schedule import Scheduler

    store = opened(loop, tmp_path, sync=True)
    scheduler = Scheduler(store, FakeClock())
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    later = encode_frame(msg_id=b"d" * 16, born_timestamp_ms=1, body=b"later", delay_level=1)

    async def scenario() -> None:
        put = await scheduler.schedule_stored(topic, 0, later, store.check(later))
        schedule_queue = store.queue(store.topics.get("rmq_sys_SCHEDULE"), 0)
        assert (put.first_offset, put.count) == (schedule_queue.count - 1, 1)
        waiting_at = schedule_queue.entry(put.first_offset)[0]
        assert store.read_at(waiting_at) is None, "indexed in the schedule queue, not t"
        await store.append(topic, 0, frames(b"a"), store.check(frames(b"a")))
        data = frames(b"b")
        appending = asyncio.ensure_future(store.append(topic, 0, data, store.check(data)))
        await asyncio.sleep(0)  # b is in the log; its fsync has not run yet
        b_at = store.queue(topic, 0).entry(1)[0]
        assert store.read_at(b_at) is None, "not served before its fsync"
        await appending
        assert bodies(store.read_at(b_at) or b"") == [b"b"]

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(store.close())


def test_lookups_by_id_and_key_answer_positions(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("orders", 1)
    data = b"".join(
        encode_frame(msg_id=bytes([i]) * 16, born_timestamp_ms=1, body=b"m%d" % i, keys=[b"k"])
        for i in range(3)
    )
    loop.run_until_complete(store.put(topic, 0, data))
    by_key = list(store.records_by_key("orders", "k"))
    assert [p for p, _ in by_key] == [e[0] for e in reversed(store.queue(topic, 0).read(0, 3))]
    for position, record in by_key:
        assert store.read_at(position) == record
    [(position, record)] = store.records_by_id(bytes([1]) * 16)
    assert bodies(record) == [b"m1"] and store.read_at(position) == record
    assert store.find_by_key("orders", "k", limit=2) == [r for _, r in by_key[:2]]
    loop.run_until_complete(store.close())


def test_queue_files_of_a_creation_cut_off_before_the_registry_was_saved_stay_harmless(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that dies after a new topic's queue files exist but before topics.json
    names it: at the restart the topic does not exist (its creation was never answered),
    the store opens (the files stay, empty: nothing could be sent to the topic), and
    creating the topic again takes them over, each queue starting at offset 0."""
    store = opened(loop, tmp_path)
    kept, _ = store.create_topic("kept", 2)
    loop.run_until_complete(store.put(kept, 1, frames(b"before")))

    def dies(data: bytes, names: list[str], change: str) -> None:
        raise SystemExit("killed between the queue files and the registry's save")

    with monkeypatch.context() as patched:
        patched.setattr(store.topics, "write", dies)
        with pytest.raises(SystemExit):
            store.create_topic("late", 4)
    left = sorted(p.name for p in (tmp_path / "consumequeue" / "late").iterdir())
    assert left == ["0", "1", "2", "3"], "the cut-off creation's queue files are on disk"
    loop.run_until_complete(store.close())

    again = opened(loop, tmp_path)
    assert again.topics.find("late") is None, "a creation never saved does not exist"
    left_sizes = [p.stat().st_size for p in (tmp_path / "consumequeue" / "late").iterdir()]
    assert left_sizes == [0, 0, 0, 0], "left as they were: empty, nothing was sent to them"
    got = again.get(again.topics.get("kept"), 1, 0, max_messages=10, max_bytes=1 << 20)
    assert bodies(got.records) == [b"before"]
    [(late, created)] = loop.run_until_complete(again.create_topics(["late"], 4))
    assert created and late.queue_count == 4
    for queue_id in range(4):
        result = loop.run_until_complete(again.put(late, queue_id, frames(b"q%d" % queue_id)))
        assert result.first_offset == 0
    loop.run_until_complete(again.close())
    reopened = opened(loop, tmp_path)
    late = reopened.topics.get("late")
    for queue_id in range(4):
        got = reopened.get(late, queue_id, 0, max_messages=10, max_bytes=1 << 20)
        assert bodies(got.records) == [b"q%d" % queue_id]
    loop.run_until_complete(reopened.close())
