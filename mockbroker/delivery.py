"""Sends and pulls on the store, the same for every front (gRPC, RocketMQ remoting).

A front translates its wire into frames (sdk/_wire.py) and calls `Delivery.send` (or
`send_parts`, for a request with batches for several queues), or asks `Delivery.pull` for
records; the checks, their order, fair scheduling between clients
(mockbroker/fair_store.py), the per-client memory limit (mockbroker/limits.py) and long
polling live here once. Every refusal is a BrokerError, raised before anything changed
(send_parts answers its parts' refusals with the others' results).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from mockbroker.dedup import MessagePlace
from mockbroker.dedup_sends import SortedBatch, across_parts, shared_keys
from mockbroker.errors import BrokerError, invalid
from mockbroker.fair_store import QueueHold
from mockbroker.long_polling import QueueKey
from mockbroker.push import SUBSCRIPTION_RECHECK, Credit, lock_wakeup
from mockbroker.state import BrokerState
from mockbroker.store.message_store import Batch, GetResult, PutResult, Written
from mockbroker.store.records import CheckedFrame, CheckedFrames, as_checked
from mockbroker.topics import Topic, check_group, check_user_topic
from mockbroker.transactions import HalfStored
from sdk._wire import MAX_PULL_BYTES, MAX_PULL_MESSAGES, MAX_SEND_BYTES

#: Longest a pull may be held (RocketMQ clients wait 30 s for a pull's answer).
MAX_SUSPEND_MS = 60_000

_Append = Callable[[Topic, int, bytes, Sequence[CheckedFrame]], Awaitable[PutResult]]


@dataclass(slots=True)  # not frozen: that costs a call per field, per part of every send
class SendOutcome:
    """What a send stored: its first offset (-1 when scheduled), count, time, durability.

    A scheduled batch waits in the schedule queue from `schedule_offset` on.
    """

    first_offset: int
    count: int
    store_timestamp_ms: int
    durable: bool
    scheduled: bool = False
    schedule_offset: int = -1
    #: A duplicate's: the queue its first copy is in (maybe not the one asked for); else -1.
    queue_id: int = -1
    #: With dedup on, for a batch with duplicates: each message's place, in order (the
    #: duplicates' their first copy's); empty when every message was stored.
    messages: tuple[MessagePlace, ...] = ()

    @property
    def duplicate(self) -> bool:
        """True when it repeats a send stored earlier: answered with that one's place."""
        return self.queue_id >= 0


