"""sdk.aio.SimpleConsumer: the simple consumer on the caller's event loop."""

from __future__ import annotations

from sdk._transport import connect
from sdk.aio._context import AsyncClientContext
from sdk.clock import Clock
from sdk.consumer.simple_core import (
    DEFAULT_AWAIT_DURATION,
    DEFAULT_INVISIBLE_DURATION,
    Keeper,
    SimpleConsumerCore,
)
from sdk.credentials import Credentials
from sdk.message import MessageExt
from sdk.tls import TLSConfig


class SimpleConsumer(AsyncClientContext):
    """The asyncio simple consumer; arguments and behaviour as sdk.SimpleConsumer.

    Example::

        async with sdk.aio.SimpleConsumer("mailers", "127.0.0.1:8081") as consumer:
            consumer.subscribe("emails")
            for message in await consumer.receive(max_messages=16, invisible_duration=30):
                async with consumer.keep_invisible(message):
                    await send_email(message.body)
                    await consumer.ack(message)
    """

    def __init__(
        self,
        group: str,
        endpoints: str | list[str],
        *,
        await_duration: float = DEFAULT_AWAIT_DURATION,
        max_delivery_attempts: int | None = None,
        fifo: bool = False,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._core = SimpleConsumerCore(
            group,
            connect(endpoints, tls, credentials, clock),
            await_duration=await_duration,
            max_delivery_attempts=max_delivery_attempts,
            fifo=fifo,
            clock=clock,
        )

    @property
    def group(self) -> str:
        """The consumer group."""
        return self._core.group

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive `topic`'s messages whose tag matches `expression` ('*' or 'A || B')."""
        self._core.subscribe(topic, expression)

    def unsubscribe(self, topic: str) -> None:
        """Receive no more of `topic` (messages in hand may still be acked)."""
        self._core.unsubscribe(topic)

    def subscriptions(self) -> dict[str, str]:
        """Topic -> tag expression, as subscribed."""
        return self._core.subscriptions()

    async def start(self) -> None:
        """Make the consumer ready to receive (it connects on the first call)."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Stop the keepers and close the connections (unacked messages come back later)."""
        await self._core.shutdown()

    async def receive(
        self, max_messages: int = 16, invisible_duration: float = DEFAULT_INVISIBLE_DURATION
    ) -> list[MessageExt]:
        """Up to `max_messages` messages, each hidden for `invisible_duration` seconds.

        Waits up to `await_duration` when there is none, then returns [].
        """
        return await self._core.receive(max_messages, invisible_duration)

    async def ack(self, message: MessageExt) -> None:
        """Settle a received message: it is not delivered again (stops its keeper)."""
        await self._core.ack(message)

    async def change_invisible_duration(self, message: MessageExt, seconds: float) -> None:
        """Hide a received message for `seconds` from now; it gets a new receipt."""
        await self._core.change_invisible_duration(message, seconds)

    def keep_invisible(
        self, message: MessageExt, invisible_duration: float | None = None
    ) -> Keeper:
        """An async context manager that keeps `message` invisible while its block runs.

        As sdk.SimpleConsumer.keep_invisible; the keeper it returns has `renewals`,
        `error` and `active`.
        """
        return self._core.keeper(message, invisible_duration)
