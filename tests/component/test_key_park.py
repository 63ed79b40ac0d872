"""Key mode's PARK policy: a key whose message keeps failing is set aside, in order, at the
broker, while the queue's other keys go on; an operator releases it and its messages come
back in order (issue 20)."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker import parking as parking_module
from mockbroker.store import commitlog as commitlog_module
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import Topic
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    KeyFailurePolicy,
    Message,
    MessageExt,
    MessageListenerOrderly,
    MessageQueue,
    ProcessingOrder,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk._wire import FRAME_LEN_PREFIX
from sdk.errors import InvalidArgumentError
from sdk.testing import TestBroker
from tests.component.admin_cli import client, run, run_json
from tests.component.pulling import read_queue
from tests.component.transports import broker_over
from tests.support import wait_until

TOPIC = "keyed"
PARK = PushConsumerConfig(
    suspend_current_queue_time=0.01, max_reconsume_times=2, persist_interval=0.1,
    key_failure_policy=KeyFailurePolicy.PARK,
)  # fmt: skip


class Accounts(MessageListenerOrderly):
    """Records each key's handled sequence numbers; fails on `poison` while `broken`."""

    def __init__(self, poison: bytes) -> None:
        self.poison = poison
        self.broken = True
        self.seen: dict[str, list[int]] = defaultdict(list)
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        if self.broken and any(m.body == self.poison for m in msgs):
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        with self.lock:
            for m in msgs:
                key, seq = m.body.decode().split(":")
                self.seen[key].append(int(seq))
        return ConsumeOrderlyStatus.SUCCESS

    def handled(self, key: str) -> list[int]:
        with self.lock:
            return list(self.seen[key])

    def keys_done(self, per_key: int) -> int:
        with self.lock:
            return sum(len(v) >= per_key for v in self.seen.values())


def send(address: str, bodies: list[tuple[str, int]]) -> None:
    with Producer(address) as p:
        p.send_batch([Message(TOPIC, f"{k}:{s}".encode(), sharding_key=k) for k, s in bodies])


