"""Where a new group starts on a queue it never committed, through the public API.

With the default ConsumeFromWhere.LAST_OFFSET a young queue (offset 0 still stored, at
most `young_queue_max_messages` messages) is read from offset 0, as RocketMQ's broker
starts a new group at 0 while a queue's first message is in memory; a larger queue from
its end. A committed offset always wins; FIRST_OFFSET and TIMESTAMP ignore the rule.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageModel,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk.errors import InvalidArgumentError
from sdk.testing import FakeClock
from tests.support import wait_until

TOPIC = "orders"


class Collect(MessageListenerConcurrently):
    """Every message body received, in queue-offset order: a concurrent listener's calls
    run side by side on the thread pool, so their arrival order is the threads' (Python
    3.13 showed it), not the queue's. The tests send to one queue."""

    def __init__(self) -> None:
        self.received: list[tuple[int, bytes]] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        with self.lock:
            self.received += [(m.queue_offset, m.body) for m in msgs]
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def got(self) -> list[bytes]:
        with self.lock:
            return [body for _, body in sorted(self.received)]


def send_to_one_queue(address: str, bodies: list[bytes]) -> MessageQueue:
    """Send `bodies` with one sharding key (so to one queue); that queue."""
    with Producer(address) as producer:
        results = producer.send_batch([Message(TOPIC, b, sharding_key="k") for b in bodies])
    return results[0].queue


def push_and_receive_new(
    address: str,
    config: PushConsumerConfig | None = None,
    *,
    group: str = "g",
    where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
    timestamp: float | None = None,
    offset_dir: Path | None = None,
) -> list[bytes]:
    """Start a push consumer, wait until it holds its queues, send b"new"; all it got."""
    listener = Collect()
    assigned = threading.Event()
    consumer = PushConsumer(
        group,
        address,
        config=config,
        consume_from_where=where,
        consume_timestamp=timestamp,
        on_queues_assigned=lambda queues: assigned.set(),
        message_model=MessageModel.BROADCASTING if offset_dir else MessageModel.CLUSTERING,
        offset_dir=offset_dir,
    )
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    with consumer:
        assert assigned.wait(30), "the start offsets are fixed before this hook runs"
        send_to_one_queue(address, [b"new"])
        wait_until(lambda: b"new" in listener.got(), 30, "the message sent after the start")
    return listener.got()


def test_a_new_group_with_the_default_config_gets_the_messages_sent_before_it_started(
    broker: EmbeddedBroker,
) -> None:
    bodies = [b"%d" % i for i in range(10)]
    with Producer(broker.address) as producer:
        for body in bodies:
            producer.send(Message(TOPIC, body))
    listener = Collect()
    consumer = PushConsumer("quick-start", broker.address)  # every default
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    with consumer:
        wait_until(lambda: len(listener.got()) >= 10, 30, "the 10 messages")
    assert sorted(listener.got()) == sorted(bodies)


def test_a_lite_pull_consumer_with_the_default_config_polls_them_too(
    broker: EmbeddedBroker,
) -> None:
    sent = [b"%d" % i for i in range(10)]
    send_to_one_queue(broker.address, sent)
    polled: list[bytes] = []
    consumer = LitePullConsumer("quick-start", broker.address)
    consumer.subscribe(TOPIC)
    with consumer:
        wait_until(
            lambda: len(polled.__iadd__([m.body for m in consumer.poll(0.1)])) >= 10,
            30,
            "the 10 messages",
        )
    assert polled == sent


def test_a_queue_of_exactly_the_limit_is_young_one_more_is_not(broker: EmbeddedBroker) -> None:
    send_to_one_queue(broker.address, [b"old-%d" % i for i in range(10)])
    limit = PushConsumerConfig(young_queue_max_messages=10)
    old = [b"old-%d" % i for i in range(10)]
    assert push_and_receive_new(broker.address, limit, group="first") == [*old, b"new"]
    # The queue holds 11 now: a second new group starts at its end.
    assert push_and_receive_new(broker.address, limit, group="second") == [b"new"]


def test_a_queue_over_the_default_limit_is_read_from_its_end(broker: EmbeddedBroker) -> None:
    send_to_one_queue(broker.address, [b"old"] * 1001)
    assert push_and_receive_new(broker.address) == [b"new"]


def test_a_committed_offset_wins_over_the_young_rule(broker: EmbeddedBroker) -> None:
    queue = send_to_one_queue(broker.address, [b"%d" % i for i in range(10)])
    with LitePullConsumer("g", broker.address, auto_commit=False) as committer:
        committer.assign([queue])
        committer.commit({queue: 7}, persist=True)
    got = push_and_receive_new(broker.address)
    assert got == [b"7", b"8", b"9", b"new"]


def test_a_zero_limit_turns_the_rule_off(broker: EmbeddedBroker) -> None:
    send_to_one_queue(broker.address, [b"old"])
    off = PushConsumerConfig(young_queue_max_messages=0)
    assert push_and_receive_new(broker.address, off) == [b"new"]


def test_a_broadcasting_member_starts_at_the_end_of_a_young_queue_as_in_rocketmq(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    send_to_one_queue(broker.address, [b"old"])
    assert push_and_receive_new(broker.address, offset_dir=tmp_path / "member") == [b"new"]


@pytest.mark.parametrize(
    ("where", "limit", "expected"),
    [
        # An old queue (the rule off) is still read from its start...
        (ConsumeFromWhere.FIRST_OFFSET, 0, [b"old", b"new"]),
        # ... and a young one from the time asked for.
        (ConsumeFromWhere.TIMESTAMP, 1000, [b"new"]),
    ],
)
def test_first_offset_and_timestamp_ignore_the_rule(
    tmp_path: Path, where: ConsumeFromWhere, limit: int, expected: list[bytes]
) -> None:
    clock = FakeClock()
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock) as broker:
        send_to_one_queue(broker.address, [b"old"])
        clock.advance(60)
        got = push_and_receive_new(
            broker.address,
            PushConsumerConfig(young_queue_max_messages=limit),
            where=where,
            timestamp=clock.now() - 1,
        )
    assert got == expected


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="young_queue_max_messages"):
        PushConsumerConfig(young_queue_max_messages=-1)
    with pytest.raises(InvalidArgumentError, match="young_queue_max_messages"):
        LitePullConsumerConfig(young_queue_max_messages=-1)
