"""Per-topic retention on a fake clock: expiry by time and by size, holds on segments,
settings saved in the registry and kept across a restart."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.consumequeue import ENTRY, ConsumeQueue
from mockbroker.store.message_store import MessageStore
from mockbroker.store.topic_expiry import SizeWindow
from mockbroker.topics import Topic, TopicRegistry, TopicRetention
from sdk.errors import CorruptFileError
from sdk.testing import FakeClock
from tests.unit.test_retention import HOUR, FakeDisk, checkpoint, offsets_served, open_store, send


def record_size(store: MessageStore, topic: Topic) -> int:
    """The stored size of each message the `send` helper writes (all alike)."""
    return store.queue(topic, 0).entry(0)[1]


def test_a_shorter_topic_retention_expires_its_messages_and_leaves_the_others(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    trims: list[tuple[str, int, int, int]] = []
    store.on_trim = lambda *a: trims.append(a)
    short, _ = store.create_topic("short", 1, TopicRetention(hours=1))
    other, _ = store.create_topic("other", 1)
    send(loop, store, short, 10)
    send(loop, store, other, 10)
    clock.advance(HOUR / 2)
    send(loop, store, short, 5, key=b"young")
    checkpoint(loop, store)
    segments = store.commitlog.segment_bases()

    clock.advance(HOUR / 2 - 1)  # the first ten are an hour old less a second: kept
    store.enforce_retention()
    assert store.queue(short, 0).min_offset == 0

    clock.advance(2)
    store.enforce_retention()
    assert store.queue(short, 0).min_offset == 10
    assert offsets_served(store, short, 10) == list(range(10, 15))
    below = store.get(short, 0, 0, max_messages=10, max_bytes=1 << 20)
    assert (below.status, below.next_offset) == ("OFFSET_ILLEGAL", 10)
    assert store.queue(other, 0).min_offset == 0, "the broker's 72 h still hold for the others"
    assert offsets_served(store, other, 0) == list(range(10))
    assert trims == [("short", 0, 0, 10)], "groups see the expired messages as skipped"
    assert store.retention_stats.messages_expired == 10
    assert store.retention_stats.messages_deleted == 0
    assert store.commitlog.segment_bases() == segments, "the shared segments stay on disk"

    loop.run_until_complete(store.close())
    store = open_store(loop, tmp_path, clock, disk)
    assert store.topics.get("short").retention == TopicRetention(hours=1)
    assert store.queue(short, 0).min_offset == 10, "a restart serves no expired message"
    loop.run_until_complete(store.close())


def test_a_size_cap_keeps_each_queues_newest_bytes_counting_only_what_is_new(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)
    capped, _ = store.create_topic("capped", 1)
    send(loop, store, capped, 10)
    size = record_size(store, capped)
    loop.run_until_complete(
        store.set_topic_retention("capped", TopicRetention(bytes_per_queue=3 * size))
    )
    store.enforce_retention()
    assert store.queue(capped, 0).min_offset == 7
    assert offsets_served(store, capped, 7) == [7, 8, 9]

    send(loop, store, capped, 2)
    store.enforce_retention()
    assert store.queue(capped, 0).min_offset == 9

    loop.run_until_complete(store.set_topic_retention("capped", TopicRetention(bytes_per_queue=1)))
    store.enforce_retention()
    assert offsets_served(store, capped, 11) == [11], "the newest message always stays"

    loop.run_until_complete(store.close())
    store = open_store(loop, tmp_path, clock, disk)
    capped = store.topics.get("capped")
    assert offsets_served(store, capped, 0) == [], "below the min offset: nothing"
    assert store.queue(capped, 0).min_offset == 11, "a restart serves no expired message"

    loop.run_until_complete(store.set_topic_retention("capped", TopicRetention()))
    send(loop, store, capped, 3)
    store.enforce_retention()
    assert store.queue(capped, 0).min_offset == 11, "back to the default: nothing more expires"
    loop.run_until_complete(store.close())


def test_a_longer_topic_retention_holds_the_segments_its_messages_are_in(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    clock, disk = FakeClock(), FakeDisk()
    store = open_store(loop, tmp_path, clock, disk)  # the broker keeps 72 h
    audit, _ = store.create_topic("audit", 1, TopicRetention(hours=240))
    other, _ = store.create_topic("other", 1)
    send(loop, store, other, 20)
    send(loop, store, audit, 3)
    send(loop, store, other, 30)
    clock.advance(HOUR)
    send(loop, store, other, 30, key=b"young")
    checkpoint(loop, store)
    held_at = store.queue(audit, 0).entry(0)[0]

    clock.advance(72 * HOUR)  # all but the young ones are past the broker's 72 h
    assert store.enforce_retention() > 0, "the segments before audit's messages go"
    assert store.commitlog.start <= held_at
    assert store.queue(audit, 0).min_offset == 0
    assert offsets_served(store, audit, 0) == [0, 1, 2]
    kept = store.queue(other, 0).min_offset
    assert 0 < kept < 20, "what shares audit's segment is kept with it"

    clock.advance(240 * HOUR - 72 * HOUR)  # audit's messages are 240 h old: they go too
    store.enforce_retention()
    assert store.commitlog.start > held_at
    assert store.queue(audit, 0).min_offset == 3
    loop.run_until_complete(store.close())


def test_settings_are_checked_saved_and_an_older_file_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "topics.json"
    registry = TopicRegistry(path)
    day = TopicRetention(hours=24, bytes_per_queue=1 << 20)
    registry.create("orders", 4, day)
    registry.create("plain", 2)
    assert registry.create("orders", 4) == (registry.get("orders"), False)
    assert registry.create("orders", 4, day)[1] is False
    with pytest.raises(BrokerError) as other:
        registry.create("orders", 4, TopicRetention(hours=48))
    assert other.value.reason == "TOPIC_EXISTS" and "set-retention" in other.value.message

    saved = json.loads(path.read_text())
    assert saved["topics"] == {"orders": 4, "plain": 2}, "the queue counts read as before"
    assert saved["retention"] == {"orders": {"hours": 24, "bytes_per_queue": 1 << 20}}
    reloaded = TopicRegistry(path)
    reloaded.load()
    assert reloaded.get("orders").retention == day
    assert reloaded.get("plain").retention.is_default

    reloaded.set_retention("orders", TopicRetention())
    assert "retention" not in json.loads(path.read_text())
    with pytest.raises(BrokerError) as missing:
        reloaded.set_retention("nosuch", day)
    assert missing.value.reason == "TOPIC_NOT_FOUND"

    path.write_text(json.dumps({"topics": {"t": 1}, "retention": {"t": {"hours": -1}}}))
    with pytest.raises(CorruptFileError, match="retention hours -1"):
        TopicRegistry(path).load()


@pytest.mark.parametrize(
    ("hours", "size", "message"),
    [
        (0.0, None, "retention hours 0.0 must be within"),
        (-1.0, None, "retention hours -1.0 must be within"),
        (87_601.0, None, "retention hours 87601.0 must be within"),
        (None, 0, "retention bytes per queue 0 must be positive"),
    ],
)
def test_out_of_range_settings_are_refused_by_name(
    hours: float | None, size: int | None, message: str
) -> None:
    with pytest.raises(BrokerError) as bad:
        TopicRetention(hours=hours, bytes_per_queue=size)
    assert bad.value.reason == "INVALID_ARGUMENT" and message in bad.value.message


def test_a_size_window_counts_afresh_once_the_queue_head_moves_under_it(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "cq")
    cq.append(b"".join(ENTRY.pack(100 * i, 10, 0) for i in range(10)))
    window = SizeWindow()
    assert window.floor(cq, 30) == 7
    cq.trim_below(800)  # a segment deletion takes the head past the window's start
    assert cq.min_offset == 8
    assert window.floor(cq, 30) == 8 and window.bytes == 20
    cq.append(ENTRY.pack(1000, 25, 0))
    assert window.floor(cq, 30) == 10 and window.bytes == 25
    cq.close()


def test_a_retention_change_saves_the_registry_in_a_worker_thread_not_on_the_loop(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(loop, tmp_path, FakeClock(), FakeDisk())
    store.create_topic("capped", 1)
    saved_on: list[threading.Thread] = []
    write = TopicRegistry.write

    def recorded(self: TopicRegistry, data: bytes, names: list[str], change: str) -> None:
        saved_on.append(threading.current_thread())
        write(self, data, names, change)

    monkeypatch.setattr(TopicRegistry, "write", recorded)
    day = TopicRetention(hours=24)
    loop.run_until_complete(store.set_topic_retention("capped", day))
    assert saved_on and threading.current_thread() not in saved_on, "an fsync on the loop"
    assert store.topics.get("capped").retention == day
    loop.run_until_complete(store.close())
    reopened = open_store(loop, tmp_path, FakeClock(), FakeDisk())
    assert reopened.topics.get("capped").retention == day, "saved before it applied"
    loop.run_until_complete(reopened.close())
