"""Creating topics: the registry's durable order, and the one place every front creates in.

A topic exists once `topics.json` holds it: a save that fails (a full disk) is refused
with DISK_FULL and leaves nothing of the topic, in memory or after a restart. Creation
(mockbroker/topic_creation.py) checks the name, the disk and the limits before anything
is created, and refuses a request past a limit whole, naming the limit.
"""

from __future__ import annotations

import asyncio
import errno
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import topics as topics_module
from mockbroker.errors import BrokerError
from mockbroker.store.files import write_atomically
from mockbroker.store.message_store import MessageStore
from mockbroker.store.retention import DiskUsage
from mockbroker.topic_creation import TopicCreation
from mockbroker.topics import Topic, TopicRegistry, TopicRetention
from sdk.testing import FakeClock


def full_disk(path: Path, data: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_topic_whose_registry_save_fails_is_refused_and_absent_then_and_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "topics.json"
    registry = TopicRegistry(path)
    registry.create("kept", 2)
    with monkeypatch.context() as patched:
        patched.setattr(topics_module, "write_atomically", full_disk)
        with pytest.raises(BrokerError) as refused:
            registry.create("lost", 4)
    assert (refused.value.status.name, refused.value.reason) == ("UNAVAILABLE", "DISK_FULL")
    assert "'lost' was not created" in refused.value.message
    assert registry.find("lost") is None, "a topic nobody could find after a restart"
    assert [t.name for t in registry.all()] == ["kept"]
    registry.create("later", 1)  # the next save holds only what was saved
    reopened = TopicRegistry(path)
    reopened.load()
    assert [t.name for t in reopened.all()] == ["kept", "later"]


def test_a_registry_save_failing_otherwise_is_store_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(path: Path, data: bytes) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    registry = TopicRegistry(tmp_path / "topics.json")
    monkeypatch.setattr(topics_module, "write_atomically", read_only)
    with pytest.raises(BrokerError) as refused:
        registry.create("t", 1)
    assert (refused.value.status.name, refused.value.reason) == (
        "UNAVAILABLE",
        "STORE_UNAVAILABLE",
    )
    assert registry.find("t") is None


class Disk:
    """A simulated disk whose use the test sets (the store reads it at each disk check)."""

    def __init__(self) -> None:
        self.used_bytes = 0

    def probe(self) -> DiskUsage:
        return DiskUsage(total_bytes=100, used_bytes=self.used_bytes)


@pytest.fixture
def disk() -> Disk:
    return Disk()


@pytest.fixture
def store(tmp_path: Path, disk: Disk, loop: asyncio.AbstractEventLoop) -> Iterator[MessageStore]:
    store = MessageStore(
        tmp_path / "data", sync_flush=False, segment_bytes=1 << 20, flush_interval_seconds=60,
        sync_flush_timeout_seconds=5, clock=FakeClock(), disk_probe=disk.probe,
    )  # fmt: skip
    store.open()
    loop.run_until_complete(store.start())
    yield store
    loop.run_until_complete(store.close())


def names(store: MessageStore) -> list[str]:
    return [t.name for t in store.topics.all() if not t.name.startswith("rmq_sys_")]


def test_retry_topics_past_the_clients_limit_are_refused_whole_naming_the_limit(
    store: MessageStore, loop: asyncio.AbstractEventLoop
) -> None:
    run = loop.run_until_complete
    creation = TopicCreation(store, max_topics=100, client_max_topics=3)
    run(creation.retry_topics(["a"], client="peer-1"))
    with pytest.raises(BrokerError) as refused:
        run(creation.retry_topics(["a", "b", "c", "d"], client="peer-1"))  # 3 new: 4 in all
    assert (refused.value.status.name, refused.value.reason) == (
        "RESOURCE_EXHAUSTED",
        "TOO_MANY_TOPICS",
    )
    assert "client_max_topics" in refused.value.message and "3" in refused.value.message
    assert names(store) == ["%RETRY%a"], "nothing of the refused request was created"
    run(creation.retry_topics(["a", "b", "c"], client="peer-1"))  # exactly at the limit
    run(creation.retry_topics(["d"], client="peer-2"))  # another client has its own count
    assert names(store) == ["%RETRY%a", "%RETRY%b", "%RETRY%c", "%RETRY%d"]
    assert creation.refused == {"client_max_topics": 1}


def test_topics_past_the_brokers_limit_are_refused_naming_the_limit(
    store: MessageStore, loop: asyncio.AbstractEventLoop
) -> None:
    run = loop.run_until_complete
    present = len(store.topics.all())  # the broker's own (the scheduler's) count too
    creation = TopicCreation(store, max_topics=present + 2, client_max_topics=100)
    run(creation.user_topic("one", 4, client="a"))
    run(creation.user_topic("two", 4, client="b"))
    found = run(creation.user_topic("one", 4, client="c"))
    assert found.name == "one", "an existing one is found"
    with pytest.raises(BrokerError) as refused:
        run(creation.user_topic("three", 4, client="c"))
    assert refused.value.reason == "TOO_MANY_TOPICS"
    assert "max_topics" in refused.value.message
    with pytest.raises(BrokerError):
        run(creation.system_topic("%DLQ%g"))  # the broker's own need is under the same limit
    assert names(store) == ["one", "two"]
    assert creation.refused == {"max_topics": 2}


def test_no_topic_is_created_while_the_disk_refuses_sends(
    store: MessageStore, disk: Disk, loop: asyncio.AbstractEventLoop
) -> None:
    run = loop.run_until_complete
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)
    disk.used_bytes = 95  # past the refuse ratio (90 %)
    store.enforce_retention()  # the disk check
    assert store.refusing_sends
    for create in (
        lambda: creation.user_topic("orders", 8, client="a"),
        lambda: creation.retry_topics(["g"], client="a"),
        lambda: creation.system_topic("%DLQ%g"),
        lambda: creation.create("orders", 8),
    ):
        with pytest.raises(BrokerError) as refused:
            run(create())
        assert (refused.value.status.name, refused.value.reason) == ("UNAVAILABLE", "DISK_FULL")
        assert "was not created" in refused.value.message
    assert names(store) == []
    assert creation.refused == {"disk_full": 4}
    disk.used_bytes = 10
    store.enforce_retention()
    assert run(creation.create("orders", 8)) == (store.topics.get("orders"), True)


