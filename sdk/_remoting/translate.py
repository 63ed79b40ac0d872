"""RocketMQ messages <-> ordermq frames and stored records: where the two wires meet.

A message sent by a RocketMQ client is stored as an ordermq frame, so ordermq's gRPC
consumers read it; an ordermq record is served to RocketMQ clients in RocketMQ's record
layout. Nothing RocketMQ-specific enters the store: what ordermq has no field for lives
in the message's properties, under RocketMQ's own name or a reserved one.

RocketMQ (remoting)                    ordermq (frame / stored record)
-------------------------------------  ---------------------------------------------------
topic                                  topic
body (zlib-compressed when sysFlag     body, always plain: a compressed body is inflated
  0x1; LZ4/ZSTD are refused)             on receipt and served with sysFlag 0
TAGS                                   tags
KEYS (space-separated)                 keys (one each; runs of spaces are not kept)
UNIQ_KEY, 32 upper-case hex digits     msg_id (16 bytes); served as its upper-case hex
UNIQ_KEY, any other string (Go's       msg_id = a 16-byte hash of it (so retries and
  mixed case, IPv6, C++'s own layout)    lookups by it agree), and the property UNIQ_KEY
                                         kept verbatim, which is served back as it is
no UNIQ_KEY                            msg_id = a new UNIQ_KEY in RocketMQ's layout
__SHARDINGKEY (RocketMQ 5's name)      sharding_key
DELAY (level; above 18 taken as 18,    delay_level, through the scheduler; served as
  0 or less: none)                       DELAY only by a record still waiting
TIMER_DELIVER_MS / TIMER_DELAY_SEC /   deliver_at_ms (RocketMQ 5's timer properties);
  TIMER_DELAY_MS                         served as TIMER_DELIVER_MS while waiting
bornTimestamp                          born_timestamp_ms
Message.flag (when not 0)              property `__rmq.flag`
born host (the client's address)       property `__rmq.bornHost` ("ip:port"); served
                                         as 0.0.0.0:0 for a message without one
WAIT=true (every Java message)         dropped, as RocketMQ 4.9's broker drops it
WAIT=false, and every other property   the property, verbatim (user properties and
  (user or system: RETRY_TOPIC,          RocketMQ system properties alike)
  MAX_RECONSUME_TIMES, CLUSTER, ...)
RETRY_TOPIC of a %RETRY% or %DLQ%      also ORIGIN_TOPIC (what ordermq's consumers read),
  message                                and the other way round when serving
reconsumeTimes header                  reconsume_times
queue id, queue offset, store time     the record's
physical offset                        the record's commit-log position
store host                             the remoting listener's address

Property names starting with `__rmq.` are the broker's: a RocketMQ send that uses one is
refused (MESSAGE_ILLEGAL). An ordermq property named TAGS, KEYS, __SHARDINGKEY, DELAY or
TIMER_* is not served to RocketMQ clients (the fields are); one named UNIQ_KEY is served
as the message's UNIQ_KEY. Properties that RocketMQ's string cannot carry (a name with
U+0001 or U+0002, a value with U+0002 or empty) are not served, and when everything
would exceed the 32767 bytes a RocketMQ record holds, properties are left out from the
least important (user properties) up, never UNIQ_KEY or TAGS first.

Limits differ: ordermq stores at most 16 KiB of properties (its own encoding) and 4 MiB
of (plain) body; RocketMQ allows 32 KiB and counts the compressed body.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingError
from sdk._remoting.message_ids import UNKNOWN_HOST, SocketAddress
from sdk._remoting.message_layout import (
    COMPRESSED_FLAG,
    TRANSACTION_TYPE_MASK,
    MessageRecord,
    compress_body,
    decompress_body,
    encode_record,
)
from sdk._remoting.properties import (
    MAX_PROPERTIES_STRING_BYTES,
    representable,
)
from sdk._validation import DLQ_PREFIX, RETRY_PREFIX
from sdk._wire import (
    DELAY_LEVEL_SECONDS,
    FRAME_FIELDS,
    KEY_SEPARATOR,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    StoredRecord,
    decode_properties,
    encode_properties,
    iter_records,
    pack_frame,
)
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.remoting")

#: Property names starting with this are the broker's own (RocketMQ-only attributes).
RESERVED_PREFIX = "__rmq."
FLAG_PROPERTY = RESERVED_PREFIX + "flag"
BORN_HOST_PROPERTY = RESERVED_PREFIX + "bornHost"

# RocketMQ's property names (MessageConst).
TAGS = "TAGS"
KEYS = "KEYS"
UNIQ_KEY = "UNIQ_KEY"
DELAY = "DELAY"
WAIT = "WAIT"
TRAN_MSG = "TRAN_MSG"
RETRY_TOPIC = "RETRY_TOPIC"
SHARDING_KEY = "__SHARDINGKEY"
TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
TIMER_DELAY_MS = "TIMER_DELAY_MS"
#: Where ordermq's retry copies name the topic a message first failed in (retry.py).
ORIGIN_TOPIC = "ORIGIN_TOPIC"
#: RocketMQ properties that become ordermq fields and are served from the fields.
FIELD_PROPERTIES = frozenset(
    {TAGS, KEYS, SHARDING_KEY, DELAY, TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS}
)
MAX_DELAY_LEVEL = len(DELAY_LEVEL_SECONDS)

#: Topics whose messages name the topic they first failed in.
_RETRIED = (RETRY_PREFIX, DLQ_PREFIX)
_NATIVE_UNIQ_KEY = re.compile(r"[0-9A-F]{32}")
_KEY_SEPARATOR = " "


@dataclass(slots=True)
class IncomingMessage:
    """A message as a RocketMQ producer sends it, once its header and body are read.

    `body` is as sent: compressed when `sys_flag` has the compression bit.
    """

    topic: str
    body: bytes
    properties: dict[str, str] = field(default_factory=dict)
    flag: int = 0
    sys_flag: int = 0
    born_timestamp_ms: int = 0
    born_host: SocketAddress | None = None


def illegal(remark: str) -> RemotingError:
    """A MESSAGE_ILLEGAL refusal."""
    return RemotingError(ResponseCode.MESSAGE_ILLEGAL, remark)


def msg_id_for_uniq_key(uniq_key: str) -> bytes:
    """The ordermq message id a UNIQ_KEY is stored under (see the module docstring)."""
    if _NATIVE_UNIQ_KEY.fullmatch(uniq_key):
        return bytes.fromhex(uniq_key)
    return hashlib.blake2b(uniq_key.encode(), digest_size=16, person=b"rmq-uniq-key").digest()


def to_frame(
    message: IncomingMessage,
    *,
    now_ms: int,
    new_uniq_key: Callable[[], str],
    unscheduled: bool = False,
    half: bool = False,
) -> bytes:
    """The ordermq frame (with its length prefix) that stores `message`.

    `unscheduled` drops its delay (a message redirected to a dead-letter topic). `half`
    accepts a transactional (prepared) message, which the broker stores as a half message.
    RemotingError: MESSAGE_ILLEGAL for what ordermq cannot store, NO_PERMISSION for a
    transactional message unless `half`.
    """
    props = dict(message.properties)
    _check_sendable(message, props, half=half)
    body = message.body
    if message.sys_flag & COMPRESSED_FLAG:
        try:
            body = decompress_body(body, message.sys_flag, max_bytes=MAX_BODY_BYTES)
        except ValueError as exc:
            raise illegal(f"the message body cannot be read: {exc}") from None
    tags = props.pop(TAGS, "")
    keys = [k for k in props.pop(KEYS, "").split(_KEY_SEPARATOR) if k]
    if any(KEY_SEPARATOR.decode() in k for k in keys):
        raise illegal("message keys must not contain NUL characters")
    sharding = props.pop(SHARDING_KEY, "")
    level, deliver_at = _schedule(props, now_ms)
    if unscheduled:
        level = deliver_at = 0
    uniq = props.pop(UNIQ_KEY, None) or new_uniq_key()
    if not _NATIVE_UNIQ_KEY.fullmatch(uniq):
        props[UNIQ_KEY] = uniq
    if props.get(WAIT) == "true":
        del props[WAIT]
    if message.topic.startswith(_RETRIED) and RETRY_TOPIC in props:
        props.setdefault(ORIGIN_TOPIC, props[RETRY_TOPIC])
    if message.flag:
        props[FLAG_PROPERTY] = str(message.flag)
    if message.born_host is not None:
        props[BORN_HOST_PROPERTY] = str(message.born_host)
    encoded = encode_properties(props)
    if len(encoded) > MAX_PROPERTIES_BYTES:
        raise illegal(
            f"the message's properties take {len(encoded)} bytes in this broker's store, "
            f"over its limit of {MAX_PROPERTIES_BYTES}"
        )
    return pack_frame(
        msg_id_for_uniq_key(uniq), message.born_timestamp_ms, deliver_at, level,
        tags.encode(), sharding.encode(), KEY_SEPARATOR.join(k.encode() for k in keys),
        encoded, body,
    )  # fmt: skip


def is_transactional(sys_flag: int, props: dict[str, str]) -> bool:
    """True for a message RocketMQ's producers send as a transaction's half message."""
    return bool(sys_flag & TRANSACTION_TYPE_MASK) or props.get(TRAN_MSG, "").lower() == "true"


def _check_sendable(message: IncomingMessage, props: dict[str, str], *, half: bool) -> None:
    if not half and is_transactional(message.sys_flag, props):
        raise RemotingError(
            ResponseCode.NO_PERMISSION,
            "transactional (half) messages are not supported by this broker; "
            "send the message without TRAN_MSG",
        )
    reserved = sorted(name for name in props if name.startswith(RESERVED_PREFIX))
    if reserved:
        raise illegal(
            f"property names starting with {RESERVED_PREFIX!r} are reserved by this broker: "
            f"{', '.join(reserved)}"
        )
    size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in props.items())
    if size - 1 > MAX_PROPERTIES_STRING_BYTES:
        raise illegal(
            f"the message's properties are {size - 1} bytes, over RocketMQ's limit of "
            f"{MAX_PROPERTIES_STRING_BYTES}"
        )


def _schedule(props: dict[str, str], now_ms: int) -> tuple[int, int]:
    """(delay level, deliver-at ms) from the DELAY and TIMER_* properties, removed."""
    level = _int_property(props, DELAY)
    deliver_at = _int_property(props, TIMER_DELIVER_MS)
    for name, unit_ms in ((TIMER_DELAY_SEC, 1000), (TIMER_DELAY_MS, 1)):
        delay = _int_property(props, name)
        if delay > 0:
            if deliver_at:
                raise illegal(
                    f"give one of {TIMER_DELIVER_MS}, {TIMER_DELAY_SEC}, {TIMER_DELAY_MS}"
                )
            deliver_at = now_ms + delay * unit_ms
    return min(max(level, 0), MAX_DELAY_LEVEL), max(deliver_at, 0)


def _int_property(props: dict[str, str], name: str) -> int:
    value = props.pop(name, None)
    if value is None:
        return 0
    try:
        return int(value.strip())
    except ValueError:
        raise illegal(f"the property {name}={value!r} is not an integer") from None


def to_record(
    record: StoredRecord, *, physical_offset: int, store_host: SocketAddress
) -> MessageRecord:
    """The RocketMQ view of a stored ordermq record at `physical_offset`."""
    props = decode_properties(record.properties) if record.properties else {}
    flag = _reserved_int(props.pop(FLAG_PROPERTY, None))
    born_host = _reserved_host(props.pop(BORN_HOST_PROPERTY, None))
    for name in [n for n in props if n.startswith(RESERVED_PREFIX) or n in FIELD_PROPERTIES]:
        del props[name]
    uniq = props.pop(UNIQ_KEY, None) or record.msg_id.hex().upper()
    first: list[tuple[str, str]] = [(UNIQ_KEY, uniq)]
    if record.tags:
        first.append((TAGS, record.tags.decode()))
    if record.sharding_key:
        first.append((SHARDING_KEY, record.sharding_key.decode()))
    if record.keys:
        first.append((KEYS, record.keys.decode().replace("\x00", _KEY_SEPARATOR)))
    if record.delay_level:
        first.append((DELAY, str(record.delay_level)))
    if record.deliver_at_ms:
        first.append((TIMER_DELIVER_MS, str(record.deliver_at_ms)))
    if record.topic.startswith(_RETRIED) and ORIGIN_TOPIC in props:
        props.setdefault(RETRY_TOPIC, props[ORIGIN_TOPIC])
    return MessageRecord(
        topic=record.topic,
        body=record.body,
        properties=_fitted([*first, *props.items()], record),
        queue_id=record.queue_id,
        flag=flag,
        queue_offset=record.queue_offset,
        physical_offset=physical_offset,
        born_timestamp_ms=record.born_timestamp_ms,
        born_host=born_host,
        store_timestamp_ms=record.store_timestamp_ms,
        store_host=store_host,
        reconsume_times=record.reconsume_times,
    )


def _reserved_int(value: str | None) -> int:
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0  # written by someone else than this broker: not a flag


def _reserved_host(value: str | None) -> SocketAddress:
    try:
        return SocketAddress.parse(value) if value is not None else UNKNOWN_HOST
    except ValueError:
        return UNKNOWN_HOST


def _fitted(entries: list[tuple[str, str]], record: StoredRecord) -> dict[str, str]:
    """The entries RocketMQ's string can carry, within its size, most important first."""
    out: dict[str, str] = {}
    size = -1  # no separator before the first entry
    left_out: list[str] = []
    for name, value in entries:
        cost = len(name.encode()) + len(value.encode()) + 2
        if not representable(name, value) or size + cost > MAX_PROPERTIES_STRING_BYTES:
            left_out.append(name)
            continue
        out[name] = value
        size += cost
    if left_out:
        log.debug(
            "%s queue %d offset %d: properties not served to RocketMQ clients: %s",
            record.topic, record.queue_id, record.queue_offset, ", ".join(left_out),
        )  # fmt: skip
    return out


