"""The simple consumer's async core: receive, ack, change invisible duration, keep invisible.

A received message is hidden from the group's other receives for its invisible duration
(its time to run); an ack settles it, and without one it comes back, its delivery
attempt one higher, until the broker dead-letters it. Nothing runs in the background but
the keepers (`keep_invisible`), each renewing one message's invisible time.

A keeper and the calls that settle or change its message take turns on the keeper's lock,
so a renewal in flight never replaces the receipt an ack is about to use: ack() stops the
message's keeper first (waiting for a renewal under way), then acks with the newest
receipt.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from sdk._transport.protocol import Transport
from sdk._validation import DLQ_PREFIX, check_group, check_topic, split_tag_expression
from sdk.clock import Clock, SystemClock
from sdk.errors import (
    ClientStateError,
    InvalidArgumentError,
    InvalidTagExpressionError,
    OrderMQError,
    ReceiptExpiredError,
)
from sdk.message import MessageExt, Receipt

log = logging.getLogger("ordermq.consumer")

#: A group's dead-letter topic is this prefix and the group's name.
#: How long a receive waits for a message when there is none (RocketMQ 5's Python
#: client's default await duration).
DEFAULT_AWAIT_DURATION = 20.0
#: The longest wait the broker allows a receive.
MAX_AWAIT_DURATION = 60.0
#: How long a received message stays hidden unless told otherwise (RocketMQ 5 proxy's
#: default invisible time).
DEFAULT_INVISIBLE_DURATION = 60.0
#: The longest invisible duration (RocketMQ's, and the broker's, limit): 12 hours.
MAX_INVISIBLE_DURATION = 12 * 3600.0
#: The most messages one receive takes (the broker's limit).
MAX_RECEIVE_MESSAGES = 1000
#: A keeper renews once this share of the invisible duration is left.
RENEW_WHEN_LEFT = 1 / 3
#: After a failure that may pass (broker unreachable or busy), a keeper tries again after
#: this long, or sooner if the message's deadline is closer.
RENEW_RETRY_SECONDS = 1.0


def check_duration(what: str, seconds: float, low: float, high: float) -> float:
    """`seconds` as a float within [low, high], else InvalidArgumentError."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidArgumentError(f"{what} must be a number of seconds, not {seconds!r}")
    if not low <= seconds <= high:
        raise InvalidArgumentError(f"{what} {seconds!r} is outside [{low:g}, {high:g}] seconds")
    return float(seconds)


def _subscribable(topic: str) -> str:
    """A user topic, or a group's dead-letter topic `%DLQ%<group>` (to handle dead jobs)."""
    if isinstance(topic, str) and topic.startswith(DLQ_PREFIX):
        check_group(topic[len(DLQ_PREFIX) :])
        return topic
    return check_topic(topic)


