"""sdk.aio.Producer: awaitable sends on the caller's event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from sdk._transport import connect
from sdk.aio._context import AsyncClientContext
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.message import Message, MessageQueue, SendResult, check_message
from sdk.producer.config import ProducerConfig
from sdk.producer.core import ProducerCore
from sdk.selector import MessageQueueSelector
from sdk.tls import TLSConfig

log = logging.getLogger("ordermq.producer")


class Producer(AsyncClientContext):
    """Send messages from asyncio code; see sdk.Producer for the arguments.

    Example::

        async with sdk.aio.Producer("127.0.0.1:8081") as producer:
            await producer.send(Message("orders", b"paid", sharding_key="order-42"))
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        group: str | None = None,
        config: ProducerConfig | None = None,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._core = ProducerCore(
            connect(endpoints, tls, credentials, clock), group=group, config=config, clock=clock
        )
        self._oneway: set[asyncio.Task[SendResult]] = set()

    async def start(self) -> None:
        """Connect."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Wait for one-way sends still in flight, then close the connections."""
        if self._oneway:
            await asyncio.gather(*self._oneway, return_exceptions=True)
        await self._core.shutdown()

    async def send(
        self,
        message: Message,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message; returns once the broker stored it (per its flush mode)."""
        return await self._core.send(message, selector=selector, arg=arg, timeout=timeout)

    async def send_batch(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[SendResult]:
        """Send many messages; results in input order.

        Over ordermq's gRPC the batch is one request whatever its queues (a few when it
        is larger than a request may be); each queue's messages are stored whole or
        refused whole, in order, its delayed ones apart (they go to the scheduler as a
        part of their own); PartialBatchError, naming the failed messages by index, when
        some were refused. Over rocketmq://, one request per queue (RocketMQ's batches
        are per queue).
        """
        return await self._core.send_batch(messages, timeout=timeout)

    def send_oneway(self, message: Message) -> None:
        """Start a send and forget it (failures are only logged).

        InvalidMessageError, at once, for what is not a Message.
        """
        check_message(message, "send_oneway()")
        task = asyncio.get_running_loop().create_task(self._core.send(message))
        self._oneway.add(task)
        task.add_done_callback(self._oneway_done)

    def _oneway_done(self, task: asyncio.Task[SendResult]) -> None:
        self._oneway.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("one-way send failed: %s", task.exception())

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every accepted message reached the broker (accumulator, spool)."""
        await self._core.flush(timeout)

    async def cancel(self, msg_id: str) -> bool:
        """Cancel a delayed message before it is due; False if it was already delivered."""
        return await self._core.cancel(msg_id)

    async def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        """The queues of `topic` that sends choose among."""
        return await self._core.fetch_publish_message_queues(topic)