def served_records(
    records: bytes, positions: Sequence[int], store_host: SocketAddress
) -> Iterator[tuple[StoredRecord, bytes]]:
    """Each stored record of `records` (at `positions`), with its RocketMQ bytes."""
    for record, position in zip(iter_records(records, verify_crc=False), positions, strict=True):
        yield (
            record,
            encode_record(to_record(record, physical_offset=position, store_host=store_host)),
        )


def encode_served(records: bytes, positions: Sequence[int], store_host: SocketAddress) -> bytes:
    """Stored records as the concatenated RocketMQ records of a pull, view or query answer."""
    return b"".join(encoded for _, encoded in served_records(records, positions, store_host))


def rocketmq_uniq_key(record: StoredRecord) -> str:
    """The UNIQ_KEY a RocketMQ client sees for a stored record."""
    props = decode_properties(record.properties) if record.properties else {}
    return props.get(UNIQ_KEY) or record.msg_id.hex().upper()


# ---------------------------------------------------------------- the client's side
#: Bodies above this are compressed when sent alone (the Java producer's
#: compressMsgBodyOverHowmuch); a batch carries its bodies as they are, as Java's does.
COMPRESS_OVER_BYTES = 4 * 1024
#: RocketMQ's system properties (MessageConst): a received message's fields or the
#: broker's bookkeeping, never the application's properties.
SYSTEM_PROPERTIES = frozenset({
    TAGS, KEYS, UNIQ_KEY, DELAY, WAIT, TRAN_MSG, SHARDING_KEY, TIMER_DELIVER_MS, RETRY_TOPIC,
    TIMER_DELAY_SEC, TIMER_DELAY_MS, "MIN_OFFSET", "MAX_OFFSET", "CLUSTER", "REAL_TOPIC",
    "REAL_QID", "PGROUP", "MSG_REGION", "TRACE_ON", "CONSUME_START_TIME", "INSTANCE_ID",
    "MAX_RECONSUME_TIMES", "ORIGIN_MESSAGE_ID", "TRANSFER_FLAG", "CORRECTION_FLAG",
    "MQ2_FLAG", "RECONSUME_TIME", "__transactionId__", "TRAN_PREPARED_QUEUE_OFFSET",
    "POP_CK", "POP_CK_OFFSET", "1ST_POP_TIME", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS",
    "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "TIMER_DEL_UNIQKEY", "INNER_NUM",
    "INNER_BASE", "__BORNHOST",
})  # fmt: skip


