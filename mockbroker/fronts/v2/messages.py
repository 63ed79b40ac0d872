"""RocketMQ 5 (apache.rocketmq.v2) messages <-> ordermq frames and stored records.

A message a RocketMQ 5 client sends is stored as an ordermq frame, so ordermq's consumers
(and the remoting front's) read it; a stored record is served to RocketMQ 5 clients as a
v2 Message. Nothing v2-specific enters the store: what ordermq has no field for lives in
the message's properties, under RocketMQ's own name (as the remoting front keeps them, so
all three fronts agree) or the broker's reserved one.

v2 Message                              ordermq frame / stored record
--------------------------------------  ----------------------------------------------------
topic.name (no namespace)               topic
body (GZIP inflated on receipt)         body, served IDENTITY with an MD5 digest (upper-case
                                          hex, what the proxy sends; the clients disagree on
                                          how CRC32 is written)
system_properties.tag                   tags
system_properties.keys                  keys (one each)
system_properties.message_id            msg_id: the 32 hex digits of an ordermq id as they
                                          are, any other id (RocketMQ 5's 34-digit ones)
                                          hashed to 16 bytes and kept verbatim in the
                                          property UNIQ_KEY; served back from UNIQ_KEY, else
                                          as the msg_id's upper-case hex
system_properties.message_group         sharding_key (FIFO); a stored sharding key is
                                          served as the message group, type FIFO
system_properties.delivery_timestamp    deliver_at_ms (DELAY, through the scheduler)
system_properties.born_timestamp        born_timestamp_ms
system_properties.born_host             property `__rmq.bornHost` ("ip:0" for an IP, as
                                          the remoting front reads it; a host name as is)
system_properties.trace_context         property TRACE_CONTEXT (RocketMQ's name)
user_properties                         properties
store timestamp, queue id and offset    the record's (served)
message type                            served FIFO with a sharding key, DELAY while
                                          scheduled, NORMAL otherwise

Refused, each with its own code: an empty or oversized message id (ILLEGAL_MESSAGE_ID); a
tag that is empty, holds `|` or NUL (ILLEGAL_MESSAGE_TAG); an empty key or one with NUL
(ILLEGAL_MESSAGE_KEY); an empty message group or one with NUL (ILLEGAL_MESSAGE_GROUP); a
user property named like a field (TAGS, KEYS, UNIQ_KEY, __SHARDINGKEY, DELAY, TIMER_*,
TRACE_CONTEXT) or with the reserved prefix `__rmq.` (ILLEGAL_MESSAGE_PROPERTY_KEY); a
type that contradicts the fields (FIFO without a group, DELAY without a delivery time, a
group and a delivery time together: MESSAGE_PROPERTY_CONFLICT_WITH_TYPE); LITE and
PRIORITY messages, and TRANSACTION ones but as half messages (UNSUPPORTED); a GZIP body
that does not inflate (MESSAGE_CORRUPTED). Body and property sizes are the store's to check.

rocketmq-python-client 5.1.2 writes a delay message's delivery time in milliseconds into
`Timestamp.seconds`: a `seconds` beyond the largest valid Timestamp (year 9999) can only
be that, and is read as milliseconds.
"""

from __future__ import annotations

import hashlib
import ipaddress
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.timestamp_pb2 import Timestamp

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker.fronts.v2.status import Code, V2Error
from sdk._remoting.message_ids import SocketAddress
from sdk._remoting.translate import (
    BORN_HOST_PROPERTY,
    FIELD_PROPERTIES,
    ORIGIN_TOPIC,
    RESERVED_PREFIX,
    UNIQ_KEY,
    msg_id_for_uniq_key,
    rocketmq_uniq_key,
)
from sdk._validation import DLQ_PREFIX
from sdk._wire import (
    KEY_SEPARATOR,
    MAX_BODY_BYTES,
    StoredRecord,
    decode_properties,
    encode_properties,
    pack_frame,
)

