"""The message store: topics, commit log, consume queues, flushing and recovery together.

Runs on the broker's event loop. Appends and index writes are plain syscalls into the
page cache made in the loop (a batch at a time); fsyncs run in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import shutil
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid, not_found, out_of_range
from mockbroker.store.checkpoint import (
    Checkpoint,
    mark_clean_shutdown,
    mark_running,
    read_checkpoint,
)
from mockbroker.store.commitlog import CommitLog
from mockbroker.store.consumequeue import ENTRY, ConsumeQueue
from mockbroker.store.data_format import check_data_format
from mockbroker.store.early_deletion import (
    Committed,
    early_reason,
    keep_deleting,
    over_cap,
    unread_by_group,
)
from mockbroker.store.files import DirectoryLock, fault_point, fsync_dir, make_dirs
from mockbroker.store.flush import Flusher, FlushFailedError
from mockbroker.store.message_index import MessageIndex
from mockbroker.store.records import (
    MIN_RECORD_SIZE,
    CheckedFrame,
    CheckedFrames,
    IdKeyEntries,
    as_checked,
    check_frames,
    check_usual_parts,
    counts_and_sizes,
    lay_out_parts,
    lay_out_records,
    rebase_entries,
)
from mockbroker.store.recovery import RecordHeader, RecoveryReport, recover
from mockbroker.store.retention import (
    DiskProbe,
    DiskUsage,
    RetentionPolicy,
    RetentionStats,
    age_floor,
    next_floor,
    statvfs_probe,
)
from mockbroker.store.topic_expiry import SizeWindow
from mockbroker.topics import (
    DEFAULT_RETENTION,
    SYSTEM_PREFIX,
    Topic,
    TopicRegistry,
    TopicRetention,
)
from sdk._crc import crc32 as crc32_of
from sdk._validation import split_tag_expression
from sdk._wire import (
    FRAME_FIELDS,
    RECORD,
    RECORD_HEAD,
    RECORD_MAGIC,
    RecordFormatError,
    StoredRecord,
    iter_records,
)
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.log import log_event

log = logging.getLogger("mockbroker.store")

#: How many index entries one filtered pull scans at most per message asked for.
_SCAN_FACTOR = 16
_MAX_SCAN = 20_000


@dataclass(frozen=True)
class StoreCut:
    """Everything stored up to one moment: what a backup copies (see `MessageStore.cut`)."""

    #: The commit-log end: every record before it, none after.
    position: int
    #: Each consume queue's entry count ("topic/queue id", as in the checkpoint).
    counts: dict[str, int]
    #: (file, bytes from its start) of every commit-log segment, queue and index file.
    extents: list[tuple[Path, int]]
    #: Queue entries still served (above each queue's min offset).
    messages: int


@dataclass(slots=True)  # not frozen: that costs a call per field, on the path of every send
class PutResult:
    """Where an appended batch went."""

    first_offset: int
    count: int
    store_timestamp_ms: int
    durable: bool  # False: sync flush timed out (the records are written, fsync pending)


@dataclass(slots=True)  # not frozen: see PutResult
class Written:
    """Records written to the commit log and indexed, not necessarily synced yet."""

    first_offset: int
    count: int
    store_timestamp_ms: int
    end: int  # the commit log's end after them: synced up to here, they are durable


@dataclass(slots=True)  # not frozen: see PutResult
class Batch:
    """Checked frames for one queue: one part of a request that writes several (write_parts)."""

    queue_id: int
    frames: bytes
    checked: Sequence[CheckedFrame]


@dataclass(slots=True)
class LaidOut:
    """A batch's records laid out ahead of its write, a slice at a time (MessageStore.lay_out).

    Positions count from the batch's first record; the write moves them to where it
    appends. It holds while the queue's next offset is still `first_offset` (the write
    lays the batch out again otherwise).
    """

    first_offset: int
    store_timestamp_ms: int
    index: IdKeyEntries | None
    pieces: list[bytes | memoryview] = field(default_factory=list)
    entries: list[bytes] = field(default_factory=list)
    size: int = 0  # bytes laid out
    count: int = 0  # records laid out


class _QueueWrite:
    """One queue's share of a write_parts: its index entries, the offsets they take."""

    __slots__ = ("cq", "entries", "first_offset", "next_offset")

    def __init__(self, cq: ConsumeQueue) -> None:
        self.cq = cq
        self.first_offset = self.next_offset = cq.count
        self.entries: list[bytes] = []


@dataclass(frozen=True)
class GetResult:
    """What a read by offset found; `status` is a PullStatus name."""

    status: str
    next_offset: int
    min_offset: int
    max_offset: int
    records: bytes = b""
    count: int = 0
    #: The read stopped at a corrupt record (at `next_offset`), after `count` good ones.
    corrupt: bool = False


@dataclass
class StoreStats:
    """Counters since start."""

    messages_stored: int = 0
    messages_served: int = 0
    corrupt_records_detected: int = 0
    stored_by_topic: dict[str, int] = field(default_factory=dict)
    served_by_topic: dict[str, int] = field(default_factory=dict)


