"""Transactional messages: the core of sdk.TransactionProducer and sdk.aio.TransactionProducer.

RocketMQ's TransactionMQProducer. `send_half` stores a *half message* at its queue's
broker, invisible to consumers; the application runs its local transaction and
`finish` commits or rolls the message back (UNKNOWN leaves it to the broker's check-back).
The blocking face runs the listener in the caller's thread between the two (where the
application's own transaction lives), the asyncio face awaits it.

The broker checks back a transaction left pending (6 s after it was stored, every 60 s,
15 times by default): each producer keeps a stream open to each broker of its endpoints
(WatchTransactionChecks; over remoting, its heartbeats as a producer of the group and
CHECK_TRANSACTION_STATE on those connections) and answers each check with
`check(message)`; the broker asks another live producer of the group when this one is
gone. A listener that raises counts as UNKNOWN and is logged, as in RocketMQ. Reaches
brokers through the Transport protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sdk._transport.protocol import HalfSent, TransactionCheck, Transport
from sdk._validation import check_group
from sdk.clock import Clock, SystemClock
from sdk.consumer.core import new_client_id
from sdk.errors import ClientStateError, InvalidArgumentError, InvalidMessageError, OrderMQError
from sdk.message import (
    ENCODING_FAILURES,
    Message,
    MessageExt,
    MessageIdGenerator,
    MessageQueue,
    SendStatus,
    check_message,
    recheck_message,
)
from sdk.selector import shard_index

log = logging.getLogger("ordermq.transaction")

#: Pause before a check-back stream that failed is opened again.
RECONNECT_SECONDS = 1.0


class LocalTransactionState(enum.Enum):
    """What became of the local transaction (RocketMQ's LocalTransactionState)."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    #: Not known yet: the broker checks back later.
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True, slots=True)
class TransactionSendResult:
    """A transactional send: where the half message went and what the listener said.

    `queue_offset` is -1: a committed message gets its offset when it is committed.
    """

    status: SendStatus
    msg_id: str
    queue: MessageQueue
    queue_offset: int
    transaction_id: str
    local_transaction_state: LocalTransactionState


@dataclass(frozen=True, slots=True)
class HalfMessage:
    """A stored half message waiting for its local transaction (between the two steps)."""

    message: Message
    msg_id: str
    queue: MessageQueue
    sent: HalfSent


CheckCallback = Callable[[MessageExt], Awaitable[LocalTransactionState]]
ExecuteCallback = Callable[[Message, Any], Awaitable[LocalTransactionState]]


def state_of(value: object, where: str) -> LocalTransactionState:
    """A listener's answer as a state; anything else counts as UNKNOWN (logged)."""
    if isinstance(value, LocalTransactionState):
        return value
    log.error("%s returned %r, not a LocalTransactionState: counted as UNKNOWN", where, value)
    return LocalTransactionState.UNKNOWN


def check_listener(listener: Any, *, asynchronous: bool) -> Any:
    """`listener` if it can serve as a TransactionListener; else InvalidArgumentError.

    It needs both methods, async ones for sdk.aio's producer (`asynchronous`), plain ones
    for the blocking producer's. Either mistake would otherwise only show when a
    transaction is sent or checked, as an AttributeError or a transaction left UNKNOWN.
    """
    kind = "async " if asynchronous else "plain (not async) "
    for name in ("execute_local_transaction", "check_local_transaction"):
        method = getattr(listener, name, None)
        if not callable(method) or inspect.iscoroutinefunction(method) != asynchronous:
            raise InvalidArgumentError(
                f"listener must be a TransactionListener with {kind}methods "
                f"execute_local_transaction and check_local_transaction; {listener!r} has "
                f"no {kind}{name}"
            )
    return listener


