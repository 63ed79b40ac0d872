"""The one interface the clients' cores talk to, whatever carries it to the brokers.

A `Transport` is a client's view of a whole cluster: it finds the brokers of a queue,
keeps their connections, and turns each call into its protocol's requests. The cores
(sdk/producer, sdk/consumer) know only this module: they pass domain values (messages,
queues, offsets, group names) and get domain values back, and never see an address, a
protocol buffer or a wire layout. `sdk._transport.connect` picks the implementation from
the endpoint; sdk/_transport/grpc_transport.py is the one for ordermq's gRPC protocol.

Errors are OrderMQError subclasses (sdk.errors), already translated by the transport.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sdk.errors import ClientStateError, OrderMQError
from sdk.message import Message, MessageExt, MessageQueue, Receipt


class PullStatus(enum.Enum):
    """What a pull found (RocketMQ's PullStatus)."""

    FOUND = "FOUND"
    NO_NEW_MESSAGE = "NO_NEW_MESSAGE"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


@dataclass(frozen=True, slots=True)
class PullResult:
    """A pull's answer, messages decoded.

    The messages are decoded for a consumer's buffer (`codec.decode_records(...,
    buffered=True)`), outside the cycle collector: whoever hands them on to a user's code
    calls `sdk._accel.hand_out` on them while it still holds them (ProcessQueue does once
    it lets go of them).
    """

    status: PullStatus
    next_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt]


class CreditWindow:
    """A push subscription's credit as its consumer sees it: granted and not yet used.

    The broker spends a batch's records and their stored bytes (at least its bodies'
    bytes) from what was granted; the client counts the same from what it received. A
    batch serves one record at least, so the broker may go past the byte credit: the
    bytes go below zero here as they do there, and the next grant pays that debt as
    well as the room. (A view that stopped at zero granted the debt's worth too little
    each time: with messages larger than the byte room the debt grew by each one's
    excess until the broker never sent again.)
    """

    __slots__ = ("bytes", "messages")

    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0

    def granted(self, messages: int, size: int) -> None:
        """`messages` more records and `size` more bytes were granted."""
        self.messages += messages
        self.bytes += size

    def received(self, count: int, size: int) -> None:
        """A batch of `count` records, `size` stored bytes, arrived."""
        self.messages -= count
        self.bytes -= size

    def to_grant(
        self, limit_messages: int, limit_bytes: int, count: int, size: int, min_messages: int
    ) -> tuple[int, int]:
        """What to grant now, for a cache of `count` messages and `size` bytes.

        The cache plus the credit outstanding stays within `limit_messages` and
        `limit_bytes`. Nothing (0, 0) until at least `min_messages` of room, or half the
        bytes, is free: grants come in batches, not one per message consumed.
        """
        if not self.grantable(limit_messages, limit_bytes, count, size, min_messages):
            return 0, 0
        messages = limit_messages - count - self.messages
        size_room = limit_bytes - size - self.bytes
        return max(0, messages), max(0, size_room)

    def grantable(
        self, limit_messages: int, limit_bytes: int, count: int, size: int, min_messages: int
    ) -> bool:
        """True when `to_grant` would grant something: the room is worth a grant."""
        return (
            limit_messages - count - self.messages >= max(1, min_messages)
            or limit_bytes - size - self.bytes >= limit_bytes // 2
        )


class Subscription(Protocol):
    """A push subscription to one queue (Transport.subscribe)."""

    @property
    def credit(self) -> CreditWindow:
        """Credit granted and not yet used, as seen here."""
        ...

    async def next(self) -> PullResult:
        """The next batch, as a pull's answer (FOUND, NO_MATCHED_MESSAGE or OFFSET_ILLEGAL).

        Raises what ended the subscription: the broker's refusal (LockNotHeldError,
        StaleEpochError when the lock is lost), BrokerUnavailableError when the
        connection broke, NotSupportedError when the broker has no push delivery.
        After OFFSET_ILLEGAL the subscription has ended.
        """
        ...

    def on_batch(self, handler: Callable[[PullResult], bool] | None) -> None:
        """Hand batches to `handler` as they arrive, in order, instead of to `next()`.

        Where batches arrive on a task of their own (a stream's reader), this saves a
        task hand-off per batch. `handler` runs on the event loop, synchronously, and
        returns True when it took the batch; on False `next()` returns that batch, in its
        order, and `handler` is called no more. A transport may call it for none: the
        subscription's end and errors always come from `next()`.
        """
        ...

    def grant(self, messages: int, size: int) -> None:
        """Let the broker send `messages` more records and `size` more bytes."""
        ...

    def close(self) -> None:
        """End the subscription; batches not yet read are dropped."""
        ...


