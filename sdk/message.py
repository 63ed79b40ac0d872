"""Messages as users build them, queues, received messages and send results."""

from __future__ import annotations

import enum
import itertools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NoReturn

from sdk._validation import check_topic, finite_number, tag_problem
from sdk._wire import MAX_BODY_BYTES, MAX_PROPERTIES_BYTES, encode_properties
from sdk.errors import InvalidMessageError, InvalidQueueError

#: The longest delay accepted (RocketMQ 5's limit for timed messages).
MAX_DELAY_SECONDS = 40 * 24 * 3600


class Message:
    """A message to send.

    Args:
        topic: Destination topic.
        body: Payload; 1 byte to 4 MiB.
        tags: One tag for broker-side filtering (`TagA || TagB` subscriptions).
        keys: Business keys (a string or several) for lookups by key.
        properties: User properties, str -> str, at most 16 KiB encoded. They are
            encoded when the message is made, and read-only afterwards: to change them,
            assign a whole new mapping (`m.properties = {**m.properties, "k": "v"}`),
            which is checked and encoded again.
        sharding_key: Messages with the same sharding key go to the same queue, in order.
        delay_seconds: Deliver this many seconds after sending.
        deliver_at: Deliver at this time (an aware datetime or epoch seconds).
        idempotency_key: The message's key for a broker's deduplication (docs/dedup.md):
            another message with the same key on the same topic within the broker's
            window is answered with this one's place and not stored again. 1 to 128
            characters of UTF-8 text, no control characters; kept as the
            `IDEMPOTENCY_KEY` property. Without it a message's key is its message id.
    """

    __slots__ = (
        "_encoded_properties",
        "_properties",
        "body",
        "delay_seconds",
        "deliver_at",
        "keys",
        "sharding_key",
        "tags",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        body: bytes,
        *,
        tags: str | None = None,
        keys: str | Iterable[str] = (),
        properties: Mapping[str, str] | None = None,
        sharding_key: str | None = None,
        delay_seconds: float | None = None,
        deliver_at: datetime | float | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        self.topic = check_topic(topic)
        if type(body) is not bytes:
            if not isinstance(body, bytes | bytearray | memoryview):
                raise InvalidMessageError(f"body must be bytes, not {type(body).__name__}")
            body = bytes(body)
        if not body:
            raise InvalidMessageError("body is empty")
        if len(body) > MAX_BODY_BYTES:
            raise InvalidMessageError(
                f"body is {len(body)} bytes, over the limit of {MAX_BODY_BYTES}"
            )
        self.body = body
        if tags is not None:
            _check_text("tags", tags)
            problem = tag_problem(tags)
            if problem is not None:
                raise InvalidMessageError(
                    f"tags {tags!r} must be one tag a subscription can name: it {problem}"
                )
        self.tags = tags
        self.keys: tuple[str, ...] = (
            keys if type(keys) is tuple else (keys,) if isinstance(keys, str) else tuple(keys)
        )
        for key in self.keys:
            _check_text("key", key)
            if not key:
                raise InvalidMessageError("keys must not be empty strings")
        if sharding_key is not None:
            _check_text("sharding_key", sharding_key)
        self.sharding_key = sharding_key
        if idempotency_key is not None:
            _check_idempotency_key(idempotency_key)
            given = (properties or {}).get(IDEMPOTENCY_KEY_PROPERTY)
            if given is not None and given != idempotency_key:
                raise InvalidMessageError(
                    f"idempotency_key {idempotency_key!r} differs from the "
                    f"{IDEMPOTENCY_KEY_PROPERTY} property {given!r}: give one of them"
                )
            properties = {**(properties or {}), IDEMPOTENCY_KEY_PROPERTY: idempotency_key}
        if properties:
            self._properties, self._encoded_properties = _checked_properties(properties)
        else:
            self._properties, self._encoded_properties = _NO_PROPERTIES, b""
        if delay_seconds is not None or deliver_at is not None:
            if delay_seconds is not None and deliver_at is not None:
                raise InvalidMessageError("give delay_seconds or deliver_at, not both")
            if delay_seconds is not None and (
                isinstance(delay_seconds, bool) or not 0 < delay_seconds <= MAX_DELAY_SECONDS
            ):
                raise InvalidMessageError(
                    f"delay_seconds {delay_seconds} must be within (0, {MAX_DELAY_SECONDS}]"
                )
            if isinstance(deliver_at, datetime):
                if deliver_at.tzinfo is None:
                    raise InvalidMessageError("deliver_at must be a timezone-aware datetime")
                deliver_at = deliver_at.timestamp()
            elif deliver_at is not None and not finite_number(deliver_at):
                raise InvalidMessageError(
                    "deliver_at must be a timezone-aware datetime or seconds since the epoch "
                    f"(a finite number), not {deliver_at!r}"
                )
        self.delay_seconds = delay_seconds
        self.deliver_at = deliver_at

    @property
    def properties(self) -> Mapping[str, str]:
        """The user properties, read-only (a dict that refuses changes); see the class."""
        return self._properties

    @properties.setter
    def properties(self, properties: Mapping[str, str] | None) -> None:
        self._properties, self._encoded_properties = (
            _checked_properties(properties) if properties else (_NO_PROPERTIES, b"")
        )

    @property
    def idempotency_key(self) -> str | None:
        """The key a broker deduplicates the message by (its IDEMPOTENCY_KEY property)."""
        return self.properties.get(IDEMPOTENCY_KEY_PROPERTY)

    @property
    def encoded_properties(self) -> bytes:
        """The properties as the wire carries them."""
        return self._encoded_properties

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, body=<{len(self.body)} bytes>, tags={self.tags!r}, "
            f"keys={self.keys!r}, sharding_key={self.sharding_key!r})"
        )


