"""Locks, membership and fenced commits over the wire, on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer
from sdk._transport.broker_client import BrokerClient
from sdk.errors import (
    GroupNotFoundError,
    InvalidQueueError,
    LockNotHeldError,
    StaleEpochError,
    TopicNotFoundError,
)
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run
from tests.support import wait_until


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path, lock_lease_seconds=60, client_timeout_seconds=120)
    with EmbeddedBroker(config, clock=clock) as b:
        with Producer(b.address, clock=clock) as p:
            p.fetch_publish_message_queues("t")
        yield b


def test_locks_are_granted_renewed_and_refused_over_the_wire(broker: EmbeddedBroker) -> None:
    async def body(c: BrokerClient) -> None:
        await join(c, "a")
        await join(c, "b")
        held_a = await c.lock_batch("g", "a", [mq("t", 0), mq("t", 1)])
        assert set(held_a) == {mq("t", 0), mq("t", 1)}
        held_b = await c.lock_batch("g", "b", [mq("t", 1), mq("t", 2)])
        assert set(held_b) == {mq("t", 2)}
        assert (await c.lock_batch("g", "a", [mq("t", 0)]))[mq("t", 0)] == held_a[mq("t", 0)]
        # b's batch names a's queue too: b's own are released, a's is reported and stays
        assert await c.unlock_batch("g", "b", [mq("t", 2), mq("t", 0)]) == [mq("t", 0)]
        assert set(await c.lock_batch("g", "a", [mq("t", 0), mq("t", 2)])) == {
            mq("t", 0),
            mq("t", 2),
        }
        assert await c.unlock_batch("g", "a", [mq("t", 0)]) == []
        assert set(await c.lock_batch("g", "b", [mq("t", 0)])) == {mq("t", 0)}

    run(broker.address, body)


def test_lock_requests_are_checked(broker: EmbeddedBroker) -> None:
    async def body(c: BrokerClient) -> None:
        with pytest.raises(GroupNotFoundError):
            await c.lock_batch("nobody", "a", [mq("t", 0)])
        await join(c, "a")
        with pytest.raises(InvalidQueueError):
            await c.lock_batch("g", "a", [mq("t", 8)])
        with pytest.raises(TopicNotFoundError):
            await c.lock_batch("g", "a", [mq("nosuch", 0)])
        assert await c.lock_batch("g", "a", [mq("t", 0)]) != {}

    run(broker.address, body)


def test_a_paused_former_owner_cannot_move_the_offset(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    with Producer(broker.address, clock=clock) as producer:
        producer.send_batch([Message("t", b"%d" % i, sharding_key="k") for i in range(5)])
        queue = producer.send(Message("t", b"x", sharding_key="k")).queue

    async def body(c: BrokerClient) -> None:
        await join(c, "a")
        epoch_a = (await c.lock_batch("g", "a", [queue]))[queue]
        await c.commit_offsets("g", "a", [(queue, 2, epoch_a)])
        clock.advance(61)  # a is paused past its lease
        await join(c, "a")
        await join(c, "b")
        epoch_b = (await c.lock_batch("g", "b", [queue]))[queue]
        assert epoch_b > epoch_a
        with pytest.raises(LockNotHeldError):
            await c.commit_offsets("g", "a", [(queue, 5, epoch_a)])
        with pytest.raises(StaleEpochError):
            await c.commit_offsets("g", "b", [(queue, 5, epoch_a)])
        with pytest.raises(LockNotHeldError, match="locked by 'b'"):
            await c.commit_offsets("g", "a", [(queue, 0, 0)])  # dropping the epoch
        await c.commit_offsets("g", "b", [(queue, 4, epoch_b)])
        await c.unlock_batch("g", "b", [queue])
        with pytest.raises(LockNotHeldError, match="without"):
            await c.commit_offsets("g", "a", [(queue, 0, 0)])  # nor once nobody holds it
        assert await c.query_offset("g", queue) == 4

    run(broker.address, body)


def test_membership_changes_reach_watchers_at_once(broker: EmbeddedBroker) -> None:
    async def body(c: BrokerClient) -> list[list[str]]:
        seen: list[list[str]] = []
        stream = c.watch_membership("g", 0)

        async def watch() -> None:
            async for _version, members in stream:
                seen.append(members)
                if len(seen) == 3:
                    return

        watcher = asyncio.create_task(watch())
        await join(c, "a")
        await asyncio.to_thread(wait_until, lambda: len(seen) >= 1)
        await join(c, "b")
        await asyncio.to_thread(wait_until, lambda: len(seen) >= 2)
        await c.unregister("a")
        await asyncio.wait_for(watcher, 10)
        assert await c.consumer_list("g") == (["b"], 3)
        return seen

    assert run(broker.address, body) == [["a"], ["a", "b"], ["b"]]


def test_a_silent_client_expires_and_loses_its_locks(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    async def body(c: BrokerClient) -> None:
        await join(c, "quiet")
        await join(c, "talkative")
        assert await c.lock_batch("g", "quiet", [mq("t", 0)]) != {}
        for _ in range(3):
            clock.advance(50)  # 150 s: quiet is past the 120 s timeout, talkative is not
            await join(c, "talkative")
        await asyncio.to_thread(
            wait_until,
            lambda: run(broker.address, lambda c2: c2.consumer_list("g"))[0] == ["talkative"],
        )
        # the lock lease (60 s) is long gone too, but the release came from the expiry:
        state = broker.broker.state
        assert state is not None and state.locks.locks("g") == {}

    run(broker.address, body)
