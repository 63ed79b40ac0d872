"""Consumers that start before their topic exists take it when a producer creates it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from mockbroker import EmbeddedBroker
from sdk import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk.consumer.core import MISSING_TOPIC_POLL
from sdk.testing import FakeClock
from tests.support import wait_until

#: A rebalance round notices a new topic; rounds come every rebalance_interval.
REBALANCE = 0.5


class Collect(MessageListenerOrderly):
    """Keeps every message it is given."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.bodies += [m.body for m in msgs]
        return ConsumeOrderlyStatus.SUCCESS


@pytest.fixture
def push(broker: EmbeddedBroker) -> Iterator[tuple[PushConsumer, Collect]]:
    listener = Collect()
    consumer = PushConsumer(
        "pushers", broker.address, config=PushConsumerConfig(rebalance_interval=REBALANCE)
    )
    consumer.subscribe("fresh")
    consumer.register_message_listener(listener)
    yield consumer, listener
    consumer.shutdown()


def test_consumers_start_before_their_topic_and_get_what_is_sent_to_it_later(
    broker: EmbeddedBroker,
    push: tuple[PushConsumer, Collect],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    pusher, listener = push
    puller = LitePullConsumer(
        "pullers", broker.address, config=LitePullConsumerConfig(rebalance_interval=REBALANCE)
    )
    puller.subscribe("fresh")
    pusher.start()  # both with the default ConsumeFromWhere.LAST_OFFSET
    with puller:
        assert "'fresh' does not exist yet" in caplog.text
        sent = [f"{i % 5}:{i}".encode() for i in range(100)]
        with Producer(broker.address) as producer:
            # Sent before a rebalance round sees the topic: nothing of it may be skipped.
            producer.send_batch([Message("fresh", b, sharding_key=b[:1].decode()) for b in sent])
        polled: list[bytes] = []
        wait_until(
            lambda: len(polled.__iadd__([m.body for m in puller.poll(0.1)])) >= len(sent),
            10 * REBALANCE + 10,
            "the lite pull consumer to get every message",
        )
        wait_until(lambda: len(listener.bodies) >= len(sent), 10, "the push consumer")
    assert sorted(polled) == sorted(sent)
    assert sorted(listener.bodies) == sorted(sent)


def test_a_consumer_started_before_its_topic_reads_within_a_second_of_its_creation(
    broker: EmbeddedBroker,
) -> None:
    clock = FakeClock()
    listener = Collect()
    # The default rebalance_interval (20 s): only the missing topic's own lookups, every
    # MISSING_TOPIC_POLL, can take its queues within the one second the clock moves.
    consumer = PushConsumer("early", broker.address, clock=clock)
    consumer.subscribe("late")
    consumer.register_message_listener(listener)
    with consumer:
        wait_until(lambda: clock.sleepers > 0, 10, "the consumer's timers to be armed")
        with Producer(broker.address) as producer:
            producer.send(Message("late", b"first", sharding_key="k"))
        assert MISSING_TOPIC_POLL <= 1.0
        clock.advance(1.0)
        wait_until(lambda: listener.bodies == [b"first"], 10, "the first message")
