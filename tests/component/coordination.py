"""Shared pieces of the coordination tests: a broker on a fake clock and async helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.message import MessageQueue

T = TypeVar("T")


def run(address: str, body: Callable[[BrokerClient], Awaitable[T]]) -> T:
    """Run `body` with a client of `address` on a fresh event loop."""

    async def main() -> T:
        client = BrokerClient(address)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


async def join(client: BrokerClient, client_id: str, group: str = "g") -> None:
    """Make `client_id` a member of `group` (orderly, clustering)."""
    await client.heartbeat(client_id, [GroupInfo(group, "CONSUME_ORDERLY")])


def mq(topic: str, queue_id: int) -> MessageQueue:
    return MessageQueue(topic, "broker-a", queue_id)
