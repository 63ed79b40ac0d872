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


def test_a_persist_started_during_another_waits_and_the_newer_offset_is_written_last(
    tmp_path: Path,
) -> None:
    # A shutdown's persist can start while the periodic one is still writing (a make test
    # run failed so: the second rename found the shared temporary file gone, and had the
    # older write ended last, the file would have moved the offset back).
    store = LocalFileOffsetStore(tmp_path)
    write = store._write
    first_writing = threading.Event()
    second_written = threading.Event()
    writers = 0
    most_at_once = 0
    count = threading.Lock()

    def observed_write(offsets: dict[MessageQueue, int]) -> None:
        nonlocal writers, most_at_once
        with count:
            writers += 1
            most_at_once = max(most_at_once, writers)
            first = not first_writing.is_set()
        first_writing.set()
        if first:  # holds the first write back until the second ended, or could have
            second_written.wait(timeout=0.5)
        write(offsets)
        with count:
            writers -= 1
        if not first:
            second_written.set()

    store._write = observed_write  # type: ignore[method-assign]

    async def two_persists() -> None:
        store.update(Q, 5)
        periodic = asyncio.create_task(store.persist())
        await asyncio.to_thread(first_writing.wait, 5)
        store.update(Q, 9)
        await asyncio.gather(periodic, store.persist())

    asyncio.run(two_persists())
    assert most_at_once == 1
    assert stored_offset(store.path) == 9
    assert asyncio.run(LocalFileOffsetStore(tmp_path).fetch(Q)) == 9


def test_a_persist_cancelled_while_it_writes_holds_the_file_until_its_write_ended(
    tmp_path: Path,
) -> None:
    # A consumer's stop cancels the periodic persist, whose write goes on in its thread;
    # the shutdown's persist that follows must not write beside it (a make test run
    # failed so: FileNotFoundError, the shared temporary file renamed by the other).
    store = LocalFileOffsetStore(tmp_path)
    write = store._write
    first_writing = threading.Event()
    release_first = threading.Event()
    writers = 0
    most_at_once = 0
    count = threading.Lock()

    def observed_write(offsets: dict[MessageQueue, int]) -> None:
        nonlocal writers, most_at_once
        with count:
            writers += 1
            most_at_once = max(most_at_once, writers)
            first = not first_writing.is_set()
        first_writing.set()
        if first:
            release_first.wait(timeout=5)
        write(offsets)
        with count:
            writers -= 1

    store._write = observed_write  # type: ignore[method-assign]

    async def cancelled_then_persisted() -> bool:
        store.update(Q, 5)
        periodic = asyncio.create_task(store.persist())
        await asyncio.to_thread(first_writing.wait, 5)
        periodic.cancel()
        for _ in range(10):  # turns of the loop: the cancellation is delivered
            await asyncio.sleep(0)
        held = store._persisting.locked()
        store.update(Q, 9)
        shutdown = asyncio.create_task(store.persist())
        release_first.set()
        await shutdown
        with contextlib.suppress(asyncio.CancelledError):
            await periodic
        return held

    assert asyncio.run(cancelled_then_persisted()), "held while the cancelled write runs"
    assert most_at_once == 1
    assert stored_offset(store.path) == 9
