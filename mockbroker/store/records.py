"""Check client message frames and lay them out as stored records.

This is the broker's per-message path: one header unpack, a few comparisons, one CRC and
one index entry per message. Everything is checked before anything is built, so a batch
with one bad frame stores nothing.
"""

from __future__ import annotations

import functools
import struct
import zlib
from dataclasses import dataclass

from mockbroker.errors import BrokerError, invalid
from mockbroker.store.consumequeue import ENTRY
from sdk._wire import (
    DELAY_LEVEL_SECONDS,
    FRAME_FIELDS,
    FRAME_LEN_PREFIX,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    RECORD,
    RECORD_HEAD,
    RECORD_MAGIC,
    RECORD_TAIL,
    decode_properties,
)

_PREFIX = FRAME_LEN_PREFIX.size
_FIELDS = FRAME_FIELDS.size
#: The length prefix and FRAME_FIELDS in one unpack, skipping the message id and born
#: timestamp (the broker does not look at them): length, deliver-at, delay level, then the
#: lengths of tags, sharding key, keys, properties and body.
_HEADER = struct.Struct("<I24x" + FRAME_FIELDS.format.removeprefix("<16sq"))
assert _HEADER.size == _PREFIX + _FIELDS, "FRAME_FIELDS no longer starts with id, born"


#: The smallest stored record: a header, a 1-byte topic, the frame fields and a 1-byte body.
MIN_RECORD_SIZE = RECORD.size + 1 + FRAME_FIELDS.size + 1

#: How far ahead a message may be scheduled (RocketMQ 5's limit for timed messages).
MAX_SCHEDULE_MS = 40 * 24 * 3600 * 1000
#: A deliver-at this little in the past is taken as "now" (clock skew between hosts).
PAST_TOLERANCE_MS = 1000
#: Where the deliver-at time and the delay level lie in a frame without its prefix.
_SCHEDULE_AT = 24
_SCHEDULE = struct.Struct("<qB")


@dataclass(slots=True)
class CheckedFrame:
    """A valid frame: where it lies (minus its length prefix), tag hash, due time.

    `due_ms` is 0 for a message to deliver now.
    """

    start: int
    end: int
    tag_hash: int
    due_ms: int = 0
    keys_at: int = 0  # where the frame's keys (joined by NUL) lie in the request
    keys_len: int = 0


def due_time_ms(deliver_at_ms: int, delay_level: int, stored_ms: int) -> int:
    """When a scheduled message falls due (0 when it is not scheduled)."""
    if delay_level:
        return stored_ms + DELAY_LEVEL_SECONDS[delay_level - 1] * 1000
    return deliver_at_ms


def unscheduled(frame: bytes | memoryview) -> bytes:
    """A frame (without prefix) with its deliver-at time and delay level cleared."""
    return rescheduled(frame, 0)


def rescheduled(frame: bytes | memoryview, deliver_at_ms: int) -> bytes:
    """A frame (without prefix) due at `deliver_at_ms` (0: now), with no delay level."""
    return b"".join(
        (frame[:_SCHEDULE_AT], _SCHEDULE.pack(deliver_at_ms, 0), frame[_SCHEDULE_AT + 9 :])
    )


def tag_hash(tags: bytes) -> int:
    """The hash kept in the index for tag filtering (0 for no tag)."""
    return zlib.crc32(tags) if tags else 0


def check_frames(
    frames: bytes,
    now_ms: int,
    *,
    start: int = 0,
    first_index: int = 0,
    max_frames: int | None = None,
    max_bytes: int | None = None,
) -> list[CheckedFrame]:
    """Parse and validate every frame; raise BrokerError naming the first bad one.

    In parts: from byte `start` (where frame number `first_index` begins), stopping after
    `max_frames` frames or once `max_bytes` bytes were checked (at least one frame); the
    next part starts at the last frame's `end`.
    """
    end = len(frames)
    if end == 0:
        raise invalid("MALFORMED_FRAME", "the request carries no message frames")
    out: list[CheckedFrame] = []
    append = out.append
    unpack_header = _HEADER.unpack_from
    view = memoryview(frames)
    pos, index = start, first_index
    last_index = end if max_frames is None else first_index + max_frames
    stop_at = end if max_bytes is None else min(end, start + max_bytes)
    while pos < stop_at and index < last_index:
        if pos + _PREFIX + _FIELDS > end:
            raise invalid("MALFORMED_FRAME", f"frame {index}: header truncated at byte {pos}")
        length, deliver_at, level, tl, sl, kl, pl, bl = unpack_header(frames, pos)
        start = pos + _PREFIX
        stop = start + length
        if length != _FIELDS + tl + sl + kl + pl + bl or stop > end:
            raise invalid("MALFORMED_FRAME", f"frame {index}: lengths do not add up")
        if bl == 0:
            raise invalid("EMPTY_BODY", f"frame {index}: message body is empty")
        if bl > MAX_BODY_BYTES:
            raise invalid(
                "BODY_TOO_LARGE",
                f"frame {index}: body is {bl} bytes, over the limit of {MAX_BODY_BYTES}",
            )
        if pl > MAX_PROPERTIES_BYTES:
            raise invalid(
                "PROPERTIES_TOO_LARGE",
                f"frame {index}: properties are {pl} bytes, "
                f"over the limit of {MAX_PROPERTIES_BYTES}",
            )
        due = _check_schedule(deliver_at, level, now_ms, index) if deliver_at or level else 0
        p = start + _FIELDS
        text = tl + sl + kl
        # ASCII is UTF-8 however it is cut: the usual text needs no decode per part.
        if text and not frames[p : p + text].isascii():
            _check_text(frames, p, (tl, sl, kl), index)
        if pl:
            try:
                decode_properties(view[p + text : p + text + pl])
            except ValueError as exc:
                raise invalid("MALFORMED_FRAME", f"frame {index}: properties: {exc}") from None
        tags_hash = tag_hash(frames[p : p + tl]) if tl else 0
        append(CheckedFrame(start, stop, tags_hash, due, p + tl + sl, kl))
        pos = stop
        index += 1
    return out