class MessageStore:
    """Durable storage of messages by (topic, queue, offset)."""

    def __init__(
        self,
        data_dir: Path,
        *,
        sync_flush: bool,
        segment_bytes: int,
        flush_interval_seconds: float,
        sync_flush_timeout_seconds: float,
        clock: Clock | None = None,
        retention: RetentionPolicy | None = None,
        disk_probe: DiskProbe | None = None,
        retention_check_seconds: float = 1.0,
    ) -> None:
        self.data_dir = data_dir
        self.sync_flush = sync_flush
        self._sync_timeout = sync_flush_timeout_seconds
        self._clock: Clock = clock or SystemClock()
        self.topics = TopicRegistry(data_dir / "topics.json")
        self.commitlog = CommitLog(
            data_dir / "commitlog", segment_bytes, may_preallocate=self._room_for_spare
        )
        self._cq_dir = data_dir / "consumequeue"
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        #: Each topic a creation (create_topics) is under way for -> that creation.
        self._creating: dict[str, asyncio.Task[list[str]]] = {}
        self._checkpoint = data_dir / "checkpoint"
        self._marker = data_dir / "running"
        self._flush_interval = flush_interval_seconds
        self._flusher: Flusher | None = None
        self.stats = StoreStats()
        self.recovery = RecoveryReport()
        #: True while open() replays the commit log after an unclean shutdown.
        self.recovering = False
        self._closed = False
        self._dir_lock = DirectoryLock(data_dir)
        self._index: MessageIndex | None = None
        #: Called with (topic, queue id) after every append (long polling's wake-up).
        self.on_append: Callable[[str, int], None] | None = None
        # Sync mode: (commit log end after an append, its queue), in append order, until an
        # fsync covers that end and its held pulls are woken.
        self._unannounced: deque[tuple[int, tuple[str, int]]] = deque()
        self.retention = retention or RetentionPolicy()
        self._probe: DiskProbe = disk_probe or statvfs_probe(data_dir)
        self._retention_check = retention_check_seconds
        self._retention_task: asyncio.Task[None] | None = None
        self.retention_stats = RetentionStats()
        #: The disk usage at the last check (None before the first).
        self.disk: DiskUsage | None = None
        #: True while the disk is over the refuse ratio or the commit log stays over
        #: max_data_bytes: sends are refused (refusal() says why).
        self.refusing_sends = False
        self._disk_refusing = False
        #: A write failed for want of space since the last disk check (its figure is older).
        self._out_of_space = False
        self._over_cap: int | None = None  # the commit log's bytes while over the cap
        #: The lowest commit-log position something outside the store still needs (the
        #: scheduler's oldest pending message), or None; retention deletes nothing there.
        self.protected_position: Callable[[], int | None] | None = None
        self._first_ts: dict[int, int] = {}  # segment base -> its first record's store time
        #: Called with (topic, queue id, old min offset, new min offset) after a deletion.
        self.on_trim: Callable[[str, int, int, int], None] | None = None
        self._retention_holds = 0
        #: Byte counts of the queues of topics with a size cap (topic_expiry.SizeWindow).
        self._size_windows: dict[tuple[str, int], SizeWindow] = {}
        #: The committed offsets (group, topic, queue id, offset), which tell early
        #: deletion what is still unread; None: no group reads anything.
        self.committed_offsets: Callable[[], Iterable[Committed]] | None = None

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> RecoveryReport:
        """Load everything from disk, recovering from a crash if the last run had one."""
        make_dirs(self.data_dir)
        self._dir_lock.acquire()
        try:
            self._load()
        except BaseException:
            self._dir_lock.release()
            raise
        return self.recovery

    def _load(self) -> None:
        check_data_format(self.data_dir)
        self._index = MessageIndex(self.data_dir / "index")
        self.topics.load()
        for name in self.topics.deleted():
            if self.topics.find(name) is None:
                self._remove_queue_files(name)  # a crash cut its deletion short
        self.commitlog.open()
        for topic in self.topics.all():
            for qid in range(topic.queue_count):
                self._queue_for(topic, qid)
        crashed = mark_running(self._marker)
        if crashed:
            checkpoint = read_checkpoint(self._checkpoint)
            counts = checkpoint.counts
            if checkpoint.position < self.commitlog.start:
                # Unreadable (or older than retention's floor): replay all that is kept.
                checkpoint, counts = Checkpoint(self.commitlog.start, None), None
            start = min(checkpoint.position, self.commitlog.end)
            log.warning("unclean shutdown detected: replaying the commit log from %d", start)
            self.recovering = True
            replayed: list[tuple[RecordHeader, int]] = []
            try:
                self.recovery = recover(
                    self.commitlog,
                    self._lookup,
                    list(self._queues.values()),
                    start,
                    counts,
                    deleted=lambda topic, position: not self.topics.holds(topic, position),
                    replayed=replayed,
                )
            finally:
                self.recovering = False
            self._reindex(replayed)
            self.stats.corrupt_records_detected += self.recovery.corrupt_records
            r = self.recovery
            log_event(
                log, logging.WARNING, "recovery",
                f"recovery done: {r.records_replayed} records replayed, "
                f"{r.truncated_bytes} bytes truncated, {r.corrupt_records} corrupt, "
                f"{r.skipped_bytes} damaged bytes skipped, "
                f"{r.deleted_records} records of deleted topics left out",
                replayed_from=r.replayed_from, records=r.records_replayed,
                truncated_bytes=r.truncated_bytes, corrupt_records=r.corrupt_records,
                skipped_bytes=r.skipped_bytes, deleted_records=r.deleted_records,
            )  # fmt: skip
        self._trim_to_log_start()

    async def start(self) -> None:
        """Start background flushing (call on the loop that will serve requests)."""
        self._flusher = Flusher(
            self.commitlog,
            lambda: self._queues.values(),
            self._checkpoint,
            interval_seconds=self._flush_interval,
            index=self._index,
            on_flushed=self._announce_flushed if self.sync_flush else None,
        )
        self._flusher.start()
        self.enforce_retention()
        self._retention_task = asyncio.create_task(self._retain(), name="retention")

    def _announce_flushed(self, flushed: int) -> None:
        """Sync mode: the queues whose appends this fsync made readable wake their pulls.

        An append made while the fsync ran lies beyond `flushed`: it stays for the fsync
        that covers it, since a pull woken now would find nothing and wait out its deadline.
        """
        pending = self._unannounced
        queues: dict[tuple[str, int], None] = {}
        while pending and pending[0][0] <= flushed:
            queues[pending.popleft()[1]] = None
        if self.on_append is not None:
            for topic, queue_id in queues:
                self.on_append(topic, queue_id)

    @property
    def flusher(self) -> Flusher | None:
        """The flusher (for its counters), once started."""
        return self._flusher

    async def close(self) -> None:
        """Flush, checkpoint, mark a clean shutdown and close the files."""
        if self._closed:
            return
        self._closed = True
        if self._retention_task is not None:
            self._retention_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._retention_task
        clean = True
        if self._flusher is not None:
            await self._flusher.stop()
            clean = self._flusher.failure is None
        try:  # a clean start trusts the queue and index files whole
            for cq in self._queues.values():
                cq.write_tail()
            if self._index is not None:
                self._index.write_pending()
        except OSError as exc:
            log.error("cannot write consume-queue or index entries at close (%s): the next "
                      "start replays the commit log", exc)  # fmt: skip
            clean = False
        if clean:
            mark_clean_shutdown(self._marker)
        for cq in self._queues.values():
            cq.close()
        self.commitlog.close()
        if self._index is not None:
            self._index.close()
        self._dir_lock.release()

    # ------------------------------------------------------------------ backup
    def cut(self) -> StoreCut:
        """Where the commit log, every queue and the index end now.

        Taken on the event loop, where every write is made whole between two awaits: no
        record, queue entry or index entry is half in it. The bytes below these ends never
        change afterwards, except by retention (hold it with `retention_held`). The queues'
        entries kept in memory are written first (OSError when they cannot be).
        """
        end = self.commitlog.end
        extents = self.commitlog.extents(end)
        counts: dict[str, int] = {}
        messages = 0
        for cq in self._queues.values():
            cq.write_tail()  # the copy reads the file
            extents.append((cq.path, cq.count * ENTRY.size))
            counts[cq.name] = cq.count
            messages += cq.count - cq.min_offset
        if self._index is not None:
            self._index.write_pending()
            extents += zip(self._index.paths, self._index.sizes(), strict=True)
        return StoreCut(end, counts, extents, messages)

    @contextlib.contextmanager
    def retention_held(self) -> Iterator[None]:
        """Delete nothing while inside (a backup copying files retention would trim)."""
        self._retention_holds += 1
        try:
            yield
        finally:
            self._retention_holds -= 1

    # ------------------------------------------------------------------ topics
    def create_topic(
        self, name: str, queue_count: int, retention: TopicRetention | None = None
    ) -> tuple[Topic, bool]:
        """Create a topic (idempotent for the same queue count and retention).

        Its queue files are opened before it is registered: a topic the process has no
        file descriptors left for is refused whole (TOO_MANY_OPEN_FILES), and so is one
        the registry could not save (DISK_FULL, STORE_UNAVAILABLE). Its file work runs on
        the calling thread: for the broker's start; a serving broker creates topics with
        create_topics(), through mockbroker/topic_creation.py, which checks the disk and
        the limits first.
        """
        existing = self.topics.existing(name, queue_count, retention)
        if existing is not None:
            for qid in range(existing.queue_count):
                self._queue_for(existing, qid)
            return existing, False
        topic = Topic(name, queue_count, retention or DEFAULT_RETENTION)
        self._queues.update(self._create_files([topic], self.topics.data_with([topic])))
        self.topics.add([topic])  # only once the file holds it: a restart finds it
        return topic, True

    async def create_topics(
        self,
        names: Sequence[str],
        queue_count: int,
        retention: TopicRetention | None = None,
        *,
        check: Callable[[list[str]], None] | None = None,
        created: Callable[[list[str]], None] | None = None,
    ) -> list[tuple[Topic, bool]]:
        """create_topic() for each of `names` while the broker serves: all, or none.

        The file work (opening the queue files, saving the registry, each fsync'd) runs in
        a worker thread, so that no client waits on it; the topics exist once the registry
        file holds them, as with create_topic(). Creations are one at a time (the
        registry's lock); one of a topic whose creation is under way waits for that one and
        answers as it did: (topic, False), or the same error. `check(missing)` is called
        under the lock before anything is created (it raises to refuse the creation) and
        `created(missing)` once they exist: another creation may have changed the answer.
        """
        registry = self.topics
        while pending := {self._creating[n] for n in names if n in self._creating}:
            for task in pending:
                await asyncio.shield(task)
        missing = [
            n for n in dict.fromkeys(names) if registry.existing(n, queue_count, retention) is None
        ]
        made: list[str] = []
        if missing:
            task = asyncio.ensure_future(
                self._create(missing, queue_count, retention, check, created)
            )
            for name in missing:
                self._creating[name] = task
            task.add_done_callback(lambda done: self._created(done, missing))
            made = await asyncio.shield(task)
        return [(registry.get(n), n in made) for n in names]

    async def _create(
        self,
        names: list[str],
        queue_count: int,
        retention: TopicRetention | None,
        check: Callable[[list[str]], None] | None,
        created: Callable[[list[str]], None] | None,
    ) -> list[str]:
        """Create those of `names` still missing under the lock; the names it created."""
        registry = self.topics
        async with registry.lock:
            # Created meanwhile by create_topic(), or a concurrent creation changed the limits.
            names = [n for n in names if registry.existing(n, queue_count, retention) is None]
            if not names:
                return names
            if check is not None:
                check(names)
            new = [Topic(n, queue_count, retention or DEFAULT_RETENTION) for n in names]
            data = registry.data_with(new)
            opened = await asyncio.to_thread(self._create_files, new, data)
            for key, cq in opened:
                if self._queues.setdefault(key, cq) is not cq:
                    cq.close()
            registry.add(new)
            if created is not None:
                created(names)
        return names

    def _create_files(
        self, new: list[Topic], data: bytes
    ) -> list[tuple[tuple[str, int], ConsumeQueue]]:
        """In a worker thread: open the queue files of `new`, then save the registry."""
        opened: list[tuple[tuple[str, int], ConsumeQueue]] = []
        try:
            for topic in new:
                for qid in range(topic.queue_count):
                    if (topic.name, qid) not in self._queues:
                        opened.append(((topic.name, qid), self._open_queue(topic.name, qid)))
            self.topics.write(data, [t.name for t in new], "created")
        except BaseException:
            for _, cq in opened:
                cq.close()
            raise
        return opened

    def _created(self, task: asyncio.Task[list[str]], names: list[str]) -> None:
        for name in names:
            if self._creating.get(name) is task:
                del self._creating[name]
        if not task.cancelled():
            task.exception()  # retrieved: every caller waiting for it may have been cancelled

    async def set_topic_retention(self, name: str, retention: TopicRetention) -> Topic:
        """Change a topic's own retention; it applies from the next retention check."""
        registry = self.topics

        async def change() -> Topic:
            async with registry.lock:  # saved (fsync'd) in a worker thread, as a creation
                topic, data = registry.with_retention(name, retention)
                await asyncio.to_thread(registry.write, data, [name], "changed")
                registry.add([topic])
            return topic

        # Shielded: a cancelled caller must not leave the file changed and memory not.
        topic = await asyncio.shield(asyncio.ensure_future(change()))
        log_event(
            log, logging.INFO, "retention.topic_changed",
            f"topic {name} retention: {retention.describe()}",
            topic=name, hours=retention.hours, bytes_per_queue=retention.bytes_per_queue,
        )  # fmt: skip
        return topic

    async def delete_topic(self, name: str) -> Topic:
        """Delete a topic: its registry entry, then its consume queues (TOPIC_NOT_FOUND).

        Its records stay in the commit log until retention deletes their segments; the
        registry marks them (every one lies below the log's end now), so that no read, no
        lookup by id or key and no recovery takes them for a topic created later with the
        same name, which starts at offset 0. The queue files go under the flusher's lock,
        so no fsync runs on a descriptor being closed; a crash before they are gone leaves
        them to the next start (_load), never to a topic created again.
        """
        flusher = self._flusher
        async with (
            self.topics.lock,
            flusher.lock if flusher is not None else contextlib.nullcontext(),
        ):
            topic = self.topics.delete(name, self.commitlog.end)
            fault_point("topic-delete-registered")
            for qid in range(topic.queue_count):
                cq = self._queues.pop((name, qid), None)
                if cq is not None:
                    cq.close()
            self._remove_queue_files(name)
        return topic

    def _remove_queue_files(self, name: str) -> None:
        directory = self._cq_dir / name
        if directory.exists():
            shutil.rmtree(directory)
            fsync_dir(self._cq_dir)

    def queue(self, topic: Topic, queue_id: int) -> ConsumeQueue:
        """The consume queue of an existing topic's queue (INVALID_QUEUE if out of range).

        TOPIC_NOT_FOUND once the topic is deleted: a request that found it before (a held
        pull, a send in flight) neither reads nor writes it, nor opens its files again.
        """
        found = self.topics.find(topic.name)
        if found is not topic and found != topic:
            self.topics.get(topic.name)  # TOPIC_NOT_FOUND
            raise not_found(
                "TOPIC_NOT_FOUND", f"topic {topic.name!r} was deleted and created again"
            )
        topic.check_queue(queue_id)
        return self._queue_for(topic, queue_id)

    # ------------------------------------------------------------------ writing
    def check(
        self,
        frames: bytes,
        *,
        start: int = 0,
        first_index: int = 0,
        max_frames: int | None = None,
        max_bytes: int | None = None,
        half: bool = False,
    ) -> CheckedFrames:
        """Validate a request's frames against the limits and the broker's clock.

        In parts, if asked; `half` for a half message (see records.check_frames).
        """
        return check_frames(
            frames,
            int(self._clock.now() * 1000),
            start=start,
            first_index=first_index,
            max_frames=max_frames,
            max_bytes=max_bytes,
            half=half,
        )

    def check_usual_parts(
        self, parts: Sequence[bytes], *, max_frames: int, max_bytes: int
    ) -> list[CheckedFrames] | None:
        """`check` of each part whole, in one call, for the usual request.

        None when that does not apply (records.check_usual_parts): check the parts one
        by one then.
        """
        return check_usual_parts(parts, max_frames=max_frames, max_bytes=max_bytes)

    async def put(self, topic: Topic, queue_id: int, frames: bytes) -> PutResult:
        """Validate and append a batch of frames that are due now."""
        checked = self.check(frames)
        if checked.scheduled:
            raise invalid("INVALID_DELIVERY_TIME", "scheduled frames go through the scheduler")
        return await self.append(topic, queue_id, frames, checked)

    async def append(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
        *,
        index_into: tuple[Topic, int] | None = None,
        reconsume_times: int = 0,
    ) -> PutResult:
        """Append checked frames as records of (topic, queue_id); durable per flush mode.

        They are indexed in that queue, or in `index_into` (for scheduled records).
        """
        written = self.write(
            topic,
            queue_id,
            frames,
            checked,
            index_into=index_into,
            reconsume_times=reconsume_times,
        )
        durable = await self.durable(written.end)
        return PutResult(written.first_offset, written.count, written.store_timestamp_ms, durable)

    def write(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
        *,
        index_into: tuple[Topic, int] | None = None,
        reconsume_times: int = 0,
    ) -> Written:
        """The synchronous part of `append`: write and index the records (`durable` is the rest).

        Several writes to one queue in a row give it consecutive offsets.
        """
        [written] = self.write_parts(
            topic,
            [Batch(queue_id, frames, checked)],
            index_into=index_into,
            reconsume_times=reconsume_times,
        )
        return written

    def lay_out(
        self,
        topic: Topic,
        batch: Batch,
        laid: LaidOut | None,
        *,
        first_offset: int,
        max_frames: int,
        max_bytes: int,
    ) -> LaidOut:
        """Lay out `batch`'s next records for write_parts; what earlier calls laid out too.

        At most `max_frames` records and `max_bytes` (but one record whatever its size),
        after `laid` (None: the first, at `first_offset`).
        Nothing is written: a write of a large batch stays one write (all or nothing),
        while the work of laying it out is done in slices before.
        """
        if laid is None:
            indexing = self._index is not None and not topic.name.startswith(SYSTEM_PREFIX)
            laid = LaidOut(
                first_offset, int(self._clock.now() * 1000), IdKeyEntries() if indexing else None
            )
        section = as_checked(batch.checked).section(laid.count, laid.count + max_frames, max_bytes)
        name = topic.name.encode()
        laid.entries.append(
            lay_out_records(
                batch.frames,
                section,
                laid.pieces,
                topic=name,
                queue_id=batch.queue_id,
                first_offset=laid.first_offset + laid.count,
                store_timestamp_ms=laid.store_timestamp_ms,
                base_position=laid.size,
                index=laid.index,
            )
        )
        laid.count += len(section)
        laid.size += section.frame_bytes() + len(section) * (RECORD.size + len(name))
        return laid

    def write_parts(
        self,
        topic: Topic,
        parts: list[Batch],
        *,
        index_into: tuple[Topic, int] | None = None,
        reconsume_times: int = 0,
        laid_out: Sequence[LaidOut | None] = (),
    ) -> list[Written]:
        """Write and index batches for several queues of `topic` in one pass; one Written each.

        One commit-log write for them all (so one fsync makes them durable: `durable` with
        the shared end), one index write per queue. Batches of one queue get consecutive
        offsets in the order given. All or nothing: a full disk rolls every batch back.
        `laid_out`: each batch's records laid out before (lay_out; None: not), used where
        they are whole and still take the offsets they were laid out at.
        """
        queues: dict[int, _QueueWrite] = {}  # by the queue indexed in (of index_name)
        targets: list[_QueueWrite] = []  # each batch's
        index_topic = topic if index_into is None else index_into[0]
        index_name = index_topic.name
        queue_count = topic.queue_count
        for part in parts:
            queue_id = part.queue_id
            if not 0 <= queue_id < queue_count:
                topic.check_queue(queue_id)  # INVALID_QUEUE
            index_queue = queue_id if index_into is None else index_into[1]
            target = queues.get(index_queue)
            if target is None:
                if not queues:  # the topic's lookup (`queue`) once: every queue is of it
                    cq = self.queue(index_topic, index_queue)
                else:
                    if index_into is not None:  # else checked above, as the batch's queue
                        index_topic.check_queue(index_queue)
                    cq = self._queue_for(index_topic, index_queue)
                target = queues[index_queue] = _QueueWrite(cq)
            targets.append(target)
        flusher = self._writable_flusher()
        store_ts = int(self._clock.now() * 1000)
        name = topic.name.encode()
        indexing = self._index is not None and not topic.name.startswith(SYSTEM_PREFIX)
        index_sizes = self._index.sizes() if self._index is not None else (0, 0)
        checks = [as_checked(part.checked) for part in parts]
        counts, sizes = counts_and_sizes(checks, RECORD.size + len(name))
        position = self.commitlog.end
        written: list[tuple[int, int, int]] = []  # (first offset, count, store time) each
        try:
            position = self.commitlog.make_room(sum(sizes))
            pieces: list[bytes | memoryview] = []
            index = IdKeyEntries() if indexing else None
            at = position
            if not laid_out:  # the usual request: every batch laid out here, in one call
                laid_parts = []
                for part, checked, count, target in zip(
                    parts, checks, counts, targets, strict=True
                ):
                    first = target.next_offset
                    target.next_offset = first + count
                    laid_parts.append((part.frames, checked, part.queue_id, first))
                    written.append((first, count, store_ts))
                entries = lay_out_parts(
                    laid_parts, pieces, topic=name, store_timestamp_ms=store_ts,
                    base_position=position, reconsume_times=reconsume_times, index=index,
                )  # fmt: skip
                for target, part_entries in zip(targets, entries, strict=True):
                    target.entries.append(part_entries)
            else:
                for i, (part, target, size, count) in enumerate(
                    zip(parts, targets, sizes, counts, strict=True)
                ):
                    first = target.next_offset
                    laid = laid_out[i] if i < len(laid_out) else None
                    if (
                        laid is not None
                        and laid.first_offset == first
                        and laid.count == count
                        and not reconsume_times
                    ):
                        pieces += laid.pieces
                        target.entries.append(rebase_entries(b"".join(laid.entries), at))
                        if index is not None and laid.index is not None:
                            index.take(laid.index, at)
                        written.append((first, count, laid.store_timestamp_ms))
                    else:
                        target.entries.append(
                            lay_out_records(
                                part.frames,
                                part.checked,
                                pieces,
                                topic=name,
                                queue_id=part.queue_id,
                                first_offset=first,
                                store_timestamp_ms=store_ts,
                                base_position=at,
                                reconsume_times=reconsume_times,
                                index=index,
                            )
                        )
                        written.append((first, count, store_ts))
                    target.next_offset = first + count
                    at += size
            self.commitlog.append(b"".join(pieces))
            for target in queues.values():
                target.cq.append(b"".join(target.entries))
            if index is not None:
                assert self._index is not None
                self._index.add(topic.name, index.positions, index.ids, index.keyed)
        except OSError as exc:
            if exc.errno == errno.ENOSPC and self._roll_back(position, queues, index_sizes):
                # Until the next disk check says otherwise. The disk is read again now:
                # sends that filled it since the last check would otherwise leave that
                # check's figure in the broker's status (under the refuse ratio).
                with contextlib.suppress(OSError):
                    self.disk = self._probe()
                self.refusing_sends = self._disk_refusing = self._out_of_space = True
                self._give_back_space()
                raise BrokerError(
                    StatusCode.UNAVAILABLE,
                    "DISK_FULL",
                    f"the disk is full: the batch was not stored ({exc}); retry later",
                ) from exc
            flusher.failure = exc
            log.critical("write failed; the store now refuses writes: %s", exc)
            raise BrokerError(
                StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", f"write failed: {exc}"
            ) from exc
        end = self.commitlog.end
        stored = sum(counts)
        self.stats.messages_stored += stored
        by_topic = self.stats.stored_by_topic
        by_topic[index_name] = by_topic.get(index_name, 0) + stored
        if self.sync_flush:  # readable once synced
            self._unannounced.extend((end, (index_name, q)) for q in queues)
        elif self.on_append is not None:
            for q in queues:
                self.on_append(index_name, q)
        return [Written(first, count, ts, end) for first, count, ts in written]

    async def durable(self, end: int) -> bool:
        """Sync mode: wait until the commit log is synced up to `end` (False: that timed out).

        Async mode: True at once (the periodic flush syncs it).
        """
        if not self.sync_flush:
            return True
        return await self._await_flush(self._writable_flusher(), end)

    def _roll_back(
        self,
        position: int,
        queues: dict[int, _QueueWrite],
        index_sizes: tuple[int, int],
    ) -> bool:
        """Undo a write cut short by a full disk, back to where it began; True on success.

        Nothing of it was answered or served: its records, index entries and id/key
        entries go, so the next write takes the same position and offsets.
        """
        try:
            for target in queues.values():
                target.cq.truncate(target.first_offset)
            if self._index is not None:
                self._index.roll_back(index_sizes)
            self.commitlog.truncate(position)
        except OSError as exc:
            log.critical("cannot roll back a batch the full disk cut short: %s", exc)
            return False
        log.error("disk full: the batch at commit-log position %d was rolled back", position)
        return True

    def _reindex(self, replayed: list[tuple[RecordHeader, int]]) -> None:
        """Index the records recovery replayed by id and key again.

        The index files are synced with the commit log, but a power cut may keep a
        record's bytes and lose its index entries (another file): without this, a lookup
        by id would miss it (and a transaction's commit could be made twice). Entries the
        index still held come twice; lookups take each position once.
        """
        assert self._index is not None
        by_topic: dict[str, tuple[list[int], list[bytes], list[tuple[int, bytes]]]] = {}
        for header, position in replayed:
            if header.topic.startswith(SYSTEM_PREFIX):
                continue  # not indexed when written either
            positions, ids, keyed = by_topic.setdefault(header.topic, ([], [], []))
            positions.append(position)
            ids.append(header.msg_id)
            if header.keys:
                keyed.append((position, header.keys))
        for topic, (positions, ids, keyed) in by_topic.items():
            self._index.add(topic, positions, ids, keyed)

    def find_by_id(self, msg_id: bytes, limit: int = 32) -> list[bytes]:
        """Stored records with this message id (original, retries, dead letter), newest first."""
        return [record for _, record in itertools.islice(self.records_by_id(msg_id), limit)]

    def find_by_key(self, topic: str, key: str, limit: int = 32) -> list[bytes]:
        """Stored records of `topic` carrying `key`, newest first."""
        return [record for _, record in itertools.islice(self.records_by_key(topic, key), limit)]

    def records_by_id(self, msg_id: bytes) -> Iterator[tuple[int, bytes]]:
        """(commit-log position, record) of each record with this message id, newest first."""
        assert self._index is not None
        return self._verified(self._index.positions_of_id(msg_id), lambda r: r.msg_id == msg_id)

    def records_by_key(self, topic: str, key: str) -> Iterator[tuple[int, bytes]]:
        """(commit-log position, record) of each record of `topic` carrying `key`, newest first."""
        assert self._index is not None
        raw = key.encode()

        def carries_key(r: StoredRecord) -> bool:
            return r.topic == topic and raw in r.keys.split(b"\0")

        return self._verified(self._index.positions_of_key(topic, raw), carries_key)

    def _verified(
        self, positions: Iterator[int], match: Callable[[StoredRecord], bool]
    ) -> Iterator[tuple[int, bytes]]:
        seen: set[int] = set()
        for position in positions:
            if position in seen or not self._readable(position, MIN_RECORD_SIZE):
                continue
            seen.add(position)
            size = RECORD.unpack(self.commitlog.read(position, RECORD.size))[0]
            if not self._readable(position, size):
                continue
            record = self.commitlog.read(position, size)
            try:
                [parsed] = list(iter_records(record))
            except RecordFormatError:
                continue  # a stale entry, or a corrupt record: never answered
            if match(parsed) and self.topics.holds(parsed.topic, position):
                yield position, record

    def read_at(self, position: int) -> bytes | None:
        """The record of a message stored at commit-log `position`; None if none starts there.

        Only a record its queue's index points at is answered (so bytes inside a message
        body that look like a record are never taken for one), and in sync mode only once
        it is flushed. A scheduled message still waiting is indexed in the schedule queue,
        not its own, and is not found here.
        """
        if not self._readable(position, MIN_RECORD_SIZE):
            return None
        size, _crc, magic, queue_id, queue_offset, _ts, _times, topic_len = RECORD.unpack(
            self.commitlog.read(position, RECORD.size)
        )
        if magic != RECORD_MAGIC or not self._readable(position, size):
            return None
        if self.sync_flush and position + size > self.commitlog.flushed:
            return None
        record = self.commitlog.read(position, size)
        if not _intact(memoryview(record), size):
            return None
        try:
            topic = record[RECORD.size : RECORD.size + topic_len].decode()
        except UnicodeDecodeError:
            return None
        cq = self._lookup(topic, queue_id)
        if cq is None or not cq.min_offset <= queue_offset < cq.count:
            return None
        indexed_at, indexed_size, _ = cq.entry(queue_offset)
        return record if (indexed_at, indexed_size) == (position, size) else None

    def end_offset(self, topic: Topic, queue_id: int) -> int:
        """The offset after the last message a reader can get; in sync mode, the last synced.

        A message past it is not served yet, and a power cut may lose it and give its
        offset to another: no consumer may start, and no offset may be committed, past it.
        """
        cq = self.queue(topic, queue_id)
        if not self.sync_flush:
            return cq.max_offset
        return cq.count_before(self.commitlog.flushed, lo=cq.min_offset)

    def read_record(self, topic: Topic, queue_id: int, offset: int) -> bytes:
        """The stored record at `offset` of a queue, its CRC verified."""
        cq = self.queue(topic, queue_id)
        if not cq.min_offset <= offset < cq.max_offset:
            raise out_of_range(
                "INVALID_OFFSET",
                f"offset {offset} of {topic.name} queue {queue_id} is outside "
                f"[{cq.min_offset}, {cq.max_offset})",
            )
        position, size, _ = cq.entry(offset)
        if self._readable(position, size):
            record = self.commitlog.read(position, size)
            if _intact(memoryview(record), size):
                return record
        self._corrupt(topic, queue_id, offset, position, served=0)
        raise AssertionError("unreachable: _corrupt raises when nothing was served")

    def write_refusal(self) -> str | None:
        """Why the store refuses writes now; None when it accepts them."""
        flusher = self._flusher
        if flusher is None or self._closed:
            return "the store is not running"
        if flusher.failure is not None:
            return f"the store refuses writes after a failed write or fsync: {flusher.failure}"
        return None

    def _writable_flusher(self) -> Flusher:
        flusher = self._flusher
        if flusher is None or self._closed or flusher.failure is not None:
            raise BrokerError(
                StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", f"{self.write_refusal()}"
            )
        return flusher

    async def _await_flush(self, flusher: Flusher, position: int) -> bool:
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
            # cancellation of the request that arrives as the fsync completes.
            async with asyncio.timeout(self._sync_timeout):
                await asyncio.shield(flusher.wait_durable(position))
        except TimeoutError:
            return False
        except FlushFailedError as exc:
            raise BrokerError(
                StatusCode.DATA_LOSS,
                "FLUSH_FAILED",
                f"fsync failed; the message is not acknowledged: {exc}",
            ) from exc
        return True

    # ------------------------------------------------------------------ reading
    def get(
        self,
        topic: Topic,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[bytes] | None = None,
        slice_bytes: int | None = None,
        first_over_budget: bool = True,
    ) -> GetResult:
        """Read up to `max_messages` / `max_bytes` from `offset` (RocketMQ's pull rules).

        The first message is served even when it is larger than `max_bytes`, unless
        `first_over_budget` is False. With `slice_bytes`, no more messages are added once
        that many bytes were chosen (a slice of a larger read: mockbroker/fairness.py).
        """
        cq = self.queue(topic, queue_id)
        lo, hi = cq.min_offset, cq.max_offset
        if self.sync_flush and lo <= offset < hi:
            # Nothing is served before its fsync: a consumer could otherwise commit past a
            # record that a crash then loses, and skip the one that takes its offset.
            hi = cq.count_before(self.commitlog.flushed, lo=offset)
        if offset < lo:
            return GetResult("OFFSET_ILLEGAL", lo, lo, hi)
        if offset > hi:
            return GetResult("OFFSET_ILLEGAL", hi, lo, hi)
        if offset == hi:
            return GetResult("NO_NEW_MESSAGE", offset, lo, hi)
        hashes = None if tags is None else {zlib.crc32(t) if t else 0 for t in tags}
        scan = max_messages if hashes is None else min(max_messages * _SCAN_FACTOR, _MAX_SCAN)
        entries = cq.read(offset, min(scan, hi - offset))
        chosen: list[tuple[int, int, int]] = []  # (queue offset, position, size)
        next_offset = offset
        budget = max_bytes
        enough = max_bytes - slice_bytes if slice_bytes is not None else -1
        for i, (position, size, tag_hash) in enumerate(entries):
            if hashes is not None and size >= MIN_RECORD_SIZE and tag_hash not in hashes:
                next_offset = offset + i + 1
                continue
            if chosen and (len(chosen) >= max_messages or size > budget or budget <= enough):
                break
            if not chosen and not first_over_budget and size > budget:
                break
            chosen.append((offset + i, position, size))
            budget -= size
            next_offset = offset + i + 1
        records, served, read_to = self._read_records(topic, queue_id, chosen, tags, next_offset)
        if not served:
            return GetResult("NO_MATCHED_MESSAGE", read_to, lo, hi)
        self.stats.messages_served += served
        by_topic = self.stats.served_by_topic
        by_topic[topic.name] = by_topic.get(topic.name, 0) + served
        return GetResult("FOUND", read_to, lo, hi, records, served, corrupt=read_to < next_offset)

    def _read_records(
        self,
        topic: Topic,
        queue_id: int,
        chosen: list[tuple[int, int, int]],
        tags: frozenset[bytes] | None,
        next_offset: int,
    ) -> tuple[bytes, int, int]:
        """Read the chosen records with one pread per contiguous stretch; verify each CRC."""
        out: list[bytes] = []
        served = 0
        log_end = self.commitlog.end
        crc32, unpack_head = crc32_of, RECORD_HEAD.unpack_from
        i = 0
        while i < len(chosen):
            first_offset, start, first_size = chosen[i]
            if not self._readable(start, first_size):
                self._corrupt(topic, queue_id, first_offset, start, served)
                return b"".join(out), served, first_offset
            end = start + first_size
            j = i + 1
            while (
                j < len(chosen)
                and chosen[j][1] == end
                and MIN_RECORD_SIZE <= chosen[j][2] <= log_end - end
            ):
                end += chosen[j][2]
                j += 1
            data = self.commitlog.read(start, end - start)
            view = memoryview(data)
            # The records kept are copied out once per run of them, not one by one: a
            # read of a stretch that keeps every record answers with the pread's bytes.
            run = 0  # where the records not yet in `out` start, in `data`
            for k in range(i, j):
                q_offset, position, size = chosen[k]
                at = position - start
                head_size, crc = unpack_head(data, at)
                # The CRC covers everything after the size and CRC fields; the size
                # field must agree with the index, or a reader would cut the answer
                # apart wrongly (_intact).
                if crc32(view[at + 8 : at + size]) != crc or head_size != size:
                    out.append(data[run:at])
                    self._corrupt(topic, queue_id, q_offset, position, served)
                    return b"".join(out), served, q_offset
                if tags is not None:
                    record_tags = _record_tags(view[at : at + size])
                    if record_tags is None:  # a good CRC over lengths that do not add up
                        out.append(data[run:at])
                        self._corrupt(topic, queue_id, q_offset, position, served)
                        return b"".join(out), served, q_offset
                    if record_tags not in tags:
                        out.append(data[run:at])
                        run = at + size
                        continue
                served += 1
            out.append(data[run:])
            i = j
        return b"".join(out), served, next_offset

    def _readable(self, position: int, size: int) -> bool:
        """True for an index entry that can point at a record, false for a damaged one.

        Not marked corrupt, not too small for a record (a hole a power cut or damage left in
        an index reads as zeros, and an empty record would pass the checks), and within the
        commit log.
        """
        log = self.commitlog
        return size >= MIN_RECORD_SIZE and log.start <= position and position + size <= log.end

    def _corrupt(
        self, topic: Topic, queue_id: int, offset: int, position: int, served: int
    ) -> None:
        self.stats.corrupt_records_detected += 1
        log.error(
            "corrupt record: %s queue %d offset %d (commit log position %d) fails its checks",
            topic.name, queue_id, offset, position,
        )  # fmt: skip
        if not served:
            raise BrokerError(
                StatusCode.DATA_LOSS,
                "CORRUPT_RECORD",
                f"the record at {topic.name} queue {queue_id} offset {offset} is corrupt "
                f"(commit log position {position}) and is not served; reset the consumer "
                f"offset past it to continue",
            )

    def offset_for_timestamp(self, topic: Topic, queue_id: int, timestamp_ms: int) -> int:
        """The first offset stored at or after `timestamp_ms`; the max offset if none."""
        return self._first_stored_since(self.queue(topic, queue_id), timestamp_ms)

    def _stored_at(self, cq: ConsumeQueue, offset: int) -> int:
        while offset >= cq.min_offset:
            position, size, _ = cq.entry(offset)
            if self._readable(position, size):
                return int(RECORD.unpack(self.commitlog.read(position, RECORD.size))[5])
            offset -= 1  # a corrupt one: its neighbours bound it, the one before is as good
        return 0

    def offset_store_timestamp_ms(self, topic: Topic, queue_id: int, offset: int) -> int:
        """When the message at `offset` of a queue was stored (0 below the min offset)."""
        return self._stored_at(self.queue(topic, queue_id), offset)

    def last_store_timestamp_ms(self, topic: Topic, queue_id: int) -> int:
        """When the newest message of a queue was stored; 0 for an empty queue."""
        cq = self.queue(topic, queue_id)
        return self._stored_at(cq, cq.count - 1) if cq.count > cq.min_offset else 0

    # ------------------------------------------------------------------ retention
    async def _retain(self) -> None:
        while True:
            await sleep_for(self._clock, self._retention_check)
            try:
                self.enforce_retention()
            except OSError as exc:
                log.error("retention check failed (retried at the next check): %s", exc)
            except Exception:
                # A fault in one check must not end retention for the broker's lifetime
                # (the disk would fill, or sends stay refused after it was freed).
                log.exception("retention check failed (retried at the next check)")

    def enforce_retention(self) -> int:
        """Delete the segments past the age limit, and more while the disk is too full.

        Updates the disk usage and whether sends are refused; returns the bytes deleted.
        When deleting fails, the disk is read again and sends are refused or accepted by
        it before the error is raised: a failing deletion must not leave sends accepted
        while the disk fills (they would run into ENOSPC instead of the refuse ratio).
        """
        try:
            return self._enforce_retention()
        except Exception:
            with contextlib.suppress(Exception):  # the deletion's error is the one to raise
                self._set_disk(self._probe(), self.commitlog.total_bytes())
            raise

    def _enforce_retention(self) -> int:
        policy = self.retention
        usage = self._probe()
        if self._retention_holds:  # a backup is copying: deletion waits for the next check
            self._set_disk(usage, self.commitlog.total_bytes())
            return 0
        self._expire_topics()
        limit = self._deletable_limit()
        bases = self.commitlog.segment_bases()
        horizon_ms = int((self._clock.now() - policy.retention_seconds) * 1000)
        held = self._held_by_topics()
        age_limit = limit if held is None else min(limit, held)
        floor = age_floor(bases, self._first_timestamp_ms, horizon_ms, age_limit)
        freed = self._delete_below(floor, "past the retention time") if floor > bases[0] else 0
        if freed:
            usage = self._probe()
        data = self.commitlog.total_bytes()
        while usage.ratio >= policy.clean_ratio or over_cap(policy, data):
            floor_ = next_floor(self.commitlog.segment_bases(), self.commitlog.start, limit)
            if floor_ is None:
                break
            unread = self._unread_below(floor_)
            why = early_reason(policy, usage, data, bool(unread))
            if why is None:
                break  # unread data waits for the disk to be about to fill
            freed += self._delete_early(floor_, why, unread)
            usage, data = self._probe(), self.commitlog.total_bytes()
            if not keep_deleting(policy, usage, data):
                break  # below the force ratio and the cap, one segment per check
        self._set_disk(usage, data)
        return freed

    def _expire_topics(self) -> None:
        """Move the min offsets of topics with their own retention past what expired."""
        now_ms = int(self._clock.now() * 1000)
        windows: dict[tuple[str, int], SizeWindow] = {}
        for topic in self.topics.all():
            retention = topic.retention
            if retention.is_default:
                continue
            expired = 0
            for qid in range(topic.queue_count):
                key = (topic.name, qid)
                cq = self._queue_for(topic, qid)
                old_min = floor = cq.min_offset
                if retention.hours is not None:
                    horizon_ms = now_ms - int(retention.hours * 3_600_000)
                    floor = self._first_stored_since(cq, horizon_ms)
                if retention.bytes_per_queue is not None:
                    window = windows[key] = self._size_windows.get(key) or SizeWindow()
                    floor = max(floor, window.floor(cq, retention.bytes_per_queue))
                if cq.trim_to(floor) > old_min:
                    expired += cq.min_offset - old_min
                    if self.on_trim is not None:
                        self.on_trim(topic.name, qid, old_min, cq.min_offset)
            if expired:
                self.retention_stats.messages_expired += expired
                log_event(
                    log, logging.INFO, "retention.expired",
                    f"topic {topic.name}: {expired} messages expired "
                    f"(its retention: {retention.describe()})",
                    topic=topic.name, messages=expired,
                )  # fmt: skip
        self._size_windows = windows

    def _first_stored_since(self, cq: ConsumeQueue, horizon_ms: int) -> int:
        """The first offset of `cq` stored at or after `horizon_ms` (its max if none)."""
        lo, hi = cq.min_offset, cq.max_offset
        if lo >= hi or self._stored_at(cq, lo) >= horizon_ms:
            return lo  # the common case: nothing has expired since the last check
        while lo < hi:
            mid = (lo + hi) // 2
            if self._stored_at(cq, mid) < horizon_ms:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def _held_by_topics(self) -> int | None:
        """The oldest commit-log position a topic kept longer than the broker still serves.

        None when no topic keeps its messages longer than the broker's retention time.
        """
        default_hours = self.retention.retention_seconds / 3600
        now_ms = int(self._clock.now() * 1000)
        held: int | None = None
        for topic in self.topics.all():
            hours = topic.retention.hours
            if hours is None or hours <= default_hours:
                continue
            horizon_ms = now_ms - int(hours * 3_600_000)
            for qid in range(topic.queue_count):
                cq = self._queue_for(topic, qid)
                offset = self._first_stored_since(cq, horizon_ms)
                if offset < cq.count:
                    position = cq.entry(offset)[0]
                    held = position if held is None else min(held, position)
        return held

    def check_accepting_sends(self) -> None:
        """DISK_FULL (retriable) while sends are refused.

        That is while the disk is over the refuse ratio, or the commit log stays over
        `max_data_bytes`. While the last reading found the disk over the clean ratio
        (`disk_high_ratio`), every call reads it again: sends could otherwise fill it to
        the last byte between two checks, and then nothing else (the lock table, offsets,
        a checkpoint) could be saved.
        """
        if (
            not self.refusing_sends
            and self.disk is not None
            and self.disk.ratio >= self.retention.clean_ratio
        ):
            with contextlib.suppress(OSError):  # unreadable: the periodic check decides
                usage = self._probe()
                if usage.ratio >= self.retention.refuse_ratio:
                    self._set_disk(usage, self.commitlog.total_bytes())
                else:
                    self.disk = usage
        if self.refusing_sends:
            self.retention_stats.sends_refused += 1
            raise BrokerError(
                StatusCode.UNAVAILABLE,
                "DISK_FULL",
                f"{self.refusal()}: sends are refused until space is freed "
                "(reads, offset commits and locks still work); retry later",
            )

    def refusal(self) -> str:
        """Why sends are refused, as an error message starts (while refusing_sends)."""
        if self._over_cap is not None:
            return (
                f"the broker's commit log holds {self._over_cap} bytes, over its cap "
                f"(max_data_bytes) of {self.retention.max_data_bytes}, and the segments "
                "over it are still needed"
            )
        if self._out_of_space:
            return "the broker's disk is full: a write found no space left on the device"
        used = f"{self.disk.ratio:.1%}" if self.disk is not None else "100%"
        return (
            f"the broker's disk is {used} full, over the limit of {self.retention.refuse_ratio:.0%}"
        )

    def oldest_timestamp_ms(self) -> int:
        """When the oldest record still stored was stored (0 when the log is empty)."""
        start = self.commitlog.start
        return self._first_timestamp_ms(start) if start < self.commitlog.end else 0

    def _set_disk(self, usage: DiskUsage, data_bytes: int) -> None:
        capped = over_cap(self.retention, data_bytes)
        if capped != (self._over_cap is not None):
            log_event(
                log, logging.ERROR if capped else logging.WARNING,
                "data.sends_refused" if capped else "data.sends_resumed",
                f"commit log {data_bytes} bytes, cap {self.retention.max_data_bytes}: sends "
                + ("refused: the segments over the cap are still needed" if capped
                   else "accepted again"),
                data_bytes=data_bytes, max_data_bytes=self.retention.max_data_bytes,
            )  # fmt: skip
        self._over_cap = data_bytes if capped else None
        refusing = usage.ratio >= self.retention.refuse_ratio
        if refusing != self._disk_refusing:
            level, what = (
                (logging.ERROR, "refused") if refusing else (logging.WARNING, "accepted again")
            )
            log_event(
                log, level, "disk.sends_refused" if refusing else "disk.sends_resumed",
                f"disk {usage.ratio:.1%} used ({usage.free_bytes} bytes free): sends {what}",
                used_ratio=round(usage.ratio, 4), free_bytes=usage.free_bytes,
            )  # fmt: skip
        self.disk, self._disk_refusing, self._out_of_space = usage, refusing, False
        self.refusing_sends = refusing or capped
        if self._room_for_spare():
            self.commitlog.prepare_spare()
        else:
            self._give_back_space()

    def _give_back_space(self) -> None:
        """The disk is filling up: free what the commit log allocated ahead of its writes."""
        try:
            self.commitlog.give_back_space()
        except OSError as exc:
            log.warning("cannot free the commit log's space allocated ahead: %s", exc)

    def _room_for_spare(self) -> bool:
        """Whether the commit log may keep a spare segment (it takes a segment's space).

        Only while the disk is under the clean ratio (`disk_high_ratio`) and no write has
        found it full since the last check: the space is better left to the writes.
        """
        disk = self.disk
        return (
            disk is not None and not self._out_of_space and disk.ratio < self.retention.clean_ratio
        )

    def _deletable_limit(self) -> int:
        """Nothing at or past this position may be deleted."""
        flusher = self._flusher
        limit = flusher.checkpointed if flusher is not None else 0
        if self.protected_position is not None:
            protected = self.protected_position()
            if protected is not None:
                limit = min(limit, protected)
        return limit

    def _unread_below(self, floor: int) -> dict[str, int]:
        """Per group, the messages below `floor` it has not consumed (see early_deletion)."""
        if self.committed_offsets is None:
            return {}
        trims = {}
        for key, cq in self._queues.items():
            new_min = max(cq.min_offset, cq.count_before(floor, lo=cq.min_offset))
            if new_min > cq.min_offset:
                trims[key] = (cq.min_offset, new_min)
        return unread_by_group(trims, self.committed_offsets()) if trims else {}

    def _delete_early(self, floor: int, why: str, unread: dict[str, int]) -> int:
        """Delete the oldest segment (up to `floor`) before its time, with a warning."""
        segment = self.commitlog.start
        groups = ", ".join(f"{g} ({n})" for g, n in unread.items()) or "none"
        log_event(
            log, logging.WARNING, "retention.early_deletion",
            f"deleting commit-log segment {segment:020d} before its retention time: {why}; "
            f"groups with unread messages in it (how many): {groups}",
            segment=segment, floor=floor, reason=why, unread=unread,
        )  # fmt: skip
        self.retention_stats.segments_deleted_early += 1
        return self._delete_below(floor, why)

    def _delete_below(self, floor: int, why: str) -> int:
        """Delete the segments below `floor` and trim everything derived from them."""
        before = {key: cq.min_offset for key, cq in self._queues.items()}
        freed = self.commitlog.delete_below(floor)
        self._trim_to_log_start()
        deleted = 0
        for key, cq in self._queues.items():
            old_min = before.get(key, 0)
            if cq.min_offset > old_min:
                deleted += cq.min_offset - old_min
                if self.on_trim is not None:
                    self.on_trim(key[0], key[1], old_min, cq.min_offset)
        for base in [b for b in self._first_ts if b < floor]:
            del self._first_ts[base]
        stats = self.retention_stats
        stats.segments_deleted += 1
        stats.bytes_deleted += freed
        stats.messages_deleted += deleted
        log_event(
            log, logging.INFO, "retention.deleted",
            f"commit log now starts at {floor}: {freed} bytes, {deleted} messages deleted ({why})",
            floor=floor, bytes=freed, messages=deleted,
        )  # fmt: skip
        return freed

    def _trim_to_log_start(self) -> None:
        start = self.commitlog.start
        for cq in self._queues.values():
            cq.trim_below(start)
        if self._index is not None:
            self._index.trim_below(start)

    def _first_timestamp_ms(self, base: int) -> int:
        """The store time of the first record at segment `base` (cached: it never changes)."""
        ts = self._first_ts.get(base)
        if ts is None:
            if base + RECORD.size > self.commitlog.end:
                return int(self._clock.now() * 1000)  # empty: as new as it gets
            ts = int(RECORD.unpack(self.commitlog.read(base, RECORD.size))[5])
            self._first_ts[base] = ts
        return ts

    # ------------------------------------------------------------------ internals
    def _queue_for(self, topic: Topic, queue_id: int) -> ConsumeQueue:
        key = (topic.name, queue_id)
        cq = self._queues.get(key)
        if cq is None:
            cq = self._queues[key] = self._open_queue(topic.name, queue_id)
        return cq

    def _open_queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """A queue's index file, created if missing (TOO_MANY_OPEN_FILES)."""
        try:
            return ConsumeQueue(self._cq_dir / topic / str(queue_id))
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            raise BrokerError(
                StatusCode.RESOURCE_EXHAUSTED,
                "TOO_MANY_OPEN_FILES",
                f"cannot open the files of {topic} queue {queue_id}: {exc.strerror}; "
                "each queue keeps a file open: raise the broker's open-files limit "
                "(ulimit -n, systemd LimitNOFILE=)",
            ) from exc

    def _lookup(self, topic_name: str, queue_id: int) -> ConsumeQueue | None:
        topic = self.topics.find(topic_name)
        if topic is None or not 0 <= queue_id < topic.queue_count:
            return None
        return self._queue_for(topic, queue_id)