class TransactionCore:
    """Half messages, their ends, and the answers to check-backs; on one event loop."""

    def __init__(
        self,
        connect: Callable[[], Transport],
        check: CheckCallback,
        *,
        group: str,
        clock: Clock | None = None,
    ) -> None:
        self.group = check_group(group)
        self._connect = connect
        self._check = check
        self._clock = clock or SystemClock()
        self._ids = MessageIdGenerator()
        self._turn = 0
        self.client_id = new_client_id()
        self._transport: Transport | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._answers: set[asyncio.Task[None]] = set()
        self._closed = False

    async def start(self) -> None:
        """Connect and open the check-back streams."""
        if self._transport is not None or self._closed:
            raise ClientStateError("the transaction producer was started already")
        transport = self._transport = self._connect()
        for broker in transport.transaction_brokers():
            self._watchers.append(
                asyncio.create_task(self._watch(broker), name=f"transaction-checks-{broker}")
            )

    async def shutdown(self) -> None:
        """Stop answering check-backs (the broker asks another producer) and disconnect."""
        self._closed = True
        tasks = [*self._watchers, *self._answers]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._transport is not None:
            await self._transport.close()

    def _running(self) -> Transport:
        if self._transport is None or self._closed:
            raise ClientStateError("the transaction producer is not running")
        return self._transport

    # ------------------------------------------------------------------ sending
    async def send_half(self, message: Message, *, timeout: float | None = None) -> HalfMessage:
        """Store `message` as a half message (its sharding key picks the queue)."""
        transport = self._running()
        check_message(message, "send_message_in_transaction()")
        if message.delay_seconds is not None or message.deliver_at is not None:
            raise InvalidMessageError("a transactional message cannot be delayed")
        queues = await transport.writable_queues(message.topic)
        if message.sharding_key is not None:
            queue = queues[shard_index(message.sharding_key, len(queues))]
        else:
            queue = queues[self._turn % len(queues)]
            self._turn += 1
        msg_id = self._ids.next()
        try:
            prepared = transport.prepare(message, msg_id, self._clock.now())
        except ENCODING_FAILURES:
            recheck_message(message, "send_message_in_transaction()")
            raise
        sent = await transport.send_half(queue, prepared, self.group, timeout=timeout)
        return HalfMessage(message, msg_id.hex().upper(), queue, sent)

    async def finish(
        self, half: HalfMessage, state: LocalTransactionState
    ) -> TransactionSendResult:
        """End the transaction as `state` says (UNKNOWN: leave it to the check-back).

        An end that fails is logged, not raised: the broker checks back (RocketMQ's
        endTransaction is one-way too).
        """
        if state is not LocalTransactionState.UNKNOWN:
            await self._end(half.sent.broker, half.sent.transaction_id, state, from_check=False)
        return TransactionSendResult(
            SendStatus.SEND_OK if half.sent.durable else SendStatus.FLUSH_DISK_TIMEOUT,
            half.msg_id,
            half.queue,
            -1,
            half.sent.transaction_id,
            state,
        )

    async def send_message_in_transaction(
        self, message: Message, arg: Any, execute: ExecuteCallback
    ) -> TransactionSendResult:
        """send_half, then `execute(message, arg)` (a raise counts as UNKNOWN), then finish."""
        half = await self.send_half(message)
        try:
            state = state_of(await execute(message, arg), "execute_local_transaction")
        except Exception:
            log.exception("execute_local_transaction raised for message %s: counted as "
                          "UNKNOWN (the broker checks back)", half.msg_id)  # fmt: skip
            state = LocalTransactionState.UNKNOWN
        return await self.finish(half, state)

    async def _end(
        self, broker: str, transaction_id: str, state: LocalTransactionState, *, from_check: bool
    ) -> None:
        commit = state is LocalTransactionState.COMMIT_MESSAGE
        try:
            await self._running().end_transaction(
                broker, self.group, transaction_id, commit, from_check=from_check
            )
        except OrderMQError as exc:
            log.warning("ending transaction %s (%s) failed, the broker checks back: %s",
                        transaction_id, state.value, exc)  # fmt: skip

    # ------------------------------------------------------------------ check-back
    async def _watch(self, broker: str) -> None:
        transport = self._running()
        while not self._closed:
            try:
                async for check in transport.watch_transaction_checks(
                    broker, self.group, self.client_id
                ):
                    task = asyncio.create_task(self._answer(check))
                    self._answers.add(task)
                    task.add_done_callback(self._answers.discard)
            except OrderMQError as exc:
                log.info("check-back stream from %s ended, opened again: %s", broker, exc)
            with contextlib.suppress(OrderMQError):
                await self._clock.sleep_until(self._clock.now() + RECONNECT_SECONDS)

    async def _answer(self, check: TransactionCheck) -> None:
        try:
            state = state_of(await self._check(check.message), "check_local_transaction")
        except Exception:
            log.exception("check_local_transaction raised for transaction %s: counted as "
                          "UNKNOWN", check.transaction_id)  # fmt: skip
            state = LocalTransactionState.UNKNOWN
        if state is not LocalTransactionState.UNKNOWN:
            await self._end(check.broker, check.transaction_id, state, from_check=True)
