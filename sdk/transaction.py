"""sdk.TransactionProducer: transactional messages, blocking (core: sdk._transaction)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from sdk._blocking import BlockingClient
from sdk._transaction import (
    LocalTransactionState,
    TransactionCore,
    TransactionSendResult,
    check_listener,
    log,
    state_of,
)
from sdk._transport import check_connection, connect
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.message import Message, MessageExt
from sdk.tls import TLSConfig


class TransactionListener(Protocol):
    """The application's side of a transaction (RocketMQ's TransactionListener).

    A method that raises counts as UNKNOWN (logged), as in RocketMQ.
    """

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction for a stored half message; say how it ended.

        Called in the thread that called send_message_in_transaction.
        """
        ...

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """The broker asks what became of the local transaction of `msg` (in a worker thread)."""
        ...


class TransactionProducer(BlockingClient):
    """Sends messages that become visible only once the local transaction commits.

    `send_message_in_transaction(msg, arg)` stores `msg` as a half message (no consumer
    sees it), calls `listener.execute_local_transaction(msg, arg)` and commits the message
    (it becomes visible on its topic, in its sharding key's queue) or rolls it back as the
    listener says. UNKNOWN, or a listener that raises, leaves it to the broker: it asks a
    live producer of the same `group` (`listener.check_local_transaction(msg)`) 6 seconds
    later, then every 60 seconds, at most 15 times, then drops it (the broker's
    --transaction-* options). See docs/transactions.md.

    Args:
        endpoints: One broker "host:port" or several ("h1:p1;h2:p2" or a list), or
            "rocketmq://<name servers>" for RocketMQ's remoting protocol.
        listener: The TransactionListener.
        group: The producer group; check-backs go to any live producer of it.
        clock: Time source (sdk.testing.FakeClock in tests).
        tls, credentials: As for the other clients.

    Example::

        with TransactionProducer("127.0.0.1:8081", listener, group="orders") as producer:
            result = producer.send_message_in_transaction(Message("orders", b"..."))
            print(result.local_transaction_state)
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
        self._listener = check_listener(listener, asynchronous=False)

        async def check(msg: MessageExt) -> LocalTransactionState:
            return await asyncio.to_thread(listener.check_local_transaction, msg)

        self._core = TransactionCore(
            lambda: connect(endpoints, tls, credentials, clock), check, group=group, clock=clock
        )
        super().__init__(self._core, f"ordermq-transaction-{group}")

    @property
    def group(self) -> str:
        """The producer group."""
        return self._core.group

    def send_message_in_transaction(self, msg: Message, arg: Any = None) -> TransactionSendResult:
        """Store `msg` as a half message, run the local transaction, commit or roll back.

        Raises an OrderMQError when the half message could not be stored (the listener
        is then not called). A failed commit or rollback is logged: the broker checks back.
        """
        half = self._run(self._core.send_half(msg))
        try:
            state = state_of(
                self._listener.execute_local_transaction(msg, arg), "execute_local_transaction"
            )
        except Exception:
            log.exception("execute_local_transaction raised for message %s: counted as "
                          "UNKNOWN (the broker checks back)", half.msg_id)  # fmt: skip
            state = LocalTransactionState.UNKNOWN
        return self._run(self._core.finish(half, state))

    def shutdown(self) -> None:
        """Stop answering check-backs (the broker asks another producer) and disconnect."""
        super().shutdown()
