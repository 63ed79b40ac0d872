"""A consume queue keeps its newest entries in memory and writes them in one go.

What the write-behind must keep: every entry reads the same whether it is in the file or
still in memory (from any thread), a roll-back cuts it like a file's end, and nothing a
checkpoint counts is missing from the file, so recovery after a crash finds every message.
"""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from mockbroker.store import consumequeue as consumequeue_module
from mockbroker.store.checkpoint import read_checkpoint
from mockbroker.store.consumequeue import ENTRY, TAIL_BYTES, ConsumeQueue
from mockbroker.store.message_index import MessageIndex
from mockbroker.store.message_store import MessageStore
from mockbroker.store.retention import DiskUsage, RetentionPolicy
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock

TAIL = TAIL_BYTES // ENTRY.size  # entries a queue keeps before it writes them


def entries(first: int, n: int) -> list[tuple[int, int, int]]:
    return [(100 * k, 10 + k, k) for k in range(first, first + n)]


def packed(first: int, n: int) -> bytes:
    return b"".join(ENTRY.pack(*e) for e in entries(first, n))


def in_file(cq: ConsumeQueue) -> int:
    return os.fstat(cq.fileno()).st_size // ENTRY.size


def test_entries_wait_in_memory_until_the_tail_fills_and_read_the_same_either_way(
    tmp_path: Path,
) -> None:
    cq = ConsumeQueue(tmp_path / "q")
    cq.append(packed(0, 3))
    cq.append(packed(3, 2))
    assert (cq.count, in_file(cq)) == (5, 0)
    assert cq.read(0, 100) == entries(0, 5)
    cq.append(packed(5, TAIL - 5))  # the tail is full: written in one go
    assert in_file(cq) == TAIL
    cq.append(packed(TAIL, 4))
    assert (cq.count, in_file(cq)) == (TAIL + 4, TAIL)
    assert cq.read(0, TAIL + 100) == entries(0, TAIL + 4)
    assert cq.read(TAIL - 2, 4) == entries(TAIL - 2, 4), "a read across the file's end"
    assert cq.read(TAIL + 1, 2) == entries(TAIL + 1, 2)
    assert cq.entry(TAIL + 3) == entries(TAIL + 3, 1)[0]
    assert cq.read(TAIL + 4, 1) == []
    cq.write_tail()
    assert in_file(cq) == TAIL + 4
    cq.close()
    reopened = ConsumeQueue(tmp_path / "q")
    assert reopened.read(0, TAIL + 100) == entries(0, TAIL + 4)
    reopened.close()


def test_a_read_in_another_thread_sees_the_entries_whole_while_the_tail_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admin reads (BrowseQueue) run in threads while the loop appends and writes the tail:
    # a read that took the file's part must take the tail it had then, not the next one.
    cq = ConsumeQueue(tmp_path / "q")
    cq.append(packed(0, TAIL))  # in the file
    cq.append(packed(TAIL, 3))  # in memory
    real_pread = os.pread

    def pread_while_the_loop_writes(fd: int, size: int, offset: int) -> bytes:
        data = real_pread(fd, size, offset)
        cq.write_tail()  # what the loop may do between the read's two halves
        cq.append(packed(TAIL + 3, 2))
        return data

    monkeypatch.setattr(consumequeue_module.os, "pread", pread_while_the_loop_writes)
    assert cq.read(TAIL - 1, 4) == entries(TAIL - 1, 4)
    monkeypatch.undo()
    assert cq.read(0, 1000) == entries(0, TAIL + 5)
    cq.close()


def test_a_roll_back_cuts_the_tail_or_the_file_and_drops_what_a_failed_write_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cq = ConsumeQueue(tmp_path / "q")
    cq.append(packed(0, TAIL))
    cq.append(packed(TAIL, 5))
    cq.truncate(TAIL + 2)  # within the tail
    assert (cq.count, in_file(cq)) == (TAIL + 2, TAIL)
    assert cq.read(0, 1000) == entries(0, TAIL + 2)

    real_pwrite = os.pwrite

    def half_then_full(fd: int, data: bytes | memoryview, offset: int) -> int:
        real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(consumequeue_module.os, "pwrite", half_then_full)
    with pytest.raises(OSError):
        cq.write_tail()
    monkeypatch.undo()
    assert cq.read(0, 1000) == entries(0, TAIL + 2), "kept in memory"
    cq.truncate(TAIL + 1)
    assert os.fstat(cq.fileno()).st_size == TAIL * ENTRY.size, "the half-written bytes went"
    cq.write_tail()
    assert in_file(cq) == TAIL + 1
    cq.append(packed(TAIL + 1, 2))
    cq.truncate(3)  # below the file's end: the tail goes with it
    assert (cq.count, in_file(cq)) == (3, 3)
    assert cq.read(0, 1000) == entries(0, 3)
    cq.append(packed(3, 1))
    assert cq.read(0, 1000) == entries(0, 4)
    cq.close()


