"""ordermq's message layouts <-> domain objects: messages to frames, records to MessageExt.

The gRPC transport's wire, and the producer spool's file format (a spooled message is a
frame): the one place either is built or read.
"""

from __future__ import annotations

import zlib

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


def decode_records(records: bytes, broker_name: str) -> list[MessageExt]:
    """Stored records (as a pull returns them) -> MessageExt, in order, CRCs checked.

    One pass straight into MessageExt: this runs for every consumed message.
    """
    out: list[MessageExt] = []
    queues: dict[tuple[str, int], MessageQueue] = {}
    topics: dict[bytes, str] = {}
    view = memoryview(records)
    unpack_record = RECORD.unpack_from
    unpack_fields = FRAME_FIELDS.unpack_from
    rec_size, fields_size = RECORD.size, FRAME_FIELDS.size
    crc32 = zlib.crc32
    pos, end = 0, len(records)
    try:
        while pos < end:
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
            topic = topics.get(raw_topic)
            if topic is None:
                topic = topics[raw_topic] = raw_topic.decode()
            p += topic_len
            msg_id, born, deliver_at, _level, tl, sl, kl, pl, bl = unpack_fields(records, p)
            p += fields_size
            if p + tl + sl + kl + pl + bl != stop:
                raise RecordFormatError(f"record at byte {pos} has inconsistent lengths")
            queue = queues.get((topic, queue_id))
            if queue is None:
                queue = queues[(topic, queue_id)] = MessageQueue(topic, broker_name, queue_id)
            tags = records[p : p + tl].decode() if tl else None
            p += tl
            sharding = records[p : p + sl].decode() if sl else None
            p += sl
            keys = tuple(records[p : p + kl].decode().split("\0")) if kl else ()
            p += kl
            props = decode_properties(view[p : p + pl]) if pl else {}
            p += pl
            out.append(
                MessageExt(
                    topic, records[p : p + bl], tags, keys, props, sharding, msg_id.hex().upper(),
                    queue, queue_offset, reconsume, born, store_ts, deliver_at,
                )
            )  # fmt: skip
            pos = stop
    except RecordFormatError:
        raise
    except ValueError as exc:  # text that is not UTF-8, properties that do not parse
        raise RecordFormatError(f"record at byte {pos} does not decode: {exc}") from None
    return out
