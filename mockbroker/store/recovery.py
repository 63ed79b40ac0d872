"""Crash recovery: replay the commit log from the checkpoint into the consume queues.

A record that fails its checks is one of two things. If a valid record follows it
anywhere later in the log, it is corruption in the middle of the log (flipped bits, in a
body or in a header): the scan resumes at the nearest valid record after it, because later
records may have been acknowledged. A damaged record whose own size still leads to that
record is indexed as corrupt; when its size or magic cannot be trusted, the whole damaged
stretch is skipped, and the queue offsets missing from it are marked corrupt when each
queue's next record shows the gap. Either way a corrupt offset is never served. When no
valid record follows, it is a torn tail (a write cut short by the crash): the log is
truncated there. In sync flush mode nothing past a torn tail was ever acknowledged, since
an acknowledgement waits for the fsync of everything before it.

A hole of zeros is the other trace a power cut leaves: the kernel wrote back a later page
of the unsynced tail and the power went before an earlier one. Nothing past such a hole was
synced, so it ends the log like a torn tail; calling it corruption would keep records no
sync covered behind offsets marked corrupt, which stop every consumer of those queues. A
damaged stretch is such a hole when zeros run from where a record should start to the end
of its 4 KiB page (no record starts with a zero size), or when a whole page of it is zeros,
unless the damaged record's header is intact and leads to the next valid record: then a
zero page in it may be its own body's, and it is corruption (corrupting a record whose
body holds a page of zeros can still be taken for a hole, past the checkpoint only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from mockbroker.store.commitlog import CommitLog
from mockbroker.store.consumequeue import CORRUPT_SIZE, ENTRY, ConsumeQueue
from mockbroker.store.records import MIN_RECORD_SIZE, tag_hash
from mockbroker.topics import HALF_PROPERTY, HALF_TOPIC, SCHEDULE_TOPIC
from sdk._crc import crc32 as crc32_of
from sdk._wire import FRAME_FIELDS, RECORD, RECORD_MAGIC, decode_properties, encode_properties

log = logging.getLogger("mockbroker.recovery")

_WINDOW = 8 * 1024 * 1024

QueueLookup = Callable[[str, int], ConsumeQueue | None]
#: (topic, commit-log position of a record) -> True for a record of a topic deleted since.
DeletedLookup = Callable[[str, int], bool]


@dataclass
class RecoveryReport:
    """What recovery found."""

    crashed: bool = False
    replayed_from: int = 0
    records_replayed: int = 0
    truncated_bytes: int = 0
    corrupt_records: int = 0
    skipped_bytes: int = 0  # damaged stretches no record header could be trusted in
    deleted_records: int = 0  # records of deleted topics, not indexed


@dataclass(frozen=True)
class RecordHeader:
    """What recovery reads of a record: where it belongs, and what indexes it."""

    size: int
    queue_id: int
    queue_offset: int
    topic: str
    tags: bytes
    msg_id: bytes
    keys: bytes  # joined by NUL, as the frame holds them
    #: The broker's own queue (queue 0) it is indexed in instead of (topic, queue_id): a
    #: scheduled message's SCHEDULE_TOPIC, a half message's HALF_TOPIC; None for others.
    held_in: str | None


def _parse(window: bytes, at: int, limit: int) -> tuple[RecordHeader | None, bool]:
    """Parse the record at `at`; returns (header or None, CRC ok)."""
    if at + RECORD.size > limit:
        return None, False
    size, crc, magic, queue_id, queue_offset, _ts, _rc, topic_len = RECORD.unpack_from(window, at)
    minimum = RECORD.size + topic_len + FRAME_FIELDS.size
    if magic != RECORD_MAGIC or size < minimum or at + size > limit:
        return None, False
    p = at + RECORD.size
    try:
        topic = window[p : p + topic_len].decode()
    except UnicodeDecodeError:
        return None, False
    fields = FRAME_FIELDS.unpack_from(window, p + topic_len)
    msg_id, _born, deliver_at, level, tl, sl, kl, pl = fields[:8]
    tags_at = p + topic_len + FRAME_FIELDS.size
    ok = crc32_of(memoryview(window)[at + 8 : at + size]) == crc
    tags = window[tags_at : tags_at + tl]
    held_in = None
    if deliver_at or level:
        held_in = SCHEDULE_TOPIC
    elif pl:
        properties_at = tags_at + tl + sl + kl
        properties = window[properties_at : properties_at + pl]
        if _HALF_MARK in properties and _is_half(properties):
            held_in = HALF_TOPIC
    keys_at = tags_at + tl + sl
    keys = window[keys_at : keys_at + kl]
    return RecordHeader(size, queue_id, queue_offset, topic, tags, msg_id, keys, held_in), ok


#: How a half message's property reads in a frame: its length, then its name.
_HALF_MARK = encode_properties({HALF_PROPERTY: ""})[:-2]


def _is_half(properties: bytes) -> bool:
    """Whether a frame's properties name it a half message (only those may carry it)."""
    try:
        return HALF_PROPERTY in decode_properties(properties)
    except ValueError:
        return False


