"""sdk.aio.PushConsumer: the push consumer on the caller's event loop."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sdk._transport import connect
from sdk.aio._context import AsyncClientContext
from sdk.clock import Clock
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.consumer.config import (
    ConsumeFromWhere,
    MessageModel,
    ProcessingOrder,
    PushConsumerConfig,
)
from sdk.consumer.listener import MessageListenerConcurrently, MessageListenerOrderly
from sdk.consumer.push_core import PushConsumerCore, QueueHook
from sdk.credentials import Credentials
from sdk.tls import TLSConfig


class PushConsumer(AsyncClientContext):
    """The asyncio push consumer; arguments as sdk.PushConsumer.

    `async def consume_message` listeners run on the event loop; plain ones on the
    consumer's thread pool.

    Shut it down before the loop ends, or it cannot commit, unlock and leave: asyncio.run
    cancels the consumer's tasks when the main coroutine returns or gets Ctrl+C. So::

        async with consumer:
            await sdk.aio.wait_for_shutdown_signal()  # until Ctrl+C or SIGTERM
    """

    def __init__(
        self,
        group: str,
        endpoints: str | list[str],
        *,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: datetime | float | None = None,
        allocate_strategy: AllocateMessageQueueStrategy | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        ordering: ProcessingOrder = ProcessingOrder.QUEUE,
        config: PushConsumerConfig | None = None,
        on_queues_assigned: QueueHook | None = None,
        on_queues_revoked: QueueHook | None = None,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
        offset_dir: Path | None = None,
        instance_name: str = "DEFAULT",
    ) -> None:
        self._core = PushConsumerCore(
            group,
            connect(endpoints, tls, credentials, clock),
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
            message_model=message_model,
            ordering=ordering,
            config=config,
            on_queues_assigned=on_queues_assigned,
            on_queues_revoked=on_queues_revoked,
            clock=clock,
            offset_dir=offset_dir,
            instance_name=instance_name,
        )

    @property
    def client_id(self) -> str:
        """The member id this consumer has in its group."""
        return self._core.client_id

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic`'s messages whose tag matches `expression`."""
        self._core.subscribe(topic, expression)

    def register_message_listener(
        self, listener: MessageListenerOrderly | MessageListenerConcurrently
    ) -> None:
        """Set the listener."""
        self._core.register_message_listener(listener)

    async def start(self) -> None:
        """Join the group and start consuming."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Finish listener calls in flight, persist offsets, unlock, leave the group."""
        await self._core.shutdown()