@dataclass(slots=True)
class OutgoingMessage:
    """A message as a RocketMQ producer sends it: the header's fields, and its body."""

    properties: dict[str, str]
    body: bytes
    born_timestamp_ms: int
    sys_flag: int = 0
    delay_level: int = 0


def from_frame(frame: bytes | memoryview) -> OutgoingMessage:
    """The RocketMQ message an ordermq frame (its length prefix left off) is sent as.

    to_frame's inverse for what ordermq's clients send: UNIQ_KEY is the message id, the
    fields become RocketMQ's properties, the delay level DELAY. ValueError for a frame
    that is cut short or names a delivery time (RocketMQ 4.x has delay levels only).
    """
    view = memoryview(frame)
    if len(view) < FRAME_FIELDS.size:
        raise ValueError(f"a frame of {len(view)} bytes is shorter than its fields")
    msg_id, born, deliver_at, level, tl, sl, kl, pl, bl = FRAME_FIELDS.unpack_from(view)
    if deliver_at:
        raise ValueError("a delivery time cannot be sent over RocketMQ remoting")
    pos = FRAME_FIELDS.size
    if pos + tl + sl + kl + pl + bl != len(view):
        raise ValueError("the frame's lengths do not add up")
    tags, pos = bytes(view[pos : pos + tl]).decode(), pos + tl
    sharding, pos = bytes(view[pos : pos + sl]).decode(), pos + sl
    keys, pos = bytes(view[pos : pos + kl]).decode(), pos + kl
    props = decode_properties(view[pos : pos + pl]) if pl else {}
    body = bytes(view[pos + pl : pos + pl + bl])
    head = {UNIQ_KEY: msg_id.hex().upper(), WAIT: "true"}
    if tags:
        head[TAGS] = tags
    if keys:
        head[KEYS] = keys.replace("\x00", _KEY_SEPARATOR)
    if sharding:
        head[SHARDING_KEY] = sharding
    if level:
        head[DELAY] = str(level)
    return OutgoingMessage({**props, **head}, body, born, delay_level=level)


