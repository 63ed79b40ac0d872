"""The simple consumer's core over the in-memory FakeTransport, on a FakeClock.

What a real broker cannot be made to do on cue: renewals that fail while the broker is
unreachable (tried again, then given up once the deadline passed), and an ack that comes
while a renewal is under way (it waits for it and acks with the newest receipt).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from sdk.consumer.simple_core import SimpleConsumerCore
from sdk.errors import ReceiptExpiredError
from sdk.message import Receipt
from sdk.testing import FakeClock
from tests.unit.fake_transport import FakeBroker, FakeTransport

Test = Callable[[FakeBroker, FakeTransport, SimpleConsumerCore], Coroutine[Any, Any, None]]


async def until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


def run(test: Test) -> None:
    async def main() -> None:
        clock = FakeClock()
        broker = FakeBroker(clock, queues=1, topic="jobs")
        broker.append(0, ["a", "b"])
        transport = FakeTransport(broker)
        core = SimpleConsumerCore("workers", transport, await_duration=0, clock=clock)
        core.subscribe("jobs")
        await core.start()
        try:
            await test(broker, transport, core)
        finally:
            await core.shutdown()

    asyncio.run(main())


def test_a_keeper_retries_while_the_broker_is_away_and_renews_once_it_is_back() -> None:
    async def test(broker: FakeBroker, transport: FakeTransport, core: SimpleConsumerCore) -> None:
        clock = broker.clock
        [job, _] = await core.receive(16, 9)
        first = job.receipt
        async with core.keeper(job) as kept:
            transport.partitioned = True
            clock.advance(6)  # time to renew; the broker cannot be reached
            await until(lambda: clock.sleepers > 0 and kept.active, "the retry timer")
            assert kept.renewals == 0 and kept.error is None
            clock.advance(1)  # the retry fails too
            await until(lambda: clock.sleepers > 0, "the next retry timer")
            transport.partitioned = False
            clock.advance(1)  # 8 s: back in time
            await until(lambda: kept.renewals == 1, "the renewal")
            assert job.receipt != first and kept.active
            assert broker.leases[("workers", 0, 0)].until == clock.now() + 9
            await core.ack(job)
            assert not kept.active and kept.error is None
        assert broker.leases[("workers", 0, 0)].acked

    run(test)


def test_a_keeper_gives_up_once_the_deadline_passed_without_a_renewal() -> None:
    async def test(broker: FakeBroker, transport: FakeTransport, core: SimpleConsumerCore) -> None:
        clock = broker.clock
        [job, _] = await core.receive(16, 3)
        async with core.keeper(job) as kept:
            transport.partitioned = True
            for _ in range(4):  # renew at 2 s, retries at 3 s: the deadline
                clock.advance(1)
                await asyncio.sleep(0.01)
            await until(lambda: not kept.active, "the keeper to give up")
        assert isinstance(kept.error, ReceiptExpiredError)
        transport.partitioned = False
        with pytest.raises(ReceiptExpiredError):
            await core.ack(job)
        [again, _other] = await core.receive(16, 3)
        assert (again.msg_id, again.delivery_attempt) == (job.msg_id, 2)

    run(test)


def test_an_ack_during_a_renewal_waits_for_it_and_uses_the_new_receipt() -> None:
    async def test(broker: FakeBroker, transport: FakeTransport, core: SimpleConsumerCore) -> None:
        clock = broker.clock
        [job, _] = await core.receive(16, 9)
        renewing = asyncio.Event()
        release = asyncio.Event()
        change = transport.change_invisible_duration

        async def slow_change(receipt: Receipt, seconds: float) -> Receipt:
            renewing.set()
            await release.wait()
            return await change(receipt, seconds)

        transport.change_invisible_duration = slow_change  # type: ignore[method-assign]
        async with core.keeper(job) as kept:
            clock.advance(6)
            await renewing.wait()
            acking = asyncio.ensure_future(core.ack(job))
            await asyncio.sleep(0.01)
            assert not acking.done(), "the ack waits for the renewal under way"
            release.set()
            await acking
            assert kept.renewals == 1 and not kept.active
        assert broker.leases[("workers", 0, 0)].acked

    run(test)
