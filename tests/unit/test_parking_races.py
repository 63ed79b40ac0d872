"""A parked key's copies and its release do not interleave.

Copying a parked key's new messages awaits the store's append; a second copy of the same
key (a pull meeting them while the consumer parks the key again) or an operator's
release must not run in between, or a message is parked twice and sent back twice, or
the release names copies it did not send back.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import mockbroker.parking as parking_module
from mockbroker.parking import Parking, parked_topic
from mockbroker.store.message_store import MessageStore
from mockbroker.store.records import check_frames
from mockbroker.topic_creation import TopicCreation
from mockbroker.topics import Topic
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock

KEY = "account-7"


def keyed(*bodies: bytes) -> bytes:
    return b"".join(
        encode_frame(
            msg_id=body.ljust(16, b"-"), born_timestamp_ms=1, body=body, sharding_key=KEY.encode()
        )
        for body in bodies
    )


class HeldAppends:
    """The store's append, whose next call waits until `go` is set (once `hold` is)."""

    def __init__(self, store: MessageStore) -> None:
        self._append = store.append
        self.hold = False
        self.holding = asyncio.Event()
        self.go = asyncio.Event()
        store.append = self  # type: ignore[method-assign]

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.hold:
            self.hold = False
            self.holding.set()
            await self.go.wait()
        return await self._append(*args, **kwargs)


async def parked_world(
    tmp_path: Path,
) -> tuple[MessageStore, Topic, Parking, Callable[..., Awaitable[None]]]:
    store = MessageStore(
        tmp_path / "store", sync_flush=False, segment_bytes=1 << 20,
        flush_interval_seconds=0.05, sync_flush_timeout_seconds=5, clock=FakeClock(),
    )  # fmt: skip
    store.open()
    await store.start()
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)
    topic, _ = store.create_topic("keyed", 1)
    parking = Parking(
        store, FakeClock(1_000.0), creation.system_topic,
        lambda *holder: None, lambda *queue: None, tmp_path / "parking.json",
    )  # fmt: skip

    async def send(*bodies: bytes) -> None:
        data = keyed(*bodies)
        await store.append(topic, 0, data, check_frames(data, 1))

    return store, topic, parking, send


async def steps(turns: int = 5) -> None:
    """Let the tasks just created run their first steps (the loop's own order, no clock)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def park(parking: Parking, topic: Topic, from_offset: int) -> None:
    await parking.park("billing", topic, 0, KEY, from_offset, "keeps failing",
                       client_id="c1", epoch=1)  # fmt: skip


def bodies_from(store: MessageStore, topic: Topic, queue_id: int, offset: int) -> list[bytes]:
    end = store.queue(topic, queue_id).max_offset
    return [
        next(iter_records(store.read_record(topic, queue_id, o))).body for o in range(offset, end)
    ]


def test_a_key_parked_again_while_its_copy_is_written_is_copied_and_sent_back_once(
    tmp_path: Path,
) -> None:
    asyncio.run(parked_again_while_copying(tmp_path))


async def parked_again_while_copying(tmp_path: Path) -> None:
    store, topic, parking, send = await parked_world(tmp_path)
    await send(b"m0")
    await park(parking, topic, 0)
    await send(b"m1", b"m2")
    appends = HeldAppends(store)
    appends.hold = True
    first = asyncio.create_task(park(parking, topic, 0))
    await appends.holding.wait()  # copying m1 and m2
    second = asyncio.create_task(park(parking, topic, 0))
    await steps()  # the second reads what to copy: in the first's copy, or after it
    appends.go.set()
    await asyncio.gather(first, second)

    [entry] = parking.entries("billing")
    parked = store.topics.find(parked_topic("billing"))
    assert parked is not None
    assert bodies_from(store, parked, 0, 0) == [b"m0", b"m1", b"m2"]
    assert len(entry.copies) == 3
    await parking.release("billing", topic, 0, KEY)
    assert bodies_from(store, topic, 0, 3) == [b"m0", b"m1", b"m2"]


def test_a_release_while_a_copy_is_written_waits_for_it_and_sends_each_message_back_once(
    tmp_path: Path,
) -> None:
    asyncio.run(released_while_copying(tmp_path))


async def released_while_copying(tmp_path: Path) -> None:
    store, topic, parking, send = await parked_world(tmp_path)
    await send(b"m0")
    await park(parking, topic, 0)
    await send(b"m1")
    appends = HeldAppends(store)
    appends.hold = True
    copying = asyncio.create_task(park(parking, topic, 0))
    await appends.holding.wait()  # copying m1
    releasing = asyncio.create_task(parking.release("billing", topic, 0, KEY))
    await steps()  # the release runs: in the copy, or after it
    appends.go.set()
    await asyncio.gather(copying, releasing)

    [entry] = parking.entries("billing")
    assert entry.released
    assert bodies_from(store, topic, 0, 2) == [b"m0", b"m1"]
    # What `recover` would send back after a crash is what the release sent back: no
    # copy named after the release was decided.
    assert entry.released_count == 2
    assert [r[-2:] for r in parking._release_frames(entry, topic)] == [b"m0", b"m1"]


def test_pulls_and_forgetting_save_the_parked_keys_in_a_worker_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(saved_off_the_loop(tmp_path, monkeypatch))


async def saved_off_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store, topic, parking, send = await parked_world(tmp_path)
    await send(b"m0")
    await park(parking, topic, 0)
    writers: list[int] = []
    write = parking_module.write_atomically

    def recording(path: Path, data: bytes) -> None:
        writers.append(threading.get_ident())
        write(path, data)

    monkeypatch.setattr(parking_module, "write_atomically", recording)
    await send(b"m1")
    got = store.get(topic, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (await parking.filter("billing", topic, 0, got)).count == 0, "both are the key's"
    assert len(writers) == 1, "the pull copied m1 and saved that"
    await parking.forget(lambda entry: True)
    assert len(writers) == 2
    assert threading.get_ident() not in writers, "written on the event loop"
    assert json.loads((tmp_path / "parking.json").read_bytes())["keys"] == []
