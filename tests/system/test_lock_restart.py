"""Rebalance locks across kill -9: the owner keeps its queue and epoch, nobody else takes it.

A grant is on disk before it is answered, so a broker killed right after answering
restarts knowing it: the owner renews at the same epoch and may commit, a second client
is refused the queue for one lease, and every later grant has a higher epoch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest

from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import LockNotHeldError
from sdk.message import MessageQueue
from tests.support import BrokerProcess

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]
T = TypeVar("T")
GROUP = "billing"


def call(address: str, body: Callable[[BrokerClient], Awaitable[T]]) -> T:
    async def main() -> T:
        client = BrokerClient(address)
        try:
            for member in ("owner", "newcomer"):
                await client.heartbeat(member, [GroupInfo(GROUP, "CONSUME_ORDERLY")])
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def test_locks_and_epochs_survive_kill_9(start_broker: StartBroker, tmp_path: Path) -> None:
    data = tmp_path / "broker"
    q0, q1 = MessageQueue("orders", "broker-a", 0), MessageQueue("orders", "broker-a", 1)
    broker = start_broker(data)

    async def lock(c: BrokerClient) -> dict[MessageQueue, int]:
        await c.create_topic("orders", 2)
        return await c.lock_batch(GROUP, "owner", [q0, q1])

    epochs = call(broker.address, lock)
    assert set(epochs) == {q0, q1}
    broker.kill9()  # at once: the grants were answered, so they are on disk
    broker = start_broker(data)

    async def after_restart(c: BrokerClient) -> None:
        assert await c.lock_batch(GROUP, "newcomer", [q0, q1]) == {}, "a second holder"
        assert await c.lock_batch(GROUP, "owner", [q0, q1]) == epochs, "renewed, same epochs"
        await c.commit_offsets(GROUP, "owner", [(q0, 0, epochs[q0])])
        with pytest.raises(LockNotHeldError):
            await c.commit_offsets(GROUP, "newcomer", [(q0, 0, 0)])
        assert await c.unlock_batch(GROUP, "owner", [q1]) == []

    call(broker.address, after_restart)
    broker.kill9()
    broker = start_broker(data)

    async def after_unlock(c: BrokerClient) -> int:
        assert await c.lock_batch(GROUP, "owner", [q0]) == {q0: epochs[q0]}
        return (await c.lock_batch(GROUP, "newcomer", [q1]))[q1]

    assert call(broker.address, after_unlock) > max(epochs.values()), "epochs only grow"
    assert broker.terminate() == 0
