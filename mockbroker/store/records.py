"""Check client message frames and lay them out as stored records.

This is the broker's per-message path: one header unpack, a few comparisons, one CRC and
one index entry per message. Everything is checked before anything is built, so a batch
with one bad frame stores nothing.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from mockbroker.errors import BrokerError, invalid, not_implemented
from mockbroker.store.consumequeue import ENTRY
from sdk._wire import (
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


@dataclass(frozen=True, slots=True)
class CheckedFrame:
    """Where a valid frame lies in the request, minus its length prefix."""

    start: int
    end: int
    tag_hash: int


def tag_hash(tags: bytes) -> int:
    """The hash kept in the index for tag filtering (0 for no tag)."""
    return zlib.crc32(tags) if tags else 0


def check_frames(frames: bytes) -> list[CheckedFrame]:
    """Parse and validate every frame; raise BrokerError naming the first bad one."""
    out: list[CheckedFrame] = []
    pos, end = 0, len(frames)
    if end == 0:
        raise invalid("MALFORMED_FRAME", "the request carries no message frames")
    unpack_len = FRAME_LEN_PREFIX.unpack_from
    unpack_fields = FRAME_FIELDS.unpack_from
    index = 0
    while pos < end:
        if pos + _PREFIX + _FIELDS > end:
            raise invalid("MALFORMED_FRAME", f"frame {index}: header truncated at byte {pos}")
        (length,) = unpack_len(frames, pos)
        start = pos + _PREFIX
        stop = start + length
        _id, _born, deliver_at, level, tl, sl, kl, pl, bl = unpack_fields(frames, start)
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
        if deliver_at or level:
            raise not_implemented(
                f"frame {index}: delayed delivery is not served by this broker version"
            )
        p = start + _FIELDS
        tags = frames[p : p + tl]
        _check_text(frames, p, tl + sl + kl, index, "tags, sharding key or keys")
        if pl:
            try:
                decode_properties(memoryview(frames)[p + tl + sl + kl : p + tl + sl + kl + pl])
            except ValueError as exc:
                raise invalid("MALFORMED_FRAME", f"frame {index}: properties: {exc}") from None
        out.append(CheckedFrame(start, stop, tag_hash(tags)))
        pos = stop
        index += 1
    return out


def _check_text(frames: bytes, start: int, length: int, index: int, what: str) -> None:
    if length:
        try:
            frames[start : start + length].decode()
        except UnicodeDecodeError:
            raise invalid("MALFORMED_FRAME", f"frame {index}: {what} are not UTF-8") from None


def build_records(
    frames: bytes,
    checked: list[CheckedFrame],
    *,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_timestamp_ms: int,
    base_position: int,
) -> tuple[bytes, bytes]:
    """Lay out the records and their index entries for appending at `base_position`."""
    parts: list[bytes | memoryview] = []
    entries: list[bytes] = []
    pack_head = RECORD_HEAD.pack
    pack_tail = RECORD_TAIL.pack
    pack_entry = ENTRY.pack
    crc32 = zlib.crc32
    header_and_topic = RECORD.size + len(topic)
    position = base_position
    view = memoryview(frames)
    for i, frame in enumerate(checked):
        body = view[frame.start : frame.end]
        size = header_and_topic + len(body)
        tail = pack_tail(
            RECORD_MAGIC, queue_id, first_offset + i, store_timestamp_ms, 0, len(topic)
        )
        crc = crc32(body, crc32(topic, crc32(tail)))
        parts += (pack_head(size, crc), tail, topic, body)
        entries.append(pack_entry(position, size, frame.tag_hash))
        position += size
    return b"".join(parts), b"".join(entries)


__all__ = ["BrokerError", "CheckedFrame", "build_records", "check_frames", "tag_hash"]
