"""Lite pull consumer: RocketMQ's assign flow, and what auto commit may commit."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from sdk import (
    AllocateMessageQueueAveragely,
    ConsumeFromWhere,
    LitePullConsumerConfig,
    MessageQueue,
    shard_index,
)
from sdk.errors import ClientStateError, InvalidQueueError
from sdk.testing import FakeClock
from tests.component.pulling import read_queue
from tests.component.test_lite_pull_consumer import drain, fill, new
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over
from tests.support import wait_until


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    """The broker, reached over each transport in turn (tests/component/transports.py)."""
    with broker_over(request.param, tmp_path / "broker") as b:
        yield b


def test_rocketmq_assign_flow_start_fetch_assign_poll(broker: BrokerOver) -> None:
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


def test_the_asyncio_twin_supports_the_assign_flow(broker: BrokerOver) -> None:
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


def test_the_orders_that_worked_before_still_work(broker: BrokerOver) -> None:
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


def test_a_rebalance_does_not_commit_the_batch_the_caller_holds(broker: BrokerOver) -> None:
    queues = fill(broker, 80)
    clock = FakeClock()  # no commit on the interval: only the rebalance could commit
    a, b = new(broker, clock=clock), new(broker, clock=clock)
    a.subscribe("orders")
    b.subscribe("orders")
    members = sorted([a.client_id, b.client_id])
    moving = AllocateMessageQueueAveragely().allocate("batch", b.client_id, queues, members)
    share = {x: len(read_queue(broker.address, x)) for x in moving}
    q = next(x for x in moving if share[x])
    with a:
        wait_until(lambda: a.assignment() == set(queues), 10, "a to hold every queue")
        a.pause([x for x in queues if x != q])
        held = a.poll(5)  # in the caller's hands, not processed yet
        assert held and {m.queue for m in held} == {q}
        with b:
            wait_until(lambda: q not in a.assignment(), 10, "a to give q up")
            assert a.committed(q) == 0, "the batch in hand was committed: a crash would lose it"
            again = drain(b, sum(share.values()))
    redelivered = [m.msg_id for m in again if m.queue == q]
    assert redelivered[: len(held)] == [m.msg_id for m in held]


def test_auto_commit_covers_only_batches_returned_before_the_last_poll(
    broker: BrokerOver,
) -> None:
    queues = fill(broker, 80)
    q = queues[shard_index("k0", 8)]
    clock = FakeClock()
    config = LitePullConsumerConfig(pull_batch_size=4, auto_commit_interval=1)
    c = new(broker, clock=clock, config=config)
    c.assign([q])
    with c:
        first = c.poll(5)
        clock.advance(1)
        second = c.poll(5)  # commits the first batch, not this one
        assert c.committed(q) == first[-1].queue_offset + 1
        clock.advance(1)
        c.poll(5)
        assert c.committed(q) == second[-1].queue_offset + 1


def test_shutdown_commits_the_last_batch_but_an_exception_does_not(
    broker: BrokerOver,
) -> None:
    queues = fill(broker, 80)
    q = queues[shard_index("k0", 8)]
    config = LitePullConsumerConfig(pull_batch_size=4)
    c = new(broker, config=config)
    c.assign([q])
    c.start()
    c.poll(5)
    last = c.poll(5)
    c.shutdown()  # the caller says it is done: what poll() returned is committed
    d = new(broker, config=config)
    d.assign([q])
    with pytest.raises(RuntimeError, match="processing failed"), d:
        assert d.committed(q) == last[-1].queue_offset + 1
        d.poll(5)
        unprocessed = d.poll(5)
        raise RuntimeError("processing failed")
    e = new(broker, config=config)
    e.assign([q])
    with e:
        assert e.committed(q) == unprocessed[0].queue_offset
        assert e.poll(5)[0].msg_id == unprocessed[0].msg_id


def test_the_asyncio_twin_leaves_the_last_batch_uncommitted_on_an_exception(
    broker: BrokerOver,
) -> None:
    queues = fill(broker, 80)
    q = queues[shard_index("k0", 8)]
    config = LitePullConsumerConfig(pull_batch_size=4)

    async def main() -> tuple[int, int]:
        c = sdk.aio.LitePullConsumer("batch", broker.address, config=config,
                                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        c.assign([q])
        with contextlib.suppress(RuntimeError):
            async with c:
                await c.poll(5)
                unprocessed = await c.poll(5)
                raise RuntimeError("processing failed")
        d = sdk.aio.LitePullConsumer("batch", broker.address, config=config)
        d.assign([q])
        async with d:
            return await d.committed(q), unprocessed[0].queue_offset

    committed, unprocessed = asyncio.run(main())
    assert committed == unprocessed


def test_leaving_the_asyncio_iteration_mid_batch_commits_only_what_it_yielded(
    broker: BrokerOver,
) -> None:
    queues = fill(broker, 80)
    q = queues[shard_index("k0", 8)]

    async def main() -> int:
        c = sdk.aio.LitePullConsumer("batch", broker.address,
                                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        c.assign([q])
        async with c:
            async for m in c:
                if m.queue_offset == 3:
                    break  # one batch holds every message of q: the rest was never seen
        d = sdk.aio.LitePullConsumer("batch", broker.address)
        d.assign([q])
        async with d:
            return await d.committed(q)

    assert asyncio.run(main()) == 4