def compressed(message: OutgoingMessage) -> OutgoingMessage:
    """`message` with its body zlib-compressed if over COMPRESS_OVER_BYTES (sysFlag says so)."""
    if len(message.body) > COMPRESS_OVER_BYTES and not message.sys_flag & COMPRESSED_FLAG:
        message.body = compress_body(message.body)
        message.sys_flag |= COMPRESSED_FLAG  # zlib: RocketMQ 4.x's only codec
    return message


def retry_properties(message: MessageExt, delay_level: int) -> dict[str, str]:
    """A failed message's properties as its copy for the retry topic is sent with."""
    props = dict(message.properties)
    # where it was first stored, under the names ordermq's broker gives its retry copies
    props.setdefault(ORIGIN_TOPIC, message.topic)
    props.setdefault("ORIGIN_QUEUE_ID", str(message.queue.queue_id))
    props.setdefault("ORIGIN_QUEUE_OFFSET", str(message.queue_offset))
    props[UNIQ_KEY] = message.msg_id
    props[RETRY_TOPIC] = message.topic
    props[WAIT] = "true"
    if message.tags:
        props[TAGS] = message.tags
    if message.keys:
        props[KEYS] = _KEY_SEPARATOR.join(message.keys)
    if message.sharding_key:
        props[SHARDING_KEY] = message.sharding_key
    if delay_level:
        props[DELAY] = str(delay_level)
    return props


