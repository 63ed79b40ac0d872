"""sdk._career.CareerCore over the in-memory FakeTransport, on a FakeClock: no sockets.

The two ways a term is lost: a holder cut off from the broker (its renewals unanswered)
goes on until its own lease view runs out, then stops and hands over; a holder whose
renewal the broker refuses (the lock was given to another client) stops at once. And a
clean shutdown: the running on_execute is cancelled, on_hand_over runs, the lock is
released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from sdk._career import GROUP_PREFIX, CareerCore
from sdk.testing import FakeClock
from tests.unit.fake_transport import FakeBroker, FakeTransport

LEASE, RENEW = 30.0, 5.0


def core(broker: FakeBroker, events: list[str]) -> tuple[CareerCore, FakeTransport]:
    transport = FakeTransport(broker)

    def note(what: str) -> Callable[[int], Awaitable[None]]:
        async def callback(epoch: int) -> None:
            events.append(f"{what} {epoch}")
            if what == "execute":
                await asyncio.Event().wait()  # runs until cancelled

        return callback

    c = CareerCore(
        "job", lambda: transport, note("inaugurate"), note("execute"), note("hand_over"),
        lease_seconds=LEASE, renew_interval_seconds=RENEW, clock=broker.clock,
    )  # fmt: skip
    return c, transport


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def advance(clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    await settle()


async def inaugurated(
    events: list[str],
) -> tuple[CareerCore, FakeTransport, FakeBroker, int]:
    """A started candidate, alone on a fake broker: it holds the career; its epoch."""
    broker = FakeBroker(FakeClock())
    holder, transport = core(broker, events)
    await holder.start()
    await settle()
    assert holder.epoch is not None
    return holder, transport, broker, holder.epoch


def test_a_cut_off_holder_stops_at_its_own_lease_end_not_at_the_first_failed_renewal() -> None:
    async def main() -> None:
        events: list[str] = []
        holder, transport, broker, epoch = await inaugurated(events)
        clock = broker.clock
        assert events == [f"inaugurate {epoch}", f"execute {epoch}"]
        transport.partitioned = True
        for _ in range(5):  # 25 s: renewals fail, the lease view (30 s) has not run out
            await advance(clock, RENEW)
            assert holder.holds(epoch)
        await advance(clock, RENEW)  # 30 s
        assert holder.epoch is None and events[-1] == f"hand_over {epoch}"
        transport.partitioned = False
        await holder.shutdown()

    asyncio.run(main())


def test_a_refused_renewal_deposes_the_holder_at_once() -> None:
    async def main() -> None:
        events: list[str] = []
        holder, _, broker, epoch = await inaugurated(events)
        # The broker forgets the holder (it expired it) and another client takes the lock.
        broker.locks.release_client(holder.client_id)
        queue = (broker.topic, 0)
        taken = broker.locks.lock_batch(GROUP_PREFIX + "job", "another", [queue])
        assert taken[queue] > epoch
        await advance(broker.clock, RENEW)  # the next renewal is refused
        assert holder.epoch is None and events[-1] == f"hand_over {epoch}"
        await holder.shutdown()

    asyncio.run(main())


def test_shutdown_cancels_the_job_hands_over_and_releases_the_lock() -> None:
    async def main() -> None:
        events: list[str] = []
        holder, _, broker, epoch = await inaugurated(events)
        await holder.shutdown()
        assert events == [f"inaugurate {epoch}", f"execute {epoch}", f"hand_over {epoch}"]
        assert broker.locks.locks(GROUP_PREFIX + "job") == {}

    asyncio.run(main())
