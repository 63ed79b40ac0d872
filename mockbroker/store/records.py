"""Check client message frames and lay them out as stored records.

This is the broker's per-message path: one header unpack, a few comparisons, one CRC and
one index entry per message. Everything is checked before anything is built, so a batch
with one bad frame stores nothing. What the check finds is kept as plain ints in one flat
list per batch (CheckedFrames), not an object per message: those objects were most of the
broker's CPU per message and, through gen-2 collections, of its send tail (issue 35).

Where sdk._speedups was built, the usual batch is checked and laid out in C (the same
ints, the same bytes); anything unusual, every refusal included, is checked here.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from mockbroker.errors import BrokerError, invalid
from mockbroker.store.consumequeue import ENTRY
from mockbroker.topics import HALF_PROPERTY
from sdk._accel import speedups
from sdk._crc import crc32 as crc32_of
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
    encode_properties,
    pack_frame,
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


#: Ints per frame in CheckedFrames: start, end, tag hash, due time, keys_at, keys_len.
_STRIDE = 6


class CheckedFrames(Sequence[CheckedFrame]):
    """A batch's valid frames as one flat list of ints (six per frame), not an object each.

    Reads as a sequence of CheckedFrame (built on access, for the rare paths); the send
    path reads the columns (`starts`, `ends`, `tag_hashes`, `keys_at`, `keys_lens`) and
    `scheduled`, the number of frames with a due time, kept as frames are added.
    """

    __slots__ = ("_data", "scheduled")

    def __init__(self, frames: Iterable[CheckedFrame] = ()) -> None:
        self._data: list[int] = []
        self.scheduled = 0
        for f in frames:
            self.add(f.start, f.end, f.tag_hash, f.due_ms, f.keys_at, f.keys_len)

    @classmethod
    def of(cls, data: list[int], scheduled: int = 0) -> CheckedFrames:
        """Frames checked already, as `data` holds them (six ints each), kept as is."""
        out = cls()
        out._data = data
        out.scheduled = scheduled
        return out

    def add(
        self,
        start: int,
        end: int,
        tag_hash: int,
        due_ms: int = 0,
        keys_at: int = 0,
        keys_len: int = 0,
    ) -> None:
        """Add one frame (see CheckedFrame for the fields)."""
        self._data += (start, end, tag_hash, due_ms, keys_at, keys_len)
        if due_ms:
            self.scheduled += 1

    def __len__(self) -> int:
        return len(self._data) // _STRIDE

    @overload
    def __getitem__(self, index: int) -> CheckedFrame: ...
    @overload
    def __getitem__(self, index: slice) -> CheckedFrames: ...
    def __getitem__(self, index: int | slice) -> CheckedFrame | CheckedFrames:
        if isinstance(index, slice):
            return CheckedFrames(self[i] for i in range(len(self))[index])
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("frame index out of range")
        at = index * _STRIDE
        return CheckedFrame(*self._data[at : at + _STRIDE])

    def __iter__(self) -> Iterator[CheckedFrame]:
        data = self._data
        for at in range(0, len(data), _STRIDE):
            yield CheckedFrame(*data[at : at + _STRIDE])

    def __iadd__(self, other: CheckedFrames) -> CheckedFrames:
        self._data += other._data
        self.scheduled += other.scheduled
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CheckedFrames):
            return self._data == other._data
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"CheckedFrames({list(self)!r})"

    @property
    def starts(self) -> list[int]:
        """Where each frame lies (minus its length prefix) in the request..."""
        return self._data[0::_STRIDE]

    @property
    def ends(self) -> list[int]:
        """... and where it ends."""
        return self._data[1::_STRIDE]

    @property
    def tag_hashes(self) -> list[int]:
        """Each frame's tag hash (0: no tag)."""
        return self._data[2::_STRIDE]

    @property
    def keys_at(self) -> list[int]:
        """Where each frame's keys (joined by NUL) lie in the request..."""
        return self._data[4::_STRIDE]

    @property
    def keys_lens(self) -> list[int]:
        """... and their lengths (0: no keys)."""
        return self._data[5::_STRIDE]

    @property
    def last_end(self) -> int:
        """Where the last frame ends (IndexError when there is none)."""
        if not self._data:
            raise IndexError("no frames")
        return self._data[-_STRIDE + 1]

    def frame_bytes(self) -> int:
        """The frames' bytes, without their length prefixes."""
        return sum(self.ends) - sum(self.starts)

    def section(self, start: int, stop: int, max_bytes: int) -> CheckedFrames:
        """Frames `start` up to `stop` (indexes), as CheckedFrames of their own.

        Cut where their bytes would pass `max_bytes` (one frame at least).
        """
        data = self._data[start * _STRIDE : stop * _STRIDE]
        if sum(data[1::_STRIDE]) - sum(data[0::_STRIDE]) > max_bytes:  # else all fit
            taken = 0
            for at in range(0, len(data), _STRIDE):
                taken += data[at + 1] - data[at]
                if taken > max_bytes and at:
                    del data[at:]
                    break
        dues = data[3::_STRIDE]
        return CheckedFrames.of(data, len(dues) - dues.count(0))


