"""sdk.SimpleConsumer: the blocking face of the simple consumer (RocketMQ 5's job queue)."""

from __future__ import annotations

from types import TracebackType

from sdk._blocking import BlockingClient
from sdk._transport import connect
from sdk.clock import Clock
from sdk.consumer.simple_core import (
    DEFAULT_AWAIT_DURATION,
    DEFAULT_INVISIBLE_DURATION,
    Keeper,
    SimpleConsumerCore,
)
from sdk.credentials import Credentials
from sdk.errors import OrderMQError
from sdk.message import MessageExt
from sdk.tls import TLSConfig


class SimpleConsumer(BlockingClient):
    """Receive messages as jobs: each is hidden while it runs, and comes back unless acked.

    RocketMQ 5's SimpleConsumer. `receive()` takes messages of the subscribed topics and
    hides each from the group's other receives for `invisible_duration` seconds (its time
    to run). `ack()` settles one for good. A message not acked in time becomes visible
    again and is delivered again (to this or another worker of the group), its
    `delivery_attempt` one higher; once delivered `max_delivery_attempts` times, it goes to
    the group's dead-letter topic `%DLQ%<group>` instead. `change_invisible_duration()`
    extends (or shortens) a job's time; `keep_invisible()` extends it for as long as a
    block runs. Messages of a queue are delivered in order, but with several workers and
    re-deliveries they are processed in no particular order (see `fifo`).

    Args:
        group: Consumer group. Its members share the messages: each goes to one of them.
        endpoints: One broker "host:port" or several ("h1:p1;h2:p2" or a list).
        await_duration: How long receive() waits for a message when there is none
            (long polling), 0 to 60 seconds; 20 by default, as RocketMQ 5's Python client.
        max_delivery_attempts: Deliveries of a message before the dead-letter topic
            (1..1000); None: the broker's `pop_max_delivery_attempts` (17 by default,
            RocketMQ's 16 retries). Set for the group from this consumer's receives on.
        fifo: Deliver the messages of one sharding key one at a time: the next only once
            the previous was acked or dead-lettered (RocketMQ 5's FIFO groups).
        clock: Time source for the keepers (sdk.testing.FakeClock in tests).
        tls: Connect over TLS (sdk.TLSConfig); None: plain text.
        credentials: The broker's ACL account (sdk.Credentials): every call is
            signed; not over rocketmq:// yet (UnsupportedByTransportError).

    Receipts: a received message carries `delivery_attempt` and its `receipt` (opaque),
    which names the broker that issued it; ack() and change_invisible_duration() go
    there. An ack after the invisible time passed raises ReceiptExpiredError (the message
    may have gone to another worker: processing it twice must be harmless); one with a
    receipt a change replaced, or that the broker does not know, InvalidReceiptError.

    Example::

        from sdk import SimpleConsumer

        with SimpleConsumer("mailers", "127.0.0.1:8081") as consumer:
            consumer.subscribe("emails")
            for message in consumer.receive(max_messages=16, invisible_duration=30):
                send_email(message.body)
                consumer.ack(message)
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
        super().__init__(self._core, f"ordermq-simple-{group}")

    @property
    def group(self) -> str:
        """The consumer group."""
        return self._core.group

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Receive `topic`'s messages whose tag matches `expression` ('*' or 'A || B').

        Before or after start(). With several topics, each receive() takes from one, in
        turn.
        """
        self._core.subscribe(topic, expression)

    def unsubscribe(self, topic: str) -> None:
        """Receive no more of `topic` (messages in hand may still be acked)."""
        self._core.unsubscribe(topic)

    def subscriptions(self) -> dict[str, str]:
        """Topic -> tag expression, as subscribed."""
        return self._core.subscriptions()

    def start(self) -> None:
        """Make the consumer ready to receive (it connects on the first call)."""
        super().start()

    def shutdown(self) -> None:
        """Stop the keepers and close the connections.

        Messages received and not acked stay hidden until their invisible time passes, then
        are delivered again.
        """
        super().shutdown()

    def receive(
        self, max_messages: int = 16, invisible_duration: float = DEFAULT_INVISIBLE_DURATION
    ) -> list[MessageExt]:
        """Up to `max_messages` (1..1000) messages, each hidden for `invisible_duration` s.

        Waits up to the consumer's `await_duration` when there is none, then returns [].
        `invisible_duration`: the time to run, over 0 up to 12 hours (60 s by default).
        InvalidArgumentError for arguments out of range and ClientStateError before
        start() or subscribe(), before anything is sent; TopicNotFoundError when the topic
        does not exist.
        """
        return self._run(self._core.receive(max_messages, invisible_duration))

    def ack(self, message: MessageExt) -> None:
        """Settle a received message: it is not delivered again.

        ReceiptExpiredError when its invisible time passed first; InvalidReceiptError when
        its receipt was replaced or is unknown; InvalidArgumentError for a message no
        SimpleConsumer of this group received. Stops the message's keep_invisible().
        """
        self._run(self._core.ack(message))

    def change_invisible_duration(self, message: MessageExt, seconds: float) -> None:
        """Hide a received message for `seconds` from now (0..12 h; 0: visible at once).

        Extends or shortens its time to run; its delivery attempt stays. The message gets a
        new receipt (kept on it; the old one no longer works). Errors as for ack().
        """
        self._run(self._core.change_invisible_duration(message, seconds))

    def keep_invisible(
        self, message: MessageExt, invisible_duration: float | None = None
    ) -> KeepInvisible:
        """A context manager that keeps `message` invisible while its block runs.

        It renews the message's invisible time (to `invisible_duration` seconds, by default
        the one it was received or last changed with) each time a third of it is left,
        until ack(), the end of the block or shutdown()::

            for message in consumer.receive(max_messages=1, invisible_duration=30):
                with consumer.keep_invisible(message):
                    run_a_long_job(message)  # hours, if need be
                    consumer.ack(message)

        Leaving the block without an ack leaves the message hidden until its current
        deadline (change_invisible_duration(message, 0) gives it back at once). See
        KeepInvisible for what it tells of the renewals.
        """
        return KeepInvisible(self, self._core.keeper(message, invisible_duration))


class KeepInvisible:
    """What `SimpleConsumer.keep_invisible()` returns: use it in a `with` statement.

    `renewals` counts the renewals that succeeded. `error` is None while the message is
    kept; else the error that ended the renewals (ReceiptExpiredError or
    InvalidReceiptError: the message may be delivered to another worker, and an ack will
    raise the same). `active` says whether it still renews.
    """

    def __init__(self, consumer: SimpleConsumer, keeper: Keeper) -> None:
        self._consumer = consumer
        self._keeper = keeper

    @property
    def renewals(self) -> int:
        """How many renewals succeeded."""
        return self._keeper.renewals

    @property
    def error(self) -> OrderMQError | None:
        """The error that ended the renewals, or None."""
        return self._keeper.error

    @property
    def active(self) -> bool:
        """True while it renews."""
        return self._keeper.active

    def __enter__(self) -> KeepInvisible:
        self._consumer._run(_start(self._keeper))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._consumer._core.running:
            self._consumer._run(self._keeper.stop())


async def _start(keeper: Keeper) -> None:
    keeper.start()