@dataclass(frozen=True, slots=True)
class MessageAnswer:
    """Where one message of a batch is, as a dedup broker answers (Appended.messages)."""

    queue_id: int
    offset: int
    #: The id of the copy there (a duplicate's first copy's); empty when not told.
    msg_id: bytes = b""
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a batch went: offsets [first_offset, first_offset + count), or scheduled."""

    durable: bool
    first_offset: int
    count: int
    scheduled: bool = False
    #: The queue they are in when not the one asked for, else -1: they repeat an earlier
    #: send to another queue (broker-side dedup answers with that send's place).
    queue_id: int = -1
    #: A batch with duplicates: each message's place, in order (then the fields above
    #: tell only of the messages stored now); empty when every message was stored.
    messages: tuple[MessageAnswer, ...] = ()


_new_appended = object.__new__
_set_durable, _set_first_offset, _set_count, _set_scheduled, _set_queue_id, _set_messages = (
    Appended.__dict__[name].__set__
    for name in ("durable", "first_offset", "count", "scheduled", "queue_id", "messages")
)


def appended(durable: bool, first_offset: int, count: int, scheduled: bool) -> Appended:
    """`Appended(durable, first_offset, count, scheduled)`, faster (one per part of a send).

    The frozen dataclass's constructor sets each field through object.__setattr__; this
    sets the slots directly (the same fields, so equal and immutable alike).
    """
    result = _new_appended(Appended)
    _set_durable(result, durable)
    _set_first_offset(result, first_offset)
    _set_count(result, count)
    _set_scheduled(result, scheduled)
    _set_queue_id(result, -1)
    _set_messages(result, ())
    return result


@dataclass(frozen=True, slots=True)
class HalfSent:
    """A stored half message: its transaction, and the broker that holds it (opaque)."""

    transaction_id: str
    broker: str
    durable: bool


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """A broker's check-back of a pending transaction: its half message, which check."""

    transaction_id: str
    broker: str
    message: MessageExt
    check_times: int


#: One queue's prepared messages, for Transport.send_parts.
SendPart = tuple[MessageQueue, Sequence[bytes]]


async def send_each(
    transport: Transport, parts: Sequence[SendPart], timeout: float | None
) -> list[Appended | OrderMQError]:
    """send_parts for a wire without requests over several queues: one `send` per part.

    The queues' parts run side by side; one queue's, one after another.
    """
    outcomes: list[Appended | OrderMQError | None] = [None] * len(parts)
    by_queue: dict[MessageQueue, list[int]] = {}
    for index, (queue, _) in enumerate(parts):
        by_queue.setdefault(queue, []).append(index)

    async def one_queue(indexes: list[int]) -> None:
        for index in indexes:
            queue, prepared = parts[index]
            try:
                outcomes[index] = await transport.send(queue, prepared, timeout=timeout)
            except ClientStateError:
                raise
            except OrderMQError as exc:
                outcomes[index] = exc

    await asyncio.gather(*(one_queue(indexes) for indexes in by_queue.values()))
    return [o for o in outcomes if o is not None]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """What a client tells the brokers about one of its consumer groups."""

    group: str
    consume_type: str  # "CONSUME_ORDERLY", "CONSUME_CONCURRENTLY" or "CONSUME_POLL"
    message_model: str = "CLUSTERING"
    subscriptions: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class SentBack:
    """Where a send-back put the message."""

    dead_letter: bool
    topic: str
    reconsume_times: int


@dataclass(frozen=True, slots=True)
class Unanswered:
    """The part of a batch call one broker did not answer: it did nothing of it."""

    broker: str  # for messages: the broker's address or name
    queues: list[MessageQueue]
    error: OrderMQError