class Delivery:
    """The broker's send and pull work for one BrokerState."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state
        self._send_seconds = state.requests.send_seconds

    async def send(self, client: str, topic_name: str, queue_id: int, frames: bytes) -> SendOutcome:
        """Store a batch of frames in one queue, or schedule it (all due later).

        With dedup on, a batch that repeats an earlier send is answered with its place
        (mockbroker/dedup_sends.py).
        """
        dedup = self._s.dedup
        if dedup is None:
            return await self._send(client, topic_name, queue_id, frames)
        keys = dedup.keys(topic_name, frames)
        await dedup.settle(keys)
        batch = dedup.sort(topic_name, frames, keys)
        if batch is None or not batch.duplicates:
            with dedup.storing(keys):
                outcome = await self._send(client, topic_name, queue_id, frames)
                if not outcome.scheduled:
                    dedup.stored(keys, queue_id, outcome.first_offset, outcome.store_timestamp_ms)
            return outcome
        stored: SendOutcome | None = None
        if batch.new:
            check_user_topic(topic_name)
            self._s.store.check(frames)  # a refusal names the frame by its place in `frames`
            new_keys = batch.new_keys()
            with dedup.storing(new_keys):
                stored = await self._send(client, topic_name, queue_id, batch.new_frames(frames))
                if not stored.scheduled:
                    dedup.stored(new_keys, queue_id, stored.first_offset, stored.store_timestamp_ms)
        durable = await dedup.durable(batch.duplicates)
        return _answered(batch, frames, queue_id, stored, durable)

    async def _send(
        self, client: str, topic_name: str, queue_id: int, frames: bytes
    ) -> SendOutcome:
        """Store a batch of frames in one queue, or schedule it (all due later).

        `client` names the connection it came on (fairness between clients). A topic
        missing while auto-creation is on is created only once every check has passed.
        """
        started = time.perf_counter()
        check_user_topic(topic_name)
        if len(frames) > MAX_SEND_BYTES:
            raise BrokerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "BATCH_TOO_LARGE",
                f"the request carries {len(frames)} bytes of frames, "
                f"over the limit of {MAX_SEND_BYTES}",
            )
        store = self._s.store
        self._shape(topic_name).check_queue(queue_id)
        sliced = self._s.sliced
        if sliced is None:
            checked = store.check(frames)
            outcome = await self._store(
                await self._accepted(client, topic_name, checked), queue_id, frames, checked,
                store.append,
            )  # fmt: skip
        else:
            queue = (topic_name, queue_id)

            def write_now(checked: CheckedFrames) -> Written | None:
                found = self._found(topic_name, checked)
                if found is None or _scheduled(checked) or sliced.writing(queue):
                    # append writes it, once the batch being written is whole or the topic
                    # is created (its file work is awaited: not in this turn)
                    return None
                return store.write(found, queue_id, frames, checked)

            async with sliced.in_order(client, queue) as hold:
                checked, written = await sliced.check(client, frames, write_now)
                if written is None:
                    append = functools.partial(sliced.append, client, hold)
                    found = await self._accepted(client, topic_name, checked)
                    outcome = await self._store(found, queue_id, frames, checked, append)
            if written is not None:
                durable = await store.durable(written.end)
                outcome = SendOutcome(
                    written.first_offset, written.count, written.store_timestamp_ms, durable
                )
        self._send_seconds.observe(time.perf_counter() - started)
        return outcome

    async def send_parts(
        self, client: str, topic_name: str, parts: list[tuple[int, bytes]]
    ) -> list[SendOutcome | BrokerError]:
        """Store a request's batches for several queues of one topic: (queue id, frames) each.

        With dedup on, a part that repeats an earlier send is answered with its place, and
        a message that repeats one of an earlier part of the request with that one's
        (`_across_parts`).
        """
        dedup = self._s.dedup
        if dedup is None:
            return await self._send_parts(client, topic_name, parts)
        keys = [dedup.keys(topic_name, frames) for _, frames in parts]
        await dedup.settle([k for part in keys for k in part])
        batches = [
            dedup.sort(topic_name, frames, part_keys)
            for (_, frames), part_keys in zip(parts, keys, strict=True)
        ]
        outcomes: dict[int, SendOutcome | BrokerError] = {}
        for i, b in enumerate(batches):
            if b is not None and b.new and b.duplicates:  # a refusal names its own frame
                try:
                    self._s.store.check(parts[i][1])
                except BrokerError as exc:
                    outcomes[i] = exc
        batches = self._across_parts(topic_name, parts, batches, outcomes)
        rest = [i for i, b in enumerate(batches) if i not in outcomes and (b is None or b.new)]
        if rest:
            stored_keys: list[bytes] = []
            to_send: list[tuple[int, bytes]] = []
            for i in rest:
                b, (q, frames) = batches[i], parts[i]
                stored_keys += keys[i] if b is None else b.new_keys()
                to_send.append((q, frames if b is None else b.new_frames(frames)))
            with dedup.storing(stored_keys):
                sent = await self._send_parts(client, topic_name, to_send)
                for index, outcome in zip(rest, sent, strict=True):
                    outcomes[index] = outcome
                    if isinstance(outcome, SendOutcome) and not outcome.scheduled:
                        b = batches[index]
                        dedup.stored(
                            keys[index] if b is None else b.new_keys(), parts[index][0],
                            outcome.first_offset, outcome.store_timestamp_ms,
                        )  # fmt: skip
        duplicates = sum(b.duplicates for b in batches if b is not None)
        if duplicates:
            durable = await dedup.durable(duplicates)
            placed = dict(outcomes)  # before the answers replace them

            def earlier(part: int, index: int) -> MessagePlace:
                got, b = placed[part], batches[part]
                assert isinstance(got, SendOutcome) and b is not None  # checked by the caller
                queue_id, frames = parts[part]
                return b.place(frames, index, queue_id, got.first_offset, got.store_timestamp_ms)

            for index, b in enumerate(batches):
                if b is None or not b.duplicates:
                    continue
                got = outcomes.get(index)
                if isinstance(got, BrokerError):
                    continue
                firsts = [placed[f[0]] for f in b.firsts if isinstance(f, tuple)]
                # A first copy's part passed the same checks: only its topic deleted and made
                # again meanwhile refuses it. Its copies are then answered with its refusal,
                # and the request sent again stores them (the others are answered duplicates).
                if refused := [f for f in firsts if isinstance(f, BrokerError)]:
                    outcomes[index] = refused[0]
                    continue
                ok = durable and all(isinstance(f, SendOutcome) and f.durable for f in firsts)
                outcomes[index] = _answered(b, parts[index][1], parts[index][0], got, ok, earlier)
        return [outcomes[index] for index in range(len(parts))]

    def _across_parts(
        self,
        topic_name: str,
        parts: list[tuple[int, bytes]],
        batches: list[SortedBatch | None],
        outcomes: dict[int, SendOutcome | BrokerError],
    ) -> list[SortedBatch | None]:
        """`batches` with the new messages that repeat one of an earlier part made duplicates.

        Only among parts stored together or not at all: a part that _send_parts's checks
        would refuse (refused whole) holds no first copy, so a later part's copy is the
        first and is stored; it is refused here already (`outcomes`), naming its own frame.
        Scheduled parts are left out (delayed messages are not deduplicated), as the
        scheduler stores or refuses each on its own. The checks are _send_parts's, on the
        whole part; for frames due now they do not depend on the clock.
        """
        candidates = [
            i for i, b in enumerate(batches) if b is not None and b.new and i not in outcomes
        ]
        shared = shared_keys(batches, candidates)
        if not shared:
            return batches
        try:
            shape = self._shape(topic_name)
        except BrokerError:
            return batches  # _send_parts refuses every part
        due_now: list[int] = []
        for i in candidates:
            b = batches[i]
            if b is None or not any(b.keys[n] in shared for n in b.new):
                continue
            queue_id, frames = parts[i]
            try:
                shape.check_queue(queue_id)
                scheduled = _scheduled(self._s.store.check(frames))
            except BrokerError as exc:
                outcomes[i] = exc
                continue
            if not scheduled:
                due_now.append(i)
        return across_parts(batches, due_now)

    async def _send_parts(
        self, client: str, topic_name: str, parts: list[tuple[int, bytes]]
    ) -> list[SendOutcome | BrokerError]:
        """Store a request's batches for several queues of one topic: (queue id, frames) each.

        Each part is checked and refused on its own (a bad frame, a queue out of range),
        the others still stored; the parts due now are written in one pass (one commit-log
        write, one flush wait), a queue's parts in the order given; scheduled parts go to
        the scheduler. A full disk refuses every part, none is written in half. Refusals
        of the request itself (its topic's name, its size) are raised.
        """
        started = time.perf_counter()
        check_user_topic(topic_name)
        total = sum(len(frames) for _, frames in parts)
        if total > MAX_SEND_BYTES:
            raise BrokerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "BATCH_TOO_LARGE",
                f"the request carries {total} bytes of frames in {len(parts)} parts, over "
                f"the limit of {MAX_SEND_BYTES}",
            )
        outcomes: dict[int, SendOutcome | BrokerError] = {}
        try:
            shape = self._shape(topic_name)
        except BrokerError as exc:
            return [exc] * len(parts)
        valid: list[tuple[int, int, bytes]] = []  # (index, queue id, frames)
        queue_count = shape.queue_count
        for index, (queue_id, frames) in enumerate(parts):
            if not 0 <= queue_id < queue_count:
                try:
                    shape.check_queue(queue_id)  # INVALID_QUEUE
                except BrokerError as exc:
                    outcomes[index] = exc
                    continue
            valid.append((index, queue_id, frames))
        sliced = self._s.sliced
        holds: list[QueueHold] = []
        if sliced is not None:
            queues = sorted({queue_id for _, queue_id, _ in valid})
            holds = await sliced.in_order_all(client, [(topic_name, q) for q in queues])
        try:
            sorted_checks: list[tuple[list[tuple[int, Batch]], list[tuple[int, Batch]]]] = []

            def write_now(checks: list[CheckedFrames | BrokerError]) -> list[Written] | None:
                """In the checks' turn: a request all due now is written at once (as `_send`)."""
                now, later = _sort_checks(valid, checks, outcomes)
                sorted_checks.append((now, later))
                assert sliced is not None
                if not now or later or sliced.writing_any(topic_name, [b.queue_id for _, b in now]):
                    return None
                try:
                    self._s.store.check_accepting_sends()
                    topic = self._s.store.topics.find(topic_name)
                    if topic is None:
                        return None  # created below, where its file work can be awaited
                    return self._s.store.write_parts(topic, [batch for _, batch in now])
                except BrokerError as exc:
                    outcomes.update((index, exc) for index, _ in now)
                    return []

            checks: list[CheckedFrames | BrokerError]
            if sliced is None:
                checks = [_checked(self._s.store.check, frames) for _, _, frames in valid]
            else:
                checks, written = await sliced.check_parts_then(
                    client, [frames for _, _, frames in valid], write_now
                )
                if written is not None:
                    for hold in holds:  # written: the queues' next sends need not wait for fsync
                        hold.release()
                    holds = []  # let go: nothing left for the `finally` below
                    if written:
                        await self._written_parts(sorted_checks[0][0], written, outcomes)
                    self._send_seconds.observe(time.perf_counter() - started)
                    return [outcomes[index] for index in range(len(parts))]
            if sorted_checks:
                now, later = sorted_checks[0]
            else:
                now, later = _sort_checks(valid, checks, outcomes)
            try:
                topic = await self._accepting(client, topic_name) if now or later else None
            except BrokerError as exc:
                outcomes.update((index, exc) for index, _ in now + later)
                topic = None
            if topic is not None and later:
                await asyncio.gather(
                    self._write_parts(client, holds, topic, now, outcomes),
                    *(self._schedule_part(topic, index, batch, outcomes) for index, batch in later),
                )
            elif topic is not None:  # no task of its own: most requests schedule nothing
                await self._write_parts(client, holds, topic, now, outcomes)
        finally:
            for hold in holds:
                hold.release()
        self._send_seconds.observe(time.perf_counter() - started)
        return [outcomes[index] for index in range(len(parts))]

    async def _write_parts(
        self,
        client: str,
        holds: list[QueueHold],
        topic: Topic,
        batches: list[tuple[int, Batch]],
        outcomes: dict[int, SendOutcome | BrokerError],
    ) -> None:
        """Write the due-now parts in one pass and wait once for them to be durable."""
        if not batches:
            return
        store, sliced = self._s.store, self._s.sliced
        parts = [batch for _, batch in batches]
        try:
            if sliced is None:
                written = store.write_parts(topic, parts)
            else:
                written = await sliced.write_parts(client, holds, topic, parts)
        except BrokerError as exc:
            outcomes.update((index, exc) for index, _ in batches)
            return
        await self._written_parts(batches, written, outcomes)

    async def _written_parts(
        self,
        batches: list[tuple[int, Batch]],
        written: list[Written],
        outcomes: dict[int, SendOutcome | BrokerError],
    ) -> None:
        """The outcomes of parts written already: each stored, durable once synced."""
        store = self._s.store
        try:
            durable = not store.sync_flush or await store.durable(written[0].end)
        except BrokerError as exc:
            outcomes.update((index, exc) for index, _ in batches)
            return
        for (index, _), w in zip(batches, written, strict=True):
            outcomes[index] = SendOutcome(w.first_offset, w.count, w.store_timestamp_ms, durable)

    async def _schedule_part(
        self,
        topic: Topic,
        index: int,
        batch: Batch,
        outcomes: dict[int, SendOutcome | BrokerError],
    ) -> None:
        try:
            outcomes[index] = await self._schedule(
                topic, batch.queue_id, batch.frames, batch.checked
            )
        except BrokerError as exc:
            outcomes[index] = exc

    async def send_half(
        self, client: str, topic_name: str, queue_id: int, frame: bytes, group: str
    ) -> HalfStored:
        """Store one framed message as a half message of producer `group` (a transaction).

        Checked as a send is; a missing topic is created only once every check passed.
        """
        check_user_topic(topic_name)
        if len(frame) > MAX_SEND_BYTES:
            raise BrokerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "BATCH_TOO_LARGE",
                f"the request carries {len(frame)} bytes, over the limit of {MAX_SEND_BYTES}",
            )
        self._shape(topic_name).check_queue(queue_id)
        transactions = self._s.transactions
        framed, checked = transactions.check_half(group, frame)
        topic = await self._accepting(client, topic_name)
        return await transactions.store_half(group, topic, queue_id, framed, checked)

    def _shape(self, topic_name: str) -> Topic:
        """The topic, or the one auto-creation would make (TOPIC_NOT_FOUND when it is off)."""
        store = self._s.store
        topic = store.topics.find(topic_name)
        if topic is None and not self._s.config.auto_create_topics:
            topic = store.topics.get(topic_name)  # TOPIC_NOT_FOUND
        return topic or Topic(topic_name, self._s.config.default_queues)

    async def _accepted(
        self, client: str, topic_name: str, checked: Sequence[CheckedFrame]
    ) -> Topic:
        """The topic to store `checked` in, once the last checks passed (created if need be)."""
        _scheduled(checked)  # INVALID_DELIVERY_TIME for a mixed batch
        return await self._accepting(client, topic_name)

    def _found(self, topic_name: str, checked: Sequence[CheckedFrame]) -> Topic | None:
        """_accepted() without creating: None for a topic that is missing."""
        _scheduled(checked)
        self._s.store.check_accepting_sends()
        return self._s.store.topics.find(topic_name)

    async def _accepting(self, client: str, topic_name: str) -> Topic:
        """The topic to store in while the disk takes sends (created if need be)."""
        self._s.store.check_accepting_sends()
        return await self._s.topic_creation.user_topic(
            topic_name, self._s.config.default_queues, client=client
        )

    async def _store(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: Sequence[CheckedFrame],
        append: _Append,
    ) -> SendOutcome:
        if _scheduled(checked):
            return await self._schedule(topic, queue_id, frames, checked)
        result = await append(topic, queue_id, frames, checked)
        return SendOutcome(
            result.first_offset, result.count, result.store_timestamp_ms, result.durable
        )

    async def _schedule(
        self, topic: Topic, queue_id: int, frames: bytes, checked: Sequence[CheckedFrame]
    ) -> SendOutcome:
        put = await self._s.scheduler.schedule_stored(topic, queue_id, frames, checked)
        now_ms = int(self._s.clock.now() * 1000)
        return SendOutcome(-1, len(checked), now_ms, put.durable, True, put.first_offset)

    async def pull(
        self,
        client: str,
        *,
        group: str,
        topic_name: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[bytes] | None,
        suspend_ms: int,
    ) -> GetResult:
        """Read from one queue by offset; hold the pull up to `suspend_ms` for a message.

        `tags` is a parsed tag expression (None: every message).
        """
        check_group(group)
        _check_batch(max_messages, max_bytes)
        if not 0 <= suspend_ms <= MAX_SUSPEND_MS:
            raise invalid(
                "INVALID_ARGUMENT",
                f"suspend_timeout_ms {suspend_ms} is outside 0..{MAX_SUSPEND_MS}",
            )
        topic = self._s.topic_queue(topic_name, queue_id)
        deadline = self._s.clock.now() + suspend_ms / 1000
        while True:
            got = await self._read(client, group, topic, queue_id, offset, max_messages,
                                   max_bytes, tags)  # fmt: skip
            if not _caught_up(got) or not suspend_ms:
                return got
            offset = got.next_offset
            if not await self._s.holder.wait((topic.name, queue_id), deadline):
                return got

    async def _read(
        self,
        client: str,
        group: str,
        topic: Topic,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[bytes] | None,
    ) -> GetResult:
        """One read of a queue for a pull or a subscription: limits, fairness, parking."""
        limits, sliced = self._s.limits, self._s.sliced
        if limits.over(client):
            await limits.room(client)
        if sliced is None:
            got = self._s.store.get(
                topic, queue_id, offset, max_messages=max_messages, max_bytes=max_bytes,
                tags=tags,
            )  # fmt: skip
        else:
            got = await sliced.get(
                client, topic, queue_id, offset, max_messages=max_messages,
                max_bytes=max_bytes, tags=tags,
            )  # fmt: skip
        return await self._s.parking.filter(group, topic, queue_id, got)

    async def subscribe(
        self,
        client: str,
        *,
        group: str,
        topic_name: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[bytes] | None,
        client_id: str,
        lock_epoch: int,
        credit: Credit,
    ) -> AsyncIterator[GetResult]:
        """Push delivery: one queue's batches from `offset` on, as they arrive, within `credit`.

        Each batch spends its count and record bytes of `credit` (mockbroker/push.py);
        with none left it waits for a grant. With a `lock_epoch`, `client_id` must hold
        the queue's lock at it before every batch: when it does not, the subscription ends
        with LOCK_NOT_HELD or STALE_EPOCH (woken at once by a lock change at this broker,
        within SUBSCRIPTION_RECHECK by an expiry). Batches with no records (the tag filter
        skipped messages) spend nothing; an OFFSET_ILLEGAL batch is the last.
        """
        check_group(group)
        _check_batch(max_messages, max_bytes)
        topic = self._s.topic_queue(topic_name, queue_id)
        key = (topic.name, queue_id)
        lock_key = lock_wakeup(group, key)
        # What a wait is woken by: the lock, a grant, and (when caught up) an append.
        on_change: tuple[QueueKey, ...] = (lock_key, credit.key)
        on_append: tuple[QueueKey, ...] = (lock_key, credit.key, key)
        state, holder = self._s, self._s.holder
        # The last batch read to the queue's end: while the end is still there, wait for
        # an append without reading again (an empty read per batch costs as much as a
        # batch's at low rates). The end is looked at in the step that starts the wait,
        # so no append comes between.
        caught_up = False
        # Without a lock nothing but an append or a grant (or a stop) changes anything.
        recheck = SUBSCRIPTION_RECHECK if lock_epoch else MAX_SUSPEND_MS / 1000
        # Every wait until then ends by then: one timer a recheck, not one a batch.
        recheck_at = 0.0
        while True:
            if holder.closed:
                raise BrokerError(
                    grpc.StatusCode.UNAVAILABLE, "", "the broker is stopping: subscribe again"
                )
            if lock_epoch:
                state.locks.check_lock(group, key, client_id, lock_epoch)
            wake = on_change
            if credit.open and caught_up and state.store.end_offset(topic, queue_id) == offset:
                wake = on_append
            elif credit.open:
                got = await self._read(
                    client, group, topic, queue_id, offset,
                    min(max_messages, credit.messages), credit.batch_bytes(max_bytes), tags,
                )  # fmt: skip
                if lock_epoch:  # the lock may have changed hands while the read waited
                    state.locks.check_lock(group, key, client_id, lock_epoch)
                if got.status == "OFFSET_ILLEGAL":
                    yield got
                    return
                if got.count:
                    credit.spend(got.count, len(got.records))
                if got.count or got.next_offset != offset:
                    offset = got.next_offset
                    caught_up = got.status == "FOUND" and offset == got.max_offset
                    yield got
                    continue
                wake = on_append
            recheck_at = next_recheck(recheck_at, state.clock.now(), recheck)
            await holder.wait_any(wake, recheck_at, shared=True)