def as_checked(checked: Sequence[CheckedFrame]) -> CheckedFrames:
    """`checked` as CheckedFrames (itself when it is one)."""
    return checked if isinstance(checked, CheckedFrames) else CheckedFrames(checked)


def counts_and_sizes(checks: Iterable[CheckedFrames], overhead: int) -> tuple[list[int], list[int]]:
    """Each batch's number of frames, and the bytes its frames take with `overhead` each."""
    counts: list[int] = []
    sizes: list[int] = []
    for checked in checks:
        data = checked._data
        count = len(data) // _STRIDE
        counts.append(count)
        sizes.append(sum(data[1::_STRIDE]) - sum(data[0::_STRIDE]) + count * overhead)
    return counts, sizes


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


_scan_in_c: Callable[..., list[int] | None] | None = (
    speedups.scan_frames if speedups is not None else None
)
_scan_parts_in_c: Callable[..., list[list[int]] | None] | None = (
    speedups.scan_parts if speedups is not None else None
)
_lay_out_in_c: Callable[..., list[bytes]] | None = (
    speedups.lay_out_parts if speedups is not None else None
)
_rebase_in_c: Callable[[bytes, int], bytes | None] | None = (
    speedups.rebase_entries if speedups is not None else None
)
_shifted_in_c: Callable[[list[int], int], list[int] | None] | None = (
    speedups.shifted if speedups is not None else None
)


def check_frames(
    frames: bytes,
    now_ms: int,
    *,
    start: int = 0,
    first_index: int = 0,
    max_frames: int | None = None,
    max_bytes: int | None = None,
    half: bool = False,
) -> CheckedFrames:
    """Parse and validate every frame; raise BrokerError naming the first bad one.

    In parts: from byte `start` (where frame number `first_index` begins), stopping after
    `max_frames` frames or once `max_bytes` bytes were checked (at least one frame); the
    next part starts at the last frame's `end`. The property HALF_PROPERTY marks a half
    message's record: refused unless `half` (a transactional send).
    """
    end = len(frames)
    last_index = end if max_frames is None else first_index + max_frames
    stop_at = end if max_bytes is None else min(end, start + max_bytes)
    if _scan_in_c is not None:
        data = _scan_in_c(
            frames, start, first_index, last_index, stop_at, MAX_BODY_BYTES,
            MAX_PROPERTIES_BYTES, HALF_PROPERTY, half,
        )  # fmt: skip
        if data is not None:  # the usual batch (none due later); anything else is checked below
            return CheckedFrames.of(data)
    return check_frames_in_python(
        frames, now_ms, start=start, first_index=first_index, max_frames=max_frames,
        max_bytes=max_bytes, half=half,
    )  # fmt: skip


def check_usual_parts(
    parts: Sequence[bytes], *, max_frames: int, max_bytes: int
) -> list[CheckedFrames] | None:
    """check_frames of each part whole, in one call, for the usual request (in C).

    None when a part is not the usual (empty, or a frame that check_frames would check
    in Python: a refusal, a due time, text that is not ASCII), when the parts hold over
    `max_frames` frames or `max_bytes` bytes in all, or without the C build: check them
    part by part then. A request over 8 queues is 8 parts, and a call each cost more
    than their scans.
    """
    if _scan_parts_in_c is None:
        return None
    datas = _scan_parts_in_c(
        parts if type(parts) is list else list(parts), max_frames, max_bytes, MAX_BODY_BYTES,
        MAX_PROPERTIES_BYTES, HALF_PROPERTY, False,
    )  # fmt: skip
    return None if datas is None else [CheckedFrames.of(data) for data in datas]


