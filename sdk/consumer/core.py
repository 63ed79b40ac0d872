"""What every consumer does in the background, shared by push and lite pull consumers.

All on one event loop:
- heartbeats to every broker, and a membership watch that triggers rebalances;
- the rebalancer (at start, periodically, on membership change), or a fixed assignment;
- one long-polling pull loop per held queue, with flow control;
- with locks (orderly): lock renewal of every held queue, fenced by epochs;
- periodic offset persistence.
What happens to pulled messages is the subclass's business (`_deliver`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from sdk import metrics
from sdk._transport.protocol import GroupInfo, PullResult, PullStatus, Transport
from sdk._validation import (
    RETRY_PREFIX,
    check_group,
    check_topic,
    finite_number,
    split_tag_expression,
)
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.consumer.allocate import AllocateMessageQueueAveragely, AllocateMessageQueueStrategy
from sdk.consumer.config import ConsumeFromWhere
from sdk.consumer.local_offsets import LocalFileOffsetStore, default_offset_dir
from sdk.consumer.offset_store import RemoteOffsetStore
from sdk.consumer.process_queue import CachedCount, ProcessQueue
from sdk.consumer.rebalance import Rebalancer
from sdk.errors import (
    ClientStateError,
    InvalidArgumentError,
    InvalidQueueError,
    InvalidTagExpressionError,
    OrderMQError,
)
from sdk.log import log_event
from sdk.message import MessageExt, MessageQueue, check_queue

log = logging.getLogger("ordermq.consumer")

#: Warn about a queue whose release has waited this long for a listener call to return.
SLOW_RELEASE_WARNING = 20.0
#: RocketMQ: how long rebalance tries for a queue's consume lock before it gives up.
CONSUME_LOCK_WAIT = 0.5
#: Rebalance again this soon after a round that could not finish.
REBALANCE_RETRY = 0.5
FIRST_LOCK_RENEWAL = 1.0
#: While a subscribed topic does not exist, its route (only its own) is looked up this
#: often, so that a consumer started before its topic reads within a second of its
#: creation rather than at the next periodic round.
MISSING_TOPIC_POLL = 0.5

QueueHook = Callable[[list[MessageQueue]], Awaitable[None] | None]


def new_client_id() -> str:
    """host@pid@random: unique per client instance."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def parse_expression(expression: str) -> str:
    """A tag expression in its plain form ('*' or 'A || B'); InvalidTagExpressionError."""
    try:
        tags = split_tag_expression(expression)
    except ValueError as exc:
        raise InvalidTagExpressionError(str(exc)) from None
    return "*" if tags is None else " || ".join(tags)


class ConsumerTuning(Protocol):
    """The settings every consumer kind has (PushConsumerConfig, LitePullConsumerConfig).

    See those classes for what each means.
    """

    @property
    def pull_batch_size(self) -> int: ...  # noqa: D102

    @property
    def pull_max_bytes(self) -> int: ...  # noqa: D102

    @property
    def pull_suspend(self) -> float: ...  # noqa: D102

    @property
    def pull_timeout(self) -> float: ...  # noqa: D102

    @property
    def pull_error_backoff(self) -> float: ...  # noqa: D102

    @property
    def flow_control_backoff(self) -> float: ...  # noqa: D102

    @property
    def pull_threshold_for_queue(self) -> int: ...  # noqa: D102

    @property
    def pull_threshold_bytes_for_queue(self) -> int: ...  # noqa: D102

    @property
    def rebalance_interval(self) -> float: ...  # noqa: D102

    @property
    def lock_renew_interval(self) -> float: ...  # noqa: D102

    @property
    def lock_lease(self) -> float: ...  # noqa: D102

    @property
    def persist_interval(self) -> float: ...  # noqa: D102

    @property
    def heartbeat_interval(self) -> float: ...  # noqa: D102

    @property
    def young_queue_max_messages(self) -> int: ...  # noqa: D102


