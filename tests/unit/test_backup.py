"""The backup's cut: everything written before it is in the copy, nothing written after."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest
from grpc import StatusCode

from mockbroker.backup import Backups
from mockbroker.errors import BrokerError
from mockbroker.store.consumequeue import ConsumeQueue
from mockbroker.store.message_store import MessageStore
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock


def frames(*bodies: bytes) -> bytes:
    return b"".join(
        encode_frame(msg_id=i.to_bytes(16, "big"), born_timestamp_ms=1, body=b)
        for i, b in enumerate(bodies)
    )


def make_store(path: Path) -> MessageStore:
    return MessageStore(
        path,
        sync_flush=False,
        segment_bytes=1 << 20,
        flush_interval_seconds=0.05,
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
    )


def queue_bodies(store: MessageStore, name: str, queue_id: int) -> list[bytes]:
    topic = store.topics.get(name)
    cq = store.queue(topic, queue_id)
    return [
        next(iter_records(store.read_record(topic, queue_id, o))).body
        for o in range(cq.min_offset, cq.max_offset)
    ]


def test_writes_after_the_cut_are_not_in_the_copy_and_those_before_are_whole(
    tmp_path: Path,
) -> None:
    copy = tmp_path / "copy"

    async def run() -> tuple[int, int]:
        store = make_store(tmp_path / "live")
        store.open()
        await store.start()
        try:
            topic, _ = store.create_topic("t", 2)
            await store.put(topic, 0, frames(b"a", b"b"))
            await store.put(topic, 1, frames(b"x" * 5000))
            backups = Backups(store, FakeClock())
            task = asyncio.create_task(backups.backup(str(copy)))
            store.write(topic, 0, frames(b"c"), store.check(frames(b"c")))  # before the cut
            await asyncio.sleep(0)  # the task takes the cut, then copies in a thread
            end_at_cut = store.commitlog.end
            # After the cut, while the copy runs: a send, a new topic, a retention check.
            await store.put(topic, 0, frames(b"after"))
            await store.put(topic, 1, frames(b"after"))
            store.create_topic("later", 1)
            assert store.enforce_retention() == 0
            report = await task
            assert report.commit_log_end == end_at_cut
            return report.commit_log_end, report.messages
        finally:
            await store.close()

    cut_end, messages = asyncio.run(run())
    assert messages == 4
    assert not (copy / "running").exists(), "the copy starts as after a clean shutdown"

    async def restored() -> None:
        store = make_store(copy)
        report = store.open()
        await store.start()
        try:
            assert not report.crashed
            assert store.commitlog.end == cut_end
            assert [t.name for t in store.topics.all()] == ["t"]
            assert queue_bodies(store, "t", 0) == [b"a", b"b", b"c"]
            assert queue_bodies(store, "t", 1) == [b"x" * 5000]
            # The id index was cut at the same moment: 3 records carry id 0 before it.
            assert len(list(store.records_by_id((0).to_bytes(16, "big")))) == 3
        finally:
            await store.close()

    asyncio.run(restored())


def test_a_cut_that_cannot_write_the_queues_entries_fails_the_backup_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cut writes the entries each queue keeps in memory, so that the copy can read
    # them from the files: a full disk then fails the backup, not the store.
    copy = tmp_path / "copy"
    write_tail = ConsumeQueue.write_tail

    def full(self: ConsumeQueue) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    async def run() -> None:
        store = make_store(tmp_path / "live")
        store.open()
        await store.start()
        try:
            topic, _ = store.create_topic("t", 1)
            await store.put(topic, 0, frames(b"a"))
            backups = Backups(store, FakeClock())
            monkeypatch.setattr(ConsumeQueue, "write_tail", full)
            with pytest.raises(BrokerError, match="No space left") as failed:
                await backups.backup(str(copy))
            assert failed.value.status is StatusCode.FAILED_PRECONDITION
            assert not copy.exists() or not any(copy.iterdir()), "nothing copied"
            monkeypatch.setattr(ConsumeQueue, "write_tail", write_tail)
            await store.put(topic, 0, frames(b"b"))  # the store goes on
            assert store.enforce_retention() == 0  # retention is not held
            report = await backups.backup(str(copy))
            assert report.messages == 2
        finally:
            await store.close()

    asyncio.run(run())
    store = make_store(copy)
    store.open()
    assert queue_bodies(store, "t", 0) == [b"a", b"b"]
    asyncio.run(store.close())