class SimpleConsumerCore:
    """Subscriptions, receives in turn over them, and the keepers of received messages."""

    def __init__(
        self,
        group: str,
        transport: Transport,
        *,
        await_duration: float = DEFAULT_AWAIT_DURATION,
        max_delivery_attempts: int | None = None,
        fifo: bool = False,
        clock: Clock | None = None,
    ) -> None:
        self.group = check_group(group)
        self.await_duration = check_duration(
            "await_duration", await_duration, 0.0, MAX_AWAIT_DURATION
        )
        if max_delivery_attempts is not None and (
            isinstance(max_delivery_attempts, bool)
            or not isinstance(max_delivery_attempts, int)
            or not 1 <= max_delivery_attempts <= 1000
        ):
            raise InvalidArgumentError(
                f"max_delivery_attempts {max_delivery_attempts!r} must be an int in 1..1000"
            )
        self.max_delivery_attempts = max_delivery_attempts or 0
        self.fifo = bool(fifo)
        self.clock: Clock = clock or SystemClock()
        self._transport = transport
        self._subscriptions: dict[str, str] = {}
        self._turn = 0
        self._state = "new"  # new -> running -> shut down
        self._keepers: dict[int, Keeper] = {}  # id(message) -> its keeper

    @property
    def running(self) -> bool:
        """True between start() and shutdown()."""
        return self._state == "running"

    # ------------------------------------------------------------------ setup
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive `topic`'s messages whose tag matches `expression` ('*' or 'A || B').

        `topic` may be a group's dead-letter topic, `%DLQ%<group>`.
        """
        if self._state == "shut down":
            raise ClientStateError("the SimpleConsumer is shut down")
        try:
            split_tag_expression(expression)
        except ValueError as exc:
            raise InvalidTagExpressionError(str(exc)) from None
        self._subscriptions[_subscribable(topic)] = expression.strip() or "*"

    def unsubscribe(self, topic: str) -> None:
        """Stop receiving `topic`'s messages (those in hand may still be acked)."""
        self._subscriptions.pop(topic, None)

    def subscriptions(self) -> dict[str, str]:
        """Topic -> tag expression, as subscribed."""
        return dict(self._subscriptions)

    async def start(self) -> None:
        """Make the consumer ready to receive."""
        if self._state == "shut down":
            raise ClientStateError("the SimpleConsumer was shut down; make a new one")
        if self._state == "running":
            raise ClientStateError("the SimpleConsumer already started")
        self._state = "running"

    async def shutdown(self) -> None:
        """Stop every keeper and close the connections; received messages stay hidden."""
        if self._state == "shut down":
            return
        self._state = "shut down"
        for keeper in list(self._keepers.values()):
            await keeper.stop()
        await self._transport.close()

    # ------------------------------------------------------------------ consuming
    def _check_running(self, call: str) -> None:
        if self._state == "new":
            raise ClientStateError(f"{call} before start(): start the SimpleConsumer first")
        if self._state == "shut down":
            raise ClientStateError(f"{call} after shutdown()")

    async def receive(self, max_messages: int, invisible_duration: float) -> list[MessageExt]:
        """Up to `max_messages` messages of one subscribed topic, each hidden for a while.

        Topics are taken in turn, one per call. Waits up to `await_duration` when there is
        no message; then [].
        """
        if isinstance(max_messages, bool) or not isinstance(max_messages, int):
            raise InvalidArgumentError(f"max_messages must be an int, not {max_messages!r}")
        if not 1 <= max_messages <= MAX_RECEIVE_MESSAGES:
            raise InvalidArgumentError(
                f"max_messages {max_messages} is outside 1..{MAX_RECEIVE_MESSAGES}"
            )
        duration = check_duration(
            "invisible_duration", invisible_duration, 0.001, MAX_INVISIBLE_DURATION
        )
        self._check_running("receive()")
        if not self._subscriptions:
            raise ClientStateError("receive() before subscribe(): subscribe to a topic first")
        topics = list(self._subscriptions)
        topic = topics[self._turn % len(topics)]
        self._turn += 1
        sent = self.clock.now()
        messages = await self._transport.receive(
            self.group,
            topic,
            max_messages=max_messages,
            invisible_duration=duration,
            await_duration=self.await_duration,
            tag_expression=self._subscriptions[topic],
            fifo=self.fifo,
            max_delivery_attempts=self.max_delivery_attempts,
        )
        for message in messages:
            assert message.receipt is not None, "a transport's receive gives every receipt"
            message.receipt = replace(message.receipt, hidden_until=sent + duration)
        return messages

    def _receipt(self, message: MessageExt, call: str) -> Receipt:
        """`message`'s receipt, checked before anything is sent."""
        if not isinstance(message, MessageExt):
            raise InvalidArgumentError(f"{call} takes a received MessageExt, not {message!r}")
        receipt = message.receipt
        if receipt is None:
            raise InvalidArgumentError(
                f"{call}: message {message.msg_id} was not received by a SimpleConsumer "
                "(it has no receipt)"
            )
        if receipt.group != self.group:
            raise InvalidArgumentError(
                f"{call}: message {message.msg_id} was received by group {receipt.group!r}, "
                f"not {self.group!r}"
            )
        self._check_running(call)
        return receipt

    async def ack(self, message: MessageExt) -> None:
        """Settle `message`: it is not delivered again. Stops its keeper first."""
        self._receipt(message, "ack()")
        keeper = self._keepers.get(id(message))
        if keeper is not None:
            await keeper.stop()
        receipt = self._receipt(message, "ack()")  # the newest, after any renewal
        await self._transport.ack(receipt)

    async def change_invisible_duration(self, message: MessageExt, seconds: float) -> None:
        """Hide `message` for `seconds` from now; 0 makes it visible again at once.

        The message gets a new receipt (the old one no longer works).
        """
        duration = check_duration("invisible duration", seconds, 0.0, MAX_INVISIBLE_DURATION)
        self._receipt(message, "change_invisible_duration()")
        keeper = self._keepers.get(id(message))
        if keeper is None:
            await self._change(message, duration)
            return
        async with keeper.lock:
            await self._change(message, duration)

    async def _change(self, message: MessageExt, seconds: float) -> None:
        receipt = self._receipt(message, "change_invisible_duration()")
        sent = self.clock.now()
        renewed = await self._transport.change_invisible_duration(receipt, seconds)
        message.receipt = replace(renewed, hidden_until=sent + seconds)

    # ------------------------------------------------------------------ keepers
    def keeper(self, message: MessageExt, invisible_duration: float | None = None) -> Keeper:
        """A keeper for `message`, not started (see Keeper)."""
        receipt = self._receipt(message, "keep_invisible()")
        duration = receipt.invisible_duration if invisible_duration is None else invisible_duration
        duration = check_duration("invisible_duration", duration, 0.001, MAX_INVISIBLE_DURATION)
        if id(message) in self._keepers:
            raise ClientStateError(f"message {message.msg_id} already has a keeper")
        return Keeper(self, message, duration)