def _answered(
    batch: SortedBatch,
    frames: bytes,
    queue_id: int,
    stored: SendOutcome | None,
    durable: bool,
    earlier: Callable[[int, int], MessagePlace] | None = None,
) -> SendOutcome:
    """The answer to a batch with duplicates: each message's place (`messages`).

    `stored`: what became of its new messages (None: it had none). A batch that wholly
    repeats one earlier send, in its order and one queue, is answered as that send
    (`queue_id` set); any other keeps the queue asked for and the new messages' offsets.
    `earlier` places the messages of earlier parts of the request (SortedBatch.answer).
    """
    if stored is None:
        places = batch.answer(frames, queue_id, -1, 0, earlier)
        first = places[0]
        run = all(
            p.queue_id == first.queue_id and p.offset == first.offset + i
            for i, p in enumerate(places)
        )
        return SendOutcome(
            first.offset, len(places), first.store_timestamp_ms, durable,
            queue_id=first.queue_id if run else -1, messages=tuple(places),
        )  # fmt: skip
    first_offset = stored.schedule_offset if stored.scheduled else stored.first_offset
    places = batch.answer(frames, queue_id, first_offset, stored.store_timestamp_ms, earlier)
    return dataclasses.replace(
        stored, count=len(places), durable=stored.durable and durable, messages=tuple(places)
    )


