"""Receive, ack, change invisible duration: RocketMQ 5's pop semantics on the store.

A receive takes messages of a topic for a consumer group and hides each from the group's
other receives for an invisible duration (the job's time-to-run); an ack settles it; a
change of invisible duration gives the message a new deadline and a new receipt; once a
deadline passes without an ack the message is visible again and is delivered again, with
its attempt count one higher. A message delivered `max_attempts` times whose last lease
ran out goes to the group's dead-letter topic `%DLQ%<group>` instead. Every front (ordermq's
gRPC, RocketMQ's apache.rocketmq.v2) calls this one implementation.

Where state lives. Per (group, topic, queue) a Window (window.py) holds what the group
received and has not settled; the group's base offset there (its first unsettled message)
is its progress, and is mirrored into the consumer offsets (offsets.json) every commit
interval, so that `ordermq groups describe` shows its lag like any group's. The journal
(journal.py) is the truth for pop groups: a receive's leases, acks, changes and
dead-letterings are journaled and synced before they are answered, so after a kill -9 a
message received and not acked comes back (once its invisible time has passed) and an
acked one does not. A group new to a queue starts at its committed offset if it has one
(a group that consumed by pulls before), else at the queue's earliest message.

Rules.
- Messages of one queue are delivered in offset order; a receive without queue ids takes
  from every queue of the topic, starting at a different queue each time.
- FIFO groups: a message is delivered only once every earlier message of its queue with
  the same sharding key (its message group; messages without one form one group per
  queue) is settled, acknowledged or dead-lettered. A receive may not switch a group
  between FIFO and not while the group has delivered, unsettled messages.
- A group holds at most `max_in_flight` messages of a queue between its base and its pop
  position (delivered or held back behind them); past it, receives answer fewer.
- Acks are idempotent: acking an already settled message answers OK and changes
  nothing, unless the receipt is an expired one that did not settle it (RECEIPT_EXPIRED).
- Pops of one group never touch another group's offsets, locks or windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid
from mockbroker.fair_store import SlicedStore
from mockbroker.limits import ClientLimits
from mockbroker.long_polling import PullHolder
from mockbroker.offsets import ConsumerOffsets
from mockbroker.pop.journal import Journal
from mockbroker.pop.receipts import (
    Receipt,
    invalid_receipt,
    new_nonce,
    parse_receipt,
    receipt_expired,
    stale_receipt,
)
from mockbroker.pop.stats import PopStats
from mockbroker.pop.window import UINT64, Entry, Lease, Window, b64, natural, unb64
from mockbroker.retry import RetryService
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import Topic, check_any_topic, check_group, name_checked
from sdk._validation import DLQ_PREFIX
from sdk._wire import FRAME_FIELDS, MAX_PULL_BYTES, RECORD
from sdk.clock import Clock

log = logging.getLogger("mockbroker.pop")

#: Most messages one receive asks for.
MAX_RECEIVE_MESSAGES = 1000
#: Longest invisible duration (RocketMQ's proxy allows 12 hours too).
MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: Longest a receive may wait for messages (as a held pull).
MAX_WAIT_MS = 60_000
#: Highest per-group delivery-attempt limit a receive may set.
MAX_ATTEMPTS_LIMIT = 1000
#: Messages read from the store at once to fill a window (FIFO groups read past held ones).
_READ_AHEAD = 32
#: How long a dead-letter copy that failed (a full disk) waits before it is tried again.
_DLQ_RETRY_MS = 1000

QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Received:
    """A message a receive delivered: its stored record and its receipt."""

    topic: str
    queue_id: int
    offset: int
    record: bytes  # the stored record, as a pull serves it (sdk/_wire.py)
    receipt: str
    attempt: int  # 1 on the first delivery
    invisible_until_ms: int  # on the broker's clock


@dataclass(frozen=True, slots=True)
class Renewed:
    """What a change of invisible duration answers: the message's new receipt."""

    receipt: str
    attempt: int
    invisible_until_ms: int


@dataclass
class _Group:
    fifo: bool
    max_attempts: int
    windows: dict[QueueKey, Window] = field(default_factory=dict)
    turn: dict[str, int] = field(default_factory=dict)  # topic -> queue index to start at


@dataclass(frozen=True)
class PopPolicy:
    """How a group receives: FIFO or not, and its deliveries before the dead-letter topic."""

    fifo: bool
    max_attempts: int


@dataclass(frozen=True)
class PopProgress:
    """One group's pop state on one queue, for operators."""

    base: int  # first unsettled offset (what its committed offset becomes)
    position: int  # next offset no receive has looked at
    in_flight: int  # messages a receive holds now