def test_names_are_checked_before_anything_else(
    store: MessageStore, disk: Disk, loop: asyncio.AbstractEventLoop
) -> None:
    run = loop.run_until_complete
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)
    disk.used_bytes = 95
    store.enforce_retention()
    with pytest.raises(BrokerError) as bad_topic:
        run(creation.user_topic("%RETRY%g", 8, client="a"))  # not a user topic
    with pytest.raises(BrokerError) as bad_group:
        run(creation.retry_topics(["ok", "no spaces"], client="a"))
    assert (bad_topic.value.reason, bad_group.value.reason) == ("INVALID_TOPIC", "INVALID_GROUP")


def test_a_creation_saves_the_registry_in_a_worker_thread_not_on_the_event_loop(
    store: MessageStore, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved_on: list[threading.Thread] = []

    def recording(path: Path, data: bytes) -> None:
        saved_on.append(threading.current_thread())
        write_atomically(path, data)

    monkeypatch.setattr(topics_module, "write_atomically", recording)
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)

    async def create() -> threading.Thread:
        await creation.user_topic("orders", 4, client="a")
        await creation.retry_topics(["g"], client="a")
        await creation.system_topic("%DLQ%g")
        await creation.create("operated", 2)
        return threading.current_thread()

    loops_thread = loop.run_until_complete(create())
    assert len(saved_on) == 4
    assert loops_thread not in saved_on, "a creation's fsync stalled every client"
    assert names(store) == ["%DLQ%g", "%RETRY%g", "operated", "orders"]


def test_an_existing_topic_is_found_without_waiting(
    store: MessageStore, loop: asyncio.AbstractEventLoop
) -> None:
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)
    loop.run_until_complete(creation.user_topic("orders", 4, client="a"))
    found = creation.user_topic("orders", 4, client="a")
    with pytest.raises(StopIteration) as done:
        found.send(None)  # finished at its first step: it never suspended
    assert done.value.value == store.topics.get("orders")


def test_concurrent_creations_of_one_name_make_one_topic_that_both_get(
    store: MessageStore, loop: asyncio.AbstractEventLoop, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[bytes] = []

    def counting(path: Path, data: bytes) -> None:
        saves.append(data)
        write_atomically(path, data)

    monkeypatch.setattr(topics_module, "write_atomically", counting)
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)

    async def both() -> list[tuple[Topic, bool]]:
        return await asyncio.gather(creation.create("orders", 4), creation.create("orders", 4))

    first, second = loop.run_until_complete(both())
    assert first == (store.topics.get("orders"), True)
    assert second == (store.topics.get("orders"), False), "the second waited for the first"
    assert len(saves) == 1, "one creation"

    async def three() -> list[Topic]:
        return await asyncio.gather(*(creation.user_topic("keys", 2, client=c) for c in "abc"))

    found = loop.run_until_complete(three())
    assert found == [store.topics.get("keys")] * 3 and len(saves) == 2


def test_concurrent_creations_of_two_names_both_reach_the_registry_file(
    store: MessageStore, loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)

    async def both() -> None:
        await asyncio.gather(
            creation.user_topic("orders", 4, client="a"),
            creation.user_topic("invoices", 2, client="b"),
            creation.retry_topics(["g", "h"], client="c"),
        )

    loop.run_until_complete(both())
    reloaded = TopicRegistry(tmp_path / "data" / "topics.json")
    reloaded.load()
    assert [t.name for t in reloaded.all() if not t.name.startswith("rmq_sys_")] == [
        "%RETRY%g",
        "%RETRY%h",
        "invoices",
        "orders",
    ]
    assert names(store) == ["%RETRY%g", "%RETRY%h", "invoices", "orders"]