_TEXT_PARTS = ("tags are", "sharding key is", "keys are")


def _check_text(frames: bytes, at: int, lengths: tuple[int, int, int], index: int) -> None:
    """Tags, sharding key and keys must each be UTF-8 on its own: consumers decode them apart.

    Together they may be UTF-8 when a character is split across two of them.
    """
    for name, length in zip(_TEXT_PARTS, lengths, strict=True):
        if length:
            try:
                frames[at : at + length].decode()
            except UnicodeDecodeError:
                raise invalid("MALFORMED_FRAME", f"frame {index}: {name} not UTF-8") from None
        at += length


def _check_schedule(deliver_at: int, level: int, now_ms: int, index: int) -> int:
    if deliver_at and level:
        raise invalid(
            "INVALID_DELIVERY_TIME", f"frame {index}: give a deliver-at time or a delay level"
        )
    if level > len(DELAY_LEVEL_SECONDS):
        raise invalid(
            "INVALID_DELIVERY_TIME",
            f"frame {index}: delay level {level} is outside 1..{len(DELAY_LEVEL_SECONDS)}",
        )
    if level:
        return due_time_ms(0, level, now_ms)
    if deliver_at < now_ms - PAST_TOLERANCE_MS:
        raise invalid(
            "INVALID_DELIVERY_TIME",
            f"frame {index}: deliver-at {deliver_at} ms is {now_ms - deliver_at} ms in the past",
        )
    if deliver_at > now_ms + MAX_SCHEDULE_MS:
        raise invalid(
            "INVALID_DELIVERY_TIME",
            f"frame {index}: deliver-at {deliver_at} ms is more than 40 days ahead",
        )
    return max(deliver_at, now_ms)


def build_records(
    frames: bytes,
    checked: list[CheckedFrame],
    *,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_timestamp_ms: int,
    base_position: int,
    reconsume_times: int = 0,
) -> tuple[bytes, bytes]:
    """Lay out the records and their index entries for appending at `base_position`."""
    parts: list[bytes | memoryview] = []
    entries = lay_out_records(
        frames,
        checked,
        parts,
        topic=topic,
        queue_id=queue_id,
        first_offset=first_offset,
        store_timestamp_ms=store_timestamp_ms,
        base_position=base_position,
        reconsume_times=reconsume_times,
    )
    return b"".join(parts), entries


def lay_out_records(
    frames: bytes,
    checked: list[CheckedFrame],
    into: list[bytes | memoryview],
    *,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_timestamp_ms: int,
    base_position: int,
    reconsume_times: int = 0,
) -> bytes:
    """`build_records`, adding the records' pieces to `into`; returns the index entries.

    Several batches laid out into one list are joined and written once (a request's parts).
    """
    entries: list[bytes] = []
    pack_head = RECORD_HEAD.pack
    pack_tail = _tail_with_topic(len(topic)).pack
    pack_entry = ENTRY.pack
    crc32 = zlib.crc32
    header_and_topic = RECORD.size + len(topic)
    position = base_position
    offset = first_offset
    view = memoryview(frames)
    for frame in checked:
        body = view[frame.start : frame.end]
        size = header_and_topic + len(body)
        tail = pack_tail(
            RECORD_MAGIC,
            queue_id,
            offset,
            store_timestamp_ms,
            reconsume_times,
            len(topic),
            topic,
        )
        # The CRC covers the tail and topic (one buffer here), then the frame.
        into += (pack_head(size, crc32(body, crc32(tail))), tail, body)
        entries.append(pack_entry(position, size, frame.tag_hash))
        position += size
        offset += 1
    return b"".join(entries)


@functools.lru_cache(maxsize=256)
def _tail_with_topic(topic_len: int) -> struct.Struct:
    """RECORD_TAIL followed by a topic of `topic_len` bytes."""
    return struct.Struct(f"{RECORD_TAIL.format}{topic_len}s")


__all__ = [
    "MIN_RECORD_SIZE",
    "BrokerError",
    "CheckedFrame",
    "build_records",
    "check_frames",
    "lay_out_records",
    "tag_hash",
]
