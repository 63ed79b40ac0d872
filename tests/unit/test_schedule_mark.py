"""The scheduler's start-up mark: a restart reads the live span of the schedule, not history."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from mockbroker.errors import BrokerError
from mockbroker.schedule import CANCELLED, DELIVERED, MARK_FILE, MOVED, Scheduler
from mockbroker.store.checkpoint import write_positions
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import Topic
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock
from tests.unit.test_retention import HOUR, FakeDisk, checkpoint, open_store, send

SHORT, LONG = 1 * HOUR, 100 * HOUR


def schedule(
    loop: asyncio.AbstractEventLoop,
    scheduler: Scheduler,
    store: MessageStore,
    clock: FakeClock,
    topic: Topic,
    ids: list[bytes],
    delay: float,
) -> None:
    due = int((clock.now() + delay) * 1000)
    frames = b"".join(
        encode_frame(msg_id=i, born_timestamp_ms=1, body=b"b" + i, deliver_at_ms=due) for i in ids
    )
    loop.run_until_complete(scheduler.schedule(topic, 0, frames, store.check(frames)))


def msg_ids(prefix: bytes, n: int) -> list[bytes]:
    return [prefix + b"%015d" % i for i in range(n)]


def load_counting_reads(store: MessageStore, clock: FakeClock) -> tuple[Scheduler, int]:
    """A scheduler loaded from `store`, and how many stored records its load read."""
    reads = 0
    read_record = store.read_record

    def counting(topic: Topic, queue_id: int, offset: int) -> bytes:
        nonlocal reads
        reads += 1
        return read_record(topic, queue_id, offset)

    store.read_record = counting  # type: ignore[method-assign]
    try:
        scheduler = Scheduler(store, clock)
        scheduler.load()
    finally:
        del store.read_record
    return scheduler, reads


def delivered_ids(store: MessageStore, topic: Topic) -> list[bytes]:
    cq = store.queue(topic, 0)
    got = store.get(topic, 0, cq.min_offset, max_messages=10_000, max_bytes=1 << 30)
    return [r.msg_id for r in iter_records(got.records)]


def test_a_restart_after_many_delivered_schedules_reads_only_the_pending_span(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    short, long = msg_ids(b"s", 300), msg_ids(b"l", 3)
    for start in range(0, 300, 50):
        schedule(loop, scheduler, store, clock, topic, short[start : start + 50], SHORT)
    schedule(loop, scheduler, store, clock, topic, long, LONG)
    cancelled = msg_ids(b"c", 1)
    schedule(loop, scheduler, store, clock, topic, cancelled, LONG)
    clock.advance(SHORT + 1)
    assert loop.run_until_complete(scheduler.deliver_due()) == 300
    assert loop.run_until_complete(scheduler.cancel(None, cancelled[0])) == CANCELLED
    assert loop.run_until_complete(scheduler.save_mark())
    loop.run_until_complete(store.close())

    store = open_store(loop, tmp_path, clock, disk)
    scheduler, reads = load_counting_reads(store, clock)
    assert scheduler.pending == 3
    # The 3 pending records and the cancel outcome of the one after them: not the 300
    # delivered records, nor their 300 outcomes.
    assert reads == 3 + 1 + 1, reads
    assert scheduler.records_loaded == reads
    # Outcomes below the mark are no longer held, yet a cancel still answers right.
    assert loop.run_until_complete(scheduler.cancel("t", short[7])) == DELIVERED
    assert loop.run_until_complete(scheduler.cancel(None, cancelled[0])) == CANCELLED
    with pytest.raises(BrokerError, match="no scheduled message"):
        loop.run_until_complete(scheduler.cancel("other", short[7]))

    clock.advance(LONG)
    assert loop.run_until_complete(scheduler.deliver_due()) == 3
    assert sorted(delivered_ids(store, topic)) == sorted(short + long)
    loop.run_until_complete(store.close())


def test_a_long_delay_in_the_middle_keeps_the_span_from_it_and_nothing_is_lost(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    before, pinned, after = msg_ids(b"a", 100), msg_ids(b"p", 1), msg_ids(b"z", 100)
    schedule(loop, scheduler, store, clock, topic, before, SHORT)
    schedule(loop, scheduler, store, clock, topic, pinned, LONG)
    schedule(loop, scheduler, store, clock, topic, after, SHORT)
    clock.advance(SHORT + 1)
    assert loop.run_until_complete(scheduler.deliver_due()) == 200
    assert loop.run_until_complete(scheduler.save_mark())
    assert (tmp_path / MARK_FILE).exists()
    loop.run_until_complete(store.close())

    store = open_store(loop, tmp_path, clock, disk)
    scheduler, reads = load_counting_reads(store, clock)
    # From the pinned record on: it and the 100 after it, and the outcomes of those 100.
    assert scheduler.pending == 1 and reads == 101 + 100, reads
    clock.advance(LONG)
    assert loop.run_until_complete(scheduler.deliver_due()) == 1
    ids = delivered_ids(store, topic)
    assert len(ids) == len(set(ids)) == 201
    loop.run_until_complete(store.close())


def test_a_crash_right_after_the_mark_is_written_loses_and_repeats_nothing(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    """The data directory copied while the broker runs is what kill -9 leaves on disk."""
    clock, disk = FakeClock(), FakeDisk()
    live = tmp_path / "live"
    store = open_store(loop, live, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    first, second, later = msg_ids(b"f", 50), msg_ids(b"g", 50), msg_ids(b"h", 20)
    schedule(loop, scheduler, store, clock, topic, first, SHORT)
    schedule(loop, scheduler, store, clock, topic, later, LONG)
    schedule(loop, scheduler, store, clock, topic, second, 2 * SHORT)
    clock.advance(SHORT + 1)
    assert loop.run_until_complete(scheduler.deliver_due()) == 50
    assert loop.run_until_complete(scheduler.save_mark())
    crashed_after_mark = tmp_path / "crash1"
    shutil.copytree(live, crashed_after_mark)  # killed right after the mark was written
    clock.advance(SHORT)
    assert loop.run_until_complete(scheduler.deliver_due()) == 50  # delivered, mark not moved
    crashed_later = tmp_path / "crash2"
    shutil.copytree(live, crashed_later)
    loop.run_until_complete(store.close())

    for data_dir, already in ((crashed_after_mark, 50), (crashed_later, 100)):
        (data_dir / "lock").unlink()
        assert (data_dir / "running").exists(), "the copy looks like a crash"
        restarted = FakeClock(clock.now())
        store = open_store(loop, data_dir, restarted, disk)
        scheduler = Scheduler(store, restarted)
        scheduler.load()
        assert scheduler.pending == 120 - already
        restarted.advance(LONG)
        assert loop.run_until_complete(scheduler.deliver_due()) == 120 - already
        ids = delivered_ids(store, topic)
        assert sorted(ids) == sorted(first + second + later), "none lost, none twice"
        loop.run_until_complete(store.close())


def test_a_mark_ahead_of_the_stored_queues_is_not_trusted(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    waiting = msg_ids(b"w", 5)
    schedule(loop, scheduler, store, clock, topic, waiting, SHORT)
    loop.run_until_complete(store.close())
    write_positions(tmp_path / MARK_FILE, (10**6, 0))
    store = open_store(loop, tmp_path, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    assert scheduler.pending == 5
    loop.run_until_complete(store.close())


def test_a_40_day_delay_is_copied_forward_and_does_not_pin_later_segments(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)  # 72 h retention
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    far = msg_ids(b"F", 1)
    due = clock.now() + 40 * 24 * HOUR
    schedule(loop, scheduler, store, clock, topic, far, 40 * 24 * HOUR)
    for day in range(39):  # a day of traffic at a time, retention and copying as it runs
        send(loop, store, topic, 20)
        clock.advance(24 * HOUR)
        loop.run_until_complete(scheduler.move_forward())
        checkpoint(loop, store)
        store.enforce_retention()
        oldest = (clock.now() * 1000 - store.oldest_timestamp_ms()) / 1000 / HOUR
        assert oldest <= 72 + 36 + 24, f"day {day}: the log keeps {oldest:.0f} h"
        if day == 20:  # a restart in the middle finds it pending once
            loop.run_until_complete(scheduler.save_mark())
            loop.run_until_complete(store.close())
            store = open_store(loop, tmp_path, clock, disk)
            scheduler = Scheduler(store, clock)
            scheduler.load()
            assert scheduler.pending == 1
    assert loop.run_until_complete(scheduler.deliver_due()) == 0, "not before it is due"
    clock.advance(due - clock.now())
    assert loop.run_until_complete(scheduler.deliver_due()) == 1
    cq = store.queue(topic, 0)
    got = store.get(topic, 0, cq.max_offset - 1, max_messages=1, max_bytes=1 << 20).records
    [record] = list(iter_records(got))
    assert record.msg_id == far[0] and record.body == b"b" + far[0]
    assert record.deliver_at_ms == 0 and record.delay_level == 0
    assert record.store_timestamp_ms >= int(due * 1000)
    assert loop.run_until_complete(scheduler.cancel(None, far[0])) == DELIVERED
    loop.run_until_complete(store.close())


def test_a_crash_between_the_copy_and_its_moved_outcome_delivers_the_message_once(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    store = open_store(loop, live, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    topic, _ = store.create_topic("t", 1)
    far = msg_ids(b"F", 3)
    schedule(loop, scheduler, store, clock, topic, far, 10 * 24 * HOUR)
    record_outcomes = scheduler._record_outcomes

    async def crash_before_moved(items: list[tuple[int, bytes]], outcome: int) -> int:
        if outcome == MOVED:
            shutil.copytree(live, crashed)  # kill -9 here: the copies are written, no outcome
        return await record_outcomes(items, outcome)

    scheduler._record_outcomes = crash_before_moved  # type: ignore[method-assign]
    clock.advance(40 * HOUR)
    assert loop.run_until_complete(scheduler.move_forward()) == 3
    loop.run_until_complete(store.close())

    (crashed / "lock").unlink()
    store = open_store(loop, crashed, clock, disk)
    scheduler = Scheduler(store, clock)
    scheduler.load()
    assert scheduler.pending == 3
    clock.advance(10 * 24 * HOUR)
    assert loop.run_until_complete(scheduler.deliver_due()) == 3
    ids = delivered_ids(store, topic)
    assert sorted(ids) == sorted(far), "each once"
    loop.run_until_complete(store.close())