def recover(
    commitlog: CommitLog,
    queues: QueueLookup,
    existing: list[ConsumeQueue],
    start: int,
    counts: dict[str, int] | None = None,
    deleted: DeletedLookup | None = None,
    replayed: list[tuple[RecordHeader, int]] | None = None,
) -> RecoveryReport:
    """Rebuild the consume queues from commit log position `start` onwards.

    `counts`: the checkpoint's entry count of each queue (mockbroker/store/checkpoint.py);
    the entries past them are dropped unread. Without counts (an older checkpoint) a
    queue keeps the entries that point below `start`. `replayed` gets each intact record
    indexed again, with its position (the message index is rebuilt from them: its files
    may have lost their last entries where the commit log kept the records).
    """
    durable = [(cq, _durable_entries(cq, start, counts)) for cq in existing]
    start = _record_boundary(commitlog, durable, start)
    report = RecoveryReport(crashed=True, replayed_from=start)
    for cq, count in durable:
        cq.truncate(cq.count_before(start, hi=count))
    pos = start
    while pos < commitlog.end:
        window = commitlog.read(pos, min(_WINDOW, commitlog.end - pos))
        at = 0
        while at < len(window):
            header, ok = _parse(window, at, len(window))
            if header is None and len(window) == _WINDOW and at > 0:
                break  # the record continues past this window: read the next one
            if header is not None and ok:
                if _index(queues, header, pos + at, report, deleted) and replayed is not None:
                    replayed.append((header, pos + at))
                report.records_replayed += 1
                at += header.size
                continue
            damaged = pos + at
            resume = _next_valid(commitlog, damaged + 1)
            if resume is None or _power_cut_hole(commitlog, header, damaged, resume):
                report.truncated_bytes = commitlog.truncate(damaged)
                log.warning(
                    "%s at commit log position %d: %d bytes dropped",
                    "torn tail" if resume is None else "pages lost by a power cut",
                    damaged, report.truncated_bytes,
                )  # fmt: skip
                return report
            if header is not None and damaged + header.size == resume:
                log.error(
                    "corrupt record at commit log position %d (%s queue %d offset %d)",
                    damaged, header.topic, header.queue_id, header.queue_offset,
                )  # fmt: skip
                report.corrupt_records += 1
                _index(queues, header, damaged, report, deleted, corrupt=True)
            else:
                log.error(
                    "damaged commit log at positions %d..%d: no record header there can be "
                    "trusted; skipped (the queue offsets it held are marked corrupt)",
                    damaged, resume - 1,
                )  # fmt: skip
                report.skipped_bytes += resume - damaged
            at = resume - pos
            break  # read on from the record found (it may lie in another window)
        pos += at
    return report


def _durable_entries(cq: ConsumeQueue, start: int, counts: dict[str, int] | None) -> int:
    if counts is None:
        return cq.count_before(start)
    return min(counts.get(cq.name, 0), cq.count)


def _power_cut_hole(
    commitlog: CommitLog, header: RecordHeader | None, damaged: int, resume: int
) -> bool:
    """The damage from `damaged` to the valid record at `resume` is pages a power cut lost."""
    if commitlog.zeros_to_page_end(damaged):
        return True
    body_only = header is not None and damaged + header.size == resume
    return not body_only and commitlog.holds_zero_page(damaged, resume)


