"""Delayed delivery: messages held back until a delay level or a deliver-at time passes.

A scheduled message is stored at once, as a record whose header names its destination
(topic, queue) but which is indexed in the broker's queue `rmq_sys_SCHEDULE`. When it
falls due, the scheduler appends it to its destination (so a sharding key keeps its queue)
and records the outcome in `rmq_sys_SCHEDULE_DONE`; a cancel records its outcome there too.
Both live in the commit log, so after any restart the pending set is the scheduled records
without an outcome: none is lost and none is delivered before it is due. A crash between
delivering a message and recording it may deliver it twice (at least once, as everywhere).

Start-up reads only the live span. The file `schedule-mark` holds two queue offsets: every
scheduled record below the first has a durable outcome, and every outcome of a record at or
above it lies at or above the second in the outcome queue. It is written (atomically) only
once the commit log is durable past everything it covers, so a crash leaves an older mark,
never one that skips a pending message. `load` starts both scans there; outcomes below the
mark are dropped from memory (a cancel of such a message is answered from the id index).

A message waiting longer than retention keeps would pin every later segment (retention
never deletes a pending message). Once it was stored half the retention time ago it is
copied to the end of the log, due at the same absolute time, and its old record gets the
outcome MOVED: the copy first, so a crash in between leaves two records of one message
id, of which only one is ever delivered (the pending set is keyed by message id).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from mockbroker.errors import BrokerError, not_found
from mockbroker.store.checkpoint import read_positions, write_positions
from mockbroker.store.consumequeue import ConsumeQueue
from mockbroker.store.files import fault_point
from mockbroker.store.flush import FlushFailedError
from mockbroker.store.message_store import MessageStore, PutResult
from mockbroker.store.records import (
    CheckedFrame,
    CheckedFrames,
    due_time_ms,
    rescheduled,
    tag_hash,
    unscheduled,
)
from mockbroker.topics import SCHEDULE_DONE_TOPIC as DONE_TOPIC
from mockbroker.topics import SCHEDULE_TOPIC, Topic
from sdk._wire import FRAME_FIELDS, FRAME_LEN_PREFIX, RECORD, encode_frame, iter_records
from sdk.clock import Clock

log = logging.getLogger("mockbroker.schedule")

DELIVERED, CANCELLED, MOVED = 1, 2, 3
_DONE_BODY = struct.Struct("<qB")  # schedule-queue offset, outcome
_BATCH = 1000  # due messages delivered per round
MARK_FILE = "schedule-mark"
#: At most one mark write (and the flush it waits for) per this many seconds.
MARK_EVERY_SECONDS = 1.0
#: How often pending messages are looked at for copying forward.
MOVE_EVERY_SECONDS = 60.0


#: A waiting message being delivered or copied: its schedule-queue offset and id first.
_Item = TypeVar("_Item", bound=tuple[Any, ...])


@dataclass(frozen=True)
class _Scheduled:
    offset: int
    topic: str


@dataclass(frozen=True)
class _Outcome:
    outcome: int
    topic: str
    offset: int  # of the scheduled record, in the schedule queue
    done_offset: int  # of the outcome record, in the outcome queue


def frame_of(record: bytes) -> memoryview:
    """The frame (without prefix) inside a stored record."""
    topic_len = int.from_bytes(record[RECORD.size - 2 : RECORD.size], "little")
    return memoryview(record)[RECORD.size + topic_len :]


class Scheduler:
    """Holds scheduled messages and delivers them when due, on the broker's clock."""

    def __init__(self, store: MessageStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._heap: list[tuple[int, int]] = []  # (due ms, schedule-queue offset)
        self._pending: dict[bytes, _Scheduled] = {}  # msg id -> where it waits
        self._outcomes: dict[bytes, _Outcome] = {}  # msg id -> its outcome, above the mark
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: (schedule queue count, outcome queue count) when each running write began.
        self._writes: list[tuple[int, int]] = []
        self._mark = (0, 0)  # (schedule offset, outcome offset) as last written
        self._mark_saved_at = float("-inf")
        self._settled_since_mark = False  # an outcome was recorded since the mark was written
        self._moved_at = float("-inf")
        #: Records `load` read (the start-up cost: the live span, not the history).
        self.records_loaded = 0

    @property
    def pending(self) -> int:
        """How many messages wait for their time."""
        return len(self._pending)

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Rebuild the pending set from the store (at startup, after recovery)."""
        self._schedule_topic = (
            self._store.topics.find(SCHEDULE_TOPIC)
            or (self._store.create_topic(SCHEDULE_TOPIC, 1)[0])
        )
        self._done_topic = (
            self._store.topics.find(DONE_TOPIC) or (self._store.create_topic(DONE_TOPIC, 1)[0])
        )
        self._mark = self._read_mark()
        low, done_from = self._mark
        done: set[int] = set()
        for done_offset, record in self._records(self._done_topic, done_from):
            if not record:
                continue
            frame = frame_of(record)
            offset, outcome = _DONE_BODY.unpack(frame[-_DONE_BODY.size :])
            if offset < low:
                continue  # resolved before the mark
            done.add(offset)
            msg_id = bytes(frame[:16])
            self._outcomes[msg_id] = _Outcome(outcome, _record_topic(record), offset, done_offset)
        for offset, record in self._records(self._schedule_topic, low):
            if offset in done or not record:
                continue
            frame = frame_of(record)
            msg_id, _born, deliver_at, level = FRAME_FIELDS.unpack_from(frame)[:4]
            stored_ms = RECORD.unpack_from(record)[5]
            heapq.heappush(self._heap, (due_time_ms(deliver_at, level, stored_ms), offset))
            self._pending[msg_id] = _Scheduled(offset, _record_topic(record))
        log.info(
            "%d scheduled messages pending (%d records read from the mark %s)",
            len(self._pending), self.records_loaded, self._mark,
        )  # fmt: skip
        self._store.protected_position = self.oldest_pending_position

    def _read_mark(self) -> tuple[int, int]:
        path = self._store.data_dir / MARK_FILE
        mark = read_positions(path, 2)
        if mark is None:
            return (0, 0)
        low, done_from = mark
        if low > self._queue().count or done_from > self._done_queue().count:
            # Never written ahead of the durable log; a mark past it is not trusted.
            log.warning("%s %s lies past the stored queues; scanning them whole", path, mark)
            return (0, 0)
        return low, done_from

    def oldest_pending_position(self) -> int | None:
        """Where the oldest message still waiting lies in the commit log (retention keeps it)."""
        if not self._pending:
            return None
        oldest = min(waiting.offset for waiting in self._pending.values())
        return self._store.queue(self._schedule_topic, 0).entry(oldest)[0]

    def start(self) -> None:
        """Start delivering."""
        self._task = asyncio.create_task(self._run(), name="scheduler")

    async def stop(self) -> None:
        """Stop delivering (pending messages stay stored) and write the mark a last time."""
        self._stopping = True
        self._changed.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.save_mark()

    # ------------------------------------------------------------------ start-up mark
    def current_mark(self) -> tuple[int, int]:
        """(schedule offset, outcome offset) a restart could start its scans at now."""
        sched_count, done_count = self._queue().count, self._done_queue().count
        low = min(
            [w.offset for w in self._pending.values()] + [w[0] for w in self._writes],
            default=sched_count,
        )
        done_from = min(
            [o.done_offset for o in self._outcomes.values() if o.offset >= low]
            + [w[1] for w in self._writes],
            default=done_count,
        )
        return low, done_from

    async def save_mark(self) -> bool:
        """Write the current mark once the log is durable past it; True when written.

        Outcomes below it are then dropped from memory.
        """
        self._settled_since_mark = False
        mark = self.current_mark()
        if mark == self._mark:
            return False
        flusher = self._store.flusher
        if flusher is None:
            return False
        try:
            await flusher.wait_durable(self._store.commitlog.end)
        except FlushFailedError:
            return False  # the store refuses writes already; the old mark stays right
        path = self._store.data_dir / MARK_FILE
        try:
            await asyncio.to_thread(write_positions, path, mark)
        except OSError as exc:  # a full disk: the old mark stays right, start-up scans more
            log.error("cannot write %s (retried later): %s", path, exc)
            self._settled_since_mark = True
            return False
        fault_point("schedule-mark-written")
        self._mark, self._mark_saved_at = mark, self._clock.now()
        low = mark[0]
        for msg_id in [m for m, o in self._outcomes.items() if o.offset < low]:
            del self._outcomes[msg_id]
        return True

    def _mark_due_at(self) -> float | None:
        """When the next mark write is due (None: the written mark is current)."""
        if not self._settled_since_mark:
            return None
        return self._mark_saved_at + MARK_EVERY_SECONDS

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Keep the mark below a write that is running (its offsets are not known yet)."""
        started = (self._queue().count, self._done_queue().count)
        self._writes.append(started)
        try:
            yield
        finally:
            self._writes.remove(started)

    def _queue(self) -> ConsumeQueue:
        return self._store.queue(self._schedule_topic, 0)

    def _done_queue(self) -> ConsumeQueue:
        return self._store.queue(self._done_topic, 0)

    # ------------------------------------------------------------------ requests
    async def schedule(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
        *,
        reconsume_times: int = 0,
    ) -> bool:
        """Store scheduled frames for (topic, queue_id); True when durable per flush mode.

        Once stored they are scheduled even if the caller is cancelled meanwhile (its
        deadline passed, or it cancelled an Exchange request during the sync flush wait):
        otherwise they would sit in the log, undelivered until a restart.
        """
        stored = await self.schedule_stored(
            topic, queue_id, frames, checked, reconsume_times=reconsume_times
        )
        return stored.durable

    async def schedule_stored(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
        *,
        reconsume_times: int = 0,
    ) -> PutResult:
        """`schedule`, answering where the frames were stored.

        Their offsets are those of the schedule queue (a RocketMQ send reply names them,
        as RocketMQ's broker does).
        """
        topic.check_queue(queue_id)
        return await asyncio.shield(
            self._store_and_schedule(topic, queue_id, frames, checked, reconsume_times)
        )

    async def _store_and_schedule(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
        reconsume_times: int,
    ) -> PutResult:
        with self._writing():
            result = await self._store.append(
                topic,
                queue_id,
                frames,
                checked,
                index_into=(self._schedule_topic, 0),
                reconsume_times=reconsume_times,
            )
        view = memoryview(frames)
        for i, frame in enumerate(checked):
            offset = result.first_offset + i
            heapq.heappush(self._heap, (frame.due_ms, offset))
            self._pending[bytes(view[frame.start : frame.start + 16])] = _Scheduled(
                offset, topic.name
            )
        self._changed.set()
        return result

    def topic_of(self, msg_id: bytes) -> str | None:
        """The topic of a message waiting or settled since start (None: not known here)."""
        waiting = self._pending.get(msg_id)
        if waiting is not None:
            return waiting.topic
        outcome = self._outcomes.get(msg_id)
        return outcome.topic if outcome is not None else None

    async def cancel(self, topic: str | None, msg_id: bytes) -> int:
        """Cancel a pending message: CANCELLED, or DELIVERED if it was already delivered.

        With a topic, only a message scheduled for that topic matches.
        """
        waiting = self._pending.get(msg_id)
        if waiting is not None and topic in (None, waiting.topic):
            done_offset = await self._record_outcomes([(waiting.offset, msg_id)], CANCELLED)
            del self._pending[msg_id]
            self._outcomes[msg_id] = _Outcome(CANCELLED, waiting.topic, waiting.offset, done_offset)
            self._changed.set()  # the mark may move
            return CANCELLED
        outcome = self._outcomes.get(msg_id)
        if outcome is not None and topic in (None, outcome.topic):
            return outcome.outcome
        settled = self._settled_before_mark(topic, msg_id)
        if settled is not None:
            return settled
        where = f" in topic {topic!r}" if topic else ""
        raise not_found("MESSAGE_NOT_FOUND", f"no scheduled message {msg_id.hex().upper()}{where}")

    def _settled_before_mark(self, topic: str | None, msg_id: bytes) -> int | None:
        """The outcome of a message settled below the mark, found through the id index.

        Its delivered copy is stored unscheduled; a scheduled record without one was
        cancelled (retention deletes the older scheduled record first).
        """
        scheduled = False
        for record in iter_records(b"".join(self._store.find_by_id(msg_id))):
            if topic not in (None, record.topic):
                continue
            if not (record.deliver_at_ms or record.delay_level):
                return DELIVERED
            scheduled = True
        return CANCELLED if scheduled else None

    # ------------------------------------------------------------------ delivery
    async def deliver_due(self) -> int:
        """Deliver every message due by now; how many were delivered."""
        now_ms = int(self._clock.now() * 1000)
        delivered = 0
        while self._heap and self._heap[0][0] <= now_ms:
            due: list[tuple[int, int]] = []
            while self._heap and self._heap[0][0] <= now_ms and len(due) < _BATCH:
                due.append(heapq.heappop(self._heap))
            try:
                delivered += await self._deliver([offset for _, offset in due])
            except BrokerError:
                for item in due:  # the delivered ones are skipped when they come up again
                    heapq.heappush(self._heap, item)
                raise
        return delivered

    async def _deliver(self, offsets: list[int]) -> int:
        groups: dict[tuple[str, int, int], list[tuple[int, bytes, bytes]]] = {}
        for offset in offsets:
            try:
                record = self._store.read_record(self._schedule_topic, 0, offset)
            except BrokerError as exc:
                log.error("scheduled message at offset %d cannot be delivered: %s", offset, exc)
                continue
            frame = frame_of(record)
            msg_id = bytes(frame[:16])
            waiting = self._pending.get(msg_id)
            if waiting is None or waiting.offset != offset:
                continue  # cancelled meanwhile
            _size, _crc, _magic, queue_id, _qo, _ts, reconsume, _tl = RECORD.unpack_from(record)
            key = (_record_topic(record), queue_id, reconsume)
            groups.setdefault(key, []).append((offset, msg_id, unscheduled(frame)))
        count = 0
        for (topic_name, queue_id, reconsume), items in groups.items():
            items = await self._without_deleted(topic_name, items)
            if not items:
                continue
            topic = self._store.topics.get(topic_name)
            frames = b"".join(FRAME_LEN_PREFIX.pack(len(f)) + f for _, _, f in items)
            checked = _checked(frames)
            await self._store.append(topic, queue_id, frames, checked, reconsume_times=reconsume)
            done_from = await self._record_outcomes([(o, m) for o, m, _ in items], DELIVERED)
            for i, (offset, msg_id, _) in enumerate(items):
                del self._pending[msg_id]
                self._outcomes[msg_id] = _Outcome(DELIVERED, topic_name, offset, done_from + i)
            count += len(items)
        return count

    # ------------------------------------------------------------------ copying forward
    async def move_forward(self) -> int:
        """Copy the messages waiting since half the retention time to the log's end.

        Returns how many were copied; their old records may then be deleted.
        """
        self._moved_at = self._clock.now()
        stored_before = int((self._moved_at - self._store.retention.retention_seconds / 2) * 1000)
        groups: dict[tuple[str, int, int], list[tuple[int, bytes, bytes, int]]] = {}
        for waiting in sorted(self._pending.values(), key=lambda w: w.offset):
            try:
                record = self._store.read_record(self._schedule_topic, 0, waiting.offset)
            except BrokerError as exc:
                log.error("scheduled message at offset %d cannot be copied: %s", waiting.offset,
                          exc)  # fmt: skip
                continue
            _size, _crc, _magic, queue_id, _qo, stored_ms, reconsume, _tl = RECORD.unpack_from(
                record
            )
            if stored_ms >= stored_before:
                break  # offsets follow store times: the rest are younger
            frame = frame_of(record)
            msg_id, _born, deliver_at, level = FRAME_FIELDS.unpack_from(frame)[:4]
            due = due_time_ms(deliver_at, level, stored_ms)
            groups.setdefault((waiting.topic, queue_id, reconsume), []).append(
                (waiting.offset, msg_id, rescheduled(frame, due), due)
            )
        moved = 0
        for (topic_name, queue_id, reconsume), items in groups.items():
            items = await self._without_deleted(topic_name, items)
            if not items:
                continue
            moved += await self._copy(topic_name, queue_id, reconsume, items)
        if moved:
            log.info("%d long-waiting scheduled messages copied forward", moved)
        return moved

    async def _copy(
        self,
        topic_name: str,
        queue_id: int,
        reconsume: int,
        items: list[tuple[int, bytes, bytes, int]],
    ) -> int:
        frames = b"".join(FRAME_LEN_PREFIX.pack(len(f)) + f for _, _, f, _ in items)
        with self._writing():
            result = await self._store.append(
                self._store.topics.get(topic_name), queue_id, frames, _checked(frames),
                index_into=(self._schedule_topic, 0), reconsume_times=reconsume,
            )  # fmt: skip
        moved: list[tuple[int, bytes]] = []
        orphans: list[tuple[int, bytes]] = []  # cancelled while being copied
        for i, (offset, msg_id, _, due) in enumerate(items):
            copy = result.first_offset + i
            waiting = self._pending.get(msg_id)
            if waiting is None or waiting.offset != offset:
                orphans.append((copy, msg_id))
                continue
            self._pending[msg_id] = _Scheduled(copy, topic_name)
            heapq.heappush(self._heap, (due, copy))  # the old heap entry is skipped
            moved.append((offset, msg_id))
        if moved:
            await self._record_outcomes(moved, MOVED)
        if orphans:
            await self._record_outcomes(orphans, CANCELLED)
        self._changed.set()
        return len(moved)

    async def _without_deleted(self, topic_name: str, items: list[_Item]) -> list[_Item]:
        """`items` but those sent to a topic deleted since, which are cancelled.

        Sent before the deletion means stored below its mark (mockbroker/topics.py): such
        a message never reaches a topic created again with the same name.
        """
        topics = self._store.topics
        alive = topics.find(topic_name) is not None
        if alive and topic_name not in topics.deleted():
            return items  # the common case: a topic never deleted
        index = self._store.queue(self._schedule_topic, 0)
        kept: list[_Item] = []
        gone: list[tuple[int, bytes]] = []
        for item in items:
            if alive and topics.holds(topic_name, index.entry(item[0])[0]):
                kept.append(item)
            else:
                gone.append((item[0], item[1]))
        if not gone:
            return items
        done_from = await self._record_outcomes(gone, CANCELLED)
        for n, (offset, msg_id) in enumerate(gone):
            del self._pending[msg_id]
            self._outcomes[msg_id] = _Outcome(CANCELLED, topic_name, offset, done_from + n)
        log.warning("%d scheduled messages of the deleted topic %s cancelled", len(gone),
                    topic_name)  # fmt: skip
        return kept

    async def _record_outcomes(self, items: list[tuple[int, bytes]], outcome: int) -> int:
        """Append the outcome records; the outcome-queue offset of the first."""
        frames = b"".join(
            encode_frame(msg_id=msg_id, born_timestamp_ms=0, body=_DONE_BODY.pack(offset, outcome))
            for offset, msg_id in items
        )
        with self._writing():
            result = await self._store.append(self._done_topic, 0, frames, _checked(frames))
        self._settled_since_mark = True
        return result.first_offset

    async def _run(self) -> None:
        while not self._stopping:
            self._changed.clear()
            try:
                await self.deliver_due()
            except BrokerError as exc:
                log.error("scheduled delivery failed, retrying: %s", exc)
                await self._clock.sleep_until(self._clock.now() + 1)
                continue
            move_due = self._moved_at + MOVE_EVERY_SECONDS if self._pending else None
            if move_due is not None and move_due <= self._clock.now():
                try:
                    await self.move_forward()
                except BrokerError as exc:
                    log.error("copying scheduled messages forward failed (retried): %s", exc)
                move_due = self._moved_at + MOVE_EVERY_SECONDS
            mark_due = self._mark_due_at()
            if mark_due is not None and mark_due <= self._clock.now():
                await self.save_mark()
                mark_due = None
            due = self._heap[0][0] / 1000 if self._heap else None
            wake_at = [t for t in (mark_due, move_due, due) if t is not None]
            if wake_at:
                sleeper = asyncio.ensure_future(self._clock.sleep_until(min(wake_at)))
                changed = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait((sleeper, changed), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
                    changed.cancel()
            else:
                await self._changed.wait()

    def _records(self, topic: Topic, start: int) -> list[tuple[int, bytes]]:
        """(offset, record) of every record from `start` retention kept; b"" if unreadable."""
        cq = self._store.queue(topic, 0)
        out = []
        for offset in range(max(cq.min_offset, start), cq.count):
            self.records_loaded += 1
            try:
                out.append((offset, self._store.read_record(topic, 0, offset)))
            except BrokerError as exc:
                log.error("%s offset %d is unreadable and skipped: %s", topic.name, offset, exc)
                out.append((offset, b""))
        return out


def _record_topic(record: bytes) -> str:
    topic_len = int.from_bytes(record[RECORD.size - 2 : RECORD.size], "little")
    return record[RECORD.size : RECORD.size + topic_len].decode()


def _checked(frames: bytes) -> CheckedFrames:
    """Frames the broker built itself: their lengths are known good."""
    out = CheckedFrames()
    pos = 0
    while pos < len(frames):
        (length,) = FRAME_LEN_PREFIX.unpack_from(frames, pos)
        start = pos + FRAME_LEN_PREFIX.size
        tl, sl, kl = FRAME_FIELDS.unpack_from(frames, start)[4:7]
        tags_at = start + FRAME_FIELDS.size
        tags = tag_hash(frames[tags_at : tags_at + tl])
        # keys_at/keys_len: a delivered message is indexed by its keys like any other.
        out.add(start, start + length, tags, 0, tags_at + tl + sl, kl)
        pos = start + length
    return out
