"""Reading a queue back to its end with the transport's pull, over either transport."""

from __future__ import annotations

import asyncio

from sdk._transport import connect
from sdk._transport.protocol import PullResult, PullStatus
from sdk.message import MessageExt, MessageQueue


def read_queue(address: str, queue: MessageQueue, start: int = 0) -> list[MessageExt]:
    """Every message of `queue` from `start` to its current end."""

    async def run() -> list[MessageExt]:
        transport = connect(address)
        out: list[MessageExt] = []
        offset = start
        try:
            await transport.readable_queues(queue.topic)
            while True:
                result = await transport.pull("readers", queue, offset, max_messages=500)
                if result.status is not PullStatus.FOUND:
                    return out
                out += result.messages
                offset = result.next_offset
        finally:
            await transport.close()

    return asyncio.run(run())


def pull_once(address: str, queue: MessageQueue, offset: int, **kw: object) -> PullResult:
    """One pull."""

    async def run() -> PullResult:
        transport = connect(address)
        try:
            await transport.readable_queues(queue.topic)
            return await transport.pull("readers", queue, offset, **kw)  # type: ignore[arg-type]
        finally:
            await transport.close()

    return asyncio.run(run())


def read_topic(
    address: str, topic: str, queue_count: int = 8, broker_name: str = "broker-a"
) -> list[MessageExt]:
    """Every message of every queue of `topic`, queue by queue."""
    return [
        m
        for q in range(queue_count)
        for m in read_queue(address, MessageQueue(topic, broker_name, q))
    ]
