"""ordermq's orderly consumer over `rocketmq://` through a broker kill -9 and restart.

The broker is `python -m mockbroker` with its name server, in sync flush; the consumer is
given only the name server. The broker dies (SIGKILL) with part of the messages consumed
and comes back on the same ports; the consumer, never restarted by hand, reconnects,
locks its queues again and goes on from the committed offsets: every message consumed,
each key in order, re-deliveries only from a committed offset (RocketMQ's guarantee: no
fencing epochs on this transport, so duplicates are allowed, order per key is not broken).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
from tests.chaos_report import ChaosRecorder
from tests.interop.harness import GrpcView, RemotingBroker, brokers
from tests.support import wait_until
from tests.system.orderly_history import Entry, verify
from tests.system.orderly_worker import CONFIG

pytestmark = [pytest.mark.system]

QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(40)]
ROUNDS = 50
#: Longer than the consumer's 3 s lease (tests/system/orderly_worker.py).
BROKER_LEASE = "4"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., RemotingBroker]]:
    with brokers(tmp_path) as start:
        yield start


class Timed(MessageListenerOrderly):
    """Records each message with the call's times, a little slowly (the run must span
    the kill)."""

    def __init__(self) -> None:
        self.entries: list[Entry] = []
        self._lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        start = time.monotonic_ns()
        time.sleep(0.002 * len(msgs))
        with self._lock:
            for m in msgs:
                key, _, seq = m.body.decode().partition(":")
                self.entries.append(
                    Entry("c", key, int(seq), m.queue.queue_id, m.queue_offset, start,
                          time.monotonic_ns())
                )  # fmt: skip
        return ConsumeOrderlyStatus.SUCCESS

    def distinct(self) -> int:
        with self._lock:
            return len({(e.key, e.seq) for e in self.entries})


def test_an_orderly_run_over_remoting_survives_a_broker_kill_9_and_restart(
    broker: Callable[..., RemotingBroker], chaos_report: ChaosRecorder
) -> None:
    b = broker("--flush-mode", "sync", "--lock-lease-seconds", BROKER_LEASE,
               "--disconnect-grace-seconds", "2")  # fmt: skip
    topic, endpoints = "remoting-kill", f"rocketmq://{b.namesrv}"
    GrpcView(b.address).create_topic(topic, QUEUES)
    with Producer(endpoints) as producer:
        for seq in range(ROUNDS):
            producer.send_batch([Message(topic, f"{k}:{seq}".encode(), sharding_key=k)
                                 for k in KEYS])  # fmt: skip
    total = len(KEYS) * ROUNDS
    listener = Timed()
    consumer = PushConsumer("remoting-kill-group", endpoints, config=CONFIG,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    with consumer:
        wait_until(lambda: listener.distinct() >= total // 3, 60, "a third consumed")
        b.process.kill9()
        killed_at = listener.distinct()
        b.start()  # the same ports and data directory
        wait_until(lambda: listener.distinct() >= total, 120,
                   "every message consumed after the restart")  # fmt: skip
    assert killed_at < total, "the kill came before the end of the run"
    report = verify(listener.entries, ROUNDS, {}, KEYS, QUEUES)
    report.record(chaos_report, "broker kill -9 under an orderly run over rocketmq://", ROUNDS,
                  f"killed after {killed_at} of {total}; consumer not restarted")  # fmt: skip
    assert not report.errors, "\n".join(report.errors[:20])
