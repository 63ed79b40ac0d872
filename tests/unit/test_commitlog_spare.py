"""The commit log's spare segment: made in a thread, renamed by a roll, synced by a flush."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import mockbroker.store.commitlog as commitlog_module
import mockbroker.store.segment_allocator as segment_allocator_module
from mockbroker.errors import BrokerError
from mockbroker.store.commitlog import CommitLog
from mockbroker.store.files import allocate
from mockbroker.store.message_store import MessageStore
from mockbroker.store.retention import RetentionPolicy
from mockbroker.store.segment_allocator import SegmentAllocator
from sdk._wire import encode_frame
from tests.unit.test_retention import FakeDisk

SEGMENT = 64 * 1024
RECORD = b"r" * 1000


@pytest.fixture
def log(tmp_path: Path) -> Iterator[CommitLog]:
    log = CommitLog(tmp_path, SEGMENT, may_preallocate=lambda: True)
    log.open()
    yield log
    log.close()


def fill_segment(log: CommitLog) -> None:
    """Append until the next record would roll the log."""
    while log.end - log.segment_bases()[-1] + len(RECORD) <= SEGMENT:
        log.append(RECORD)


def spare(directory: Path) -> Path:
    return directory / "spare"


def test_a_roll_renames_the_spare_made_ahead_and_a_new_one_is_made(
    log: CommitLog, tmp_path: Path
) -> None:
    log.prepare_spare()
    log.settle()
    assert log.spare_ready
    log.prepare_spare()  # as every disk check asks
    assert not log._allocator._has_work_locked(), "nothing to do while a spare is ready"
    made = os.stat(spare(tmp_path))
    assert made.st_size == 0, "its blocks are allocated, its size stays 0"
    assert made.st_blocks * 512 >= SEGMENT
    fill_segment(log)
    log.append(RECORD)
    base = log.segment_bases()[-1]
    assert base > 0
    segment = os.stat(tmp_path / f"{base:020d}")
    assert (segment.st_ino, segment.st_size) == (made.st_ino, len(RECORD))
    log.settle()
    assert log.spare_ready and os.stat(spare(tmp_path)).st_ino != made.st_ino
    assert log.read(base, len(RECORD)) == RECORD


def test_a_rolled_segment_gives_back_the_blocks_it_did_not_fill(
    log: CommitLog, tmp_path: Path
) -> None:
    log.prepare_spare()
    log.settle()
    fill_segment(log)
    log.append(RECORD)  # into the spare
    base = log.segment_bases()[-1]
    log.append(bytes(SEGMENT // 2 - len(RECORD)))
    log.append(bytes(SEGMENT // 2 + 1))  # does not fit: rolls, leaving half of it unused
    log.settle()
    rolled = os.stat(tmp_path / f"{base:020d}")
    assert rolled.st_size == SEGMENT // 2
    assert rolled.st_blocks * 512 < SEGMENT * 3 // 4, "the blocks past its end were freed"
    assert log.read(base, len(RECORD)) == RECORD


def test_rolls_wake_the_thread_started_at_open_and_start_none(
    log: CommitLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Thread.start waits until the new thread runs: on a machine whose cores a flood of
    # sends kept busy, a roll that started one stalled the event loop for 24 ms.
    log.prepare_spare()
    log.settle()
    worker = log._allocator._worker
    assert worker is not None and worker.is_alive()
    started: list[str] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    for _ in range(3):
        fill_segment(log)
        log.append(RECORD)  # a roll: the rolled segment's rest to free, a new spare to make
        log.settle()
        assert log.spare_ready
    assert started == [], "no thread started by a roll"
    assert len(log.segment_bases()) == 4
    log.close()
    assert not worker.is_alive(), "close stops the thread"
    assert not spare(tmp_path).exists()


def test_a_trim_voided_by_a_truncation_leaves_the_segment_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    allocator = SegmentAllocator(tmp_path, SEGMENT)
    fd = os.open(tmp_path / "segment", os.O_RDWR | os.O_CREAT)
    allocate(fd, SEGMENT)
    os.pwrite(fd, RECORD, 0)
    wake = allocator._wake_locked
    monkeypatch.setattr(allocator, "_wake_locked", lambda: None)  # the thread is late
    allocator.trim_later(fd, len(RECORD))
    allocator.void_trims()
    monkeypatch.setattr(allocator, "_wake_locked", wake)
    allocator.want()
    allocator.settle()
    assert os.fstat(fd).st_blocks * 512 >= SEGMENT, "not trimmed"
    assert allocator.ready
    allocator.close()
    assert not spare(tmp_path).exists()
    allocator.trim_later(fd, len(RECORD))
    allocator.settle()
    assert os.fstat(fd).st_blocks * 512 < SEGMENT, "trimmed when not voided"
    os.close(fd)


def test_a_roll_leaves_the_directory_sync_to_the_next_flush(
    log: CommitLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    monkeypatch.setattr(commitlog_module, "fsync_dir", synced.append)
    for ready in (True, False):  # renaming the spare, or creating a file without one
        log.settle()
        if not ready:
            log.give_back_space()
        fill_segment(log)
        log.append(RECORD)
        assert synced == [], "no directory sync on the event loop"
        plan = log.begin_flush()
        assert plan.directory == tmp_path
        CommitLog.execute_flush(plan)
        log.complete_flush(plan)
        assert synced == [tmp_path]
        synced.clear()
        assert log.begin_flush().directory is None, "synced once"


def test_without_permission_no_spare_is_made_and_rolls_create_files(tmp_path: Path) -> None:
    allowed = False
    log = CommitLog(tmp_path, SEGMENT, may_preallocate=lambda: allowed)
    log.open()
    log.prepare_spare()
    log.settle()
    assert not log.spare_ready and not spare(tmp_path).exists()
    fill_segment(log)
    log.append(RECORD)
    log.settle()
    assert len(log.segment_bases()) == 2 and not spare(tmp_path).exists()
    allowed = True
    log.prepare_spare()
    log.settle()
    assert log.spare_ready
    log.give_back_space()
    assert not log.spare_ready and not spare(tmp_path).exists()
    log.prepare_spare()
    log.close()
    assert not spare(tmp_path).exists(), "close removes it"


def test_a_spare_left_by_a_crash_is_not_a_segment(tmp_path: Path) -> None:
    log = CommitLog(tmp_path, SEGMENT)
    log.open()
    log.append(RECORD)
    log.close()
    spare(tmp_path).write_bytes(RECORD)  # a crash leaves the spare behind
    again = CommitLog(tmp_path, SEGMENT)
    again.open()
    assert not spare(tmp_path).exists()
    assert again.segment_bases() == [0] and again.end == len(RECORD)
    again.close()


@pytest.fixture
def disk() -> FakeDisk:
    return FakeDisk()


@pytest.fixture
def store(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, disk: FakeDisk
) -> Iterator[MessageStore]:
    store = MessageStore(
        tmp_path,
        sync_flush=False,
        segment_bytes=SEGMENT,
        flush_interval_seconds=3600,
        sync_flush_timeout_seconds=5,
        retention=RetentionPolicy(clean_ratio=0.75, refuse_ratio=0.95),
        disk_probe=disk,
        retention_check_seconds=10**9,
    )
    store.open()
    loop.run_until_complete(store.start())
    store.commitlog.settle()
    assert store.commitlog.spare_ready, "made once the disk was read"
    yield store
    loop.run_until_complete(store.close())


def test_the_store_keeps_a_spare_only_while_the_disk_has_room(
    store: MessageStore, disk: FakeDisk, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    topic, _ = store.create_topic("t", 1)
    frame = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=RECORD)
    while len(store.commitlog.segment_bases()) < 2:  # into the spare
        loop.run_until_complete(store.put(topic, 0, frame))
    active = tmp_path / "commitlog" / f"{store.commitlog.segment_bases()[-1]:020d}"
    assert os.stat(active).st_blocks * 512 >= SEGMENT
    disk.ratio = 0.80
    store.enforce_retention()
    store.commitlog.settle()  # one being made is removed once made
    assert not store.commitlog.spare_ready
    assert not spare(tmp_path / "commitlog").exists(), "its space given back"
    assert os.stat(active).st_blocks * 512 < SEGMENT // 2, "and the active segment's rest"
    assert store.commitlog.read(store.commitlog.segment_bases()[-1], 1)
    disk.ratio = 0.50
    store.enforce_retention()
    store.commitlog.settle()
    assert store.commitlog.spare_ready, "made again once there is room"


def test_a_write_that_finds_the_disk_full_gives_the_spare_space_back(
    store: MessageStore,
    loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    topic, _ = store.create_topic("t", 1)
    monkeypatch.setattr(commitlog_module.os, "pwrite", full)
    with pytest.raises(BrokerError, match="disk is full"):
        loop.run_until_complete(
            store.put(topic, 0, encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"x"))
        )
    monkeypatch.undo()
    assert not store.commitlog.spare_ready
    assert not spare(tmp_path / "commitlog").exists()


@pytest.mark.parametrize(
    ("error", "tries"), [(errno.ENOSPC, 2), (errno.EOPNOTSUPP, 1)], ids=["full", "unsupported"]
)
def test_a_file_system_without_fallocate_is_not_asked_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: int,
    tries: int,
) -> None:
    calls: list[int] = []

    def refuse(fd: int, length: int) -> None:
        calls.append(fd)
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(segment_allocator_module, "allocate", refuse)
    allocator = SegmentAllocator(tmp_path, SEGMENT)
    caplog.set_level(logging.INFO, "mockbroker.store")
    for _ in range(2):
        allocator.want()
        allocator.settle()
        assert not allocator.ready and not spare(tmp_path).exists()
    assert len(calls) == tries
    assert len(caplog.records) == 1, "said once"