def _intact(record: memoryview, size: int) -> bool:
    """The record an index entry of `size` points at passes its checks.

    The CRC covers everything after the size and CRC fields; the size field must agree with
    the index, or a reader would cut the answer apart wrongly.
    """
    return crc32_of(record[8:]) == int.from_bytes(record[4:8], "little") and (
        int.from_bytes(record[:4], "little") == size
    )


def _record_tags(record: memoryview) -> bytes | None:
    """The record's tags; None when its lengths do not fit in it."""
    topic_len = int.from_bytes(record[RECORD.size - 2 : RECORD.size], "little")
    at = RECORD.size + topic_len
    if at + FRAME_FIELDS.size > len(record):
        return None
    tl = FRAME_FIELDS.unpack_from(record, at)[4]
    start = at + FRAME_FIELDS.size
    return bytes(record[start : start + tl]) if start + tl <= len(record) else None


def parse_tag_expression(expression: str) -> frozenset[bytes] | None:
    """`*` or empty -> None (everything); `A || B` -> {b"A", b"B"}; INVALID_TAG_EXPRESSION."""
    try:
        tags = split_tag_expression(expression)
    except ValueError as exc:
        raise invalid("INVALID_TAG_EXPRESSION", str(exc)) from None
    return None if tags is None else frozenset(t.encode() for t in tags)
