"""Lite pull consumer: RocketMQ's assign flow, and what auto commit may commit."""

from __future__ import annotations

import asyncio

import pytest

import sdk.aio
from mockbroker import EmbeddedBroker
from sdk import ConsumeFromWhere, MessageQueue, shard_index
from sdk.errors import ClientStateError, InvalidQueueError
from tests.component.test_lite_pull_consumer import drain, fill, new


def test_rocketmq_assign_flow_start_fetch_assign_poll(broker: EmbeddedBroker) -> None:
    fill(broker, 80)  # 8 keys over the 8 queues of "orders"
    c = new(broker, auto_commit=False)
    with c:
        assert c.assignment() == set()
        queues = c.fetch_message_queues("orders")
        c.assign(queues)
        assert c.assignment() == set(queues), "assign after start takes the queues at once"
        q = queues[shard_index("k0", 8)]
        c.seek(q, 1)  # usable at once, too
        got = drain(c, 79)
        assert len(got) == 79 and min(m.queue_offset for m in got if m.queue == q) == 1
        # Assigning again swaps the queues: the dropped ones are released.
        c.assign([q])
        assert c.assignment() == {q}
        c.seek_to_begin(q)
        first = c.poll(5)[0]
        assert (first.queue, first.queue_offset) == (q, 0)
        with pytest.raises(ClientStateError, match="assign"):
            c.subscribe("orders")
        with pytest.raises(InvalidQueueError, match="queue_id=99"):
            c.assign([MessageQueue("orders", queues[0].broker_name, 99)])
        assert c.assignment() == {q}, "a refused assignment changes nothing"


def test_the_asyncio_twin_supports_the_assign_flow(broker: EmbeddedBroker) -> None:
    fill(broker, 40)

    async def main() -> tuple[int, set[MessageQueue], set[MessageQueue]]:
        c = sdk.aio.LitePullConsumer(
            "batch", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
        )
        async with c:
            queues = await c.fetch_message_queues("orders")
            await c.assign(queues)
            held = c.assignment()
            got = 0
            while got < 40:
                got += len(await c.poll(5))
            c.assign(queues[:1])  # not awaited: the next call waits for it
            assert await c.poll(0) == []
            return got, held, c.assignment()

    got, held, later = asyncio.run(main())
    assert got == 40
    assert len(held) == 8 and len(later) == 1


def test_the_orders_that_worked_before_still_work(broker: EmbeddedBroker) -> None:
    queues = fill(broker, 16)
    before = new(broker)
    before.assign(queues)  # assign, then start
    with before:
        assert before.assignment() == set(queues)
        assert len(drain(before, 16)) == 16
    push = sdk.PushConsumer("g", broker.address)
    push.register_message_listener(Idle())
    with pytest.raises(ClientStateError, match="subscribe to a topic"):
        push.start()  # a push consumer still needs a subscription


class Idle(sdk.MessageListenerOrderly):
    """A listener that is never called."""

    def consume_message(
        self, msgs: list[sdk.MessageExt], context: sdk.ConsumeOrderlyContext
    ) -> sdk.ConsumeOrderlyStatus:
        raise AssertionError("not called")