def consumer(address: str, listener: Accounts, config: PushConsumerConfig = PARK) -> PushConsumer:
    c = PushConsumer("g", address, ordering=ProcessingOrder.KEY, config=config,
                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    c.subscribe(TOPIC)
    c.register_message_listener(listener)
    return c


def parked(broker: Any) -> list[dict[str, Any]]:
    keys: list[dict[str, Any]] = run_json(broker, "parked", "list", "g")
    return keys


def test_a_parked_key_waits_aside_through_a_restart_and_comes_back_in_order() -> None:
    keys = [f"k{i:02d}" for i in range(100)]
    with TestBroker(default_queues=1) as broker:
        send(broker.address, [(k, s) for s in range(3) for k in keys])  # k00:0 is offset 0
        listener = Accounts(poison=b"k00:0")
        with consumer(broker.address, listener):
            wait_until(lambda: listener.keys_done(3) == 99, 30, "the other 99 keys finished")
            wait_until(lambda: bool(parked(broker)), 10, "k00 parked")
            [entry] = parked(broker)
            assert (entry["sharding_key"], entry["parked_messages"]) == ("k00", 3)
            assert entry["queue"]["queue_id"] == 0 and not entry["released_at_ms"]
            assert "3 listener calls failed" in entry["reason"]
            send(broker.address, [("k00", 3), ("k00", 4), ("k01", 3)])  # k00's go aside too
            wait_until(lambda: listener.handled("k01") == [0, 1, 2, 3], 10, "k01:3")
        assert listener.handled("k00") == []
        assert parked(broker)[0]["parked_messages"] == 5
        [copy, *_] = read_queue(broker.address, MessageQueue("%PARKED%g", "broker-a", 0))
        assert copy.body == b"k00:0" and copy.properties["ORIGIN_QUEUE_OFFSET"] == "0"

        broker.restart()  # the parked key stays parked
        listener.broken = False
        with consumer(broker.address, listener):
            send(broker.address, [("k02", 3)])
            wait_until(lambda: listener.handled("k02") == [0, 1, 2, 3], 10, "k02:3")
            assert listener.handled("k00") == []
            result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
            assert result.exit_code == 0, result.output
            assert "5 parked message(s) back at the queue's end" in result.output
            wait_until(lambda: len(listener.handled("k00")) >= 5, 10, "k00 released")
        assert listener.handled("k00") == [0, 1, 2, 3, 4], "each once, in the order sent"
        for key in keys[1:]:
            seen = listener.handled(key)
            assert seen == sorted(seen) and set(seen) >= {0, 1, 2}, key
        # forgotten once the group committed past the release point (persist_interval 0.1)
        wait_until(lambda: parked(broker) == [], 10, "the released key forgotten")
        again = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes", "--queue", "0")
        assert again.exit_code != 0 and "PARKED_KEY_NOT_FOUND" in again.output


def test_park_is_refused_in_queue_mode_and_without_a_retry_limit() -> None:
    with pytest.raises(InvalidArgumentError, match="PARK needs max_reconsume_times"):
        PushConsumerConfig(key_failure_policy=KeyFailurePolicy.PARK)
    with pytest.raises(InvalidArgumentError, match=r"PARK needs ordering=ProcessingOrder\.KEY"):
        PushConsumer("g", "127.0.0.1:1", config=PARK)
    with pytest.raises(InvalidArgumentError, match="must be a KeyFailurePolicy, not str"):
        PushConsumerConfig(key_failure_policy="park")  # type: ignore[arg-type]


def test_over_rocketmq_a_key_that_cannot_be_parked_stalls_alone(tmp_path: Path) -> None:
    """RocketMQ has no parked keys: the failing key keeps retrying; the others finish."""
    with broker_over("rocketmq", tmp_path) as broker:
        send(broker.grpc_address, [(k, s) for s in range(2) for k in ("bad", "ok1", "ok2")])
        listener = Accounts(poison=b"bad:0")
        with consumer(broker.address, listener):
            wait_until(lambda: listener.keys_done(2) == 2, 30, "ok1 and ok2 finished")
        assert listener.handled("bad") == []


def test_a_parking_file_that_does_not_parse_is_set_aside_and_the_broker_starts(
    tmp_path: Path,
) -> None:
    (tmp_path / "parking.json").write_text('{"version": 1, "keys": [{"group": 7}]}')
    with TestBroker(tmp_path, default_queues=1) as broker:
        assert parked(broker) == []
    assert (tmp_path / "parking.json.corrupt").exists()


class FullDisk:
    """os.pwrite that fails ENOSPC while `full` is set (the store's writes: no room)."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0
        self.real = os.pwrite  # taken before the test patches it

    def __call__(self, fd: int, data: bytes | memoryview, offset: int) -> int:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data, offset)


def disk_broker(tmp_path: Path) -> EmbeddedBroker:
    """A broker on a simulated disk of 1 GB, empty (its refuse ratio 90%), checked often."""
    usage = tmp_path / "disk.json"
    usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 0}))
    config = BrokerConfig(data_dir=tmp_path / "data", port=0, default_queues=1,
                          disk_usage_file=usage, disk_check_seconds=0.05)  # fmt: skip
    return EmbeddedBroker(config)


def refused_parks(caplog: pytest.LogCaptureFixture, key: str) -> int:
    """How many of the consumer's attempts to park `key` the broker answered DISK_FULL."""
    return sum(
        f"could not park key {key!r}" in r.getMessage()
        and isinstance(r.args, tuple)
        and getattr(r.args[-1], "reason", "") == "DISK_FULL"
        and getattr(r.args[-1], "retriable", False)
        for r in list(caplog.records)
    )


def messages_of(broker: Any, topic: str) -> list[bytes]:
    return [m.body for m in read_queue(broker.address, MessageQueue(topic, "broker-a", 0))]


def test_a_key_a_full_disk_cannot_park_stays_stalled_and_is_parked_once_there_is_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ordermq.consumer")
    disk = FullDisk()
    monkeypatch.setattr(commitlog_module.os, "pwrite", disk)  # the os module: every write
    with disk_broker(tmp_path) as broker:
        send(broker.address, [(k, s) for s in range(3) for k in ("k00", "k01", "k02")])
        state = broker.broker.state
        assert state is not None
        disk.full = True
        listener = Accounts(poison=b"k00:0")
        with consumer(broker.address, listener):
            wait_until(lambda: listener.keys_done(3) == 2, 30, "k01 and k02 finished")
            wait_until(lambda: refused_parks(caplog, "k00") >= 2, 30, "two refused parks")
            assert disk.refused >= 1, "a copy was tried and the disk had no room"
            assert parked(broker) == [], "a key the broker could not copy is not parked"
            assert listener.handled("k00") == [], "stalled, not lost"
            assert state.store.topics.find("%DLQ%g") is None, "nor dead-lettered"
            disk.full = False  # room again: the consumer's next try parks it
            wait_until(lambda: bool(parked(broker)), 30, "k00 parked")
            [entry] = parked(broker)
            assert (entry["sharding_key"], entry["parked_messages"]) == ("k00", 3)
            assert messages_of(broker, "%PARKED%g") == [b"k00:0", b"k00:1", b"k00:2"]

            listener.broken = False
            disk.full = True
            result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
            assert result.exit_code != 0 and "DISK_FULL" in result.output, result.output
            [entry] = parked(broker)
            assert not entry["released_at_ms"] and entry["parked_messages"] == 3
            assert listener.handled("k00") == []
            disk.full = False
            wait_until(lambda: not state.store.refusing_sends, 10, "the disk check saw room")
            result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
            assert result.exit_code == 0, result.output
            wait_until(lambda: len(listener.handled("k00")) >= 3, 10, "k00 released")
        assert listener.handled("k00") == [0, 1, 2], "each once, in the order sent"
        assert messages_of(broker, TOPIC).count(b"k00:0") == 2, "the original and one copy"


def test_a_key_is_not_parked_while_the_disk_is_over_its_refuse_ratio(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ordermq.consumer")
    with disk_broker(tmp_path) as broker:
        send(broker.address, [(k, s) for s in range(2) for k in ("k00", "k01")])
        state = broker.broker.state
        assert state is not None
        with Producer(broker.address) as p:  # the group has a dead-letter topic already
            other = p.send(Message("other", b"other", sharding_key="x"))

        async def dead_letter(c: BrokerClient) -> None:
            await c.heartbeat("w", [GroupInfo("g", "CONSUME_ORDERLY")])
            await c.send_back("g", other.queue, other.queue_offset, max_reconsume_times=1,
                              reconsume_times=1)  # fmt: skip
            await c.unregister("w")

        client(broker, dead_letter)
        usage = tmp_path / "disk.json"
        usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 95 * 10**7}))
        wait_until(lambda: state.store.refusing_sends, 10, "sends refused")
        listener = Accounts(poison=b"k00:0")
        with consumer(broker.address, listener):
            wait_until(lambda: refused_parks(caplog, "k00") >= 2, 30, "two refused parks")
            assert parked(broker) == [] and listener.handled("k00") == []
            assert listener.handled("k01") == [0, 1]
            assert messages_of(broker, "%DLQ%g") == [b"other"], "stalled, not dead-lettered"
            usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 0}))
            wait_until(lambda: bool(parked(broker)), 30, "k00 parked once there is room")
            assert parked(broker)[0]["parked_messages"] == 2

            listener.broken = False
            usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 95 * 10**7}))
            wait_until(lambda: state.store.refusing_sends, 10, "sends refused again")
            result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
            assert result.exit_code != 0 and "DISK_FULL" in result.output, result.output
            assert not parked(broker)[0]["released_at_ms"], "still parked"
            usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 0}))
            wait_until(lambda: not state.store.refusing_sends, 10, "sends accepted again")
            result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
            assert result.exit_code == 0, result.output
            wait_until(lambda: len(listener.handled("k00")) >= 2, 10, "k00 released")
        assert listener.handled("k00") == [0, 1], "each once, in the order sent"