@dataclass(frozen=True, slots=True)
class LockResult:
    """A lock_batch's answer: the queues held now, and the brokers that did not answer."""

    #: Each queue held, with its fencing epoch (0 where the protocol has none).
    locked: dict[MessageQueue, int]
    unanswered: list[Unanswered]


@dataclass(frozen=True, slots=True)
class UnlockResult:
    """An unlock_batch's answer: queues another client holds, and unanswered brokers."""

    not_held: list[MessageQueue]
    unanswered: list[Unanswered]


class Transport(Protocol):
    """A client's connections to a cluster; create it anywhere, use it on one event loop.

    Connections open on first use. Calls with a `timeout` wait within it for a broker
    that cannot be reached yet; the others fail at once while it cannot be.
    """

    # ------------------------------------------------------------------ routes
    async def writable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues producers may write, sorted by (broker, queue id); do not modify.

        Creates the topic when it does not exist. Cached until `refresh`;
        BrokerUnavailableError when the topic has no writable queue.
        """
        ...

    def known_writable_queues(self, topic: str) -> list[MessageQueue] | None:
        """`writable_queues` as last learned and not due for a refresh, asking nobody.

        None when it would ask (or has no writable queue); do not modify.
        """
        ...

    async def readable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues consumers may read, sorted; cached until `refresh`.

        TopicNotFoundError when the topic does not exist.
        """
        ...

    # ------------------------------------------------------------------ producing
    @property
    def max_send_bytes(self) -> int:
        """The most bytes of prepared messages one `send` takes."""
        ...

    def prepare(
        self,
        message: Message,
        msg_id: bytes,
        now_s: float,
        extra_properties: dict[str, str] | None = None,
    ) -> bytes:
        """`message` sent at `now_s` with id `msg_id`, encoded for `send`: opaque bytes.

        Its length is what counts against `max_send_bytes`. A delay is resolved against
        `now_s`; `extra_properties` (a trace context) are added unless they would break
        the protocol's limit. Called once per message: a retry sends the same bytes.
        """
        ...

    def prepare_many(
        self, messages: Sequence[Message], ids: Sequence[bytes], now_s: float
    ) -> list[bytes]:
        """`prepare` for each message of a send (without extra properties), in order."""
        ...

    def prepare_spooled(self, record: bytes) -> bytes:
        """A message the producer's spool kept (see sdk/producer/spool.py), for `send`."""
        ...

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        """Append prepared messages to `queue`, in order, in one request."""
        ...

    async def send_parts(
        self, parts: Sequence[SendPart], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        """Append each part to its queue, in as few requests as the wire allows.

        Each part's outcome, in order: where it went, or the error that refused it
        (nothing of a refused part was stored; the others are not affected). Parts of one
        queue are appended in order. The parts' bytes together may be up to
        `max_send_bytes` (each request's limit). Raises only for a client shut down.
        """
        ...

    async def cancel_scheduled(self, msg_id: str) -> bool:
        """Cancel a scheduled message; False when it was delivered already.

        MessageNotFoundError when no broker scheduled it.
        """
        ...

    # ------------------------------------------------------------------ consuming
    async def pull(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        tag_expression: str = "*",
        suspend_timeout: float = 0.0,
        timeout: float | None = None,
    ) -> PullResult:
        """Read `queue` from `offset`; with `suspend_timeout`, wait that long for a message."""
        ...

    async def subscribe(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        client_id: str,
        lock_epoch: int,
        credit_messages: int,
        credit_bytes: int,
        max_messages: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        tag_expression: str = "*",
    ) -> Subscription:
        """Push delivery of `queue` from `offset`, within the credit granted.

        `lock_epoch` (orderly consumers): the epoch of `client_id`'s lock on the queue;
        the subscription ends when it is no longer held. NotSupportedError (at once, or
        from the first `next()`) when the transport or the broker has no push delivery:
        pull instead.
        """
        ...

    async def queue_offsets(
        self, queue: MessageQueue, timestamp_ms: int = 0
    ) -> tuple[int, int, int]:
        """(min offset, max offset, first offset stored at or after timestamp_ms)."""
        ...

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        """The group's committed offset for `queue`, or None if it never committed."""
        ...

    async def commit_offsets(
        self, group: str, client_id: str, offsets: Sequence[tuple[MessageQueue, int, int]]
    ) -> None:
        """Commit (queue, offset, lock epoch) triples durably; epoch 0: not fenced.

        LockNotHeldError or StaleEpochError when the lock's owner or epoch changed.
        """
        ...

    async def send_back(
        self,
        group: str,
        message: MessageExt,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        reconsume_times: int = 0,
    ) -> SentBack:
        """Return a message the group failed to consume, for a later retry or dead letter."""
        ...

    async def park_key(
        self,
        group: str,
        client_id: str,
        message: MessageExt,
        *,
        epoch: int,
        reason: str,
    ) -> int:
        """Park `message`'s sharding key in its queue for `group`, from `message` on.

        The broker copies the key's messages from there, in order, to %PARKED%<group> and
        skips them in the group's pulls until an operator releases the key. Returns the
        queue offset up to which the key's messages are parked (the caller drops those it
        holds). Fenced as a commit: LockNotHeldError or StaleEpochError.
        """
        ...

    # ------------------------------------------------------------------ receiving (pop)
    async def receive(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int,
        invisible_duration: float,
        await_duration: float,
        tag_expression: str = "*",
        fifo: bool = False,
        max_delivery_attempts: int = 0,
    ) -> list[MessageExt]:
        """Take up to `max_messages` of `topic` for `group`, each hidden for a while.

        The transport picks the broker (one per call, in turn among those that serve the
        topic's readable queues). Each message carries its `delivery_attempt` and a
        `receipt` naming that broker (its `hidden_until` as the broker said; the caller
        may put its own estimate in). Waits up to `await_duration` seconds for a message
        when there is none; then answers []. `max_delivery_attempts` 0: the broker's.
        TopicNotFoundError when the topic does not exist.
        """
        ...

    async def ack(self, receipt: Receipt) -> None:
        """Settle the message `receipt` holds, at the broker that issued it.

        ReceiptExpiredError when its invisible time passed; InvalidReceiptError when the
        broker does not know it, or a change of invisible duration replaced it.
        """
        ...

    async def change_invisible_duration(self, receipt: Receipt, seconds: float) -> Receipt:
        """Hide the message `receipt` holds for `seconds` from now; its new receipt.

        The old receipt no longer works. Errors as for ack.
        """
        ...

    # ------------------------------------------------------------------ membership
    async def heartbeat(self, client_id: str, groups: Sequence[GroupInfo]) -> None:
        """Tell every broker the client is a member of exactly `groups`."""
        ...

    async def unregister(self, client_id: str) -> None:
        """Leave every group and release every lock, on every broker.

        Tries every broker; raises the first failure once it has.
        """
        ...

    async def consumer_list(self, group: str, topic: str) -> list[str]:
        """The sorted member ids of `group`, as a broker serving `topic` knows them."""
        ...

    def watch_membership(self, group: str, known_version: int) -> AsyncIterator[int]:
        """Yield a new version each time `group`'s membership changes, until it fails.

        `known_version`: the last one seen (0: none); a change since then is yielded at
        once. The versions mean nothing but "changed".
        """
        ...

    # ------------------------------------------------------------------ locks
    async def lock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> LockResult:
        """Take or renew the locks of `queues` for `client_id`, at each queue's broker."""
        ...

    async def unlock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> UnlockResult:
        """Release the locks of `queues` the client holds."""
        ...

    # ------------------------------------------------------------------ transactions
    async def send_half(
        self, queue: MessageQueue, prepared: bytes, group: str, *, timeout: float | None = None
    ) -> HalfSent:
        """Store one prepared message as a half message of producer `group`."""
        ...

    async def end_transaction(
        self, broker: str, group: str, transaction_id: str, commit: bool, *, from_check: bool
    ) -> None:
        """Commit or roll back a transaction at the broker (HalfSent.broker) holding it."""
        ...

    def transaction_brokers(self) -> list[str]:
        """The brokers a transaction producer watches for check-backs (opaque names)."""
        ...

    def watch_transaction_checks(
        self, broker: str, group: str, client_id: str
    ) -> AsyncIterator[TransactionCheck]:
        """Yield the check-backs `broker` sends to this producer of `group`, until it fails."""
        ...

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        """Close every connection: calls in flight fail, and no new one is opened."""
        ...