#: RocketMQ's property for a message's trace context (MessageConst.PROPERTY_TRACE_CONTEXT).
TRACE_CONTEXT = "TRACE_CONTEXT"
#: User properties may not take these names: the fields are stored under them.
FIELD_NAMES = FIELD_PROPERTIES | {UNIQ_KEY, TRACE_CONTEXT}
#: Longest message id taken (RocketMQ 5's are 34 characters, ordermq's 32).
MAX_MESSAGE_ID_CHARS = 128
#: The largest `seconds` of a valid protobuf Timestamp (9999-12-31T23:59:59Z).
MAX_TIMESTAMP_SECONDS = 253_402_300_799
_MAX_TEXT_BYTES = 0xFFFF  # a frame's u16 length fields
_NUL = KEY_SEPARATOR.decode()


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A v2 message ready for the store: its frame (with length prefix) and what to answer."""

    frame: bytes
    message_id: str
    message_group: str
    scheduled: bool


def timestamp_ms(ts: Timestamp) -> int:
    """Milliseconds since the epoch of a Timestamp (see the module docstring's quirk)."""
    if ts.seconds > MAX_TIMESTAMP_SECONDS:
        return ts.seconds
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def from_ms(ms: int) -> Timestamp:
    """A Timestamp of milliseconds since the epoch."""
    ts = Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def to_frame(message: v2.Message, *, now_ms: int, transaction: bool = False) -> Outgoing:
    """The ordermq frame that stores `message`; V2Error for what cannot be stored.

    A TRANSACTION message is refused (UNSUPPORTED) unless `transaction` (the caller
    stores it as a half message).
    """
    sp = message.system_properties
    message_id = _message_id(sp.message_id)
    kind = sp.message_type
    if (
        (kind == v2.TRANSACTION and not transaction)
        or kind in (v2.LITE, v2.PRIORITY)
        or (sp.HasField("lite_topic"))
    ):
        name = v2.MessageType.Name(kind) if kind in (v2.TRANSACTION, v2.PRIORITY) else "LITE"
        raise V2Error(
            v2.UNSUPPORTED,
            f"{name} messages are not supported by this broker; send NORMAL, FIFO or DELAY "
            "messages",
        )
    tag = _tag(sp.tag) if sp.HasField("tag") else ""
    keys = [_key(k) for k in sp.keys]
    group = _group(sp.message_group) if sp.HasField("message_group") else ""
    deliver_at = timestamp_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else 0
    _check_type(kind, group, deliver_at)
    props = _user_properties(message.user_properties)
    msg_id = msg_id_for_uniq_key(message_id)
    if msg_id.hex().upper() != message_id:  # not an ordermq id: kept as RocketMQ keeps it
        props[UNIQ_KEY] = message_id
    if sp.born_host:
        props[BORN_HOST_PROPERTY] = _stored_host(sp.born_host)
    if sp.HasField("trace_context"):
        props[TRACE_CONTEXT] = sp.trace_context
    born_ms = timestamp_ms(sp.born_timestamp) if sp.HasField("born_timestamp") else now_ms
    frame = pack_frame(
        msg_id, born_ms, deliver_at, 0, tag.encode(), group.encode(),
        KEY_SEPARATOR.join(k.encode() for k in keys), encode_properties(props),
        _body(message.body, sp.body_encoding),
    )  # fmt: skip
    return Outgoing(frame, message_id, group, bool(deliver_at))


def _message_id(message_id: str) -> str:
    if not message_id:
        raise V2Error(v2.ILLEGAL_MESSAGE_ID, "the message has no message_id")
    if len(message_id) > MAX_MESSAGE_ID_CHARS:
        raise V2Error(
            v2.ILLEGAL_MESSAGE_ID,
            f"message_id is {len(message_id)} characters, over {MAX_MESSAGE_ID_CHARS}",
        )
    return message_id


def _text(value: str, what: str, code: Code, extra: str = "") -> str:
    if not value.strip():
        raise V2Error(code, f"{what} is blank")
    bad = [c for c in _NUL + extra if c in value]
    if bad:
        raise V2Error(code, f"{what} {value!r} contains {bad[0]!r}")
    if len(value.encode()) > _MAX_TEXT_BYTES:
        raise V2Error(code, f"{what} is over {_MAX_TEXT_BYTES} bytes")
    return value


def _tag(tag: str) -> str:
    return _text(tag, "the tag", v2.ILLEGAL_MESSAGE_TAG, "|")


def _key(key: str) -> str:
    return _text(key, "a message key", v2.ILLEGAL_MESSAGE_KEY)


def _group(group: str) -> str:
    return _text(group, "the message group", v2.ILLEGAL_MESSAGE_GROUP)


def _check_type(kind: v2.MessageType.ValueType, group: str, deliver_at: int) -> None:
    if group and deliver_at:
        raise V2Error(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            "a message has either a message group (FIFO) or a delivery timestamp (DELAY)",
        )
    wants = {v2.FIFO: ("FIFO", bool(group)), v2.DELAY: ("DELAY", bool(deliver_at))}
    if kind in wants:
        name, present = wants[kind]
        if not present:
            field = "message_group" if kind == v2.FIFO else "delivery_timestamp"
            raise V2Error(
                v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, f"a {name} message needs a {field}"
            )
    elif kind == v2.NORMAL and (group or deliver_at):
        field = "message group" if group else "delivery timestamp"
        raise V2Error(
            v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
            f"a NORMAL message has no {field}; send it as {'FIFO' if group else 'DELAY'}",
        )


def _user_properties(properties: Mapping[str, str]) -> dict[str, str]:
    props = dict(properties)
    for name in props:
        if not name:
            raise V2Error(v2.ILLEGAL_MESSAGE_PROPERTY_KEY, "a user property has an empty name")
        if name in FIELD_NAMES or name.startswith(RESERVED_PREFIX):
            raise V2Error(
                v2.ILLEGAL_MESSAGE_PROPERTY_KEY,
                f"the user property name {name!r} is reserved (the message's fields are "
                f"stored under {', '.join(sorted(FIELD_NAMES))} and {RESERVED_PREFIX}*)",
            )
    return props


def _body(body: bytes, encoding: v2.Encoding.ValueType) -> bytes:
    if encoding != v2.GZIP:
        return body
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing
    try:
        plain = inflater.decompress(body, MAX_BODY_BYTES + 1)
    except zlib.error as exc:
        raise V2Error(v2.MESSAGE_CORRUPTED, f"the GZIP body does not inflate: {exc}") from None
    if len(plain) > MAX_BODY_BYTES:
        raise V2Error(
            v2.MESSAGE_BODY_TOO_LARGE,
            f"the GZIP body inflates to over {MAX_BODY_BYTES} bytes, the limit",
        )
    if not inflater.eof:
        raise V2Error(v2.MESSAGE_CORRUPTED, "the GZIP body is truncated")
    return plain


def _stored_host(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return host  # a host name (the Node client sends one): kept as it is
    return str(SocketAddress(ip.packed, 0))


def _served_host(value: str) -> str:
    try:
        return str(ipaddress.ip_address(SocketAddress.parse(value).ip))
    except ValueError:
        return value


def to_v2(record: StoredRecord, *, store_host: str) -> v2.Message:
    """The v2 view of a stored record (without the receipt fields a receive adds)."""
    props = decode_properties(record.properties) if record.properties else {}
    message_id = rocketmq_uniq_key(record)
    born_host = props.pop(BORN_HOST_PROPERTY, "")
    trace_context = props.pop(TRACE_CONTEXT, None)
    for name in [n for n in props if n in FIELD_NAMES or n.startswith(RESERVED_PREFIX)]:
        del props[name]
    sp = v2.SystemProperties(
        message_id=message_id,
        keys=[k.decode() for k in record.keys.split(KEY_SEPARATOR)] if record.keys else [],
        body_digest=v2.Digest(type=v2.MD5, checksum=hashlib.md5(record.body).hexdigest().upper()),
        body_encoding=v2.IDENTITY,
        message_type=_served_type(record),
        born_timestamp=from_ms(record.born_timestamp_ms),
        born_host=_served_host(born_host),
        store_timestamp=from_ms(record.store_timestamp_ms),
        store_host=store_host,
        queue_id=record.queue_id,
        queue_offset=record.queue_offset,
    )
    if record.tags:
        sp.tag = record.tags.decode()
    if record.sharding_key:
        sp.message_group = record.sharding_key.decode()
    if record.deliver_at_ms:
        sp.delivery_timestamp.CopyFrom(from_ms(record.deliver_at_ms))
    if trace_context is not None:
        sp.trace_context = trace_context
    if record.topic.startswith(DLQ_PREFIX) and ORIGIN_TOPIC in props:
        sp.dead_letter_queue.CopyFrom(
            v2.DeadLetterQueue(topic=props[ORIGIN_TOPIC], message_id=message_id)
        )
    return v2.Message(
        topic=v2.Resource(name=record.topic),
        user_properties=props,
        system_properties=sp,
        body=record.body,
    )


def _served_type(record: StoredRecord) -> v2.MessageType.ValueType:
    if record.deliver_at_ms or record.delay_level:
        return v2.DELAY
    return v2.FIFO if record.sharding_key else v2.NORMAL


__all__ = [
    "FIELD_NAMES",
    "MAX_TIMESTAMP_SECONDS",
    "TRACE_CONTEXT",
    "Outgoing",
    "from_ms",
    "timestamp_ms",
    "to_frame",
    "to_v2",
]
