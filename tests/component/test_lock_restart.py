"""Rebalance locks across broker restarts on one data directory, on fake clocks."""

from __future__ import annotations

import asyncio
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.lock_manager import LOCK_FILE, RebalanceLockManager
from mockbroker.server import Broker
from sdk._transport.broker_client import BrokerClient
from sdk.message import MessageQueue
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run

Q0 = mq("t", 0)


def broker_on(data: Path, clock: FakeClock) -> EmbeddedBroker:
    return EmbeddedBroker(BrokerConfig(data_dir=data, lock_lease_seconds=60), clock=clock)


def lock_once(data: Path) -> int:
    """Start a broker, let client `a` lock Q0, stop it; a's epoch."""

    async def body(c: BrokerClient) -> int:
        await c.create_topic("t", 2)
        await join(c, "a")
        return (await c.lock_batch("g", "a", [Q0]))[Q0]

    with broker_on(data, FakeClock()) as broker:
        return run(broker.address, body)


def test_after_a_restart_the_owner_keeps_its_queue_for_a_lease(tmp_path: Path) -> None:
    epoch = lock_once(tmp_path)
    clock = FakeClock()
    with broker_on(tmp_path, clock) as broker:

        async def body(c: BrokerClient) -> None:
            # b joined the restarted broker; a has not yet, and renews as the lock's owner.
            await join(c, "b")
            assert await c.lock_batch("g", "b", [Q0]) == {}
            clock.advance(59)
            assert await c.lock_batch("g", "b", [Q0]) == {}
            assert await c.lock_batch("g", "a", [Q0]) == {Q0: epoch}, "renewed at its epoch"
            clock.advance(60.5)  # a stops renewing: its lease runs out on the new broker
            taken = await c.lock_batch("g", "b", [Q0])
            assert taken[Q0] > epoch

        run(broker.address, body)


def test_a_corrupt_lock_file_does_not_stop_the_broker_and_holds_grants_for_a_lease(
    tmp_path: Path,
) -> None:
    lock_once(tmp_path)
    (tmp_path / LOCK_FILE).write_bytes(b"\x00garbage")
    clock = FakeClock()
    with broker_on(tmp_path, clock) as broker:

        async def body(c: BrokerClient) -> dict[MessageQueue, int]:
            await join(c, "b")
            assert await c.lock_batch("g", "b", [Q0]) == {}, "a may still believe it holds Q0"
            clock.advance(60.001)
            return await c.lock_batch("g", "b", [Q0])

        assert set(run(broker.address, body)) == {Q0}
    assert (tmp_path / (LOCK_FILE + ".corrupt")).read_bytes() == b"\x00garbage"


def test_a_release_not_saved_when_the_broker_stops_is_on_disk_after_it(tmp_path: Path) -> None:
    """The expiry sweep saves its releases over several turns of the loop; stopped between
    two, the broker still writes them, or the next start would hold the gone client's
    locks for a lease."""

    async def main() -> None:
        broker = Broker(BrokerConfig(data_dir=tmp_path, port=0))
        await broker.start()
        try:
            assert broker.state is not None
            locks = broker.state.locks
            locks.lock_batch("g", "gone", [("t", 0), ("t", 1)])
            await locks.save()
            assert locks.release_client("gone") == 2  # as the sweep does, then cancelled
        finally:
            await broker.stop()

    asyncio.run(main())
    after = RebalanceLockManager(FakeClock(), path=tmp_path / LOCK_FILE)
    after.load(previous_run=True)
    assert after.locks("g") == {}