def check_frames_in_python(
    frames: bytes,
    now_ms: int,
    *,
    start: int = 0,
    first_index: int = 0,
    max_frames: int | None = None,
    max_bytes: int | None = None,
    half: bool = False,
) -> CheckedFrames:
    """check_frames in Python: every batch the C scan leaves, and the reference for it."""
    end = len(frames)
    last_index = end if max_frames is None else first_index + max_frames
    stop_at = end if max_bytes is None else min(end, start + max_bytes)
    if end == 0:
        raise invalid("MALFORMED_FRAME", "the request carries no message frames")
    out = CheckedFrames()
    add = out._data.extend  # six ints a frame (CheckedFrames.add, without a call per field)
    scheduled = 0
    unpack_header = _HEADER.unpack_from
    view = memoryview(frames)
    pos, index = start, first_index
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
        due = 0
        if deliver_at or level:
            due = _check_schedule(deliver_at, level, now_ms, index)
            scheduled += due != 0
        p = start + _FIELDS
        text = tl + sl + kl
        # ASCII is UTF-8 however it is cut: the usual text needs no decode per part.
        if text and not frames[p : p + text].isascii():
            _check_text(frames, p, (tl, sl, kl), index)
        if pl:
            try:
                properties = decode_properties(view[p + text : p + text + pl])
            except ValueError as exc:
                raise invalid("MALFORMED_FRAME", f"frame {index}: properties: {exc}") from None
            if HALF_PROPERTY in properties and not half:
                raise invalid(
                    "INVALID_ARGUMENT",
                    f"frame {index}: the property {HALF_PROPERTY} is reserved for transactional "
                    "messages (send them with sdk.TransactionProducer)",
                )
        tags_hash = tag_hash(frames[p : p + tl]) if tl else 0
        add((start, stop, tags_hash, due, p + tl + sl, kl))
        pos = stop
        index += 1
    out.scheduled = scheduled
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
    checked: Sequence[CheckedFrame],
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
    checked: Sequence[CheckedFrame],
    into: list[bytes | memoryview],
    *,
    topic: bytes,
    queue_id: int,
    first_offset: int,
    store_timestamp_ms: int,
    base_position: int,
    reconsume_times: int = 0,
    index: IdKeyEntries | None = None,
) -> bytes:
    """`build_records`, adding the records' pieces to `into`; returns the index entries.

    Several batches laid out into one list are joined and written once (a request's parts:
    `lay_out_parts` does them in one call). With `index`, each record's position, message
    id and keys are added to it in the same pass (for the id/key index).
    """
    [entries] = lay_out_parts(
        [(frames, checked, queue_id, first_offset)], into, topic=topic,
        store_timestamp_ms=store_timestamp_ms, base_position=base_position,
        reconsume_times=reconsume_times, index=index,
    )  # fmt: skip
    return entries


def lay_out_parts(
    parts: Sequence[tuple[bytes, Sequence[CheckedFrame], int, int]],
    into: list[bytes | memoryview],
    *,
    topic: bytes,
    store_timestamp_ms: int,
    base_position: int,
    reconsume_times: int = 0,
    index: IdKeyEntries | None = None,
) -> list[bytes]:
    """`lay_out_records` for several batches in a row, in one call; each one's entries.

    Each batch is (frames, checked, queue id, first offset), laid out after the one before
    from `base_position`. The same records, entries and id/key entries as a call per
    batch, without a call's setup per batch (a request over 8 queues has 8 small batches).
    In C where built (each batch's records as one piece of `into`), else in Python.
    """
    if _lay_out_in_c is not None:
        laid = [
            (f if type(f) is bytes else bytes(f), as_checked(c)._data, q, o) for f, c, q, o in parts
        ]
        if index is None:
            return _lay_out_in_c(laid, into, topic, store_timestamp_ms, base_position,
                                 reconsume_times, None, None, None)  # fmt: skip
        return _lay_out_in_c(
            laid, into, topic, store_timestamp_ms, base_position, reconsume_times,
            index.positions, index.ids, index.keyed,
        )  # fmt: skip
    return lay_out_parts_in_python(
        parts, into, topic=topic, store_timestamp_ms=store_timestamp_ms,
        base_position=base_position, reconsume_times=reconsume_times, index=index,
    )  # fmt: skip