def _record_boundary(
    commitlog: CommitLog, durable: list[tuple[ConsumeQueue, int]], start: int
) -> int:
    """`start`, or the start of a record that is indexed below `start` but reaches past it.

    The checkpoint is a record boundary of the log as it was written. When the log is found
    shorter than that (a torn write the disk did not keep), the replay starts at the log's
    end, which may lie inside a record: its index entry would survive the replay and point
    past the end. Replaying from that record's start checks it, and cuts it off as torn.
    """
    boundary = start
    for cq, count in durable:
        below = cq.count_before(start, hi=count)
        if not below:
            continue
        position, entry_size, _ = cq.entry(below - 1)
        if position < commitlog.start:
            continue  # a record retention deleted, or a damaged entry: nothing to reach
        size: int | None = entry_size
        if entry_size == CORRUPT_SIZE:  # recovery skipped it by the size in its header
            size = _header_size(commitlog, position)
        if size is None or position + size > start:
            boundary = min(boundary, position)
    return boundary


def _header_size(commitlog: CommitLog, position: int) -> int | None:
    """The size field of the record at `position`, or None when the log ends first."""
    if position + RECORD.size > commitlog.end:
        return None
    return int(RECORD.unpack(commitlog.read(position, RECORD.size))[0])


def _next_valid(commitlog: CommitLog, position: int) -> int | None:
    """Where the first whole record with a good CRC at or after `position` starts, if any.

    A record's magic number lies 8 bytes into it: each occurrence of it is a candidate.
    """
    magic = RECORD_MAGIC.to_bytes(4, "little")
    end = commitlog.end
    pos = position
    while pos + RECORD.size <= end:
        chunk = commitlog.read(pos, min(_WINDOW, end - pos))
        hit = chunk.find(magic, 8)
        while hit >= 0:
            if _valid_follows(commitlog, pos + hit - 8):
                return pos + hit - 8
            hit = chunk.find(magic, hit + 1)
        if len(chunk) < _WINDOW:
            return None
        pos += len(chunk) - 11  # a magic number across the chunk boundary is found next time
    return None


def _valid_follows(commitlog: CommitLog, position: int) -> bool:
    """True when a whole record with a good CRC starts at `position`."""
    if position >= commitlog.end:
        return False
    head = commitlog.read(position, min(RECORD.size, commitlog.end - position))
    if len(head) < RECORD.size:
        return False
    size = RECORD.unpack_from(head)[0]
    if position + size > commitlog.end or size < RECORD.size:
        return False
    try:
        data = commitlog.read(position, size)
    except ValueError:
        return False
    header, ok = _parse(data, 0, len(data))
    return header is not None and ok


def _index(
    queues: QueueLookup,
    header: RecordHeader,
    position: int,
    report: RecoveryReport,
    deleted: DeletedLookup | None,
    corrupt: bool = False,
) -> bool:
    """Index the record at `position` in its queue; whether it was (not left out).

    A corrupt record is indexed as a gap entry: False too (it has no message to find).
    """
    if header.held_in is None and deleted is not None and deleted(header.topic, position):
        report.deleted_records += 1  # its topic's deletion took it; a namesake starts afresh
        return False
    cq = (
        queues(header.topic, header.queue_id)
        if header.held_in is None
        else queues(header.held_in, 0)
    )
    if cq is None:
        log.error("record at %d names unknown queue %s/%d", position, header.topic, header.queue_id)
        return False
    if corrupt and header.queue_offset != cq.count:
        return False  # its header is not to be trusted; the next record fills the gap
    if header.queue_offset > position // MIN_RECORD_SIZE:
        # Each earlier offset of the queue has a record before this one: a CRC-valid header
        # claiming more is not marked as a gap (it could be one of 2**63 offsets).
        log.error(
            "record at %d claims %s/%d offset %d, more records than the log before it holds; "
            "not indexed",
            position, header.topic, header.queue_id, header.queue_offset,
        )  # fmt: skip
        report.corrupt_records += 1
        return False
    if header.queue_offset < cq.count:
        log.error(
            "record at %d repeats %s/%d offset %d; keeping the first",
            position, header.topic, header.queue_id, header.queue_offset,
        )  # fmt: skip
        return False
    gap = header.queue_offset - cq.count
    if gap:
        log.error(
            "%s/%d: offsets %d..%d are missing from the commit log; marked corrupt",
            header.topic, header.queue_id, cq.count, header.queue_offset - 1,
        )  # fmt: skip
        report.corrupt_records += gap
        cq.append(ENTRY.pack(position, CORRUPT_SIZE, 0) * gap)
    size = CORRUPT_SIZE if corrupt else header.size
    cq.append(ENTRY.pack(position, size, tag_hash(header.tags)))
    return not corrupt
