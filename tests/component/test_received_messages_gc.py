"""Received messages wait in a consumer's buffer outside the cycle collector, and go back
to it once done with: a reference cycle a user's code made through one is collected.

Every consumer face, through its public API, against an in-process broker. Where
sdk._speedups was not built, messages are decoded in Python and always tracked: the
cycles are collected alike, and only the check that the buffer kept them out is skipped.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
    aio,
)
from sdk._accel import speedups
from tests.component.transports import BrokerOver, broker_over
from tests.support import wait_until

COUNT = 200


class Holder:
    """What a user's code might keep a message in, while the message refers to it."""

    def __init__(self, message: MessageExt) -> None:
        self.message = message


class Cycles:
    """Makes a reference cycle through every message it is handed; weak refs to see them go."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref[Holder]] = []
        self.tracked: list[bool] = []
        self.lock = threading.Lock()

    def make(self, messages: list[MessageExt]) -> None:
        with self.lock:
            for m in messages:
                self.tracked.append(gc.is_tracked(m))
                holder = Holder(m)
                m.properties["holder"] = holder  # type: ignore[assignment]  # as a user might
                self.refs.append(weakref.ref(holder))

    def seen(self) -> int:
        with self.lock:
            return len(self.refs)

    def alive(self) -> int:
        gc.collect()
        return sum(ref() is not None for ref in self.refs)


class Orderly(MessageListenerOrderly):
    def __init__(self, cycles: Cycles) -> None:
        self.cycles = cycles

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.cycles.make(msgs)
        return ConsumeOrderlyStatus.SUCCESS


class Concurrent(MessageListenerConcurrently):
    def __init__(self, cycles: Cycles) -> None:
        self.cycles = cycles

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        self.cycles.make(msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerOver]:
    with broker_over("grpc", tmp_path / "broker", default_queues=2) as b:
        with Producer(b.address) as p:
            p.send_batch(
                [Message("orders", f"{i}".encode(), sharding_key=f"k{i % 7}") for i in range(COUNT)]
            )
        yield b


def check(cycles: Cycles) -> None:
    assert cycles.seen() == COUNT
    if speedups is not None:  # decoded in C for the buffer: kept out while in hand
        assert not any(cycles.tracked)
    assert cycles.alive() == 0, "a cycle through a received message was never collected"


@pytest.mark.parametrize("delivery", ["pull", "push"])
@pytest.mark.parametrize("kind", ["orderly", "concurrent"])
def test_cycles_through_messages_a_listener_was_given_are_collected(
    broker: BrokerOver, delivery: str, kind: str
) -> None:
    cycles = Cycles()
    c = PushConsumer(
        f"g-{kind}-{delivery}",
        broker.address,
        config=PushConsumerConfig(delivery=delivery),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
    )
    c.subscribe("orders", "*")
    c.register_message_listener(Orderly(cycles) if kind == "orderly" else Concurrent(cycles))
    c.start()
    try:
        wait_until(lambda: cycles.seen() >= COUNT, 30, "every message")
    finally:
        c.shutdown()
    del c
    check(cycles)  # back in the collector's care once committed


def test_cycles_through_polled_messages_are_collected(broker: BrokerOver) -> None:
    cycles = Cycles()
    c = LitePullConsumer("g-poll", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
    c.subscribe("orders", "*")
    c.start()
    try:
        while cycles.seen() < COUNT:
            cycles.make(c.poll(10))
    finally:
        c.shutdown()
    del c
    check(cycles)  # back in the collector's care as the next poll returns, or at shutdown


def test_a_polled_batch_goes_back_to_the_collector_as_the_poll_after_next_returns(
    broker: BrokerOver,
) -> None:
    # The blocking face keeps two batches out: its caller still holds the last one while
    # the loop's thread answers the next poll (LitePullConsumerCore.batches_lent).
    c = LitePullConsumer(
        "g-next",
        broker.address,
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        config=LitePullConsumerConfig(pull_batch_size=10),  # a batch of each poll's
    )
    c.subscribe("orders", "*")
    c.start()
    try:
        first = c.poll(10)
        assert first
        second = c.poll(10)
        if speedups is not None:
            assert second and not any(gc.is_tracked(m) for m in first + second)
        third = c.poll(10)
        assert all(gc.is_tracked(m) for m in first)  # the caller moved on from them
        if speedups is not None:
            assert third and not any(gc.is_tracked(m) for m in second + third)
    finally:
        c.shutdown()
    assert all(gc.is_tracked(m) for m in second + third)


def test_an_asyncio_polled_batch_goes_back_to_the_collector_as_the_next_poll_returns(
    broker: BrokerOver,
) -> None:
    async def main() -> None:
        c = aio.LitePullConsumer(
            "g-next-aio", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
        )
        c.subscribe("orders", "*")
        await c.start()
        try:
            first = await c.poll(10)
            assert first
            if speedups is not None:
                assert not any(gc.is_tracked(m) for m in first)
            second = await c.poll(10)
            assert all(gc.is_tracked(m) for m in first)  # the caller moves on from them
            if speedups is not None:
                assert second and not any(gc.is_tracked(m) for m in second)
        finally:
            await c.shutdown()
        assert all(gc.is_tracked(m) for m in second)

    asyncio.run(main())


class Stuck(MessageListenerOrderly):
    """Makes a cycle through the first message it is given, then holds that call."""

    def __init__(self, cycles: Cycles) -> None:
        self.cycles = cycles
        self.holding = threading.Event()
        self.go = threading.Event()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        if not self.holding.is_set():
            self.cycles.make(msgs[:1])
            self.holding.set()
            self.go.wait(30)
        return ConsumeOrderlyStatus.SUCCESS


def test_a_message_in_a_call_that_outlives_the_shutdown_goes_back_to_the_collector(
    broker: BrokerOver,
) -> None:
    # The call is given up (shutdown_timeout), so its batch is never settled: the
    # consumer lets go of the queue, and that must hand the message back.
    cycles = Cycles()
    listener = Stuck(cycles)
    c = PushConsumer(
        "g-stuck",
        broker.address,
        config=PushConsumerConfig(shutdown_timeout=0.2),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
    )
    c.subscribe("orders", "*")
    c.register_message_listener(listener)
    c.start()
    try:
        assert listener.holding.wait(30)
    finally:
        c.shutdown()
        listener.go.set()
    del c
    assert cycles.seen() == 1
    wait_until(lambda: cycles.alive() == 0, 10, "the cycle through the held message collected")


class SuspendsFirst(MessageListenerOrderly):
    """Makes a cycle through the first message of each queue it is given, and suspends
    that queue (SUSPEND_CURRENT_QUEUE_A_MOMENT): the message waits, untracked, in the
    consumer's buffer for the retry, and the listener's cycle keeps it."""

    def __init__(self, cycles: Cycles) -> None:
        self.cycles = cycles
        self.first: dict[int, weakref.ref[Holder]] = {}  # queue id -> the cycle's holder
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        queue_id = msgs[0].queue.queue_id
        with self.lock:
            if queue_id in self.first:
                return ConsumeOrderlyStatus.SUCCESS
            self.cycles.make(msgs[:1])
            self.first[queue_id] = self.cycles.refs[-1]
        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def held_message_tracked(ref: weakref.ref[Holder]) -> bool:
    """Whether the message a listener's cycle goes through is in the collector's care."""
    holder = ref()
    return holder is None or gc.is_tracked(holder.message)


@pytest.mark.skipif(speedups is None, reason="without sdk._speedups messages are always tracked")
def test_messages_of_a_queue_a_rebalance_moves_away_go_back_to_the_collector(
    broker: BrokerOver,
) -> None:
    # A second member joins: the first gives one of its two queues up while the message
    # its listener made a cycle through waits in that queue's buffer for a retry. Once
    # given up, the queue's messages are the collector's again (ProcessQueue.let_go at
    # release); the kept queue's stay out of its generations.
    cycles = Cycles()
    listener = SuspendsFirst(cycles)
    revoked: list[MessageQueue] = []
    first = PushConsumer(
        "g-moved",
        broker.address,
        config=PushConsumerConfig(suspend_current_queue_time=30),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        on_queues_revoked=revoked.extend,
    )
    first.subscribe("orders", "*")
    first.register_message_listener(listener)
    second = PushConsumer(
        "g-moved", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    second.subscribe("orders", "*")
    second.register_message_listener(Orderly(Cycles()))
    first.start()
    try:
        wait_until(lambda: len(listener.first) == 2, 30, "a suspended message on each queue")
        assert not any(cycles.tracked)
        second.start()
        wait_until(lambda: bool(revoked), 30, "a queue moved to the second member")
        [moved] = revoked
        [kept] = set(listener.first) - {moved.queue_id}
        wait_until(
            lambda: held_message_tracked(listener.first[moved.queue_id]),
            10,
            "the moved queue's message back in the collector's care",
        )
        assert not held_message_tracked(listener.first[kept]), "the kept queue's message"
        # And its buffer is emptied at once: the suspended message waited there for its
        # retry, 30 s away, and kept the listener's cycle alive until then.
        wait_until(
            lambda: gc.collect() >= 0 and listener.first[moved.queue_id]() is None,
            10,
            "the moved queue's suspended message freed",
        )
    finally:
        second.shutdown()
        first.shutdown()
