"""Held pulls: woken by an arrival, timed out on the broker clock, cheap, released."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer
from sdk._transport.broker_client import BrokerClient, PullStatus
from sdk.testing import FakeClock
from tests.component.coordination import mq
from tests.support import wait_until


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def fake_broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock) as b:
        with Producer(b.address) as p:  # creates the topic with 8 queues
            p.fetch_publish_message_queues("t")
        yield b


def held(broker: EmbeddedBroker) -> int:
    state = broker.broker.state
    assert state is not None
    return state.holder.held


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def test_a_held_pull_returns_as_soon_as_a_message_arrives(fake_broker: EmbeddedBroker) -> None:
    async def main() -> tuple[PullStatus, list[bytes], float]:
        client = BrokerClient(fake_broker.address)
        pull = asyncio.create_task(client.pull("g", mq("t", 3), 0, suspend_timeout=15))
        await asyncio.to_thread(wait_until, lambda: held(fake_broker) == 1)
        started = time.perf_counter()
        with Producer(fake_broker.address) as producer:
            await asyncio.to_thread(
                producer.send, Message("t", b"wake up"), selector=lambda qs, m, a: qs[3]
            )
        result = await pull
        await client.close()
        return result.status, [m.body for m in result.messages], time.perf_counter() - started

    status, bodies, delay = asyncio.run(main())
    assert (status, bodies) == (PullStatus.FOUND, [b"wake up"])
    print(f"long-poll wake-up including the send: {delay * 1000:.1f} ms")


def test_a_held_pull_times_out_on_the_broker_clock(
    fake_broker: EmbeddedBroker, clock: FakeClock
) -> None:
    async def main() -> PullStatus:
        client = BrokerClient(fake_broker.address)
        pull = asyncio.create_task(client.pull("g", mq("t", 0), 0, suspend_timeout=15))
        await asyncio.to_thread(wait_until, lambda: held(fake_broker) == 1)
        clock.advance(14.9)
        await asyncio.sleep(0)  # a chance for a wrong early answer to arrive
        assert not pull.done()
        clock.advance(0.2)
        result = await pull
        await client.close()
        return result.status

    assert asyncio.run(main()) is PullStatus.NO_NEW_MESSAGE
    assert held(fake_broker) == 0


def test_a_filtered_held_pull_skips_what_does_not_match(fake_broker: EmbeddedBroker) -> None:
    async def main() -> tuple[list[bytes], int]:
        client = BrokerClient(fake_broker.address)
        pull = asyncio.create_task(
            client.pull("g", mq("t", 1), 0, suspend_timeout=15, tag_expression="B")
        )
        await asyncio.to_thread(wait_until, lambda: held(fake_broker) == 1)
        with Producer(fake_broker.address) as producer:
            pick = {"selector": lambda qs, m, a: qs[1]}
            await asyncio.to_thread(producer.send, Message("t", b"a", tags="A"), **pick)
            await asyncio.to_thread(wait_until, lambda: held(fake_broker) == 1)  # re-held
            await asyncio.to_thread(producer.send, Message("t", b"b", tags="B"), **pick)
        result = await pull
        await client.close()
        return [m.body for m in result.messages], result.next_offset

    assert asyncio.run(main()) == ([b"b"], 2)


def test_a_thousand_held_pulls_take_no_thread_each_and_free_their_slots_on_cancel(
    fake_broker: EmbeddedBroker,
) -> None:
    async def main() -> tuple[int, int]:
        clients = [BrokerClient(fake_broker.address) for _ in range(4)]
        await asyncio.gather(*(c.pull("g", mq("t", 0), 0) for c in clients))  # connect
        before = os_threads()
        pulls = [
            asyncio.create_task(clients[i % 4].pull("g", mq("t", i % 8), 0, suspend_timeout=30))
            for i in range(1000)
        ]
        await asyncio.to_thread(wait_until, lambda: held(fake_broker) == 1000, 30)
        during = os_threads()
        for p in pulls:
            p.cancel()
        await asyncio.gather(*pulls, return_exceptions=True)
        await asyncio.to_thread(wait_until, lambda: held(fake_broker) == 0, 10)
        await asyncio.gather(*(c.close() for c in clients))
        return before, during

    before, during = asyncio.run(main())
    assert during - before < 16, f"threads: {before} before, {during} with 1000 held pulls"


def test_shutdown_answers_held_pulls(tmp_path: Path, clock: FakeClock) -> None:
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock)
    broker.start()

    async def main() -> PullStatus:
        client = BrokerClient(broker.address)
        with Producer(broker.address) as p:
            await asyncio.to_thread(p.fetch_publish_message_queues, "t")
        pull = asyncio.create_task(client.pull("g", mq("t", 0), 0, suspend_timeout=30))
        await asyncio.to_thread(wait_until, lambda: held(broker) == 1)
        await asyncio.to_thread(broker.stop)
        result = await pull
        await client.close()
        return result.status

    assert asyncio.run(main()) is PullStatus.NO_NEW_MESSAGE