def to_message_ext(record: MessageRecord, broker_name: str) -> MessageExt:
    """The MessageExt of a record a RocketMQ broker served (its body already plain).

    A retried message names the topic it failed in as ORIGIN_TOPIC, as on gRPC.
    """
    props = record.properties
    if RETRY_TOPIC in props and record.topic.startswith(_RETRIED):
        props = {ORIGIN_TOPIC: props[RETRY_TOPIC], **props}
    keys = props.get(KEYS)
    return MessageExt(
        topic=record.topic,
        body=record.body,
        tags=props.get(TAGS) or None,
        keys=tuple(k for k in keys.split(_KEY_SEPARATOR) if k) if keys else (),
        properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES},
        sharding_key=props.get(SHARDING_KEY) or None,
        msg_id=props.get(UNIQ_KEY) or record.offset_msg_id,
        queue=MessageQueue(record.topic, broker_name, record.queue_id),
        queue_offset=record.queue_offset,
        reconsume_times=record.reconsume_times,
        born_timestamp=record.born_timestamp_ms,
        store_timestamp=record.store_timestamp_ms,
        commit_log_offset=record.physical_offset,
    )


__all__ = [
    "BORN_HOST_PROPERTY",
    "COMPRESS_OVER_BYTES",
    "FIELD_PROPERTIES",
    "FLAG_PROPERTY",
    "RESERVED_PREFIX",
    "SYSTEM_PROPERTIES",
    "IncomingMessage",
    "OutgoingMessage",
    "compressed",
    "encode_served",
    "from_frame",
    "illegal",
    "is_transactional",
    "msg_id_for_uniq_key",
    "retry_properties",
    "rocketmq_uniq_key",
    "served_records",
    "to_frame",
    "to_message_ext",
    "to_record",
]
