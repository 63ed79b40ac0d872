"""Sends and pulls against the store in slices, each slice taking its turn (fairness.py).

A send's frames are checked at most `slice_messages` messages and `slice_bytes` bytes at
a time, then written in one turn (one store.write: a batch is all or nothing); a pull's
answer is read in slices too. What a client sees is unchanged: a batch is still checked
whole before any of it is stored and gets consecutive offsets in its queue, a client's
sends to a queue are stored in the order they arrived (the next starts once the previous
one is stored), and a pull answers what one read would have, at most what it asked for.
Only while other clients are active (FairScheduler.others_active) does a pull answer
less: one slice, so that no client's answer holds the loop up for long while it is
copied into its message and onto the socket.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from types import TracebackType
from typing import TypeVar

from mockbroker.errors import BrokerError
from mockbroker.fairness import FairScheduler
from mockbroker.store.message_store import (
    Batch,
    GetResult,
    LaidOut,
    MessageStore,
    PutResult,
    Written,
)
from mockbroker.store.records import CheckedFrame, CheckedFrames
from mockbroker.topics import Topic

T = TypeVar("T")


class SlicedStore:
    """The store's send and pull work, sliced and scheduled fairly between clients."""

    def __init__(
        self,
        store: MessageStore,
        scheduler: FairScheduler,
        *,
        slice_messages: int,
        slice_bytes: int,
    ) -> None:
        self._store = store
        self.scheduler = scheduler
        self._messages = slice_messages
        self._bytes = slice_bytes
        self._orders = _Locks()  # (client, queue): a client's sends to a queue, in order
        self._writes = _Locks()  # queue: a batch written there in slices, until whole

    @property
    def slice_messages(self) -> int:
        """Most messages one slice checks or reads."""
        return self._messages

    @property
    def slice_bytes(self) -> int:
        """Most bytes one slice checks or reads (but one record, whatever its size)."""
        return self._bytes

    def in_order(self, client: Hashable, queue: tuple[str, int]) -> InOrder:
        """Hold `queue` for one send of `client`: its sends to a queue are stored in order.

        Enter it before the first await of the send: a free queue is taken at once. It is
        let go on leaving, or as soon as the send's records are written (`append`), so
        that the next send's records do not wait for this one's fsync. Other clients'
        sends to the queue do not wait for it (concurrent sends of two clients have no
        order between them).
        """
        return InOrder(self._orders, (client, queue))

    async def in_order_all(
        self, client: Hashable, queues: Iterable[tuple[str, int]]
    ) -> list[QueueHold]:
        """`in_order` for several queues of one send, taken in the order given.

        The caller releases every hold when the send is done (QueueHold.release): those
        `write_parts` let go are let go once.
        """
        return await self._orders.acquire_all([(client, queue) for queue in queues])

    def writing(self, queue: tuple[str, int]) -> bool:
        """True while a batch is written to `queue` slice by slice (nothing may come between)."""
        return self._writes.locked(queue)

    def writing_any(self, topic: str, queue_ids: Iterable[int]) -> bool:
        """`writing` for any of `queue_ids` of `topic`."""
        writes = self._writes
        return writes.any_locked() and any(writes.locked((topic, q)) for q in queue_ids)

    async def check(
        self,
        client: Hashable,
        frames: bytes,
        then: Callable[[CheckedFrames], Written | None],
    ) -> tuple[CheckedFrames, Written | None]:
        """Every frame checked (store.check), a slice per turn: (checked, what `then` wrote).

        A batch checked whole in one slice goes on to `then` in the same turn (which may
        write it); a larger one is written with `append`, and `then` is not called.
        """
        checked = CheckedFrames()
        start = 0
        while start < len(frames) or not checked:
            async with self.scheduler.turn(client):
                part = self._store.check(
                    frames,
                    start=start,
                    first_index=len(checked),
                    max_frames=self._messages,
                    max_bytes=self._bytes,
                )
                if not checked and part.last_end == len(frames):
                    return part, then(part)
            checked += part
            start = part.last_end
        return checked, None

    async def check_parts(
        self, client: Hashable, parts: Sequence[bytes]
    ) -> list[CheckedFrames | BrokerError]:
        """Each part's frames checked (store.check): its CheckedFrames, or its refusal.

        As `check`, a slice per turn, but a turn goes on to the next part while the slice
        has room: a request's small parts take one turn, not one each.
        """
        checks, _ = await self.check_parts_then(client, parts, None)
        return checks

    async def check_parts_then(
        self,
        client: Hashable,
        parts: Sequence[bytes],
        then: Callable[[list[CheckedFrames | BrokerError]], T] | None,
    ) -> tuple[list[CheckedFrames | BrokerError], T | None]:
        """`check_parts`, and what `then` made of the checks (None: not called).

        As with `check`, a request checked whole in its first turn goes on to `then` in
        that turn (which may write it: one turn instead of two); a larger one does not.
        """
        out: list[CheckedFrames | BrokerError] = []
        checked = CheckedFrames()  # of the part being checked, so far
        start = 0
        index = 0
        first = True
        while index < len(parts):
            async with self.scheduler.turn(client):
                if first:  # the usual request: every part whole in one call
                    usual = self._store.check_usual_parts(
                        parts, max_frames=self._messages, max_bytes=self._bytes
                    )
                    if usual is not None:
                        out += usual
                        return out, None if then is None else then(out)
                frames_left, bytes_left = self._messages, self._bytes
                while index < len(parts) and frames_left > 0 and bytes_left > 0:
                    frames = parts[index]
                    try:
                        got = self._store.check(
                            frames,
                            start=start,
                            first_index=len(checked),
                            max_frames=frames_left,
                            max_bytes=bytes_left,
                        )
                    except BrokerError as exc:
                        out.append(exc)
                        index += 1
                        checked, start = CheckedFrames(), 0
                        continue
                    end = got.last_end
                    frames_left -= len(got)
                    bytes_left -= end - start
                    if checked:
                        checked += got
                    else:
                        checked = got
                    if end < len(frames):
                        start = end  # the rest in the next slice
                        continue
                    out.append(checked)
                    index += 1
                    checked, start = CheckedFrames(), 0
                if first and index == len(parts) and then is not None:
                    return out, then(out)
            first = False
        return out, None

    async def append(
        self,
        client: Hashable,
        hold: QueueHold,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
    ) -> PutResult:
        """store.append in one turn, within the queue's `hold` (see in_order).

        One store.write is what makes a batch all-or-nothing (a full disk rolls back that
        write whole, and readers never see part of a batch); a large batch's records are
        laid out before it, in slices (write_parts), so that the write's turn is mostly
        copying bytes.
        """
        [written] = await self.write_parts(
            client, [hold], topic, [Batch(queue_id, frames, checked)]
        )
        durable = await self._store.durable(written.end)
        return PutResult(written.first_offset, written.count, written.store_timestamp_ms, durable)

    async def write_parts(
        self, client: Hashable, holds: list[QueueHold], topic: Topic, parts: list[Batch]
    ) -> list[Written]:
        """store.write_parts in one turn, then the queues' `holds` let go (see in_order).

        Waits until no other batch is being written to any of the parts' queues. Parts
        of more than a slice are laid out first, a slice per turn (`_lay_out`), so that
        the write's turn costs little more than copying their bytes.
        """
        wholes = await self._writes.acquire_all(
            [(topic.name, queue_id) for queue_id in sorted({part.queue_id for part in parts})]
        )
        try:
            laid_out = await self._lay_out(client, topic, parts)
            async with self.scheduler.turn(client):
                written = self._store.write_parts(topic, parts, laid_out=laid_out)
        finally:
            for whole in wholes:
                whole.release()
        for hold in holds:
            hold.release()
        return written

    async def _lay_out(
        self, client: Hashable, topic: Topic, parts: list[Batch]
    ) -> list[LaidOut | None]:
        """Each part's records laid out a slice per turn (store.lay_out), or [] (small).

        A request of a slice or less is laid out by its write. A part is laid out at the
        offsets its queue gives it now: the caller holds the parts' queues for writing,
        so only a write past the sliced store (a scheduled message falling due) can move
        an offset meanwhile, and the write then lays that part out again.
        """
        if (
            sum(len(p.checked) for p in parts) <= self._messages
            and sum(len(p.frames) for p in parts) <= self._bytes
        ):
            return []
        out: list[LaidOut | None] = []
        next_offsets: dict[int, int] = {}  # of the queues laid out so far in this request
        for part in parts:
            laid: LaidOut | None = None
            while laid is None or laid.count < len(part.checked):
                async with self.scheduler.turn(client):
                    first = next_offsets.get(part.queue_id)
                    if first is None:
                        first = self._store.queue(topic, part.queue_id).count
                    laid = self._store.lay_out(
                        topic,
                        part,
                        laid,
                        first_offset=first,
                        max_frames=self._messages,
                        max_bytes=self._bytes,
                    )
            next_offsets[part.queue_id] = laid.first_offset + laid.count
            out.append(laid)
        return out

    async def get(
        self,
        client: Hashable,
        topic: Topic,
        queue_id: int,
        offset: int,
        *,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[bytes] | None,
    ) -> GetResult:
        """store.get, a slice per turn; the slices' records joined into one answer."""
        parts: list[bytes] = []
        count = taken = 0
        last: GetResult | None = None  # the last slice that found something
        while True:
            try:
                async with self.scheduler.turn(client):
                    got = self._store.get(
                        topic,
                        queue_id,
                        offset,
                        max_messages=min(max_messages - count, self._messages),
                        max_bytes=max_bytes - taken,
                        tags=tags,
                        slice_bytes=self._bytes,
                        first_over_budget=last is None,
                    )
            except BrokerError as exc:
                if last is None or exc.reason != "CORRUPT_RECORD":
                    raise
                return _joined(parts, count, offset, last)  # the next pull meets the corruption
            if got.status != "FOUND":
                if last is None:
                    return got
                if got.status == "NO_MATCHED_MESSAGE":
                    offset = got.next_offset  # what it looked at matched nothing: skip it
                return _joined(parts, count, offset, got)
            parts.append(got.records)
            count += got.count
            taken += len(got.records)
            offset = got.next_offset
            last = got
            if got.corrupt or count >= max_messages or taken >= max_bytes:
                return _joined(parts, count, offset, got)
            if offset >= got.max_offset or self.scheduler.others_active(client):
                return _joined(parts, count, offset, got)


