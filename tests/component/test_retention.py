"""Retention over the wire: a consumer behind the new minimum is moved to it, and counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import sdk.metrics
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk._transport.broker_client import BrokerClient, PullStatus
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run
from tests.component.pulling import pull_once
from tests.support import wait_until

BODY = b"r" * 20_000  # 60 of them fill a 1 MiB segment


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(
        data_dir=tmp_path, segment_bytes=1 << 20, retention_hours=72, flush_interval_seconds=0.05
    )
    with EmbeddedBroker(config, clock=clock) as b:
        run(b.address, lambda c: c.admin("CreateTopic", topic="t", queue_count=1))
        yield b


def send(broker: EmbeddedBroker, n: int) -> None:
    with Producer(broker.address) as p:
        for i in range(0, n, 20):
            p.send_batch([Message("t", BODY, sharding_key="k") for _ in range(min(20, n - i))])


class Collect(MessageListenerConcurrently):
    """Records queue offsets; `done` once `expected` arrived."""

    def __init__(self, expected: int) -> None:
        self.seen: list[int] = []
        self.expected = expected
        self.done = threading.Event()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        self.seen.extend(m.queue_offset for m in msgs)
        if len(self.seen) >= self.expected:
            self.done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def retention_ran(broker: EmbeddedBroker, clock: FakeClock) -> int:
    """Advance the fake clock until retention has moved queue 0's minimum; return it."""
    queue = mq("t", 0)

    def moved() -> bool:
        clock.advance(1)  # the broker's retention check sleeps on this clock
        return pull_once(broker.address, queue, 0).status is PullStatus.OFFSET_ILLEGAL

    wait_until(moved, 30, "retention to delete the old segments")
    return pull_once(broker.address, queue, 0).min_offset


def test_a_group_behind_the_minimum_is_moved_to_it_and_its_skipped_messages_are_shown(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    queue = mq("t", 0)
    send(broker, 200)

    async def commit_5(c: BrokerClient) -> None:
        await join(c, "stale-member")
        await c.commit_offsets("g", "stale-member", [(queue, 5, 0)])
        await c.unregister("stale-member")

    run(broker.address, commit_5)
    clock.advance(73 * 3600)
    send(broker, 1)  # the old segments are all past the limit now
    minimum = retention_ran(broker, clock)
    assert 5 < minimum < 200

    below = pull_once(broker.address, queue, 5)
    assert (below.status, below.next_offset, below.messages) == (
        PullStatus.OFFSET_ILLEGAL, minimum, [],
    )  # fmt: skip
    progress = run(broker.address, lambda c: c.admin("ConsumerProgress", group="g", topic="t"))
    row = next(q for q in progress["queues"] if q["queue"]["queue_id"] == 0)
    assert (row["broker_min_offset"], row["skipped"], row["lag"]) == (
        minimum,
        minimum - 5,
        201 - minimum,
    )
    status = run(broker.address, lambda c: c.admin("BrokerStatus"))
    assert status["retention_deleted_messages"] >= minimum and status["retention_hours"] == 72
    assert [t["min_offsets"][0] for t in status["retention"] if t["topic"] == "t"] == [minimum]

    registry = sdk.metrics.enable(CollectorRegistry())
    listener = Collect(201 - minimum)
    consumer = PushConsumer(
        "g",
        broker.address,
        config=PushConsumerConfig(persist_interval=0.2),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
    )
    consumer.subscribe("t", "*")
    consumer.register_message_listener(listener)
    try:
        with consumer:
            assert listener.done.wait(30), f"consumed {len(listener.seen)}"
        skipped = registry.get_sample_value(
            "ordermq_client_retention_skipped_total", {"group": "g", "topic": "t"}
        )
    finally:
        sdk.metrics.disable()
    assert sorted(listener.seen) == list(range(minimum, 201)), "from the minimum, nothing lost"
    assert skipped == minimum - 5
