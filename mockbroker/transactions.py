"""Transactional messages: half messages, their commit or rollback, and check-back.

RocketMQ's way, with no wire format here (the fronts translate). A half message is stored
at once as a record whose header names its destination (topic, queue) but which is
indexed only in the broker's queue `rmq_sys_TRANS_HALF_TOPIC` (RocketMQ's
RMQ_SYS_TRANS_HALF_TOPIC): no consumer sees it. Its frame gets the properties TRAN_MSG
and PGROUP (its producer group), as RocketMQ's clients set them; TRAN_MSG is what tells
recovery, which rebuilds the queues from the commit log after a crash, to index the
record in the half queue (store/recovery.py), so no other message may carry it, and the
committed copy goes without it. Each outcome is a record
in `rmq_sys_TRANS_OP_HALF_TOPIC` (RocketMQ's op topic): COMMITTED, ROLLED_BACK or DROPPED
with the half message's offset. Both live in the commit log, so after any restart the
pending set is the half records without an outcome.

Commit appends the message to its topic and queue (a sharding key keeps its queue), then
its outcome, and answers once that outcome is durable (whatever the flush mode). A crash
between the two leaves the message both delivered and pending: start-up finds its
delivered copy through the id index and records the outcome then, so it is never
committed twice. Rollback only records its outcome, so a restart never brings it back.

A transaction not ended `timeout_seconds` after it was stored is checked back: a live
producer of its group (one watching for checks) is asked for its state, then again every
`check_seconds`, at most `max_checks` times; then it is dropped (outcome DROPPED, a log
line, and the `dropped` count). The check counts live in memory: a restart starts them
again (RocketMQ keeps them in the re-stored half message).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid, not_found
from mockbroker.store.flush import FlushFailedError
from mockbroker.store.message_store import MessageStore
from mockbroker.store.records import CheckedFrames, tag_hash, with_properties
from mockbroker.topics import HALF_OP_TOPIC as OP_TOPIC
from mockbroker.topics import HALF_PROPERTY, HALF_TOPIC, Topic, check_group
from sdk._wire import (
    FRAME_FIELDS,
    FRAME_LEN_PREFIX,
    RECORD,
    decode_properties,
    encode_frame,
    iter_records,
)
from sdk.clock import Clock

log = logging.getLogger("mockbroker.transactions")

COMMITTED, ROLLED_BACK, DROPPED = 1, 2, 3
OUTCOME_NAMES = {COMMITTED: "committed", ROLLED_BACK: "rolled back", DROPPED: "dropped"}
_OP_BODY = struct.Struct("<qB")  # half-queue offset, outcome
#: RocketMQ's property names: a transactional message, and its producer group.
PROPERTY_TRANSACTION = HALF_PROPERTY
PROPERTY_GROUP = "PGROUP"

DEFAULT_TIMEOUT_SECONDS = 6.0
DEFAULT_CHECK_SECONDS = 60.0
DEFAULT_MAX_CHECKS = 15


@dataclass(frozen=True, slots=True)
class HalfStored:
    """A stored half message: its transaction id, time, durability and half-queue offset."""

    transaction_id: str
    store_timestamp_ms: int
    durable: bool
    #: Its offset in the half queue (RocketMQ's tranStateTableOffset).
    half_offset: int


@dataclass(frozen=True, slots=True)
class Check:
    """A check-back for a producer: the transaction, its half record, which check.

    `half_offset` is the half record's offset in the half queue, `position` where it lies
    in the commit log (RocketMQ's tranStateTableOffset and commitLogOffset).
    """

    transaction_id: str
    record: bytes
    check_times: int
    half_offset: int = 0
    position: int = 0


@dataclass(slots=True)
class _Pending:
    offset: int
    msg_id: bytes
    group: str
    next_check_at: float
    checks: int = 0


@dataclass(slots=True)
class _Watcher:
    group: str
    client_id: str
    checks: asyncio.Queue[Check | None] = field(default_factory=asyncio.Queue)


def transaction_id(msg_id: bytes, offset: int) -> str:
    """The id a transaction is ended by: the message id and its half-queue offset."""
    return f"{msg_id.hex().upper()}-{offset}"


def _parse_id(text: str) -> tuple[bytes, int]:
    msg_hex, _, offset = text.partition("-")
    try:
        msg_id, number = bytes.fromhex(msg_hex), int(offset)
    except ValueError:
        raise invalid("INVALID_ARGUMENT", f"{text!r} is not a transaction id") from None
    if len(msg_id) != 16 or number < 0:
        raise invalid("INVALID_ARGUMENT", f"{text!r} is not a transaction id")
    return msg_id, number


class Transactions:
    """Half messages of every producer group, on the broker's clock."""

    def __init__(
        self,
        store: MessageStore,
        clock: Clock,
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        check_seconds: float = DEFAULT_CHECK_SECONDS,
        max_checks: int = DEFAULT_MAX_CHECKS,
    ) -> None:
        self._store = store
        self._clock = clock
        self.timeout_seconds = timeout_seconds
        self.check_seconds = check_seconds
        self.max_checks = max_checks
        self._pending: dict[int, _Pending] = {}  # half-queue offset -> pending transaction
        self._ended: dict[int, int] = {}  # half-queue offset -> outcome, since start
        # Taken out of _pending while their outcome is written, and pending until it is
        # on disk: no check-back and no second end meanwhile, and still counted.
        self._ending = 0
        self._watchers: dict[str, list[_Watcher]] = {}
        self._turns = itertools.count()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Outcomes recorded since start, by name ("committed", "rolled back", "dropped").
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOME_NAMES.values(), 0)
        #: Check-backs sent to producers since start.
        self.checks_sent = 0

    @property
    def pending(self) -> int:
        """How many transactions wait for their end (an outcome not yet on disk included)."""
        return len(self._pending) + self._ending

    # ------------------------------------------------------------------ lifecycle
    def load(self) -> None:
        """Rebuild the pending set from the store (at startup, after recovery)."""
        store = self._store
        self._half = store.topics.find(HALF_TOPIC) or store.create_topic(HALF_TOPIC, 1)[0]
        self._op = store.topics.find(OP_TOPIC) or store.create_topic(OP_TOPIC, 1)[0]
        op_queue = store.queue(self._op, 0)
        for offset in range(op_queue.min_offset, op_queue.count):
            try:
                record = store.read_record(self._op, 0, offset)
            except BrokerError as exc:
                log.error("%s offset %d is unreadable and skipped: %s", OP_TOPIC, offset, exc)
                continue
            half_offset, outcome = _OP_BODY.unpack(record[-_OP_BODY.size :])
            self._ended[half_offset] = outcome
        half_queue = store.queue(self._half, 0)
        now = self._clock.now()
        for offset in range(half_queue.min_offset, half_queue.count):
            if offset in self._ended:
                continue
            try:
                half = next(iter_records(store.read_record(self._half, 0, offset)))
            except BrokerError as exc:
                log.error("%s offset %d is unreadable and skipped: %s", HALF_TOPIC, offset, exc)
                continue
            group = decode_properties(half.properties).get(PROPERTY_GROUP, "")
            stored_s = half.store_timestamp_ms / 1000
            self._pending[offset] = _Pending(
                offset, half.msg_id, group, max(now, stored_s + self.timeout_seconds)
            )
        log.info("%d transactions pending", len(self._pending))
        store.protected_position = self._protecting(store.protected_position)

    def _protecting(self, other: Callable[[], int | None] | None) -> Callable[[], int | None]:
        """A retention guard keeping the oldest pending half message, and what `other` keeps."""

        def oldest() -> int | None:
            kept = [other()] if other is not None else []
            if self._pending:
                first = min(self._pending)
                kept.append(self._store.queue(self._half, 0).entry(first)[0])
            positions = [p for p in kept if p is not None]
            return min(positions) if positions else None

        return oldest

    async def recover(self) -> int:
        """Record the outcomes missing of half messages already committed; how many.

        A crash between a commit and its outcome record leaves one. Run once, after
        `load`, before serving.
        """
        repaired = 0
        for offset, waiting in sorted(self._pending.items()):
            half = next(iter_records(self._store.read_record(self._half, 0, offset)))
            copies = [
                r
                for r in iter_records(b"".join(self._store.find_by_id(waiting.msg_id)))
                if r.topic == half.topic
            ]
            if len(copies) >= 2:
                await self._record(offset, waiting.msg_id, COMMITTED)
                del self._pending[offset]
                repaired += 1
        if repaired:
            log.warning("%d committed transactions had no outcome record: recorded", repaired)
        return repaired

    def start(self) -> None:
        """Start checking back."""
        self._task = asyncio.create_task(self._run(), name="transaction-checks")

    async def stop(self) -> None:
        """Stop checking back (pending transactions stay stored)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # ------------------------------------------------------------------ requests
    def check_half(self, group: str, frame: bytes) -> tuple[bytes, CheckedFrames]:
        """A framed message (with its length prefix) checked as a half message of `group`.

        Returns it with the transaction properties set, and its check; changes nothing.
        """
        check_group(group)
        checked = self._store.check(frame, half=True)  # RocketMQ's clients set TRAN_MSG
        if len(checked) != 1:
            raise invalid("INVALID_ARGUMENT", f"a half message is one frame, not {len(checked)}")
        if checked.scheduled:
            raise invalid("INVALID_DELIVERY_TIME", "a transactional message cannot be delayed")
        framed = with_properties(
            frame[FRAME_LEN_PREFIX.size :], {PROPERTY_TRANSACTION: "true", PROPERTY_GROUP: group}
        )
        # the properties may now be over their limit
        return framed, self._store.check(framed, half=True)

    async def store_half(
        self, group: str, topic: Topic, queue_id: int, framed: bytes, checked: CheckedFrames
    ) -> HalfStored:
        """Store a half message `check_half` answered; durable as the flush mode promises.

        Once stored it is pending even if the caller is cancelled meanwhile.
        """
        topic.check_queue(queue_id)
        return await asyncio.shield(self._store_half(group, topic, queue_id, framed, checked))

    async def _store_half(
        self, group: str, topic: Topic, queue_id: int, framed: bytes, checked: CheckedFrames
    ) -> HalfStored:
        result = await self._store.append(
            topic, queue_id, framed, checked, index_into=(self._half, 0)
        )
        msg_id = framed[FRAME_LEN_PREFIX.size : FRAME_LEN_PREFIX.size + 16]
        offset = result.first_offset
        self._pending[offset] = _Pending(
            offset, msg_id, group, self._clock.now() + self.timeout_seconds
        )
        self._changed.set()
        return HalfStored(
            transaction_id(msg_id, offset), result.store_timestamp_ms, result.durable, offset
        )

    async def end(self, group: str, txn_id: str, commit: bool) -> None:
        """Commit or roll back a pending transaction; returns once its outcome is durable.

        Ending it again the same way changes nothing. TRANSACTION_NOT_FOUND for one
        unknown or ended otherwise, WRONG_PRODUCER_GROUP for another group's.
        """
        check_group(group)
        msg_id, offset = _parse_id(txn_id)
        wanted = COMMITTED if commit else ROLLED_BACK
        waiting = self._pending.get(offset)
        if waiting is None or waiting.msg_id != msg_id:
            ended = self._ended.get(offset)
            if ended == wanted and self._is_half(offset, msg_id):
                return
            why = f"it was {OUTCOME_NAMES[ended]}" if ended else "no such transaction"
            raise not_found("TRANSACTION_NOT_FOUND", f"transaction {txn_id} is not pending: {why}")
        if waiting.group != group:
            raise BrokerError(
                StatusCode.FAILED_PRECONDITION,
                "WRONG_PRODUCER_GROUP",
                f"transaction {txn_id} belongs to producer group {waiting.group!r}, not {group!r}",
            )
        await asyncio.shield(self._end(waiting, wanted))

    def _is_half(self, offset: int, msg_id: bytes) -> bool:
        try:
            record = self._store.read_record(self._half, 0, offset)
        except BrokerError:
            return False
        return bytes(next(iter_records(record)).msg_id) == msg_id

    async def _end(self, waiting: _Pending, outcome: int) -> None:
        if self._pending.get(waiting.offset) is not waiting:
            return  # ended by a concurrent request meanwhile
        del self._pending[waiting.offset]  # no check-back, no second end, meanwhile
        self._ending += 1
        try:
            if outcome == COMMITTED:
                record = self._store.read_record(self._half, 0, waiting.offset)
                await self._deliver(record)
            await self._record(waiting.offset, waiting.msg_id, outcome)
        except BaseException:
            self._pending[waiting.offset] = waiting
            raise
        finally:
            self._ending -= 1
        self._changed.set()

    async def _deliver(self, record: bytes) -> None:
        half = next(iter_records(record))
        topic = self._store.topics.get(half.topic)
        topic_len = int.from_bytes(record[RECORD.size - 2 : RECORD.size], "little")
        framed = with_properties(record[RECORD.size + topic_len :], {}, drop=(HALF_PROPERTY,))
        await self._store.append(topic, half.queue_id, framed, _checked(framed))

    async def _record(self, offset: int, msg_id: bytes, outcome: int) -> None:
        """Append an outcome and wait until it is on disk, whatever the flush mode."""
        frame = encode_frame(
            msg_id=msg_id, born_timestamp_ms=0, body=_OP_BODY.pack(offset, outcome)
        )
        written = self._store.write(self._op, 0, frame, _checked(frame))
        flusher = self._store.flusher
        if flusher is not None:
            try:
                await flusher.wait_durable(written.end)
            except FlushFailedError as exc:
                raise BrokerError(StatusCode.DATA_LOSS, "FLUSH_FAILED", str(exc)) from None
        self._ended[offset] = outcome
        self.outcomes[OUTCOME_NAMES[outcome]] += 1

    def is_half(self, position: int, queue_offset: int) -> bool:
        """True when the record at `position` (header's `queue_offset`) is a half message.

        Pending or ended. Its header names its destination topic, but it is no message of
        that topic: lookups by id or key skip it (a committed transaction is found by its
        committed copy, as RocketMQ finds it).
        """
        half = getattr(self, "_half", None)
        if half is None:
            return False
        queue = self._store.queue(half, 0)
        if not queue.min_offset <= queue_offset < queue.count:
            return False
        try:
            return queue.entry(queue_offset)[0] == position
        except BrokerError:
            return False

    # ------------------------------------------------------------------ check-back
    @contextlib.asynccontextmanager
    async def watching(self, group: str, client_id: str) -> AsyncIterator[_Watcher]:
        """A producer of `group` offering to answer check-backs while inside."""
        check_group(group)
        watcher = _Watcher(group, client_id)
        self._watchers.setdefault(group, []).append(watcher)
        try:
            yield watcher
        finally:
            watchers = self._watchers[group]
            watchers.remove(watcher)
            if not watchers:
                del self._watchers[group]

    @staticmethod
    async def checks(watcher: _Watcher) -> AsyncIterator[Check]:
        """The check-backs sent to `watcher`, as they come, until the broker closes."""
        while (check := await watcher.checks.get()) is not None:
            yield check

    def close(self) -> None:
        """End every producer's check-back stream (the broker is stopping)."""
        for watchers in self._watchers.values():
            for watcher in watchers:
                watcher.checks.put_nowait(None)

    async def check_due(self) -> int:
        """Send every check-back due now, and drop the transactions checked too often.

        Returns how many checks were sent.
        """
        now = self._clock.now()
        sent = 0
        for waiting in [w for w in self._pending.values() if w.next_check_at <= now]:
            if self._pending.get(waiting.offset) is not waiting:
                continue
            if waiting.checks >= self.max_checks:
                await self._drop(waiting)
                continue
            waiting.checks += 1
            waiting.next_check_at = now + self.check_seconds
            watchers = self._watchers.get(waiting.group)
            if not watchers:
                log.info("transaction %s of group %s: no live producer to check back with "
                         "(check %d)", transaction_id(waiting.msg_id, waiting.offset),
                         waiting.group, waiting.checks)  # fmt: skip
                continue
            watcher = watchers[next(self._turns) % len(watchers)]
            record = self._store.read_record(self._half, 0, waiting.offset)
            position = self._store.queue(self._half, 0).entry(waiting.offset)[0]
            watcher.checks.put_nowait(
                Check(
                    transaction_id(waiting.msg_id, waiting.offset),
                    record,
                    waiting.checks,
                    waiting.offset,
                    position,
                )
            )
            self.checks_sent += 1
            sent += 1
        return sent

    async def _drop(self, waiting: _Pending) -> None:
        del self._pending[waiting.offset]
        self._ending += 1
        try:
            await self._record(waiting.offset, waiting.msg_id, DROPPED)
        except BaseException:
            self._pending[waiting.offset] = waiting
            raise
        finally:
            self._ending -= 1
        log.warning(
            "transaction %s of group %s dropped: still unknown after %d check-backs",
            transaction_id(waiting.msg_id, waiting.offset), waiting.group, waiting.checks,
        )  # fmt: skip

    async def _run(self) -> None:
        while True:
            self._changed.clear()
            try:
                await self.check_due()
            except BrokerError as exc:
                log.error("transaction check-back failed, retrying: %s", exc)
            due = min((w.next_check_at for w in self._pending.values()), default=None)
            if due is None:
                await self._changed.wait()
                continue
            sleeper = asyncio.ensure_future(self._clock.sleep_until(max(due, self._clock.now())))
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait((sleeper, changed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                changed.cancel()


def _checked(frames: bytes) -> CheckedFrames:
    """Frames the broker built or checked before: their lengths are known good."""
    out = CheckedFrames()
    pos = 0
    while pos < len(frames):
        (length,) = FRAME_LEN_PREFIX.unpack_from(frames, pos)
        start = pos + FRAME_LEN_PREFIX.size
        tl, sl, kl = FRAME_FIELDS.unpack_from(frames, start)[4:7]
        tags_at = start + FRAME_FIELDS.size
        out.add(start, start + length, tag_hash(frames[tags_at : tags_at + tl]), 0,
                tags_at + tl + sl, kl)  # fmt: skip
        pos = start + length
    return out