class FailingSave:
    """write_atomically of parking.py that fails (read-only disk) while `failing` is set."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.failing = False

    def __call__(self, path: Path, data: bytes) -> None:
        if self.failing:
            raise OSError(errno.EROFS, "Read-only file system")
        self.real(path, data)


class ReleaseCrash:
    """Kills the release's append (`armed`): the queue write raises as a killed process
    stops, after writing its first `keep` records, and parking.json cannot be saved again
    (a dead process writes nothing more), so the disk holds the saved release and at most
    those records."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, keep: int = 0) -> None:
        self.save = FailingSave(parking_module.write_atomically)
        monkeypatch.setattr(parking_module, "write_atomically", self.save)
        self.armed = False
        real_write = MessageStore.write

        def write(
            store: MessageStore, topic: Topic, queue_id: int, frames: bytes, checked: Any, **kw: Any
        ) -> Any:
            if not (self.armed and topic.name == TOPIC):
                return real_write(store, topic, queue_id, frames, checked, **kw)
            if keep:
                size = sum(FRAME_LEN_PREFIX.size + c.end - c.start for c in checked[:keep])
                real_write(store, topic, queue_id, frames[:size], checked[:keep], **kw)
            self.save.failing = True
            raise OSError(errno.EIO, "killed")

        monkeypatch.setattr(MessageStore, "write", write)

    def release(self, broker: TestBroker) -> None:
        """Release k00, killed as described; then the disk works again."""
        self.armed = True
        assert run(broker, "parked", "release", "g", TOPIC, "k00", "--yes").exit_code != 0
        self.armed = False
        self.save.failing = False


