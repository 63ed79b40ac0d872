"""A broadcasting member's offsets file: persists one at a time, never moving back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from pathlib import Path

from sdk.consumer.local_offsets import LocalFileOffsetStore
from sdk.message import MessageQueue

Q = MessageQueue("t", "b", 0)


def stored_offset(path: Path) -> int:
    [item] = json.loads(path.read_text())["offsets"]
    return int(item["offset"])


class ObservedWrites:
    """A store's file writes, counted as they overlap; the first one held back until
    `release_first` is set (or `hold_seconds` passed)."""

    def __init__(self, store: LocalFileOffsetStore, hold_seconds: float) -> None:
        self._write = store._write
        self._hold_seconds = hold_seconds
        self.first_writing = threading.Event()
        self.release_first = threading.Event()
        self.most_at_once = 0
        self._writers = 0
        self._count = threading.Lock()
        store._write = self  # type: ignore[method-assign]

    def __call__(self, offsets: dict[MessageQueue, int]) -> None:
        with self._count:
            self._writers += 1
            self.most_at_once = max(self.most_at_once, self._writers)
            first = not self.first_writing.is_set()
        self.first_writing.set()
        if first:
            self.release_first.wait(timeout=self._hold_seconds)
        self._write(offsets)
        with self._count:
            self._writers -= 1
        if not first:
            self.release_first.set()


def test_a_persist_started_during_another_waits_and_the_newer_offset_is_written_last(
    tmp_path: Path,
) -> None:
    # A shutdown's persist can start while the periodic one is still writing (a make test
    # run failed so: the second rename found the shared temporary file gone, and had the
    # older write ended last, the file would have moved the offset back).
    store = LocalFileOffsetStore(tmp_path)
    # The first write is held back until the second ended, or could have.
    writes = ObservedWrites(store, hold_seconds=0.5)

    async def two_persists() -> None:
        store.update(Q, 5)
        periodic = asyncio.create_task(store.persist())
        await asyncio.to_thread(writes.first_writing.wait, 5)
        store.update(Q, 9)
        await asyncio.gather(periodic, store.persist())

    asyncio.run(two_persists())
    assert writes.most_at_once == 1
    assert stored_offset(store.path) == 9
    assert asyncio.run(LocalFileOffsetStore(tmp_path).fetch(Q)) == 9


def test_a_persist_cancelled_while_it_writes_holds_the_file_until_its_write_ended(
    tmp_path: Path,
) -> None:
    # A consumer's stop cancels the periodic persist, whose write goes on in its thread;
    # the shutdown's persist that follows must not write beside it (a test run failed
    # so: FileNotFoundError, the shared temporary file renamed by the other).
    store = LocalFileOffsetStore(tmp_path)
    writes = ObservedWrites(store, hold_seconds=5)

    async def cancelled_then_persisted() -> bool:
        store.update(Q, 5)
        periodic = asyncio.create_task(store.persist())
        await asyncio.to_thread(writes.first_writing.wait, 5)
        periodic.cancel()
        for _ in range(10):  # turns of the loop: the cancellation is delivered
            await asyncio.sleep(0)
        held = store._persisting.locked()
        store.update(Q, 9)
        shutdown = asyncio.create_task(store.persist())
        writes.release_first.set()
        await shutdown
        with contextlib.suppress(asyncio.CancelledError):
            await periodic
        return held

    assert asyncio.run(cancelled_then_persisted()), "held while the cancelled write runs"
    assert writes.most_at_once == 1
    assert stored_offset(store.path) == 9