class ConsumerCore:
    """Group membership, queue ownership, pulling and offsets; subclasses consume.

    `transport`: how it reaches the brokers (sdk._transport.connect); closed at shutdown.
    """

    consume_type = "CONSUME_POLL"
    #: Whether start() needs a subscription or an assignment first.
    needs_queues = True

    def __init__(
        self,
        group: str,
        transport: Transport,
        *,
        tuning: ConsumerTuning,
        threshold_for_all: int,
        locks: bool,
        consume_from_where: ConsumeFromWhere,
        consume_timestamp: datetime | float | None,
        allocate_strategy: AllocateMessageQueueStrategy | None,
        on_queues_assigned: QueueHook | None,
        on_queues_revoked: QueueHook | None,
        clock: Clock | None,
        broadcasting: bool = False,
        offset_dir: Path | None = None,
        instance_name: str = "DEFAULT",
    ) -> None:
        self.group = check_group(group)
        self._transport = transport
        if not isinstance(consume_from_where, ConsumeFromWhere):
            raise InvalidArgumentError("consume_from_where must be a ConsumeFromWhere")
        if consume_from_where is ConsumeFromWhere.TIMESTAMP and consume_timestamp is None:
            raise InvalidArgumentError("ConsumeFromWhere.TIMESTAMP needs consume_timestamp")
        self._from_where = consume_from_where
        if isinstance(consume_timestamp, datetime):
            consume_timestamp = seconds_since_epoch(consume_timestamp)
        elif consume_timestamp is not None and not finite_number(consume_timestamp):
            raise InvalidArgumentError(
                "consume_timestamp must be a datetime or seconds since the epoch (a finite "
                f"number), not {consume_timestamp!r}"
            )
        self._from_timestamp = consume_timestamp
        for name, hook in (("on_queues_assigned", on_queues_assigned),
                           ("on_queues_revoked", on_queues_revoked)):  # fmt: skip
            if hook is not None and not callable(hook):
                raise InvalidArgumentError(f"{name} must be callable or None, not {hook!r}")
        if allocate_strategy is not None and not callable(
            getattr(allocate_strategy, "allocate", None)
        ):
            raise InvalidArgumentError(
                "allocate_strategy must have an allocate(consumer_group, current_cid, mq_all, "
                f"cid_all) method, not {allocate_strategy!r}"
            )
        self._tuning = tuning
        self._threshold_for_all = threshold_for_all  # -1: off
        self.uses_locks = locks
        self._on_assigned = on_queues_assigned
        self._on_revoked = on_queues_revoked
        self._clock: Clock = clock or SystemClock()
        self.lock_lease = tuning.lock_lease
        self.client_id = new_client_id()
        self.broadcasting = broadcasting
        self._subscriptions: dict[str, str] = {}
        self._state = "new"
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        self._cached = CachedCount()  # messages cached over `_queues`
        self._pulls: dict[MessageQueue, asyncio.Task[None]] = {}
        self._releasing_since: dict[MessageQueue, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_now = asyncio.Event()
        self.offsets: RemoteOffsetStore | LocalFileOffsetStore
        if broadcasting:
            self.offsets = LocalFileOffsetStore(
                offset_dir or default_offset_dir(self.group, instance_name)
            )
        else:
            self.offsets = RemoteOffsetStore(
                self._transport, self.group, self.client_id, on_fenced=self._fenced
            )
        metrics.track(self)
        self._rebalancer = Rebalancer(
            self._transport,
            self.group,
            self.client_id,
            allocate_strategy or AllocateMessageQueueAveragely(),
            self,
            broadcasting=broadcasting,
        )

    # ------------------------------------------------------------------ setup
    def _check_new(self, call: str) -> None:
        if self._state != "new":
            raise ClientStateError(f"{call} must come before start()")

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic`'s messages whose tag matches `expression` ('*' or 'A || B').

        The group's members share the topic's queues. The topic need not exist yet: start()
        logs a warning, and the first rebalance round after a producer creates it (within
        `rebalance_interval`) takes its queues. With ConsumeFromWhere.LAST_OFFSET they
        start at their first message, not their end, however many it holds: every message
        of a topic created after the consumer subscribed was sent since.
        """
        self._check_new("subscribe()")
        if self._rebalancer.assigned is not None:
            raise ClientStateError("subscribe() and assign() are exclusive: this consumer assigns")
        self._subscriptions[check_topic(topic)] = parse_expression(expression)

    async def _check_queues(self, queues: list[MessageQueue]) -> None:
        """InvalidQueueError unless every queue is a readable queue of its topic."""
        for q in queues:
            check_queue(q, "a consumer")
        for topic in sorted({q.topic for q in queues}):
            readable = await self._transport.readable_queues(topic)
            for queue in sorted(q for q in queues if q.topic == topic):
                if queue not in readable:
                    raise InvalidQueueError(
                        f"{queue} is not one of the {len(readable)} readable queues of "
                        f"{topic!r} (see fetch_message_queues)"
                    )

    # ------------------------------------------------------------------ lifecycle
    async def _start_core(self) -> None:
        """Join the group and take the queues (by rebalance or assignment).

        An assignment's queues are held when this returns; a subscription's are taken by
        the rebalance rounds that start here.
        """
        assigned = self._rebalancer.assigned
        if self.needs_queues and not self._subscriptions and assigned is None:
            raise ClientStateError("subscribe to a topic (or assign queues) before start()")
        self._state = "starting"
        self._rebalancer.topics = list(self._subscriptions)
        for topic in self._rebalancer.topics:
            if not topic.startswith(RETRY_PREFIX):
                # A topic that does not exist yet is only warned of: the rebalance takes
                # its queues once a producer creates it. Other failures fail the start.
                await self._rebalancer.topic_queues(topic)
        if assigned is not None:
            await self._check_queues(assigned)
        await self._heartbeat()
        self._state = "running"
        if assigned is not None:
            await self._rebalancer.rebalance()
        self._tasks = [
            asyncio.create_task(self._every(self._heartbeat, self._tuning.heartbeat_interval)),
            asyncio.create_task(self._every(self._persist, self._tuning.persist_interval)),
            # With an assignment, rounds retry what could not be taken (a lock held by
            # another member) and take a new assignment.
            asyncio.create_task(self._rebalance_loop()),
        ]
        if self._subscriptions:
            self._tasks.append(asyncio.create_task(self._watch_membership()))
            self._tasks.append(asyncio.create_task(self._watch_missing_topics()))
        if self.uses_locks:
            self._tasks.append(asyncio.create_task(self._lock_renewal_loop()))

    async def _stop_pulling(self) -> list[MessageQueue]:
        """Stop the background tasks and every pull loop; the queues still held."""
        self._state = "stopping"
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pq in self._queues.values():
            pq.dropped = True
        await self._cancel_pulls(list(self._pulls))
        return list(self._queues)

    async def _leave(self, held: list[MessageQueue]) -> None:
        """Persist offsets, call the revoke hook, unlock, leave the group, close."""
        await self.offsets.persist(held)
        if held:
            await self._call_hook(self._on_revoked, held)
        if self.uses_locks and held:
            await self._unlock(held)
        for queue in held:
            log_event(log, logging.INFO, "queue.removed", f"gave up {queue} (shutdown)",
                      group=self.group, topic=queue.topic, queue=queue.queue_id)  # fmt: skip
        with contextlib.suppress(OrderMQError):
            await self._transport.unregister(self.client_id)
        await self._transport.close()
        for pq in self._queues.values():
            pq.let_go()
            pq.detach()
        self._queues.clear()
        self._state = "shut down"

    # ------------------------------------------------------------------ subclass hooks
    def _deliver(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        """Messages were added to `pq`."""
        raise NotImplementedError

    def _may_pull(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        """False to hold back pulling `queue` for now (paused)."""
        return True

    async def _starting_offset(self, queue: MessageQueue, offset: int) -> None:
        """A queue starts (again) at `offset`."""

    # ------------------------------------------------------------------ rebalance host
    def held(self) -> Collection[MessageQueue]:
        """Queues held now, including ones being released."""
        return list(self._queues)

    def releasing(self) -> Collection[MessageQueue]:
        """Queues whose release waits for a listener call to end."""
        return list(self._releasing_since)

    async def acquire(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Lock (if need be), find the start offset, and start pulling each queue."""
        epochs: dict[MessageQueue, int] = {}
        asked = 0.0
        if self.uses_locks:
            epochs, asked = await self._lock(queues)
            queues = [q for q in queues if q in epochs]
            for queue in queues:
                log_event(log, logging.INFO, "lock.granted", f"locked {queue}", group=self.group,
                          topic=queue.topic, queue=queue.queue_id, epoch=epochs[queue])  # fmt: skip
        taken: list[MessageQueue] = []
        for queue in queues:
            try:
                offset = await self._start_offset(queue)
            except OrderMQError as exc:
                log.warning("cannot take %s yet: %s", queue, exc)
                continue
            pq = ProcessQueue(self._cached)
            pq.next_offset = offset
            if queue in epochs:
                pq.locked, pq.lock_epoch, pq.last_lock_time = True, epochs[queue], asked
                self.offsets.set_epoch(queue, epochs[queue])
            self.offsets.update(queue, offset, increase_only=False)
            self._queues[queue] = pq
            await self._starting_offset(queue, offset)
            taken.append(queue)
        for queue in taken:
            pq = self._queues[queue]
            log_event(log, logging.INFO, "queue.added", f"took {queue}", group=self.group,
                      topic=queue.topic, queue=queue.queue_id, offset=pq.next_offset,
                      epoch=pq.lock_epoch)  # fmt: skip
        if taken:
            await self._call_hook(self._on_assigned, taken)
            for queue in taken:
                self._start_pulling(queue, self._queues[queue])
        return taken

    async def release(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Stop queues; persist their offsets and (with locks) unlock them.

        A locked queue whose listener call does not end within CONSUME_LOCK_WAIT stays
        held, its lock renewed, until a later round finds the call ended. RocketMQ gives
        such a queue up after 20 s, and its next owner then calls its listener on the
        queue while this call still runs; ordermq never does (it warns instead).
        """
        now = self._clock.now()
        ready: list[MessageQueue] = []
        for queue in queues:
            pq = self._queues[queue]
            pq.dropped = True
            self._releasing_since.setdefault(queue, now)
            if not self.uses_locks:
                ready.append(queue)
                continue
            if not await self._acquire_within(pq.consume_lock, CONSUME_LOCK_WAIT):
                waited = now - self._releasing_since[queue]
                if waited >= SLOW_RELEASE_WARNING:
                    log.warning("%s cannot move to another consumer: its listener call has run "
                                "for %.0f s and has not returned", queue, waited)  # fmt: skip
                continue
            pq.consume_lock.release()
            ready.append(queue)
        if not ready:
            return []
        await self._cancel_pulls(ready)
        await self.offsets.persist(ready)
        await self._call_hook(self._on_revoked, ready)
        if self.uses_locks:
            await self._unlock(ready)
        for queue in ready:
            released = self._queues.pop(queue, None)
            if released is not None:
                # Its buffer goes now: a consume task may hold the queue a while yet
                # (waiting out a suspend, up to 30 s), and its messages with it.
                released.clear()
                released.detach()
            self._releasing_since.pop(queue, None)
            self.offsets.remove(queue)
            log_event(log, logging.INFO, "queue.removed", f"gave up {queue}", group=self.group,
                      topic=queue.topic, queue=queue.queue_id)  # fmt: skip
        return ready

    async def relock(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        """Try to lock one queue again now."""
        epochs, asked = await self._lock([queue])
        if queue in epochs:
            await self._apply_lock(queue, pq, epochs[queue], asked)
            return True
        return False

    # ------------------------------------------------------------------ loops
    async def _every(self, step: Callable[[], Awaitable[None]], seconds: float) -> None:
        while True:
            await sleep_for(self._clock, seconds)
            try:
                await step()
            except OrderMQError as exc:
                log.warning("%s failed: %s", step.__name__, exc)
            except Exception:  # a bug below: the loop must not end with it
                log.exception("%s failed unexpectedly", step.__name__)

    async def _heartbeat(self) -> None:
        model = "BROADCASTING" if self.broadcasting else "CLUSTERING"
        info = GroupInfo(self.group, self.consume_type, model, tuple(self._subscriptions.items()))
        await self._transport.heartbeat(self.client_id, [info])

    async def _persist(self) -> None:
        # A queue whose lock was lost is not ours to commit until it is locked again.
        await self.offsets.persist(
            [q for q, pq in self._queues.items() if pq.locked or not self.uses_locks]
        )

    async def _rebalance_loop(self) -> None:
        delay = 0.0
        while True:
            if delay:
                await self._wait_for_rebalance(delay)
            self._rebalance_now.clear()
            complete = await self._rebalancer.rebalance()
            delay = self._tuning.rebalance_interval if complete else REBALANCE_RETRY

    async def _acquire_within(self, lock: asyncio.Lock, seconds: float) -> bool:
        """Take `lock` if it comes free within `seconds` on the clock."""
        acquire = asyncio.ensure_future(lock.acquire())
        timer = asyncio.ensure_future(sleep_for(self._clock, seconds))
        try:
            await asyncio.wait((acquire, timer), return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            acquire.cancel()  # no effect once it has the lock
        return acquire.done() and not acquire.cancelled()

    async def _wait_for_rebalance(self, delay: float) -> None:
        sleeper = asyncio.ensure_future(sleep_for(self._clock, delay))
        trigger = asyncio.ensure_future(self._rebalance_now.wait())
        try:
            await asyncio.wait((sleeper, trigger), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            trigger.cancel()

    async def _watch_membership(self) -> None:
        known = 0
        while True:
            try:
                async for version in self._transport.watch_membership(self.group, known):
                    known = version
                    self._rebalance_now.set()
            except OrderMQError as exc:
                log.debug("membership watch interrupted: %s", exc)
            except Exception:  # a bug below: the watch must not end with it
                log.exception("membership watch failed unexpectedly")
            await sleep_for(self._clock, self._tuning.pull_error_backoff)
            with contextlib.suppress(OrderMQError):
                await self._heartbeat()  # a broker that restarted learns of us at once

    async def _watch_missing_topics(self) -> None:
        while True:
            await sleep_for(self._clock, MISSING_TOPIC_POLL)
            if not self._rebalancer.missing:
                continue
            try:
                if await self._rebalancer.missing_appeared():
                    self._rebalance_now.set()
            except OrderMQError as exc:
                log.debug("looking up topics that did not exist failed: %s", exc)
            except Exception:  # a bug below: the loop must not end with it
                log.exception("looking up topics that did not exist failed unexpectedly")

    async def _lock_renewal_loop(self) -> None:
        await sleep_for(self._clock, FIRST_LOCK_RENEWAL)
        while True:
            try:
                await self._renew_locks()
            except OrderMQError as exc:
                log.warning("lock renewal failed: %s", exc)
            except Exception:  # a bug below: the renewals must not end with it
                log.exception("lock renewal failed unexpectedly")
            await sleep_for(self._clock, self._tuning.lock_renew_interval)

    async def _renew_locks(self) -> None:
        # Queues being released are renewed too: their listener call still runs, and
        # nobody else may call a listener on them until it ends.
        held = dict(self._queues)
        if not held:
            return
        epochs, unanswered, asked = await self._lock_answers(list(held))
        for queue, pq in held.items():
            if pq.dropped or queue in unanswered:
                continue  # a broker that did not answer took nothing: the lease runs on
            if queue in epochs:
                try:
                    await self._apply_lock(queue, pq, epochs[queue], asked)
                except OrderMQError as exc:  # the other queues' grants still count
                    log.warning("taking %s at its new lock epoch failed: %s", queue, exc)
            elif pq.locked:
                log_event(log, logging.WARNING, "lock.lost", f"lost the lock of {queue}",
                          group=self.group, topic=queue.topic, queue=queue.queue_id)  # fmt: skip
                pq.locked = False

    def _fenced(self, queue: MessageQueue) -> None:
        """The broker refused a commit of `queue`: another owner has (or had) it since.

        No listener call until a fresh grant; it comes with a new epoch, so the queue
        starts again from the committed offset.
        """
        pq = self._queues.get(queue)
        if pq is not None and pq.locked:
            log_event(log, logging.WARNING, "lock.lost", f"lost the lock of {queue} (fenced)",
                      group=self.group, topic=queue.topic, queue=queue.queue_id)  # fmt: skip
            pq.locked = False

    async def _apply_lock(
        self, queue: MessageQueue, pq: ProcessQueue, epoch: int, asked: float
    ) -> None:
        """Take a grant of `queue`'s lock at `epoch`, asked for at `asked` (clock time).

        The client's lease runs from when the lock was asked for, not from when the
        answer came: the broker renewed it at some moment in between, so the client's
        view ends before the broker's. Counted from the answer, a grant whose answer
        was held up (a partition that cut the way back first) would give a fresh lease
        to a client the broker has since expired, while another client has the queue.
        """
        if epoch != pq.lock_epoch:
            log_event(log, logging.INFO, "lock.granted", f"locked {queue} again", group=self.group,
                      topic=queue.topic, queue=queue.queue_id, epoch=epoch)  # fmt: skip
        if pq.lock_epoch and epoch != pq.lock_epoch:
            # The lock passed through another owner: what we buffered, and where we
            # were, may be stale. No listener call until we start again from the
            # committed offset; a failed read leaves the old epoch, so the next renewal
            # tries again. Pulls and batches of before the reset are dropped as stale.
            log.warning("%s changed owner while we were away; re-reading its offset", queue)
            pq.locked = False
            committed = await self.offsets.fetch(queue)
            if pq.dropped:
                return
            if committed is not None:
                pq.reset(committed)
                self.offsets.update(queue, committed, increase_only=False)
                await self._starting_offset(queue, committed)
        if epoch == pq.lock_epoch:  # no other owner since: a later grant's time stands
            asked = max(asked, pq.last_lock_time)
        pq.locked, pq.lock_epoch, pq.last_lock_time = True, epoch, asked
        self.offsets.set_epoch(queue, epoch)

    # ------------------------------------------------------------------ pulling
    def _start_pulling(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        self._pulls[queue] = asyncio.create_task(self._pull_loop(queue, pq))

    async def _pull_loop(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        t = self._tuning
        expression = self._subscriptions.get(queue.topic, "*")
        while not pq.dropped:
            if self._over_threshold(pq) or not self._may_pull(queue, pq):
                await self._wait_for_room(pq, t.flow_control_backoff)
                continue
            if self.uses_locks and not pq.locked:
                await sleep_for(self._clock, 1.0)
                continue
            generation = pq.generation
            try:
                result = await self._transport.pull(
                    self.group,
                    queue,
                    pq.next_offset,
                    max_messages=t.pull_batch_size,
                    max_bytes=t.pull_max_bytes,
                    tag_expression=expression,
                    suspend_timeout=t.pull_suspend,
                    timeout=t.pull_timeout,
                )
            except OrderMQError as exc:
                log.warning("pull of %s failed: %s", queue, exc)
                await sleep_for(self._clock, t.pull_error_backoff)
                continue
            except Exception:  # a bug below: this queue's task must not end with it
                log.exception("pull of %s failed unexpectedly", queue)
                await sleep_for(self._clock, t.pull_error_backoff)
                continue
            if pq.dropped:
                return
            if pq.generation != generation:
                continue  # the queue was reset (seek, new owner) while this pull ran
            await self._accept(queue, pq, result)

    async def _accept(self, queue: MessageQueue, pq: ProcessQueue, result: PullResult) -> None:
        """Buffer and hand on what a pull (or a push subscription) brought."""
        if result.status is PullStatus.OFFSET_ILLEGAL:
            self._offset_illegal(queue, pq.next_offset, result)
            pq.next_offset = result.next_offset
            self.offsets.update(queue, result.next_offset, increase_only=False)
            await self._starting_offset(queue, result.next_offset)
        else:
            self._buffer(queue, pq, result)

    def _buffer(self, queue: MessageQueue, pq: ProcessQueue, result: PullResult) -> None:
        """`_accept` of a FOUND or NO_MATCHED_MESSAGE result: it needs no await."""
        if result.status is PullStatus.FOUND:
            if queue.topic.startswith(RETRY_PREFIX):
                _restore_origin(result.messages)
            pq.put(result.messages)
            pq.next_offset = result.next_offset
            self._deliver(queue, pq)
        else:
            pq.next_offset = result.next_offset
            if pq.count == 0:  # skipped only non-matching messages: move past them
                self._skipped_to(queue, result.next_offset)

    async def _wait_for_room(
        self, pq: ProcessQueue, seconds: float, when: Callable[[], bool] | None = None
    ) -> None:
        """Flow control: wait `seconds`, or less: until messages leave `pq`'s cache.

        With `when`, until they leave and `when()` says the room is enough (asked each
        time some leave).

        Without the early wake a pull loop held back by a full cache slept the whole
        backoff after poll() or the listener had made room (issue 40: a blocking poll loop,
        whose caller lags its loop thread, did so about 50 times per 200 000 messages).
        """
        room = pq.room = asyncio.Event()
        pq.room_when = when
        sleeper = asyncio.ensure_future(sleep_for(self._clock, seconds))
        trigger = asyncio.ensure_future(room.wait())
        try:
            await asyncio.wait((sleeper, trigger), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            trigger.cancel()
            if pq.room is room:
                pq.room = pq.room_when = None

    def _offset_illegal(self, queue: MessageQueue, offset: int, result: PullResult) -> None:
        """Say why the pull's offset moves; count messages retention deleted (too small)."""
        if offset < result.min_offset == result.next_offset:
            skipped = result.min_offset - offset
            metrics.retention_skipped(self.group, queue.topic, skipped)
            log.warning(
                "%s: offset %d is below the oldest stored %d: the broker's retention deleted "
                "%d messages before they were consumed; continuing at %d",
                queue, offset, result.min_offset, skipped, result.next_offset,
            )  # fmt: skip
            return
        log.warning(
            "%s: offset %d is outside [%d, %d]; continuing at %d",
            queue, offset, result.min_offset, result.max_offset, result.next_offset,
        )  # fmt: skip

    def _skipped_to(self, queue: MessageQueue, offset: int) -> None:
        """Nothing buffered, and the broker skipped to `offset` (filtered messages)."""
        self.offsets.update(queue, offset)

    def _over_threshold(self, pq: ProcessQueue) -> bool:
        return (
            pq.count >= self._queue_threshold()
            or pq.size >= self._tuning.pull_threshold_bytes_for_queue
        )

    def _queue_threshold(self) -> int:
        """Most messages one queue's cache holds before its pulls pause."""
        limit = self._tuning.pull_threshold_for_queue
        if self._threshold_for_all > 0 and self._queues:
            limit = min(limit, max(1, self._threshold_for_all // len(self._queues)))
        return limit

    async def _cancel_pulls(self, queues: list[MessageQueue]) -> None:
        tasks = [t for q in queues if (t := self._pulls.pop(q, None)) is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ helpers
    async def _start_offset(self, queue: MessageQueue) -> int:
        committed = await self.offsets.fetch(queue)
        if committed is not None:
            return committed
        low, high, at_time = await self._transport.queue_offsets(
            queue,
            int((self._from_timestamp or 0) * 1000)
            if self._from_where is ConsumeFromWhere.TIMESTAMP
            else 0,
        )
        if (
            queue.topic.startswith(RETRY_PREFIX)
            or self._from_where is ConsumeFromWhere.FIRST_OFFSET
        ):
            return low
        if self._from_where is ConsumeFromWhere.TIMESTAMP:
            return at_time
        # A topic created after this client subscribed holds only messages sent since.
        if queue.topic in self._rebalancer.created_later or self._young(low, high):
            return low
        return high

    def _young(self, low: int, high: int) -> bool:
        """Whether a new group starts at 0 with LAST_OFFSET on a queue of these offsets.

        RocketMQ's broker answers 0 for a group with no offset when the queue's min offset
        is 0 and its first message is still in memory; ordermq has no page cache to ask,
        so "small enough to replay" stands in: at most `young_queue_max_messages`.
        Broadcasting members never ask the broker, in RocketMQ either.
        """
        limit = self._tuning.young_queue_max_messages
        return not self.broadcasting and low == 0 and high <= limit

    async def _lock(self, queues: list[MessageQueue]) -> tuple[dict[MessageQueue, int], float]:
        """The queues locked, with their epochs, and when they were asked for."""
        epochs, _unanswered, asked = await self._lock_answers(queues)
        return epochs, asked

    async def _lock_answers(
        self, queues: list[MessageQueue]
    ) -> tuple[dict[MessageQueue, int], set[MessageQueue], float]:
        """The locks: granted (with epochs), unanswered, and when they were asked for.

        The time is the clock's before the first request: each lease counts from it.
        """
        asked = self._clock.now()
        answer = await self._transport.lock_batch(self.group, self.client_id, queues)
        unanswered: set[MessageQueue] = set()
        for part in answer.unanswered:
            log.warning("locking %d queues at %s failed: %s", len(part.queues), part.broker,
                        part.error)  # fmt: skip
            unanswered.update(part.queues)
        return answer.locked, unanswered, asked

    async def _unlock(self, queues: list[MessageQueue]) -> None:
        answer = await self._transport.unlock_batch(self.group, self.client_id, queues)
        for part in answer.unanswered:
            log.warning("unlocking %d queues at %s failed: %s", len(part.queues), part.broker,
                        part.error)  # fmt: skip
        for queue in answer.not_held:
            log.info("%s was not unlocked: another client holds it now", queue)

    async def _call_hook(self, hook: QueueHook | None, queues: list[MessageQueue]) -> None:
        if hook is None:
            return
        try:
            result: Any = hook(sorted(queues))
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("rebalance hook %s raised", getattr(hook, "__name__", hook))


def _restore_origin(messages: list[MessageExt]) -> None:
    """Messages read from a retry topic show the topic they were first sent to."""
    for m in messages:
        origin = m.properties.get("ORIGIN_TOPIC")
        if origin:
            m.topic = origin


def seconds_since_epoch(moment: datetime) -> float:
    """`moment.timestamp()`, or InvalidArgumentError for a datetime it cannot convert.

    Such as a naive one near year 1 or 9999, whose local time falls outside the years
    datetime holds (ValueError or OverflowError before).
    """
    try:
        return moment.timestamp()
    except (ValueError, OverflowError, OSError) as exc:
        raise InvalidArgumentError(
            f"consume_timestamp {moment!r} is no time since the epoch this host can tell "
            f"({exc}); give an aware datetime or seconds since the epoch"
        ) from exc