def consumed_once_in_order(broker: TestBroker, listener: Accounts, expected: list[int]) -> None:
    """With the listener mended, a consumer gets key k00's released messages: each once,
    in the order they were sent."""
    listener.broken = False
    with consumer(broker.address, listener):
        wait_until(lambda: len(listener.handled("k00")) >= len(expected), 10, "k00 released")
    assert listener.handled("k00") == expected, "each once, in the order sent"


def parked_once(broker: TestBroker, listener: Accounts) -> None:
    """k00 parked with its 3 messages, k01 handled; the consumer stopped."""
    send(broker.address, [(k, s) for s in range(3) for k in ("k00", "k01")])
    with consumer(broker.address, listener):
        wait_until(lambda: bool(parked(broker)), 30, "k00 parked")
        wait_until(lambda: listener.handled("k01") == [0, 1, 2], 10, "k01 handled")
    assert parked(broker)[0]["parked_messages"] == 3


def test_a_release_whose_state_cannot_be_saved_changes_nothing_and_sends_back_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save = FailingSave(parking_module.write_atomically)
    monkeypatch.setattr(parking_module, "write_atomically", save)
    with TestBroker(default_queues=1) as broker:
        listener = Accounts(poison=b"k00:0")
        parked_once(broker, listener)
        before = messages_of(broker, TOPIC)
        save.failing = True
        result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
        assert result.exit_code != 0 and "STORE_UNAVAILABLE" in result.output, result.output
        assert messages_of(broker, TOPIC) == before, "nothing sent back"
        assert not parked(broker)[0]["released_at_ms"], "still parked"
        save.failing = False

        broker.restart()  # what is on disk: parked, as the broker answered
        assert not parked(broker)[0]["released_at_ms"]
        result = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes")
        assert result.exit_code == 0, result.output
        assert messages_of(broker, TOPIC) == [*before, b"k00:0", b"k00:1", b"k00:2"]
        consumed_once_in_order(broker, listener, [0, 1, 2])


def test_a_release_a_crash_cuts_off_after_its_state_is_saved_is_finished_at_the_next_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crash = ReleaseCrash(monkeypatch)
    with TestBroker(default_queues=1) as broker:
        listener = Accounts(poison=b"k00:0")
        parked_once(broker, listener)
        before = messages_of(broker, TOPIC)
        crash.release(broker)
        assert messages_of(broker, TOPIC) == before, "the crash came before the append"

        broker.restart()  # the start finishes the release
        assert messages_of(broker, TOPIC) == [*before, b"k00:0", b"k00:1", b"k00:2"]
        broker.restart()  # and only once
        assert messages_of(broker, TOPIC) == [*before, b"k00:0", b"k00:1", b"k00:2"]
        consumed_once_in_order(broker, listener, [0, 1, 2])
        again = run(broker, "parked", "release", "g", TOPIC, "k00", "--yes", "--queue", "0")
        assert again.exit_code != 0, again.output


def test_a_cut_off_release_past_the_end_of_a_queue_that_lost_its_tail_goes_back_at_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crash = ReleaseCrash(monkeypatch)
    with TestBroker(default_queues=1) as broker:
        listener = Accounts(poison=b"k00:0")
        parked_once(broker, listener)
        before = messages_of(broker, TOPIC)
        crash.release(broker)
        broker.stop()
        # as if the queue's last 2 records were lost (async flush): its release point is
        # past the queue's end
        path = broker.data_dir / parking_module.PARKING_FILE
        state = json.loads(path.read_text())
        state["keys"][0]["through"] += 2
        path.write_text(json.dumps(state))
        broker.start()
        assert messages_of(broker, TOPIC) == [*before, b"k00:0", b"k00:1", b"k00:2"]
        send(broker.address, [("k00", 3)])  # after the release point: not skipped
        consumed_once_in_order(broker, listener, [0, 1, 2, 3])


def test_a_release_a_crash_tore_after_its_first_message_sends_back_only_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crash = ReleaseCrash(monkeypatch, keep=1)
    with TestBroker(default_queues=1) as broker:
        listener = Accounts(poison=b"k00:0")
        parked_once(broker, listener)
        before = messages_of(broker, TOPIC)
        crash.release(broker)
        assert messages_of(broker, TOPIC) == [*before, b"k00:0"]
        broker.restart()
        assert messages_of(broker, TOPIC) == [*before, b"k00:0", b"k00:1", b"k00:2"]
        consumed_once_in_order(broker, listener, [0, 1, 2])
