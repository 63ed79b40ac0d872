"""sdk.aio.TransactionProducer: transactional messages on the caller's event loop."""

from __future__ import annotations

from typing import Any, Protocol

from sdk._transaction import (
    LocalTransactionState,
    TransactionCore,
    TransactionSendResult,
    check_listener,
)
from sdk._transport import check_connection, connect
from sdk.aio._context import AsyncClientContext
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.message import Message, MessageExt
from sdk.tls import TLSConfig


class TransactionListener(Protocol):
    """sdk.TransactionListener with async methods; a raise counts as UNKNOWN (logged)."""

    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction for a stored half message; say how it ended."""
        ...

    async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """The broker asks what became of the local transaction of `msg`."""
        ...


class TransactionProducer(AsyncClientContext):
    """The asyncio transaction producer; arguments and behaviour as sdk.TransactionProducer.

    Example::

        async with sdk.aio.TransactionProducer("127.0.0.1:8081", listener,
                                               group="orders") as producer:
            result = await producer.send_message_in_transaction(Message("orders", b"..."))
    """

    def __init__(
        self,
        endpoints: str | list[str],
        listener: TransactionListener,
        *,
        group: str,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        check_connection(endpoints, tls, credentials, clock)
        self._listener = check_listener(listener, asynchronous=True)
        self._core = TransactionCore(
            lambda: connect(endpoints, tls, credentials, clock),
            listener.check_local_transaction,
            group=group,
            clock=clock,
        )

    @property
    def group(self) -> str:
        """The producer group."""
        return self._core.group

    async def start(self) -> None:
        """Connect and start answering check-backs."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Stop answering check-backs (the broker asks another producer) and disconnect."""
        await self._core.shutdown()

    async def send_message_in_transaction(
        self, msg: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Store `msg` as a half message, await the local transaction, commit or roll back."""
        return await self._core.send_message_in_transaction(
            msg, arg, self._listener.execute_local_transaction
        )
