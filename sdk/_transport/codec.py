"""Domain objects <-> the wire: messages to frames, stored records to MessageExt."""

from __future__ import annotations

import itertools
import os

from sdk._wire import (
    MAX_PROPERTIES_BYTES,
    decode_properties,
    encode_frame,
    encode_properties,
    iter_records,
)
from sdk.message import Message, MessageExt, MessageQueue


class MessageIdGenerator:
    """Unique 16-byte message ids: 8 random bytes per generator, then a counter."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8)
        self._counter = itertools.count()

    def next(self) -> bytes:
        """A new id."""
        return self._prefix + next(self._counter).to_bytes(8, "big")


def encode_message(
    message: Message, msg_id: bytes, now_s: float, extra_properties: dict[str, str] | None = None
) -> bytes:
    """The frame for `message` sent at `now_s`, with delays turned into an absolute time.

    `extra_properties` (a trace context) are added unless they would break the limit.
    """
    properties = message.encoded_properties
    if extra_properties:
        merged = encode_properties({**message.properties, **extra_properties})
        if len(merged) <= MAX_PROPERTIES_BYTES:
            properties = merged
    deliver_at_ms = 0
    if message.delay_seconds is not None:
        deliver_at_ms = int((now_s + message.delay_seconds) * 1000)
    elif message.deliver_at is not None:
        deliver_at_ms = int(message.deliver_at * 1000)
    return encode_frame(
        msg_id=msg_id,
        born_timestamp_ms=int(now_s * 1000),
        body=message.body,
        tags=message.tags.encode() if message.tags else b"",
        sharding_key=message.sharding_key.encode() if message.sharding_key else b"",
        keys=[k.encode() for k in message.keys],
        properties=properties,
        deliver_at_ms=deliver_at_ms,
    )


def decode_records(records: bytes, broker_name: str) -> list[MessageExt]:
    """Stored records (as a pull returns them) -> MessageExt, in order."""
    out: list[MessageExt] = []
    queues: dict[tuple[str, int], MessageQueue] = {}
    for r in iter_records(records):
        queue = queues.get((r.topic, r.queue_id))
        if queue is None:
            queue = queues[(r.topic, r.queue_id)] = MessageQueue(r.topic, broker_name, r.queue_id)
        out.append(
            MessageExt(
                topic=r.topic,
                body=r.body,
                tags=r.tags.decode() if r.tags else None,
                keys=tuple(k.decode() for k in r.keys.split(b"\x00")) if r.keys else (),
                properties=decode_properties(r.properties) if r.properties else {},
                sharding_key=r.sharding_key.decode() if r.sharding_key else None,
                msg_id=r.msg_id.hex().upper(),
                queue=queue,
                queue_offset=r.queue_offset,
                reconsume_times=r.reconsume_times,
                born_timestamp=r.born_timestamp_ms,
                store_timestamp=r.store_timestamp_ms,
                deliver_at=r.deliver_at_ms,
            )
        )
    return out
