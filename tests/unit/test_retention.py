"""Retention on a fake clock and a fake disk: what is deleted, what is kept, a full disk."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from mockbroker.errors import BrokerError
from mockbroker.schedule import Scheduler
from mockbroker.store import commitlog as commitlog_module
from mockbroker.store import consumequeue as consumequeue_module
from mockbroker.store.checkpoint import write_positions
from mockbroker.store.consumequeue import ENTRY, ConsumeQueue
from mockbroker.store.message_store import Batch, MessageStore
from mockbroker.store.retention import DiskUsage, RetentionPolicy, file_probe, statvfs_probe
from mockbroker.topics import Topic
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock

HOUR = 3600.0
SEGMENT = 4096
BODY = b"x" * 400  # about 9 records a segment


class FakeDisk:
    """A disk-usage probe whose used share a test sets."""

    def __init__(self) -> None:
        self.ratio = 0.10

    def __call__(self) -> DiskUsage:
        return DiskUsage(1000, int(self.ratio * 1000))


def open_store(
    loop: asyncio.AbstractEventLoop,
    path: Path,
    clock: FakeClock,
    disk: FakeDisk,
    policy: RetentionPolicy | None = None,
) -> MessageStore:
    store = MessageStore(
        path,
        sync_flush=False,
        segment_bytes=SEGMENT,
        flush_interval_seconds=3600,  # checkpoints are taken by the tests
        sync_flush_timeout_seconds=5,
        clock=clock,
        retention=policy or RetentionPolicy(retention_seconds=72 * HOUR),
        disk_probe=disk,
        retention_check_seconds=10**9,  # checks are run by the tests
    )
    store.open()
    loop.run_until_complete(store.start())
    return store


def send(
    loop: asyncio.AbstractEventLoop, store: MessageStore, topic: Topic, n: int, key: bytes = b"k"
) -> None:
    for i in range(n):
        data = encode_frame(
            msg_id=os.urandom(16), born_timestamp_ms=1, body=BODY, keys=[key + b"%d" % i]
        )
        loop.run_until_complete(store.put(topic, 0, data))


def checkpoint(loop: asyncio.AbstractEventLoop, store: MessageStore) -> None:
    assert store.flusher is not None
    loop.run_until_complete(store.flusher.flush(checkpoint=True))


def offsets_served(store: MessageStore, topic: Topic, offset: int, queue_id: int = 0) -> list[int]:
    got = store.get(topic, queue_id, offset, max_messages=10_000, max_bytes=1 << 26)
    return [r.queue_offset for r in iter_records(got.records)]


def test_the_disk_in_use_is_reckoned_as_df_and_rocketmq_do_root_reserved_blocks_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file system of 1 000 blocks: 200 in use, 800 free of which 300 for the broker
    (the other 500 kept for root). In use: 200 of 500, 40% (`df` says so); not 70%,
    which would have the broker delete read segments early (its high ratio: 75%) on a
    disk more than half empty for it."""
    fake = os.statvfs_result((4096, 4096, 1000, 800, 300, 0, 0, 0, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: fake)
    usage = statvfs_probe(tmp_path)()
    assert usage == DiskUsage(total_bytes=500 * 4096, used_bytes=200 * 4096)
    assert usage.ratio == 0.4
    assert usage.free_bytes == 300 * 4096  # what the broker may still write


def test_segments_past_the_age_limit_are_deleted_and_pulls_below_move_to_the_minimum(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 30)  # old: about 3 segments
    clock.advance(24 * HOUR)
    send(loop, store, topic, 30, key=b"young")
    checkpoint(loop, store)
    cq = store.queue(topic, 0)
    segments = len(store.commitlog.segment_bases())

    clock.advance(48 * HOUR - 1)  # the old ones are 72 h old less a second: kept
    assert store.enforce_retention() == 0 and cq.min_offset == 0

    clock.advance(2)
    assert store.enforce_retention() > 0
    assert 20 <= cq.min_offset <= 30, "whole segments go: the one shared with young records stays"
    assert len(store.commitlog.segment_bases()) < segments
    assert store.retention_stats.messages_deleted == cq.min_offset
    assert store.oldest_timestamp_ms() < int(clock.now() * 1000) - 48 * HOUR * 1000

    below = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (below.status, below.next_offset, below.min_offset) == (
        "OFFSET_ILLEGAL", cq.min_offset, cq.min_offset,
    )  # fmt: skip
    assert offsets_served(store, topic, cq.min_offset) == list(range(cq.min_offset, 60))
    with pytest.raises(BrokerError) as deleted:
        store.read_record(topic, 0, cq.min_offset - 1)
    assert deleted.value.reason == "INVALID_OFFSET"
    assert store.find_by_key("t", "k0") == [], "index entries of deleted records are not served"
    assert len(store.find_by_key("t", "young0")) == 1, "the young batch is still there"

    clock.advance(24 * HOUR)  # now everything is past the limit but the active segment
    store.enforce_retention()
    assert cq.min_offset > 30 and cq.max_offset == 60
    loop.run_until_complete(store.close())


def test_minimum_offsets_survive_a_restart_and_a_deletion_cut_short(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 40)
    checkpoint(loop, store)
    clock.advance(73 * HOUR)
    send(loop, store, topic, 1)
    checkpoint(loop, store)
    store.enforce_retention()
    kept = store.queue(topic, 0).min_offset
    assert kept > 0
    loop.run_until_complete(store.close())

    store = open_store(loop, tmp_path, clock, disk)
    assert store.queue(topic, 0).min_offset == kept
    bases = store.commitlog.segment_bases()
    loop.run_until_complete(store.close())

    # A crash after the new floor was written, before any segment was unlinked.
    write_positions(tmp_path / "commitlog" / "floor", (bases[-1],))
    (tmp_path / "running").touch()
    store = open_store(loop, tmp_path, clock, disk)
    cq = store.queue(topic, 0)
    assert store.commitlog.segment_bases() == [bases[-1]]
    assert cq.min_offset == cq.count_before(bases[-1]) and cq.max_offset == 41
    assert offsets_served(store, topic, cq.min_offset) == list(range(cq.min_offset, 41))
    loop.run_until_complete(store.close())


def test_a_consume_queue_frees_the_blocks_of_its_trimmed_head(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "q")
    cq.append(b"".join(ENTRY.pack(i, 100, 0) for i in range(100_000)))
    before = os.stat(tmp_path / "q").st_blocks
    assert cq.trim_below(90_000) == 90_000
    assert os.stat(tmp_path / "q").st_blocks < before / 2
    assert cq.read(90_000, 1)[0][0] == 90_000
    assert cq.trim_below(10) == 90_000, "the minimum never moves back"
    cq.close()


def test_an_undelivered_scheduled_message_keeps_its_segment_until_delivered(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 20)
    due = int((clock.now() + 100 * HOUR) * 1000)
    later = encode_frame(msg_id=b"s" * 16, born_timestamp_ms=1, body=b"later", deliver_at_ms=due)
    loop.run_until_complete(scheduler.schedule(topic, 0, later, store.check(later)))
    send(loop, store, topic, 30)
    checkpoint(loop, store)
    scheduled_at = scheduler.oldest_pending_position()
    assert scheduled_at is not None

    clock.advance(80 * HOUR)
    send(loop, store, topic, 1)
    checkpoint(loop, store)
    store.enforce_retention()
    assert store.commitlog.start <= scheduled_at, "the pending message's segment is kept"
    assert 0 < store.queue(topic, 0).min_offset <= 20, "older segments went"

    clock.advance(21 * HOUR)
    assert loop.run_until_complete(scheduler.deliver_due()) == 1
    checkpoint(loop, store)
    store.enforce_retention()
    assert store.commitlog.start > scheduled_at, "delivered: its segment may go now"
    cq = store.queue(topic, 0)
    assert [
        r.body
        for r in iter_records(
            store.get(topic, 0, cq.max_offset - 1, max_messages=1, max_bytes=1 << 20).records
        )
    ] == [b"later"]
    loop.run_until_complete(store.close())

    store = open_store(loop, tmp_path, clock, disk)  # the scheduler reloads from the minimum
    scheduler = Scheduler(store, clock)
    scheduler.load()
    assert scheduler.pending == 0
    loop.run_until_complete(store.close())


def test_a_fuller_disk_deletes_young_segments_and_refuses_sends_above_the_limit(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 60)
    checkpoint(loop, store)
    start = store.commitlog.start

    disk.ratio = 0.80  # over the clean ratio: one segment a check, young or not
    store.enforce_retention()
    first = store.commitlog.start
    assert first > start and not store.refusing_sends
    disk.ratio = 0.92  # over the refuse ratio (and the force ratio: every segment allowed)
    store.enforce_retention()
    assert store.commitlog.segment_bases() == [store.commitlog.start]
    assert store.refusing_sends
    with pytest.raises(BrokerError) as refused:
        store.check_accepting_sends()
    assert (refused.value.reason, refused.value.status.name) == ("DISK_FULL", "UNAVAILABLE")
    cq = store.queue(topic, 0)
    assert offsets_served(store, topic, cq.min_offset) == list(range(cq.min_offset, 60))

    disk.ratio = 0.50
    store.enforce_retention()
    store.check_accepting_sends()  # accepted again
    send(loop, store, topic, 1)
    assert cq.max_offset == 61
    loop.run_until_complete(store.close())


class FailingWrites:
    """os.pwrite that writes half of the `fail_at`-th call's bytes, then fails ENOSPC."""

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at
        self.real = os.pwrite

    def __call__(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        self.calls += 1
        if self.calls == self.fail_at:
            self.real(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data, offset)


@pytest.mark.parametrize("fail_at", [1, 2], ids=["commit log write", "consume queue write"])
@pytest.mark.parametrize("crash", [False, True], ids=["clean restart", "crash"])
def test_a_batch_cut_short_by_a_full_disk_fails_whole_and_nothing_of_it_is_served(
    loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fail_at: int,
    crash: bool,
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 3)
    batch = b"".join(
        encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=BODY) for _ in range(5)
    )
    failing = FailingWrites(fail_at)
    monkeypatch.setattr(commitlog_module.os, "pwrite", failing)  # the os module: every write
    # The queue writes its entries to its file once its tail holds 6: in this batch.
    monkeypatch.setattr(consumequeue_module, "TAIL_BYTES", 6 * ENTRY.size)
    with pytest.raises(BrokerError) as full:
        loop.run_until_complete(store.put(topic, 0, batch))
    assert failing.calls == fail_at
    monkeypatch.undo()
    assert full.value.reason == "DISK_FULL"
    assert store.queue(topic, 0).max_offset == 3
    assert offsets_served(store, topic, 0) == [0, 1, 2]
    assert store.refusing_sends, "refused until the next disk check"
    store.enforce_retention()  # the disk has room again
    send(loop, store, topic, 1)
    assert offsets_served(store, topic, 0) == [0, 1, 2, 3]
    checkpoint(loop, store)
    if crash:
        (tmp_path / "running").touch()  # not shut down cleanly: recovery replays
    loop.run_until_complete(store.close())
    if crash:
        (tmp_path / "running").touch()

    store = open_store(loop, tmp_path, clock, disk)
    assert store.recovery.corrupt_records == 0 and store.recovery.truncated_bytes == 0
    assert offsets_served(store, topic, 0) == [0, 1, 2, 3]
    loop.run_until_complete(store.close())


def test_a_nearly_full_disk_is_read_at_every_send_so_sends_stop_at_the_limit(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    # Sends of 20 KB filled a 32 MB disk from 85% to the last byte within one check
    # interval (fresh CI 89): the lock table could not be saved after. Over the clean
    # ratio each send reads the disk; below it, the periodic check alone decides.
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    disk.ratio = 0.50
    store.enforce_retention()
    disk.ratio = 0.95  # filled since the check: not read again at this usage
    store.check_accepting_sends()
    disk.ratio = 0.80
    store.enforce_retention()  # over the clean ratio
    disk.ratio = 0.89
    store.check_accepting_sends()
    assert store.disk is not None and store.disk.ratio == 0.89, "read again, under the limit"
    disk.ratio = 0.95  # the next sends filled it past the limit before the next check
    with pytest.raises(BrokerError) as refused:
        store.check_accepting_sends()
    assert refused.value.reason == "DISK_FULL" and "95.0%" in refused.value.message
    assert store.refusing_sends
    disk.ratio = 0.60
    store.enforce_retention()  # the periodic check lets sends in again
    store.check_accepting_sends()
    loop.run_until_complete(store.close())


def test_sends_refused_after_a_write_ran_out_of_space_say_so_until_the_next_disk_check(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The refusal said "the broker's disk is 10.0% full, over the limit of 90%": the last
    # disk check's figure, from before the write that found no space.
    store = open_store(loop, tmp_path, FakeClock(), FakeDisk())
    topic, _ = store.create_topic("t", 1)
    batch = encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=BODY)
    monkeypatch.setattr(commitlog_module.os, "pwrite", FailingWrites(1))
    with pytest.raises(BrokerError):
        loop.run_until_complete(store.put(topic, 0, batch))
    monkeypatch.undo()
    with pytest.raises(BrokerError) as refused:
        store.check_accepting_sends()
    assert refused.value.reason == "DISK_FULL"
    assert "no space left" in refused.value.message, refused.value.message
    assert "10.0%" not in refused.value.message, refused.value.message
    store.enforce_retention()  # the next disk check: room again
    store.check_accepting_sends()
    loop.run_until_complete(store.close())


def test_a_write_that_ran_out_of_space_reads_the_disk_again(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # BrokerStatus said 0.896 used (the last disk check's figure) while the disk was full:
    # sends that fill the disk between two checks meet ENOSPC before the refuse ratio
    # (tests/system/test_full_disk.py, fresh CI runs 31 and 54).
    disk = FakeDisk()
    store = open_store(loop, tmp_path, FakeClock(), disk)
    topic, _ = store.create_topic("t", 1)
    batch = encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=BODY)
    disk.ratio = 0.999  # filled since the last check
    monkeypatch.setattr(commitlog_module.os, "pwrite", FailingWrites(1))
    with pytest.raises(BrokerError):
        loop.run_until_complete(store.put(topic, 0, batch))
    monkeypatch.undo()
    assert store.disk is not None and store.disk.ratio == pytest.approx(0.999)
    assert store.refusing_sends
    loop.run_until_complete(store.close())


@pytest.mark.parametrize(
    "fail_at", [1, 2, 3], ids=["commit log write", "first queue's index", "second queue's index"]
)
@pytest.mark.parametrize("crash", [False, True], ids=["clean restart", "crash"])
def test_a_request_for_several_queues_cut_short_by_a_full_disk_stores_none_of_its_parts(
    loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    fail_at: int,
    crash: bool,
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    topic, _ = store.create_topic("t", 2)
    send(loop, store, topic, 2)

    def batch(queue_id: int, n: int) -> Batch:
        data = b"".join(
            encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=BODY) for _ in range(n)
        )
        return Batch(queue_id, data, store.check(data))

    parts = [batch(0, 2), batch(1, 2), batch(0, 1)]
    end = store.commitlog.end
    failing = FailingWrites(fail_at)
    monkeypatch.setattr(commitlog_module.os, "pwrite", failing)
    # Each queue writes its entries to its file at once (none kept in memory).
    monkeypatch.setattr(consumequeue_module, "TAIL_BYTES", ENTRY.size)
    with pytest.raises(BrokerError) as full:
        store.write_parts(topic, parts)
    assert failing.calls == fail_at
    monkeypatch.undo()
    assert full.value.reason == "DISK_FULL"
    assert store.commitlog.end == end
    assert (store.queue(topic, 0).max_offset, store.queue(topic, 1).max_offset) == (2, 0)
    assert offsets_served(store, topic, 0) == [0, 1]
    assert offsets_served(store, topic, 0, queue_id=1) == []
    store.enforce_retention()  # the disk has room again
    written = store.write_parts(topic, parts)
    assert [(w.first_offset, w.count) for w in written] == [(2, 2), (0, 2), (4, 1)]
    checkpoint(loop, store)
    loop.run_until_complete(store.close())
    if crash:
        (tmp_path / "running").touch()  # not shut down cleanly: recovery replays

    store = open_store(loop, tmp_path, clock, disk)
    assert store.recovery.corrupt_records == 0 and store.recovery.truncated_bytes == 0
    assert offsets_served(store, topic, 0) == [0, 1, 2, 3, 4]
    assert offsets_served(store, topic, 0, queue_id=1) == [0, 1]
    loop.run_until_complete(store.close())


def test_a_simulated_disk_file_caught_mid_rewrite_is_an_io_error_not_a_crash(
    tmp_path: Path,
) -> None:
    settings = tmp_path / "disk.json"
    settings.write_text("")  # a test's write_text truncates before it writes
    probe = file_probe(settings, tmp_path)
    with pytest.raises(OSError, match="not a disk description"):
        probe()
    settings.write_text('{"total_bytes": 1000, "other_used_bytes": 100}')
    assert probe().total_bytes == 1000


def test_a_failing_retention_check_is_retried_at_the_next_one(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock = FakeClock()
    failures: list[Exception] = []
    used = [950]

    def probe() -> DiskUsage:
        if failures:
            raise failures.pop(0)
        return DiskUsage(1000, used[0])

    store = MessageStore(
        tmp_path, sync_flush=False, segment_bytes=SEGMENT, flush_interval_seconds=3600,
        sync_flush_timeout_seconds=5, clock=clock, disk_probe=probe, retention_check_seconds=1,
    )  # fmt: skip
    store.open()
    loop.run_until_complete(store.start())
    assert store.refusing_sends
    failures += [ValueError("a bug in a check"), OSError("EIO")]
    used[0] = 100
    for _ in range(3):  # a check that raised, one that failed, then one that worked
        clock.advance(1.5)
        loop.run_until_complete(asyncio.sleep(0.05))
    assert not failures
    assert not store.refusing_sends, "the checks after the failures ran"
    loop.run_until_complete(store.close())


def test_a_disk_filling_while_deletion_fails_still_refuses_sends_at_the_limit(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 60)
    checkpoint(loop, store)

    def cannot_delete(floor: int) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store.commitlog, "delete_below", cannot_delete)
    disk.ratio = 0.95  # over the refuse ratio, and deletion is due
    with pytest.raises(OSError):
        store.enforce_retention()
    assert store.refusing_sends, "refused by the disk's reading though deleting failed"
    assert store.disk is not None and store.disk.ratio == 0.95
    disk.ratio = 0.50  # space freed elsewhere: nothing to delete, sends accepted
    store.enforce_retention()
    assert not store.refusing_sends
    loop.run_until_complete(store.close())
