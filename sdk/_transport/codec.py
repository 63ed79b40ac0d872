"""ordermq's message layouts <-> domain objects: messages to frames, records to MessageExt.

The gRPC transport's wire, and the producer spool's file format (a spooled message is a
frame): the one place either is built or read.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

from sdk._accel import speedups
from sdk._crc import crc32 as crc32_of
from sdk._wire import (
    FRAME_FIELDS,
    KEY_SEPARATOR,
    MAX_PROPERTIES_BYTES,
    RECORD,
    RECORD_MAGIC,
    RecordFormatError,
    decode_properties,
    encode_properties,
    pack_frame,
)
from sdk.message import Message, MessageExt, MessageQueue
from sdk.message import MessageIdGenerator as MessageIdGenerator  # where tools look for it


def encode_message(
    message: Message,
    msg_id: bytes,
    now_s: float,
    extra_properties: dict[str, str] | None = None,
    *,
    delay_level: int = 0,
) -> bytes:
    """The frame for `message` sent at `now_s`, with delays turned into an absolute time.

    `extra_properties` (a trace context) are added unless they would break the limit.
    With `delay_level` (a RocketMQ delay level), the message's delay is that level instead.
    """
    if _encode_in_c is not None and not extra_properties and not delay_level:
        frames = _encode_in_c(
            (message,), (msg_id,), int(now_s * 1000), now_s, encode_message_in_python
        )
        return frames[0]
    return encode_message_in_python(
        message, msg_id, now_s, extra_properties, delay_level=delay_level
    )


def encode_messages(messages: Sequence[Message], ids: Sequence[bytes], now_s: float) -> list[bytes]:
    """encode_message for each message of a send, in order: in one C call where built."""
    if _encode_in_c is not None:
        return _encode_in_c(messages, ids, int(now_s * 1000), now_s, encode_message_in_python)
    return [encode_message_in_python(m, i, now_s) for m, i in zip(messages, ids, strict=True)]


def encode_message_in_python(
    message: Message,
    msg_id: bytes,
    now_s: float,
    extra_properties: dict[str, str] | None = None,
    *,
    delay_level: int = 0,
) -> bytes:
    """encode_message in Python: every message the C encode leaves, and its reference."""
    properties = message.encoded_properties
    if extra_properties:
        merged = encode_properties({**message.properties, **extra_properties})
        if len(merged) <= MAX_PROPERTIES_BYTES:
            properties = merged
    deliver_at_ms = 0
    if delay_level:
        pass  # the level alone says when
    elif message.delay_seconds is not None:
        deliver_at_ms = int((now_s + message.delay_seconds) * 1000)
    elif message.deliver_at is not None:
        deliver_at_ms = int(message.deliver_at * 1000)
    keys = message.keys
    return pack_frame(
        msg_id,
        int(now_s * 1000),
        deliver_at_ms,
        delay_level,
        message.tags.encode() if message.tags else b"",
        message.sharding_key.encode() if message.sharding_key else b"",
        KEY_SEPARATOR.join([k.encode() for k in keys]) if keys else b"",
        properties,
        message.body,
    )


def decode_records(records: bytes, broker_name: str, *, buffered: bool = False) -> list[MessageExt]:
    """Stored records (as a pull returns them) -> MessageExt, in order, CRCs checked.

    RecordFormatError names the first record that does not parse, fails its CRC or does
    not decode. This runs for every consumed message: sdk._speedups does it in C where it
    was built (about a sixth of the time), `decode_records_in_python` elsewhere; both give the
    same messages and the same errors.

    `buffered`: the messages wait in a consumer's buffer; the C decode keeps them out of
    the cycle collector until `sdk._accel.hand_out` gives them back (a buffer of thousands
    would be traversed by every collection while the consumer decodes more).
    """
    if _decode_in_c is not None:
        return _decode_in_c(records, broker_name, not buffered)
    return decode_records_in_python(records, broker_name)


def decode_records_in_python(records: bytes, broker_name: str) -> list[MessageExt]:
    """decode_records in Python: the reference the C decode is tested against.

    One pass straight into MessageExt: this runs for every consumed message. The records
    of a pull share one topic: after the first, a record's header, topic and frame fields
    are read in one unpack (checked against that topic); a record of another topic takes
    the general path, and the next ones its topic.
    """
    out: list[MessageExt] = []
    append = out.append
    queues: dict[tuple[str, int], MessageQueue] = {}
    topics: dict[bytes, str] = {}
    view = memoryview(records)
    unpack_record = RECORD.unpack_from
    unpack_fields = FRAME_FIELDS.unpack_from
    rec_size, fields_size = RECORD.size, FRAME_FIELDS.size
    crc32 = crc32_of
    new_message = object.__new__
    pos, end = 0, len(records)
    # The last topic's header-topic-fields layout, its size and raw topic; the queue of
    # the last record.
    unpack_same: Callable[[bytes, int], tuple[Any, ...]] | None = None
    same_size, same_topic, topic = 0, b"", ""
    last_queue_id: int | None = None
    queue = MessageQueue(topic, broker_name, -1)
    try:
        while pos < end:
            if unpack_same is not None and pos + same_size <= end:
                (size, crc, magic, queue_id, queue_offset, store_ts, reconsume, topic_len,
                 raw_topic, msg_id, born, deliver_at, _level, tl, sl, kl, pl, bl,
                 ) = unpack_same(records, pos)  # fmt: skip
                if raw_topic != same_topic or topic_len != len(same_topic):
                    unpack_same = None  # another topic: the general path reads it
                    continue
                stop = pos + size
                if magic != RECORD_MAGIC or size < same_size or stop > end:
                    raise RecordFormatError(f"malformed record at byte {pos}")
                if crc32(view[pos + 8 : stop]) != crc:
                    raise RecordFormatError(f"record at byte {pos} fails its CRC check")
                p = pos + same_size
            else:
                if pos + rec_size > end:
                    raise RecordFormatError(f"record header truncated at byte {pos}")
                size, crc, magic, queue_id, queue_offset, store_ts, reconsume, topic_len = (
                    unpack_record(records, pos)
                )
                stop = pos + size
                if magic != RECORD_MAGIC or size < rec_size + topic_len + fields_size or stop > end:
                    raise RecordFormatError(f"malformed record at byte {pos}")
                if crc32(view[pos + 8 : stop]) != crc:
                    raise RecordFormatError(f"record at byte {pos} fails its CRC check")
                p = pos + rec_size
                raw_topic = records[p : p + topic_len]
                known = topics.get(raw_topic)
                if known is None:
                    known = topics[raw_topic] = raw_topic.decode()
                topic = known
                p += topic_len
                msg_id, born, deliver_at, _level, tl, sl, kl, pl, bl = unpack_fields(records, p)
                p += fields_size
                unpack_same = _same_topic_layout(topic_len)
                same_size, same_topic, last_queue_id = p - pos, raw_topic, None
            if p + tl + sl + kl + pl + bl != stop:
                raise RecordFormatError(f"record at byte {pos} has inconsistent lengths")
            if queue_id != last_queue_id:
                found = queues.get((topic, queue_id))
                if found is None:
                    found = queues[(topic, queue_id)] = MessageQueue(topic, broker_name, queue_id)
                queue, last_queue_id = found, queue_id
            tags = records[p : p + tl].decode() if tl else None
            p += tl
            sharding = records[p : p + sl].decode() if sl else None
            p += sl
            keys = tuple(records[p : p + kl].decode().split("\0")) if kl else ()
            p += kl
            props = decode_properties(view[p : p + pl]) if pl else {}
            p += pl
            # MessageExt's fields set in place: its dataclass __init__ is a call frame
            # more per message (tests compare with MessageExt(...)).
            m = new_message(MessageExt)
            m.topic = topic
            m.body = records[p:stop]
            m.tags = tags
            m.keys = keys
            m.properties = props
            m.sharding_key = sharding
            m.msg_id = msg_id.hex().upper()
            m.queue = queue
            m.queue_offset = queue_offset
            m.reconsume_times = reconsume
            m.born_timestamp = born
            m.store_timestamp = store_ts
            m.deliver_at = deliver_at
            m.delivery_attempt = 0
            m.receipt = None
            m.commit_log_offset = -1
            append(m)
            pos = stop
    except RecordFormatError:
        raise
    except ValueError as exc:  # text that is not UTF-8, properties that do not parse
        raise RecordFormatError(f"record at byte {pos} does not decode: {exc}") from None
    return out


_encode_in_c: Callable[..., list[bytes]] | None = (
    speedups.encode_frames if speedups is not None else None
)
_decode_in_c: Callable[[bytes, str, bool], list[MessageExt]] | None = (
    speedups.decode_records if speedups is not None else None
)


@functools.lru_cache(maxsize=64)
def _same_topic_layout(topic_len: int) -> Callable[[bytes, int], tuple[Any, ...]]:
    """unpack_from of a record's header, a topic of `topic_len` bytes and frame fields."""
    return struct.Struct(RECORD.format + f"{topic_len}s" + FRAME_FIELDS.format[1:]).unpack_from