class Keeper:
    """Keeps one received message invisible while its job runs.

    Renews the message's invisible time (to `invisible_duration` from then) each time a
    third of the current one is left, on the consumer's clock, until stopped: by ack(),
    by the end of the `with` block, or by shutdown(). A renewal that fails for a reason
    that may pass (broker unreachable, busy, slow) is tried again; one that cannot succeed
    (the receipt expired or was replaced) ends the keeper, and `error` says why: the
    message may then be delivered to another worker, and acking it raises that error.
    """

    def __init__(self, core: SimpleConsumerCore, message: MessageExt, duration: float) -> None:
        self._core = core
        self.message = message
        self.invisible_duration = duration
        #: Held while a renewal (or the consumer's change_invisible_duration) is under way.
        self.lock = asyncio.Lock()
        #: How many renewals succeeded.
        self.renewals = 0
        #: The error that ended the renewals, or None.
        self.error: OrderMQError | None = None
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start renewing (on the running loop)."""
        self._core._keepers[id(self.message)] = self
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Stop renewing; waits for a renewal under way (so the receipt is the newest)."""
        self._stopped.set()
        if self._core._keepers.get(id(self.message)) is self:
            del self._core._keepers[id(self.message)]
        if self._task is not None and self._task is not asyncio.current_task():
            await asyncio.wait((self._task,))

    @property
    def active(self) -> bool:
        """True while it renews."""
        return self._task is not None and not self._task.done()

    async def _wait(self, deadline: float) -> bool:
        """Sleep until `deadline` on the consumer's clock; False when stopped meanwhile."""
        stopped = asyncio.ensure_future(self._stopped.wait())
        timer = asyncio.ensure_future(self._core.clock.sleep_until(deadline))
        try:
            await asyncio.wait((stopped, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
            timer.cancel()
        return not self._stopped.is_set()

    async def _run(self) -> None:
        clock = self._core.clock
        while True:
            receipt = self.message.receipt
            assert receipt is not None
            left = receipt.invisible_duration * RENEW_WHEN_LEFT
            if not await self._wait(receipt.hidden_until - left):
                return
            async with self.lock:
                if self._stopped.is_set():
                    return
                try:
                    await self._core._change(self.message, self.invisible_duration)
                    self.renewals += 1
                except OrderMQError as exc:
                    if not exc.retriable or clock.now() >= receipt.hidden_until:
                        if exc.retriable:  # the deadline passed while the broker was away
                            exc = ReceiptExpiredError(
                                f"message {self.message.msg_id}: its invisible time ran out "
                                f"while renewals failed ({exc})"
                            )
                        self.error = exc
                        log.warning(
                            "stopped keeping message %s invisible: %s", self.message.msg_id, exc
                        )
                        return
                    retry_at = min(clock.now() + RENEW_RETRY_SECONDS, receipt.hidden_until)
                else:
                    continue
            if not await self._wait(retry_at):
                return

    async def __aenter__(self) -> Keeper:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
