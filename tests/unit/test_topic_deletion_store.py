"""MessageStore.delete_topic: a deleted topic's records never come back, not even to a
topic created again with the same name, neither after a clean restart nor after a crash."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.message_store import MessageStore
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock


def frames(*bodies: bytes, first_id: int = 0, keys: tuple[bytes, ...] = ()) -> bytes:
    return b"".join(
        encode_frame(
            msg_id=(first_id + i).to_bytes(16, "big"), born_timestamp_ms=1, body=b, keys=keys
        )
        for i, b in enumerate(bodies)
    )


def opened(loop: asyncio.AbstractEventLoop, path: Path) -> MessageStore:
    store = MessageStore(
        path,
        sync_flush=False,
        segment_bytes=1 << 20,
        flush_interval_seconds=0.05,
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
    )
    store.open()
    loop.run_until_complete(store.start())
    return store


def read_all(store: MessageStore, name: str, queue_id: int = 0) -> list[bytes]:
    topic = store.topics.get(name)
    got = store.get(topic, queue_id, 0, max_messages=1000, max_bytes=1 << 20)
    return [r.body for r in iter_records(got.records)]


def deleted_then_created_again(loop: asyncio.AbstractEventLoop, path: Path) -> MessageStore:
    store = opened(loop, path)
    topic, _ = store.create_topic("orders", 1)
    loop.run_until_complete(store.put(topic, 0, frames(b"old-0", b"old-1", b"old-2", keys=(b"k",))))
    loop.run_until_complete(store.delete_topic("orders"))
    assert store.topics.find("orders") is None
    assert not (path / "consumequeue" / "orders").exists()
    again, created = store.create_topic("orders", 1)
    assert created
    loop.run_until_complete(store.put(again, 0, frames(b"new-0", first_id=100, keys=(b"k",))))
    return store


def test_a_topic_created_again_starts_empty_at_offset_zero(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = deleted_then_created_again(loop, tmp_path)
    assert read_all(store, "orders") == [b"new-0"]
    assert store.queue(store.topics.get("orders"), 0).max_offset == 1
    assert store.find_by_id((1).to_bytes(16, "big")) == []  # an old message's id
    assert [next(iter_records(r)).body for r in store.find_by_key("orders", "k")] == [b"new-0"]
    loop.run_until_complete(store.close())
    reopened = opened(loop, tmp_path)
    assert not reopened.recovery.crashed
    assert read_all(reopened, "orders") == [b"new-0"]
    loop.run_until_complete(reopened.close())


def test_recovery_after_a_crash_does_not_give_the_old_records_to_the_new_topic(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = deleted_then_created_again(loop, tmp_path)
    loop.run_until_complete(store.close())
    # As kill -9 leaves it: no clean-shutdown mark, and a checkpoint from before it all.
    (tmp_path / "checkpoint").unlink()
    (tmp_path / "running").touch()
    again = opened(loop, tmp_path)
    assert again.recovery.crashed and again.recovery.records_replayed == 4
    assert again.recovery.deleted_records == 3 and again.recovery.corrupt_records == 0
    assert read_all(again, "orders") == [b"new-0"]
    assert again.find_by_id((0).to_bytes(16, "big")) == []
    loop.run_until_complete(again.close())


def test_queue_files_a_crash_left_behind_are_removed_at_start(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    topic, _ = store.create_topic("orders", 2)
    loop.run_until_complete(store.put(topic, 1, frames(b"old")))
    end = store.commitlog.end
    loop.run_until_complete(store.close())
    # The registry saved the deletion; the process died before the queue files went.
    registry = tmp_path / "topics.json"
    data = json.loads(registry.read_text())
    del data["topics"]["orders"]
    data["deleted"] = {"orders": end}
    registry.write_text(json.dumps(data))
    (tmp_path / "running").touch()
    again = opened(loop, tmp_path)
    assert not (tmp_path / "consumequeue" / "orders").exists()
    recreated, _ = again.create_topic("orders", 2)
    assert again.queue(recreated, 1).max_offset == 0
    loop.run_until_complete(again.put(recreated, 1, frames(b"new", first_id=9)))
    assert read_all(again, "orders", 1) == [b"new"]
    loop.run_until_complete(again.close())


def test_deleting_a_missing_topic_is_refused_and_changes_nothing(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    store = opened(loop, tmp_path)
    store.create_topic("kept", 1)
    before = (tmp_path / "topics.json").read_bytes()
    with pytest.raises(BrokerError) as refused:
        loop.run_until_complete(store.delete_topic("missing"))
    assert refused.value.reason == "TOPIC_NOT_FOUND"
    assert (tmp_path / "topics.json").read_bytes() == before
    loop.run_until_complete(store.close())