def next_recheck(recheck_at: float, now: float, recheck: float) -> float:
    """The latest end of a subscription's wait starting `now`.

    `recheck_at` while it is ahead, by at most `recheck` (the waits share that deadline's
    timer, PullHolder's `shared`); else `recheck` from now (it passed, or the clock was
    set back).
    """
    return recheck_at if 0 < recheck_at - now <= recheck else now + recheck


def _check_batch(max_messages: int, max_bytes: int) -> None:
    if not 1 <= max_messages <= MAX_PULL_MESSAGES:
        raise invalid(
            "INVALID_ARGUMENT",
            f"max_messages {max_messages} is outside 1..{MAX_PULL_MESSAGES}",
        )
    if not 1 <= max_bytes <= MAX_PULL_BYTES:
        raise invalid("INVALID_ARGUMENT", f"max_bytes {max_bytes} is outside 1..{MAX_PULL_BYTES}")


def _caught_up(got: GetResult) -> bool:
    return got.status == "NO_NEW_MESSAGE" or (
        got.status == "NO_MATCHED_MESSAGE" and got.next_offset == got.max_offset
    )


def _checked(check: Callable[[bytes], CheckedFrames], frames: bytes) -> CheckedFrames | BrokerError:
    """check(frames), or its refusal."""
    try:
        return check(frames)
    except BrokerError as exc:
        return exc


def _sort_checks(
    valid: list[tuple[int, int, bytes]],
    checks: list[CheckedFrames | BrokerError],
    outcomes: dict[int, SendOutcome | BrokerError],
) -> tuple[list[tuple[int, Batch]], list[tuple[int, Batch]]]:
    """The checked parts (index, batch) due now and those scheduled; refusals to `outcomes`."""
    now: list[tuple[int, Batch]] = []
    later: list[tuple[int, Batch]] = []
    for (index, queue_id, frames), checked in zip(valid, checks, strict=True):
        try:
            if isinstance(checked, BrokerError):
                raise checked
            (later if _scheduled(checked) else now).append(
                (index, Batch(queue_id, frames, checked))
            )
        except BrokerError as exc:
            outcomes[index] = exc
    return now, later


def _scheduled(checked: Sequence[CheckedFrame]) -> bool:
    """True for a batch of scheduled messages; INVALID_DELIVERY_TIME for a mixed one."""
    scheduled = as_checked(checked).scheduled
    if scheduled and scheduled != len(checked):
        raise invalid(
            "INVALID_DELIVERY_TIME",
            "a batch is either all scheduled or all for now; send them separately",
        )
    return bool(scheduled)