def test_concurrent_creations_past_the_brokers_limit_create_only_up_to_it(
    store: MessageStore, loop: asyncio.AbstractEventLoop
) -> None:
    present = len(store.topics.all())
    creation = TopicCreation(store, max_topics=present + 1, client_max_topics=100)

    async def both() -> list[Topic | BaseException]:
        return await asyncio.gather(
            creation.user_topic("one", 1, client="a"),
            creation.user_topic("two", 1, client="b"),
            return_exceptions=True,
        )

    one, two = loop.run_until_complete(both())
    assert one == store.topics.get("one")
    assert isinstance(two, BrokerError) and two.reason == "TOO_MANY_TOPICS"
    assert names(store) == ["one"]


def test_a_creation_whose_save_fails_leaves_no_trace_and_is_disk_full(
    store: MessageStore,
    loop: asyncio.AbstractEventLoop,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    run = loop.run_until_complete
    creation = TopicCreation(store, max_topics=100, client_max_topics=1)
    version = store.topics.version
    with monkeypatch.context() as patched:
        patched.setattr(topics_module, "write_atomically", full_disk)

        async def both() -> list[Topic | BaseException]:
            return await asyncio.gather(
                creation.user_topic("orders", 4, client="a"),
                creation.user_topic("orders", 4, client="b"),
                return_exceptions=True,
            )

        first, second = run(both())
    assert isinstance(first, BrokerError) and first.reason == "DISK_FULL"
    assert second is first, "the second waited for the first: the same error"
    assert first.status.name == "UNAVAILABLE" and "'orders' was not created" in first.message
    assert store.topics.find("orders") is None and store.topics.version == version
    assert not (tmp_path / "data" / "topics.json.tmp").exists()
    reloaded = TopicRegistry(tmp_path / "data" / "topics.json")
    reloaded.load()
    assert reloaded.find("orders") is None
    # Nothing counted against the client: its one topic may still be created.
    assert run(creation.user_topic("orders", 4, client="a")) == store.topics.get("orders")


def test_a_store_topic_whose_save_fails_leaves_nothing_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.new_event_loop()

    def opened() -> MessageStore:
        store = MessageStore(
            tmp_path / "data", sync_flush=False, segment_bytes=1 << 20,
            flush_interval_seconds=60, sync_flush_timeout_seconds=5, clock=FakeClock(),
        )  # fmt: skip
        store.open()
        loop.run_until_complete(store.start())
        return store

    try:
        store = opened()
        with monkeypatch.context() as patched:
            patched.setattr(topics_module, "write_atomically", full_disk)
            with pytest.raises(BrokerError) as refused:
                store.create_topic("orders", 4)
        assert refused.value.reason == "DISK_FULL"
        assert store.topics.find("orders") is None
        loop.run_until_complete(store.close())
        store = opened()
        assert store.topics.find("orders") is None
        topic, created = store.create_topic("orders", 4)  # once there is room again
        assert created and topic.queue_count == 4
        loop.run_until_complete(store.close())
    finally:
        loop.close()


def test_an_operators_change_during_a_creation_loses_neither_from_the_registry_file(
    store: MessageStore,
    loop: asyncio.AbstractEventLoop,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = loop.run_until_complete
    creation = TopicCreation(store, max_topics=100, client_max_topics=100)
    run(creation.create("old", 1))
    run(creation.create("gone", 1))
    saving, go = threading.Event(), threading.Event()

    def held(path: Path, data: bytes) -> None:
        if threading.current_thread() is not threading.main_thread():
            saving.set()  # the creation's save, in its worker thread: held until `go`
            go.wait(5)
        write_atomically(path, data)

    monkeypatch.setattr(topics_module, "write_atomically", held)

    async def together() -> None:
        creating = asyncio.ensure_future(creation.create("new", 2))
        while not saving.is_set():
            await asyncio.sleep(0.001)
        changes = asyncio.gather(
            store.set_topic_retention("old", TopicRetention(hours=1)),
            store.delete_topic("gone"),
        )
        await asyncio.sleep(0.01)  # as far as they go while the creation's save is held
        go.set()
        await asyncio.gather(creating, changes)

    run(together())
    reloaded = TopicRegistry(tmp_path / "data" / "topics.json")
    reloaded.load()
    assert [t.name for t in reloaded.all() if not t.name.startswith("rmq_sys_")] == [
        "new",
        "old",
    ]
    assert reloaded.get("old").retention == TopicRetention(hours=1)
    assert "gone" in reloaded.deleted()
