"""Key mode's PARK policy: a key whose message keeps failing is set aside, in order, at the
broker, while the queue's other keys go on; an operator releases it and its messages come
back in order (issue 20)."""

from __future__ import annotations

import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

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
from sdk.errors import InvalidArgumentError
from sdk.testing import TestBroker
from tests.component.admin_cli import run, run_json
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