class QueueHold:
    """A hold on a key of _Locks (see SlicedStore.in_order)."""

    __slots__ = ("_key", "_locks")

    def __init__(self, locks: _Locks, key: Hashable) -> None:
        self._locks: _Locks | None = locks
        self._key = key

    def release(self) -> None:
        """Let the next one go (once; later calls do nothing)."""
        if self._locks is not None:
            locks, self._locks = self._locks, None
            locks.release(self._key)


class InOrder:
    """`async with sliced.in_order(client, queue) as hold:` (see SlicedStore.in_order)."""

    __slots__ = ("_hold", "_key", "_locks")

    def __init__(self, locks: _Locks, key: Hashable) -> None:
        self._locks = locks
        self._key = key
        self._hold: QueueHold | None = None

    async def __aenter__(self) -> QueueHold:
        self._hold = await self._locks.acquire(self._key)
        return self._hold

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._hold is not None:
            self._hold.release()


class _Locks:
    """Exclusive holds by key, handed on in the order they were asked for.

    A key is held while it is in `_waiting` (with those waiting for it); taking a free
    one costs no await, and nothing is kept for a key nobody holds.
    """

    def __init__(self) -> None:
        self._waiting: dict[Hashable, deque[asyncio.Future[None]]] = {}

    def locked(self, key: Hashable) -> bool:
        return key in self._waiting

    def any_locked(self) -> bool:
        return bool(self._waiting)

    async def acquire_all(self, keys: list[Hashable]) -> list[QueueHold]:
        """A hold on each of `keys`, taken in the order given (none kept if cancelled)."""
        holds: list[QueueHold] = []
        waiting = self._waiting
        try:
            for key in keys:
                if key in waiting:
                    holds.append(await self.acquire(key))
                else:  # free: taken without a coroutine
                    waiting[key] = deque()
                    holds.append(QueueHold(self, key))
        except BaseException:
            for hold in holds:
                hold.release()
            raise
        return holds

    async def acquire(self, key: Hashable) -> QueueHold:
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = deque()
            return QueueHold(self, key)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting.append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(key)  # it was handed over, but will not be used: pass it on
            else:
                waiting.remove(future)
            raise
        return QueueHold(self, key)

    def release(self, key: Hashable) -> None:
        waiting = self._waiting[key]
        while waiting:
            future = waiting.popleft()
            if not future.done():
                future.set_result(None)  # handed over: still held
                return
        del self._waiting[key]


def _joined(parts: list[bytes], count: int, next_offset: int, last: GetResult) -> GetResult:
    """One FOUND answer of the slices read (the queue's bounds as the last read saw them)."""
    return GetResult("FOUND", next_offset, last.min_offset, last.max_offset, b"".join(parts), count)


def _frame_size(frame: CheckedFrame) -> int:
    return frame.end - frame.start