def lay_out_parts_in_python(
    parts: Sequence[tuple[bytes, Sequence[CheckedFrame], int, int]],
    into: list[bytes | memoryview],
    *,
    topic: bytes,
    store_timestamp_ms: int,
    base_position: int,
    reconsume_times: int = 0,
    index: IdKeyEntries | None = None,
) -> list[bytes]:
    """lay_out_parts in Python: the reference the C one is tested against."""
    out: list[bytes] = []
    pack_head = RECORD_HEAD.pack
    pack_tail = _tail_with_topic(len(topic)).pack
    pack_entry = ENTRY.pack
    crc32 = crc32_of
    header_and_topic = RECORD.size + len(topic)
    topic_len = len(topic)
    position = base_position
    positions, ids, keyed = (
        (index.positions, index.ids, index.keyed) if index is not None else ([], [], [])
    )
    for frames, checked, queue_id, offset in parts:
        entries: list[bytes] = []
        view = memoryview(frames)
        data = as_checked(checked)._data
        for start, end, hash_, keys_at, keys_len in zip(
            data[0::_STRIDE], data[1::_STRIDE], data[2::_STRIDE], data[4::_STRIDE],
            data[5::_STRIDE], strict=True,
        ):  # fmt: skip
            body = view[start:end]
            size = header_and_topic + end - start
            tail = pack_tail(
                RECORD_MAGIC, queue_id, offset, store_timestamp_ms, reconsume_times, topic_len,
                topic,
            )  # fmt: skip
            into += (pack_head(size, crc32(body, crc32(tail))), tail, body)
            entries.append(pack_entry(position, size, hash_))
            if index is not None:
                positions.append(position)
                ids.append(frames[start : start + 16])
                if keys_len:
                    keyed.append((position, frames[keys_at : keys_at + keys_len]))
            position += size
            offset += 1
        out.append(b"".join(entries))
    return out


def rebase_entries(entries: bytes, delta: int) -> bytes:
    """Consume-queue entries laid out from one position, moved `delta` bytes on."""
    if not delta:
        return entries
    if _rebase_in_c is not None:
        moved = _rebase_in_c(entries, delta)
        if moved is not None:
            return moved
    return rebase_entries_in_python(entries, delta)


def rebase_entries_in_python(entries: bytes, delta: int) -> bytes:
    """rebase_entries in Python: the reference the C one is tested against."""
    pack = ENTRY.pack
    return b"".join([pack(p + delta, size, h) for p, size, h in ENTRY.iter_unpack(entries)])


class IdKeyEntries:
    """What the id/key index takes for a write: each record's position, id, and its keys."""

    __slots__ = ("ids", "keyed", "positions")

    def __init__(self) -> None:
        self.positions: list[int] = []
        self.ids: list[bytes] = []
        #: (position, keys joined by NUL) of the records that carry keys.
        self.keyed: list[tuple[int, bytes]] = []

    def take(self, other: IdKeyEntries, delta: int) -> None:
        """Add `other`'s entries, their positions moved `delta` bytes on."""
        moved = _shifted_in_c(other.positions, delta) if _shifted_in_c is not None else None
        self.positions += [p + delta for p in other.positions] if moved is None else moved
        self.ids += other.ids
        self.keyed += [(p + delta, keys) for p, keys in other.keyed]


@functools.lru_cache(maxsize=256)
def _tail_with_topic(topic_len: int) -> struct.Struct:
    """RECORD_TAIL followed by a topic of `topic_len` bytes."""
    return struct.Struct(f"{RECORD_TAIL.format}{topic_len}s")


__all__ = [
    "MIN_RECORD_SIZE",
    "BrokerError",
    "CheckedFrame",
    "CheckedFrames",
    "IdKeyEntries",
    "as_checked",
    "build_records",
    "check_frames",
    "lay_out_parts",
    "lay_out_records",
    "tag_hash",
]


def with_properties(frame: bytes, extra: dict[str, str], drop: tuple[str, ...] = ()) -> bytes:
    """A frame (no length prefix) with `extra` properties set, those in `drop` removed.

    Framed with its length prefix. For frames the broker checked before (a stored record's).
    """
    fields = FRAME_FIELDS.unpack_from(frame)
    msg_id, born, deliver_at, level, tl, sl, kl, pl, bl = fields
    p = FRAME_FIELDS.size
    tags, p = frame[p : p + tl], p + tl
    sharding, p = frame[p : p + sl], p + sl
    keys, p = frame[p : p + kl], p + kl
    properties, p = decode_properties(frame[p : p + pl]), p + pl
    body = frame[p : p + bl]
    properties.update(extra)
    for name in drop:
        properties.pop(name, None)
    return pack_frame(
        msg_id, born, deliver_at, level, tags, sharding, keys, encode_properties(properties), body
    )