class PopService:
    """Pop groups' windows, their journal and their background work (see the module)."""

    def __init__(
        self,
        directory: Path,
        *,
        store: MessageStore,
        offsets: ConsumerOffsets,
        retry: RetryService,
        holder: PullHolder,
        clock: Clock,
        max_in_flight: int,
        max_attempts: int,
        commit_interval_seconds: float,
    ) -> None:
        self._store = store
        self._offsets = offsets
        self._retry = retry
        self._holder = holder
        self._clock = clock
        self.max_in_flight = max_in_flight
        self.default_max_attempts = max_attempts
        self._commit_interval = commit_interval_seconds
        self.journal = Journal(directory)
        self._groups: dict[str, _Group] = {}
        self._exhausted: set[tuple[str, str, int, int]] = set()  # to dead-letter
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: What the groups did since start (the metrics page reads it).
        self.stats = PopStats()
        #: Set by the server: a receive naming its client reads the store in slices that
        #: take turns with other clients' sends and pulls (None: at once), and waits while
        #: its client is over its in-flight limit, its answer counting against it.
        self.sliced: SlicedStore | None = None
        self.limits: ClientLimits | None = None

    @property
    def dead_lettered(self) -> int:
        """Messages dead-lettered since start, every group's."""
        return sum(self.stats.dead_lettered.values())

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Recover the windows from the journal and fit them to the store (at start).

        CorruptFileError when the snapshot or a record cannot be read.
        """
        self.journal.open(self._restore, self._replay)
        store = self._store
        for group, g in self._groups.items():
            for (topic_name, qid), window in list(g.windows.items()):
                window.restored()
                topic = store.topics.find(topic_name)
                if topic is None or qid >= topic.queue_count:
                    del g.windows[(topic_name, qid)]
                    continue
                cq = store.queue(topic, qid)
                window.truncate(cq.max_offset)  # an async-flush crash lost the log's tail
                # The committed offset mirrors a base that may have passed what survived:
                # never past the queue's end, or the messages stored next at the lost
                # offsets would be skipped.
                committed = self._offsets.get(group, topic_name, qid)
                window.move_base(min(max(committed or 0, cq.min_offset), cq.max_offset))
        log.info("pop state of %d group(s) recovered (%d journal records replayed)",
                 len(self._groups), self.journal.replayed)  # fmt: skip
        self._open_journal(self._state())

    def _open_journal(self, state: dict[str, Any]) -> bool:
        """Start the journal's new generation; False when the disk has no room for it.

        Until it opens, receives and acks are refused (DISK_FULL); the background task
        tries again every commit interval. Nothing changes meanwhile, so the state to
        write stays what recovery found.
        """
        try:
            self.journal.begin(state)
        except OSError as exc:
            log.error("pop journal not opened (receives and acks refused; retried): %s", exc)
            return False
        return True

    def start(self) -> None:
        """Start expiring leases, dead-lettering and committing offsets in the background."""
        self._task = asyncio.create_task(self._run(), name="pop")

    async def stop(self) -> None:
        """Stop the background work, commit the offsets a last time, close the journal."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self.commit_offsets()
        except BrokerError as exc:
            log.error("pop offsets not committed at stop: %s", exc.message)
        await self.journal.close()

    # ------------------------------------------------------------------ receive
    async def receive(
        self,
        group: str,
        topic_name: str,
        *,
        max_messages: int,
        invisible_ms: int,
        queue_ids: Sequence[int] = (),
        tags: frozenset[bytes] | None = None,
        fifo: bool = False,
        max_attempts: int = 0,
        wait_ms: int = 0,
        client: Hashable | None = None,
    ) -> list[Received]:
        """Deliver up to `max_messages` messages of `topic_name` to `group`.

        Each stays invisible to the group's other receives for `invisible_ms`. From
        `queue_ids`, or every queue of the topic when empty. `tags` is a parsed tag
        expression (None: every message); messages it does not match are settled unseen.
        `max_attempts` (0: the broker's default) sets the group's delivery limit. With
        `wait_ms`, a receive that finds nothing waits that long for a message.

        `client` (a connection) shares the store fairly as a pull does: the receive reads
        in slices, each taking its turn (`sliced`), and answers one slice while other
        clients are active; it waits while its client is over its in-flight limit
        (`limits`), and its answer counts against that limit until it is answered.
        """
        topic, queues = self._check_receive(
            group, topic_name, max_messages, invisible_ms, queue_ids, max_attempts, wait_ms
        )
        self.journal.check()
        deadline = self._clock.now() + wait_ms / 1000
        limits = self.limits if client is not None else None
        while True:
            if limits is not None and limits.over(client):
                await limits.room(client)
            self._check_mode(group, fifo)  # again after a wait: another receive may have won
            got = await self._take_turns(client, group, topic, queues, max_messages,
                                         invisible_ms, tags, fifo,
                                         max_attempts or self.default_max_attempts)  # fmt: skip
            if got:
                size = sum(len(r.record) for r in got)
                if limits is not None:
                    limits.hold(client, size)
                try:
                    await self.journal.sync()
                finally:
                    if limits is not None:
                        limits.hold(client, -size)
                self.stats.received[(group, topic.name)] += len(got)
                return got
            now = self._clock.now()
            if now >= deadline or self._holder.closed:
                return []
            wake = deadline
            next_ms = self._next_deadline_ms(group, topic.name, queues)
            if next_ms is not None:
                wake = min(wake, next_ms / 1000)
            await self._holder.wait_any([(topic.name, q) for q in queues], wake)

    def _check_receive(
        self,
        group: str,
        topic_name: str,
        max_messages: int,
        invisible_ms: int,
        queue_ids: Sequence[int],
        max_attempts: int,
        wait_ms: int,
    ) -> tuple[Topic, list[int]]:
        check_group(group)
        _check_invisible(invisible_ms, 1)
        for name, value, low, high in (
            ("max_messages", max_messages, 1, MAX_RECEIVE_MESSAGES),
            ("max_delivery_attempts", max_attempts, 0, MAX_ATTEMPTS_LIMIT),
            ("wait_ms", wait_ms, 0, MAX_WAIT_MS),
        ):
            if not low <= value <= high:
                raise invalid("INVALID_ARGUMENT", f"{name} {value} is outside {low}..{high}")
        check_any_topic(topic_name)
        topic = self._store.topics.get(topic_name)
        for qid in queue_ids:
            topic.check_queue(qid)
        return topic, sorted(set(queue_ids)) or list(range(topic.queue_count))

    def _check_mode(self, group: str, fifo: bool) -> None:
        g = self._groups.get(group)
        if g is None or g.fifo == fifo:
            return
        delivered = sum(w.delivered() for w in g.windows.values())
        if delivered:
            mode, other = ("FIFO", "without") if g.fifo else ("not FIFO", "with")
            raise BrokerError(
                StatusCode.FAILED_PRECONDITION,
                "INVALID_ARGUMENT",
                f"group {group!r} receives {mode} and has {delivered} delivered message(s) "
                f"not yet settled; a receive {other} fifo would break its order: settle "
                "them first, or use another group",
            )

    async def _take_turns(
        self,
        client: Hashable | None,
        group: str,
        topic: Topic,
        queues: list[int],
        want: int,
        invisible_ms: int,
        tags: frozenset[bytes] | None,
        fifo: bool,
        max_attempts: int,
    ) -> list[Received]:
        """`_take` at once, or, for a client under fair scheduling, a slice per turn.

        Each slice is a `_take` of its own (leased and journaled whole). A slice that
        fails after others were taken ends the receive with what they took: those are
        journaled already, and the next receive meets the failure.
        """
        sliced = self.sliced if client is not None else None
        if sliced is None:
            return self._take(group, topic, queues, want, invisible_ms, tags, fifo,
                              max_attempts, budget=MAX_PULL_BYTES, first=True)  # fmt: skip
        scheduler = sliced.scheduler
        out: list[Received] = []
        taken = 0
        while True:
            try:
                async with scheduler.turn(client):
                    part = self._take(
                        group, topic, queues, min(want - len(out), sliced.slice_messages),
                        invisible_ms, tags, fifo, max_attempts,
                        budget=min(MAX_PULL_BYTES - taken, sliced.slice_bytes), first=not out,
                    )  # fmt: skip
            except BrokerError:
                if not out:
                    raise
                return out
            out += part
            taken += sum(len(r.record) for r in part)
            if (not part or len(out) >= want or taken >= MAX_PULL_BYTES
                    or scheduler.others_active(client)):  # fmt: skip
                return out

    def _take(
        self,
        group: str,
        topic: Topic,
        queues: list[int],
        want: int,
        invisible_ms: int,
        tags: frozenset[bytes] | None,
        fifo: bool,
        max_attempts: int,
        *,
        budget: int,
        first: bool,
    ) -> list[Received]:
        """Choose and lease messages now (no await: nothing changes meanwhile).

        At most `budget` bytes of records, but the first one when `first` (a receive's
        first message is delivered however large). All or nothing: when a queue fails
        part-way (a read error), the leases already taken of the others are taken back
        before anything is journaled, so no message stays hidden for a delivery that
        never went out.
        """
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group(fifo, max_attempts)
        g.fifo, g.max_attempts = fifo, max_attempts
        now_ms = self._now_ms()
        out: list[Received] = []
        taken: list[tuple[int, Window, list[Lease]]] = []
        start = g.turn.get(topic.name, 0) % len(queues)
        g.turn[topic.name] = start + 1
        try:
            for i in range(len(queues)):
                if len(out) >= want or budget <= 0:
                    break
                qid = queues[(start + i) % len(queues)]
                window = self._window(g, group, topic, qid)
                leases, got = self._take_from(group, g, topic, qid, window, want - len(out),
                                              budget, tags, now_ms, invisible_ms,
                                              first=first and not out)  # fmt: skip
                if leases:
                    taken.append((qid, window, leases))
                budget -= sum(len(r.record) for r in got)
                out += got
        except BaseException:
            for _qid, window, leases in taken:
                for lease in leases:
                    window.unlease(lease.offset)
            raise
        for qid, window, leases in taken:
            self.journal.append({
                "op": "lease", "g": group, "t": topic.name, "q": qid, "b": window.base,
                "f": g.fifo, "m": g.max_attempts,
                "e": [[ls.offset, b64(window.entries[ls.offset].key), ls.attempts, ls.nonce,
                       ls.deadline_ms] for ls in leases],
            })  # fmt: skip
        return out

    def _take_from(
        self,
        group: str,
        g: _Group,
        topic: Topic,
        qid: int,
        window: Window,
        want: int,
        budget: int,
        tags: frozenset[bytes] | None,
        now_ms: int,
        invisible_ms: int,
        *,
        first: bool,
    ) -> tuple[list[Lease], list[Received]]:
        """Lease what `window` can give now: the leases (not journaled yet), the messages."""
        records: dict[int, bytes] = {}
        dropped = window.move_base(self._store.queue(topic, qid).min_offset)
        if dropped:
            log.warning("%s queue %d: retention deleted %d message(s) group %s had not "
                        "settled", topic.name, qid, dropped, group)  # fmt: skip
        self._expire(group, g, topic.name, qid, window, now_ms)
        while True:
            chosen, exhausted = window.candidates(want, fifo=g.fifo, max_attempts=g.max_attempts)
            self._note_exhausted(group, topic.name, qid, exhausted)
            if len(chosen) >= want or not self._read_ahead(topic, qid, window, want,
                                                            budget, tags, records):  # fmt: skip
                break
        leases: list[tuple[Lease, bytes]] = []
        for offset in chosen:
            record = records.get(offset) or self._read(group, topic, qid, window, offset)
            if record is None:
                continue
            if (leases or not first) and len(record) > budget:
                break
            budget -= len(record)
            lease = window.lease(offset, new_nonce(), now_ms + invisible_ms)
            leases.append((lease, record))
        return [ls for ls, _ in leases], [
            Received(
                topic.name, qid, ls.offset, record,
                Receipt(group, topic.name, qid, ls.offset, ls.nonce, ls.deadline_ms).encode(),
                ls.attempts, ls.deadline_ms,
            )
            for ls, record in leases
        ]  # fmt: skip

    def _read_ahead(
        self,
        topic: Topic,
        qid: int,
        window: Window,
        want: int,
        budget: int,
        tags: frozenset[bytes] | None,
        records: dict[int, bytes],
    ) -> bool:
        """Read messages from the pop position into the window; False when none came."""
        room = self.max_in_flight - (window.position - window.base)
        end = self._store.end_offset(topic, qid)
        if room <= 0 or window.position >= end:
            return False
        start = window.position
        try:
            got = self._store.get(
                topic, qid, start, max_messages=min(room, max(want, _READ_AHEAD)),
                max_bytes=max(budget, 1), tags=tags,
            )  # fmt: skip
        except BrokerError as exc:
            if exc.reason != "CORRUPT_RECORD":
                raise
            log.error("%s: skipped by receives", exc.message)
            window.index((), start + 1)
            return True
        if got.status not in ("FOUND", "NO_MATCHED_MESSAGE") or got.next_offset <= start:
            return False
        found = []
        for offset, key, record in _split(got.records):
            records[offset] = record
            found.append((offset, key))
        window.index(found, got.next_offset)
        return True

    def _read(
        self, group: str, topic: Topic, qid: int, window: Window, offset: int
    ) -> bytes | None:
        """A message delivered before, read again; None (settled) when it is corrupt."""
        try:
            return self._store.read_record(topic, qid, offset)
        except BrokerError as exc:
            if exc.reason != "CORRUPT_RECORD":
                raise
        log.error("%s queue %d offset %d is corrupt: group %s settles it unseen",
                  topic.name, qid, offset, group)  # fmt: skip
        window.settle(offset, 0)
        self.journal.append(_settle_record(group, topic.name, qid, offset, 0, window.base))
        return None

    def _window(self, g: _Group, group: str, topic: Topic, qid: int) -> Window:
        window = g.windows.get((topic.name, qid))
        if window is None:
            cq = self._store.queue(topic, qid)
            committed = self._offsets.get(group, topic.name, qid)
            start = cq.min_offset if committed is None else committed
            window = Window(min(max(start, cq.min_offset), cq.max_offset))
            g.windows[(topic.name, qid)] = window
        return window

    def _next_deadline_ms(self, group: str, topic: str, queues: list[int]) -> int | None:
        g = self._groups.get(group)
        if g is None:
            return None
        deadlines = [
            d
            for q in queues
            if (w := g.windows.get((topic, q))) is not None and (d := w.next_deadline()) is not None
        ]
        return min(deadlines, default=None)

    # ------------------------------------------------------------------ ack, change
    async def ack(self, group: str, receipt: str) -> None:
        """Settle the message a receipt names (see the module docstring for the rules)."""
        self._settle(group, receipt)
        await self.journal.sync()  # also before repeating an ack: it must be on disk

    async def ack_many(self, group: str, receipts: Sequence[str]) -> list[BrokerError | None]:
        """`ack` of several receipts sharing one journal sync: each one's refusal, or None.

        A refused receipt changes nothing and does not keep the others from being settled.
        """
        answers: list[BrokerError | None] = []
        for receipt in receipts:
            try:
                self._settle(group, receipt)
            except BrokerError as exc:
                answers.append(exc)
            else:
                answers.append(None)
        await self.journal.sync()
        return answers

    def _settle(self, group: str, receipt: str) -> None:
        r, window = self._receipt(group, receipt)
        entry = self._held(r, window, "acknowledge")
        if entry is not None and window is not None:
            window.settle(r.offset, r.nonce)
            self.journal.append(
                _settle_record(group, r.topic, r.queue_id, r.offset, r.nonce, window.base)
            )
            self.stats.acked[(group, r.topic)] += 1
            self._holder.notify(r.topic, r.queue_id)  # a FIFO key or window room freed

    async def change_invisible_duration(
        self, group: str, receipt: str, invisible_ms: int
    ) -> Renewed:
        """Hide the message a live receipt names for `invisible_ms` from now.

        It gets a new receipt; the old one is stale from then on. 0 makes it visible again
        at once (a negative acknowledgement): it is delivered again, or dead-lettered if
        that was its last attempt.
        """
        _check_invisible(invisible_ms, 0)
        r, window = self._receipt(group, receipt)
        if self._held(r, window, "change the invisible duration of") is None or window is None:
            raise stale_receipt(
                f"{r.topic} queue {r.queue_id} offset {r.offset} is already settled "
                f"(acknowledged or dead-lettered) for group {group!r}"
            )
        deadline = self._now_ms() + invisible_ms
        lease = window.change(r.offset, new_nonce(), deadline)
        self.journal.append({"op": "change", "g": group, "t": r.topic, "q": r.queue_id,
                             "o": r.offset, "n": lease.nonce, "d": deadline})  # fmt: skip
        self._changed.set()  # the lease may now end before the sweeper's next wake-up
        await self.journal.sync()
        new = Receipt(group, r.topic, r.queue_id, r.offset, lease.nonce, deadline)
        return Renewed(new.encode(), lease.attempts, deadline)

    async def forward_to_dead_letter(self, group: str, receipt: str) -> str:
        """Move the message a live receipt names to `%DLQ%<group>` now; the DLQ topic's name.

        A message already settled answers the same and changes nothing. A copy that fails
        is refused with the store's error, and the receipt stays as it was.
        """
        r, window = self._receipt(group, receipt)
        entry = self._held(r, window, "dead-letter")
        if entry is not None and window is not None:
            entry.dead_lettering = True
            try:
                topic = self._store.topics.get(r.topic)
                await self._retry.dead_letter(group, topic, r.queue_id, r.offset,
                                              reconsume_times=entry.attempts)  # fmt: skip
            finally:
                entry.dead_lettering = False
            self._settle_dead(group, r.topic, r.queue_id, window, r.offset, entry)
        await self.journal.sync()
        return DLQ_PREFIX + group

    def _receipt(self, group: str, text: str) -> tuple[Receipt, Window | None]:
        check_group(group)
        self.journal.check()
        r = parse_receipt(text)
        if r.group != group:
            raise invalid_receipt(f"the receipt belongs to group {r.group!r}, not {group!r}")
        topic = self._store.topics.find(r.topic)
        if topic is None or r.queue_id >= topic.queue_count:
            raise invalid_receipt(f"the receipt names {r.topic} queue {r.queue_id}: no such queue")
        g = self._groups.get(group)
        return r, (g.windows.get((r.topic, r.queue_id)) if g is not None else None)

    def _held(self, r: Receipt, window: Window | None, action: str) -> Entry | None:
        """The entry a live receipt holds; None when its message is settled already.

        RECEIPT_EXPIRED once the receipt's time has passed (unless it settled the
        message), INVALID_RECEIPT_HANDLE when it is not the message's current receipt.
        """
        now_ms = self._now_ms()
        entry = window.held(r.offset, r.nonce) if window is not None else None
        if entry is not None and not entry.dead_lettering:
            if now_ms >= entry.deadline_ms:
                raise receipt_expired(r)
            return entry
        if window is not None and window.settled.get(r.offset) == r.nonce:
            return None  # this receipt settled it: a repeat
        if now_ms >= r.deadline_ms:
            raise receipt_expired(r)
        if window is not None:
            settled = window.is_settled(r.offset)
        else:
            committed = self._offsets.get(r.group, r.topic, r.queue_id)
            settled = committed is not None and r.offset < committed
        if settled:
            return None
        raise stale_receipt(
            f"cannot {action} {r.topic} queue {r.queue_id} offset {r.offset} with this receipt: "
            "it is not the message's current one (a change of invisible duration replaced it, "
            "or this broker never handed it out)"
        )

    # ------------------------------------------------------------------ expiry, dead letters
    def _expire(self, group: str, g: _Group, topic: str, qid: int, window: Window,
                now_ms: int) -> bool:  # fmt: skip
        freed, exhausted = window.expire(now_ms, g.max_attempts)
        if freed:
            self.stats.expired[(group, topic)] += freed
        self._note_exhausted(group, topic, qid, exhausted)
        return freed > 0

    def _note_exhausted(self, group: str, topic: str, qid: int, offsets: list[int]) -> None:
        if offsets:
            self._exhausted.update((group, topic, qid, o) for o in offsets)
            self._changed.set()

    async def sweep(self) -> int:
        """End the leases that ran out and dead-letter used-up messages; how many were.

        A message is used up once delivered the group's maximum attempts times. Receives
        waiting on a queue whose messages became visible again are woken.
        """
        now_ms = self._now_ms()
        for group, g in self._groups.items():
            for (topic, qid), window in g.windows.items():
                if self._expire(group, g, topic, qid, window, now_ms):
                    self._holder.notify(topic, qid)
        moved = 0
        while self._exhausted and self.journal.ready:
            group, topic, qid, offset = self._exhausted.pop()
            found = self._groups.get(group)
            held = found.windows.get((topic, qid)) if found is not None else None
            entry = held.entries.get(offset) if held is not None else None
            if held is None or entry is None or entry.nonce or entry.dead_lettering:
                continue
            entry.dead_lettering = True
            moved += await self._dead_letter(group, topic, qid, held, offset)
        return moved

    async def _dead_letter(self, group: str, topic_name: str, qid: int, window: Window,
                           offset: int) -> int:  # fmt: skip
        """Copy an exhausted message to the DLQ, then settle it; 1 when done, 0 when put off."""
        entry = window.entries[offset]
        try:
            topic = self._store.topics.get(topic_name)
            await self._retry.dead_letter(group, topic, qid, offset,
                                          reconsume_times=entry.attempts)  # fmt: skip
        except BrokerError as exc:
            if exc.reason != "CORRUPT_RECORD":
                log.error("%s queue %d offset %d not dead-lettered for group %s (retried): %s",
                          topic_name, qid, offset, group, exc.message)  # fmt: skip
                if window.entries.get(offset) is entry:
                    entry.dead_lettering = False
                    window.change(offset, new_nonce(), self._now_ms() + _DLQ_RETRY_MS)
                    self._changed.set()
                return 0
            log.error("%s: group %s settles it unseen", exc.message, group)
        entry.dead_lettering = False
        if not self._settle_dead(group, topic_name, qid, window, offset, entry):
            return 0
        await self.journal.sync()
        return 1

    def _settle_dead(
        self, group: str, topic: str, qid: int, window: Window, offset: int, entry: Entry
    ) -> bool:
        """Settle a message its DLQ copy now holds; False when settled or reset meanwhile."""
        if window.entries.get(offset) is not entry:
            return False
        window.settle(offset, 0)
        self.journal.append(_settle_record(group, topic, qid, offset, 0, window.base))
        self.stats.dead_lettered[(group, topic)] += 1
        self._holder.notify(topic, qid)
        return True

    # ------------------------------------------------------------------ offsets, resets
    async def commit_offsets(self) -> int:
        """Mirror each window's base into the consumer offsets; how many changed.

        Only what the journal holds is committed, so a committed offset never passes a
        settlement a crash could lose.
        """
        captured = {
            (group, topic, qid): (window, window.base)
            for group, g in self._groups.items()
            for (topic, qid), window in g.windows.items()
            if self._offsets.get(group, topic, qid) != window.base
        }
        if not captured:
            return 0
        await self.journal.sync()
        updates = {
            key: base
            for key, (window, base) in captured.items()
            if (g := self._groups.get(key[0])) is not None
            and g.windows.get(key[1:]) is window
            and window.base >= base  # a reset since takes over
        }
        if updates:
            await self._offsets.commit(updates)
        return len(updates)

    async def reset(self, group: str, topic: str, qid: int, offset: int) -> None:
        """Start the group over at `offset` on a queue (an operator's offset reset).

        Its leases there end: their receipts no longer settle anything.
        """
        g = self._groups.get(group)
        if g is None or (topic, qid) not in g.windows:
            return
        self.journal.check()
        g.windows[(topic, qid)] = Window(offset)
        self.journal.append({"op": "reset", "g": group, "t": topic, "q": qid, "b": offset})
        await self.journal.sync()
        self._holder.notify(topic, qid)

    async def forget(self, group: str, topic: str | None = None) -> None:
        """Drop the group's windows on a deleted `topic` (None: all, the group is deleted).

        Their receipts settle nothing any more; a group left with no window is gone.
        """
        g = self._groups.get(group)
        if g is None or (topic is not None and all(t != topic for t, _ in g.windows)):
            return
        self.journal.check()
        dropped = self._forget(group, topic)
        record: dict[str, Any] = {"op": "forget", "g": group}
        if topic is not None:
            record["t"] = topic
        self.journal.append(record)
        await self.journal.sync()
        for queue in dropped:
            self._holder.notify(*queue)

    def _forget(self, group: str, topic: str | None) -> list[QueueKey]:
        g = self._groups.get(group)
        if g is None:
            return []
        dropped = [q for q in g.windows if topic is None or q[0] == topic]
        for queue in dropped:
            del g.windows[queue]
        g.turn.pop(topic or "", None)
        if topic is None or not g.windows:
            del self._groups[group]
        return dropped

    # ------------------------------------------------------------------ inspection
    def policy(self, group: str) -> PopPolicy:
        """How the group receives: as its latest receive said, else the broker's defaults."""
        g = self._groups.get(group)
        if g is None:
            return PopPolicy(False, self.default_max_attempts)
        return PopPolicy(g.fifo, g.max_attempts)

    def groups(self) -> set[str]:
        """Every group with pop state."""
        return set(self._groups)

    def progress(self, group: str, topic: str, qid: int) -> PopProgress | None:
        """The group's window on a queue, or None when it has none."""
        g = self._groups.get(group)
        window = g.windows.get((topic, qid)) if g is not None else None
        if window is None:
            return None
        return PopProgress(window.base, window.position, window.in_flight(self._now_ms()))

    def in_flight(self) -> dict[tuple[str, str], int]:
        """Messages receives hold now (leased, not acked, time not up), by (group, topic).

        Every group's windows appear, with 0 when nothing of a topic is held.
        """
        now_ms = self._now_ms()
        held: dict[tuple[str, str], int] = {}
        for group, g in self._groups.items():
            for (topic, _qid), window in g.windows.items():
                key = (group, topic)
                held[key] = held.get(key, 0) + window.in_flight(now_ms)
        return held

    def describe(self) -> dict[str, Any]:
        """Everything the windows hold, comparable (for tests and debugging)."""
        return {
            group: {
                "fifo": g.fifo,
                "max_attempts": g.max_attempts,
                "windows": {key: w.to_json() for key, w in sorted(g.windows.items())},
            }
            for group, g in sorted(self._groups.items())
        }

    # ------------------------------------------------------------------ background
    async def _run(self) -> None:
        commit_at = self._clock.now() + self._commit_interval
        while True:
            self._changed.clear()
            if not self.journal.ready and self.journal.failure is None:
                await asyncio.to_thread(self._open_journal, self._state())
            try:
                await self.sweep()
                if self._clock.now() >= commit_at:
                    commit_at = self._clock.now() + self._commit_interval
                    await self.commit_offsets()
                    await self._compact()
            except BrokerError as exc:
                log.error("pop background work failed (retried): %s", exc.message)
            wake = commit_at
            for g in self._groups.values():
                for window in g.windows.values():
                    deadline = window.next_deadline()
                    if deadline is not None:
                        wake = min(wake, deadline / 1000)
            sleeper = asyncio.ensure_future(self._clock.sleep_until(wake))
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait((sleeper, changed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                changed.cancel()

    async def _compact(self) -> None:
        """Forget settled windows the offsets hold, and compact the journal if it grew."""
        for group in list(self._groups):
            g = self._groups[group]
            for (topic, qid), window in list(g.windows.items()):
                if window.empty and self._offsets.get(group, topic, qid) == window.base:
                    del g.windows[(topic, qid)]
            if not g.windows:
                del self._groups[group]
        if self.journal.wants_compaction():
            await self.journal.compact(self._state)

    def _now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    # ------------------------------------------------------------------ persistence
    def _state(self) -> dict[str, Any]:
        return {
            "groups": {
                group: {
                    "fifo": g.fifo,
                    "max_attempts": g.max_attempts,
                    "queues": [[t, q, w.to_json()] for (t, q), w in g.windows.items()],
                }
                for group, g in self._groups.items()
            }
        }

    def _restore(self, state: Any) -> None:
        self._groups = {}
        if state is None:
            return
        for group, data in state["groups"].items():
            name_checked(check_group, group)
            g = self._groups[group] = _Group(_flag(data["fifo"]), _attempts(data["max_attempts"]))
            for topic, qid, window in data["queues"]:
                name_checked(check_any_topic, topic)
                g.windows[(topic, natural(qid))] = Window.from_json(window)

    def _replay(self, record: dict[str, Any]) -> None:
        if record["op"] == "forget":
            topic = record.get("t")
            self._forget(
                name_checked(check_group, record["g"]),
                None if topic is None else name_checked(check_any_topic, topic),
            )
            return
        op, group, topic, qid = record["op"], record["g"], record["t"], natural(record["q"])
        name_checked(check_group, group)
        name_checked(check_any_topic, topic)
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _Group(False, self.default_max_attempts)
        window = g.windows.get((topic, qid))
        if window is None:
            if "b" not in record:
                return  # a change in a window since reset and forgotten
            window = g.windows[(topic, qid)] = Window(natural(record["b"]))
        if op == "lease":
            g.fifo, g.max_attempts = _flag(record["f"]), _attempts(record["m"])
            window.move_base(natural(record["b"]))
            for offset, key, attempts, nonce, deadline in record["e"]:
                window.restore(natural(offset), unb64(key), natural(attempts),
                               natural(nonce, UINT64), natural(deadline))  # fmt: skip
        elif op == "settle":
            window.settle(natural(record["o"]), natural(record["n"], UINT64))
            window.move_base(natural(record["b"]))
        elif op == "change":
            if natural(record["o"]) in window.entries:
                window.change(
                    natural(record["o"]), natural(record["n"], UINT64), natural(record["d"])
                )
        elif op == "reset":
            window.reset(natural(record["b"]))
        else:
            raise ValueError(f"unknown operation {op!r}")


def _check_invisible(invisible_ms: int, low: int) -> None:
    if not low <= invisible_ms <= MAX_INVISIBLE_MS:
        raise invalid(
            "INVALID_INVISIBLE_TIME",
            f"invisible_duration_ms {invisible_ms} is outside {low}..{MAX_INVISIBLE_MS} (12 hours)",
        )


def _settle_record(
    group: str, topic: str, qid: int, offset: int, nonce: int, base: int
) -> dict[str, Any]:
    return {"op": "settle", "g": group, "t": topic, "q": qid, "o": offset, "n": nonce, "b": base}


def _flag(value: object) -> bool:
    if type(value) is not bool:
        raise ValueError(f"{value!r} is not true or false")
    return value


def _attempts(value: object) -> int:
    attempts = natural(value)
    if not 1 <= attempts <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(f"max attempts {attempts} is outside 1..{MAX_ATTEMPTS_LIMIT}")
    return attempts


def _split(records: bytes) -> list[tuple[int, bytes, bytes]]:
    """(queue offset, sharding key, record) of each of concatenated stored records."""
    out = []
    pos = 0
    while pos < len(records):
        size, _crc, _magic, _qid, offset, _ts, _times, topic_len = RECORD.unpack_from(records, pos)
        frame = pos + RECORD.size + topic_len
        tags_len, key_len = FRAME_FIELDS.unpack_from(records, frame)[4:6]
        key_at = frame + FRAME_FIELDS.size + tags_len
        out.append((offset, records[key_at : key_at + key_len], records[pos : pos + size]))
        pos += size
    return out