class FakeDisk:
    def __call__(self) -> DiskUsage:
        return DiskUsage(1000, 100)


def open_store(loop: asyncio.AbstractEventLoop, path: Path) -> MessageStore:
    store = MessageStore(
        path,
        sync_flush=False,
        segment_bytes=1 << 20,
        flush_interval_seconds=3600,  # checkpoints are taken by the test
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
        retention=RetentionPolicy(retention_seconds=3600.0),
        disk_probe=FakeDisk(),
        retention_check_seconds=10**9,
    )
    store.open()
    loop.run_until_complete(store.start())
    return store


def send(loop: asyncio.AbstractEventLoop, store: MessageStore, n: int) -> None:
    topic = store.topics.get("t")
    for _ in range(n):
        frame = encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=b"x" * 50)
        loop.run_until_complete(store.put(topic, 0, frame))


def stored(store: MessageStore) -> list[int]:
    got = store.get(store.topics.get("t"), 0, 0, max_messages=10_000, max_bytes=1 << 26)
    return [r.queue_offset for r in iter_records(got.records)]


def checkpoint(loop: asyncio.AbstractEventLoop, store: MessageStore) -> None:
    assert store.flusher is not None
    loop.run_until_complete(store.flusher.flush(checkpoint=True))


def crash_and_reopen(
    loop: asyncio.AbstractEventLoop, store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> MessageStore:
    """Stop the store as a kill -9 would leave it: no last flush, what is only in memory
    (queue tails, index entries) gone; then open it again (recovery)."""

    async def no_flush(*, checkpoint: bool) -> None:
        pass

    with monkeypatch.context() as patched:
        patched.setattr(store.flusher, "flush", no_flush)
        patched.setattr(ConsumeQueue, "write_tail", lambda self: None)
        patched.setattr(MessageIndex, "write_pending", lambda self: None)
        loop.run_until_complete(store.close())
    (store.data_dir / "running").touch()  # not shut down cleanly: recovery replays
    return open_store(loop, store.data_dir)


def test_a_checkpoint_writes_the_tails_it_counts_and_a_crash_after_it_loses_nothing(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(loop, tmp_path)
    store.create_topic("t", 1)
    send(loop, store, 5)
    cq = store.queue(store.topics.get("t"), 0)
    assert in_file(cq) == 0, "kept in memory"
    checkpoint(loop, store)
    assert in_file(cq) == 5
    assert read_checkpoint(tmp_path / "checkpoint").counts == {"t/0": 5}
    send(loop, store, 3)  # after the checkpoint, in memory only: the crash loses them
    store = crash_and_reopen(loop, store, monkeypatch)
    assert store.recovery.crashed and store.recovery.records_replayed == 3
    assert stored(store) == list(range(8))
    loop.run_until_complete(store.close())


def no_room(fd: int, data: bytes | memoryview, offset: int) -> int:
    """os.pwrite on a full disk."""
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_tail_the_full_disk_will_not_take_holds_the_checkpoint_back_until_it_is_written(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(loop, tmp_path)
    store.create_topic("t", 1)
    send(loop, store, 2)
    checkpoint(loop, store)
    send(loop, store, 4)
    real_pwrite = os.pwrite

    monkeypatch.setattr(consumequeue_module.os, "pwrite", no_room)
    checkpoint(loop, store)  # the commit log is synced; the checkpoint stays where it was
    monkeypatch.setattr(consumequeue_module.os, "pwrite", real_pwrite)
    assert read_checkpoint(tmp_path / "checkpoint").counts == {"t/0": 2}
    assert store.flusher is not None and store.flusher.failure is None, "not a failed store"
    assert stored(store) == list(range(6))
    store = crash_and_reopen(loop, store, monkeypatch)
    assert store.recovery.records_replayed == 4
    assert stored(store) == list(range(6))
    send(loop, store, 1)
    checkpoint(loop, store)  # the disk has room again
    assert read_checkpoint(tmp_path / "checkpoint").counts == {"t/0": 7}
    loop.run_until_complete(store.close())
    store = open_store(loop, tmp_path)  # a clean start trusts the files
    assert not store.recovery.crashed
    assert stored(store) == list(range(7))
    loop.run_until_complete(store.close())


def test_a_close_that_cannot_write_the_tails_is_not_clean_and_the_next_start_replays(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A clean start trusts the queue files whole: a close whose tails found the disk full
    # must not mark the shutdown clean, or the entries kept in memory would be lost.
    store = open_store(loop, tmp_path)
    store.create_topic("t", 1)
    send(loop, store, 2)
    checkpoint(loop, store)
    send(loop, store, 3)

    monkeypatch.setattr(consumequeue_module.os, "pwrite", no_room)
    loop.run_until_complete(store.close())
    monkeypatch.undo()
    store = open_store(loop, tmp_path)
    assert store.recovery.crashed and store.recovery.records_replayed == 3
    assert stored(store) == list(range(5))
    loop.run_until_complete(store.close())