class _ReadOnlyProperties(dict[str, str]):
    """A Message's properties: encoded when they were given, so never changed in place.

    A change in place would not be sent (the message carries the encoding made when the
    properties were given); it raises TypeError saying what to do instead.
    """

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError(
            "a Message's properties are read-only (they were encoded when given): assign "
            'a new mapping instead, e.g. message.properties = {**message.properties, "k": "v"}'
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> tuple[type[_ReadOnlyProperties], tuple[dict[str, str]]]:
        # Made whole, not filled in item by item (which pickle and deepcopy would do).
        return (_ReadOnlyProperties, (dict(self),))


_NO_PROPERTIES = _ReadOnlyProperties()


def _checked_properties(properties: Mapping[str, str]) -> tuple[_ReadOnlyProperties, bytes]:
    """Validated properties (read-only) and their encoding; InvalidMessageError if bad."""
    if not isinstance(properties, Mapping):
        raise InvalidMessageError(
            f"properties must be a mapping of str to str, not {type(properties).__name__}"
        )
    checked = _ReadOnlyProperties(properties)
    size = 0
    for k, v in checked.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k:
            raise InvalidMessageError(f"properties must map non-empty str to str; got {k!r}: {v!r}")
        # each name and value is prefixed by its length in two bytes
        size += 4 + len(_utf8("a property name", k)) + len(_utf8(f"property {k!r}", v))
    if size > MAX_PROPERTIES_BYTES:
        raise InvalidMessageError(
            f"properties are {size} bytes encoded, over the limit of {MAX_PROPERTIES_BYTES}"
        )
    return checked, encode_properties(checked)


#: The user property a message's idempotency key travels in (docs/dedup.md).
IDEMPOTENCY_KEY_PROPERTY = "IDEMPOTENCY_KEY"
#: The longest idempotency key, in characters.
MAX_IDEMPOTENCY_KEY_CHARS = 128


def _check_idempotency_key(key: str) -> None:
    if not isinstance(key, str):
        raise InvalidMessageError(f"idempotency_key must be a str, not {type(key).__name__}")
    if not key:
        raise InvalidMessageError("idempotency_key is empty")
    if len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidMessageError(
            f"idempotency_key is {len(key)} characters, over the limit of "
            f"{MAX_IDEMPOTENCY_KEY_CHARS}"
        )
    _utf8("idempotency_key", key)
    control = next((c for c in key if c < " " or c == "\x7f"), None)
    if control is not None:
        raise InvalidMessageError(
            f"idempotency_key must not hold control characters; it holds {control!r}"
        )


def _check_text(what: str, value: str) -> None:
    # ASCII text is as many UTF-8 bytes as characters, and cannot hold a lone surrogate
    # (which .encode() refuses): the common case needs no encoding to check.
    if type(value) is str and value.isascii():
        if len(value) <= 65535 and "\x00" not in value:
            return
    elif not isinstance(value, str):
        raise InvalidMessageError(f"{what} must be a str, not {type(value).__name__}")
    if "\x00" in value:
        raise InvalidMessageError(f"{what} must not contain NUL characters")
    if len(_utf8(what, value)) > 65535:
        raise InvalidMessageError(f"{what} is over 65535 bytes")


def _utf8(what: str, value: str) -> bytes:
    try:
        return value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidMessageError(
            f"{what} is not UTF-8 text: it holds a lone surrogate at index {exc.start}"
        ) from None


def message_ids_in_python(prefix: bytes, numbers: list[int]) -> list[bytes]:
    """An id per number: `prefix` (8 bytes), then the number as 8 big-endian bytes."""
    return [prefix + i.to_bytes(8, "big") for i in numbers]


class MessageIdGenerator:
    """Unique 16-byte message ids: 8 random bytes per generator, then a counter.

    `make`: what builds `take`'s ids from their numbers (sdk._speedups.message_ids, where
    a producer has it).
    """

    def __init__(self, make: Callable[[bytes, list[int]], list[bytes]] | None = None) -> None:
        self._prefix = os.urandom(8)
        self._counter = itertools.count()
        self._make = make or message_ids_in_python

    def next(self) -> bytes:
        """A new id."""
        return self._prefix + next(self._counter).to_bytes(8, "big")

    def take(self, n: int) -> list[bytes]:
        """`n` new ids."""
        return self._make(self._prefix, list(itertools.islice(self._counter, n)))


@dataclass(frozen=True, order=True, slots=True)
class MessageQueue:
    """One queue of a topic on one broker; ordered by (topic, broker_name, queue_id)."""

    topic: str
    broker_name: str
    queue_id: int


def check_message(value: object, taker: str) -> Message:
    """`value`, when it is a Message; else InvalidMessageError saying `taker` takes one."""
    if not isinstance(value, Message):
        raise InvalidMessageError(f"{taker} takes a Message, not {type(value).__name__}")
    return value


#: What encoding a message whose fields were set to bad values after it was made raises.
ENCODING_FAILURES = (AttributeError, TypeError, ValueError, OverflowError)


def recheck_message(value: object, taker: str) -> None:
    """After encoding `value` failed: the error Message() gives for its fields, if any.

    A Message checks its fields when it is made; one set to a bad value afterwards
    (`m.sharding_key = 5`) fails only when the send encodes it, deep inside. This names
    the field as the constructor would; returns when the fields are good (the encoding's
    own error stands then).
    """
    m = check_message(value, taker)
    Message(
        m.topic, m.body, tags=m.tags, keys=m.keys, properties=m.properties,
        sharding_key=m.sharding_key, delay_seconds=m.delay_seconds, deliver_at=m.deliver_at,
    )  # fmt: skip


def check_queue(value: object, taker: str) -> MessageQueue:
    """`value`, when it is a MessageQueue; else InvalidQueueError saying `taker` takes one."""
    if not isinstance(value, MessageQueue):
        raise InvalidQueueError(f"{taker} takes a MessageQueue, not {type(value).__name__}")
    return value


@dataclass(slots=True)
class MessageExt:
    """A received message, with where and when it was stored.

    Timestamps are milliseconds since the epoch, as in RocketMQ.
    """

    topic: str
    body: bytes
    tags: str | None
    keys: tuple[str, ...]
    properties: dict[str, str]
    sharding_key: str | None
    msg_id: str
    queue: MessageQueue
    queue_offset: int
    reconsume_times: int
    born_timestamp: int
    store_timestamp: int
    deliver_at: int = field(default=0, repr=False)
    #: How often this message was delivered to its group by a SimpleConsumer, this time
    #: included (1 on the first delivery); 0 for messages that were pulled or pushed.
    delivery_attempt: int = 0
    #: A SimpleConsumer's hold on the message (opaque; ack and change_invisible_duration
    #: use it and change_invisible_duration replaces it); None when not received by one.
    receipt: Receipt | None = field(default=None, repr=False)
    #: Where a RocketMQ broker stores the message (its commit-log offset), for a message
    #: read over `rocketmq://`; -1 over ordermq's gRPC.
    commit_log_offset: int = field(default=-1, repr=False)

    @property
    def idempotency_key(self) -> str | None:
        """The key it was sent with for a broker's deduplication; None if none."""
        return self.properties.get(IDEMPOTENCY_KEY_PROPERTY)


@dataclass(frozen=True, slots=True)
class Receipt:
    """A SimpleConsumer's hold on a received message: opaque, kept on the message.

    It names the message, the delivery and the broker that issued it, so an ack or a
    change goes back to that broker. `invisible_duration` is how long the last receive or
    change hid the message; `hidden_until` is when that ends, on the consumer's clock
    (counted from when the request was sent, so never later than the broker's deadline).
    """

    handle: str = field(repr=False)
    broker: str
    group: str
    invisible_duration: float
    hidden_until: float


class SendStatus(enum.Enum):
    """How a send ended (RocketMQ's SendStatus)."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    #: Accepted into the producer's local spool; delivered to the broker in the
    #: background (the queue is chosen then: `queue.queue_id` is -1 until it is).
    SPOOLED = "SPOOLED"


@dataclass(frozen=True, slots=True)
class SendResult:
    """Where a sent message was stored.

    A delayed message gets its queue offset when it falls due: until then `queue_offset`
    is -1 (use `msg_id` to cancel it). So does a spooled one (status SPOOLED).
    """

    status: SendStatus
    msg_id: str
    queue: MessageQueue
    queue_offset: int


_new_object = object.__new__
_set_status, _set_msg_id, _set_queue, _set_queue_offset = (
    SendResult.__dict__[name].__set__ for name in ("status", "msg_id", "queue", "queue_offset")
)


def build_send_results(
    status: SendStatus, msg_ids: Iterable[bytes], queue: MessageQueue, offsets: Iterable[int]
) -> list[SendResult]:
    """`SendResult(status, msg_id.hex().upper(), queue, offset)` for each pair, faster.

    For the send path: the frozen dataclass's constructor sets each field through
    object.__setattr__; this sets the slots directly (same fields, so equal, hashable and
    immutable alike).
    """
    results = []
    for msg_id, offset in zip(msg_ids, offsets, strict=True):
        result = _new_object(SendResult)
        _set_status(result, status)
        _set_msg_id(result, msg_id.hex().upper())
        _set_queue(result, queue)
        _set_queue_offset(result, offset)
        results.append(result)
    return results
