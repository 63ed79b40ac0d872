"""The lite pull consumer's async core: background pulls into a bounded cache, poll().

Offsets: a batch poll() returns is done when the caller calls poll() again (or commit(),
or shutdown()); each queue's "consumed" offset is the end of its done batches. commit()
makes that the group's offset and sends it to the broker. Auto commit covers only done
batches, whenever it runs (in poll() every `auto_commit_interval`, when a rebalance
takes a queue away, at shutdown), so a batch the caller holds is delivered again after
a crash (Kafka's rule). shutdown() takes the last batch as done, as Kafka's close() does;
leaving a `with` block by an exception does not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Generator, Mapping
from datetime import datetime

from sdk._accel import hand_out
from sdk._transport.protocol import Transport
from sdk._validation import check_kind
from sdk.clock import Clock
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.consumer.config import ConsumeFromWhere, LitePullConsumerConfig
from sdk.consumer.core import QueueHook
from sdk.consumer.process_queue import ProcessQueue
from sdk.consumer.push_delivery import PushDeliveryCore
from sdk.errors import ClientStateError, InvalidArgumentError, InvalidOffsetError
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.consumer")


#: Beyond this many seconds from the epoch, a timestamp in milliseconds is not an int64.
_MAX_TIMESTAMP_S = 2**63 / 1000


class LitePullConsumerCore(PushDeliveryCore):
    """Subscribe or assign, then poll."""

    consume_type = "CONSUME_POLL"
    needs_queues = False  # RocketMQ's assign flow: start, fetch_message_queues, assign

    def __init__(
        self,
        group: str,
        transport: Transport,
        *,
        auto_commit: bool = True,
        orderly: bool = False,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: datetime | float | None = None,
        allocate_strategy: AllocateMessageQueueStrategy | None = None,
        config: LitePullConsumerConfig | None = None,
        on_queues_assigned: QueueHook | None = None,
        on_queues_revoked: QueueHook | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.config = c = (
            check_kind(config, LitePullConsumerConfig, "config") or LitePullConsumerConfig()
        )
        super().__init__(
            group,
            transport,
            tuning=c,
            threshold_for_all=-1,  # the cache limit below is a total, not a share
            locks=orderly,
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
            on_queues_assigned=on_queues_assigned,
            on_queues_revoked=on_queues_revoked,
            clock=clock,
        )
        self.auto_commit = auto_commit
        self._push = c.delivery == "push"
        self._consumed: dict[MessageQueue, int] = {}  # the end of the done batches
        # The queue of the batch the last poll() returned, and where that batch ends.
        self._last: tuple[MessageQueue, int] | None = None
        # The last batches handed out, oldest first: out of the cycle collector (see
        # ProcessQueue) until `batches_lent` later ones are handed out or the consumer
        # shuts down, so that collections do not traverse a poll's batch while the caller
        # works through it.
        self._lent: list[list[MessageExt]] = []
        #: How many of the last batches handed out stay out of the cycle collector. The
        #: blocking face keeps two: its caller still holds the last one until poll()'s
        #: answer reaches its thread, and collections the loop's thread runs meanwhile
        #: would traverse it (and move it a generation up, as if long-lived).
        self.batches_lent = 1
        self._paused: set[MessageQueue] = set()
        self._ready = asyncio.Event()
        self._turn = 0
        self._last_commit = 0.0
        # Orderly: the queue whose batch the caller is processing keeps its consume lock
        # until the next poll(), so rebalance cannot unlock it under the caller's feet.
        self._in_hand: ProcessQueue | None = None
        self._assigning = asyncio.Lock()  # assign() calls after start() apply in call order
        self._assignment: asyncio.Task[None] | None = None  # the latest of them

    # ------------------------------------------------------------------ setup
    def subscribe(self, topic: str, expression: str = "*") -> None:
        """As ConsumerCore.subscribe; before start() only (a started consumer assigns)."""
        if self._state != "new":
            raise ClientStateError(
                "subscribe() must come before start(); a started lite pull consumer takes "
                "queues with assign()"
            )
        super().subscribe(topic, expression)

    def assign(self, queues: list[MessageQueue]) -> Awaitable[None]:
        """Consume exactly these queues (no group rebalance); exclusive with subscribe().

        Before start(), records them (start() checks them and takes them). After start(),
        replaces the assignment: queues no longer assigned are released (committing
        what earlier polls returned, with auto commit) and new ones taken. That happens
        in the returned awaitable, which the next poll(), commit() or seek waits for too;
        it raises InvalidQueueError, changing nothing, unless every queue is a readable
        queue of its topic. With orderly, a queue whose lock another member holds is
        taken once that member lets go.
        """
        if self._state not in ("new", "running"):
            raise ClientStateError(f"cannot assign queues: the consumer is {self._state}")
        if self._subscriptions:
            raise ClientStateError(
                "subscribe() and assign() are exclusive: this consumer subscribes"
            )
        if not queues:
            raise InvalidArgumentError("assign() needs at least one queue")
        wanted = sorted(set(queues))
        if self._state == "new":
            self._rebalancer.assigned = wanted
            return _DONE
        task = asyncio.ensure_future(self._reassign(wanted))
        task.add_done_callback(_log_failure)
        self._assignment = task
        return task

    async def _reassign(self, queues: list[MessageQueue]) -> None:
        async with self._assigning:
            await self._check_queues(queues)
            self._rebalancer.assigned = queues
            await self._rebalancer.rebalance()

    async def _assigned(self) -> None:
        """Wait for the latest assign() (its error is its caller's, not ours)."""
        if self._assignment is not None:
            await asyncio.wait([self._assignment])

    async def start(self) -> None:
        """Join the group and start pulling in the background.

        Without subscribe() or assign() first, it starts with no queues: assign() them
        later (RocketMQ's flow: start, fetch_message_queues, assign, poll).
        """
        if self._state != "new":
            raise ClientStateError(f"consumer cannot start: it is {self._state}")
        self._last_commit = self._clock.now()
        try:
            await self._start_core()
        except BaseException:
            await self._transport.close()
            self._state = "shut down"
            raise

    async def shutdown(self) -> None:
        """Commit what poll() returned (with auto commit), unlock, leave the group.

        The last batch counts as processed: shutting down says the caller is done with it
        (call abandon_last_batch() first when it is not).
        """
        if self._state in ("new", "shut down"):
            self._state = "shut down"
            return
        self._put_down()
        if self._assignment is not None:
            self._assignment.cancel()
            await asyncio.wait([self._assignment])
        for lent in self._lent:
            hand_out(lent)
        self._lent = []
        held = await self._stop_pulling()
        if self.auto_commit:
            self._take_consumed(held)
        self._ready.set()
        await self._leave(held)

    @property
    def running(self) -> bool:
        """True between start() and shutdown()."""
        return self._state == "running"

    def _running(self) -> None:
        if self._state != "running":
            raise ClientStateError(f"the consumer is {self._state}; poll after start()")

    # ------------------------------------------------------------------ poll
    async def poll(self, timeout: float) -> list[MessageExt]:
        """Messages of one queue in order, or [] when none arrive within `timeout` s."""
        if not timeout >= 0:  # NaN too
            raise InvalidArgumentError(f"poll timeout must not be negative, not {timeout}")
        self._running()
        self._put_down()
        await self._assigned()
        if self.auto_commit and self._clock.now() - self._last_commit >= (
            self.config.auto_commit_interval
        ):
            await self.commit()
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            batch = await self._take()
            if batch or self._state != "running":
                return batch
            self._ready.clear()
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                return []
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that arrives as the event is set, and poll() would run on.
                async with asyncio.timeout(remaining):
                    await self._ready.wait()
            except TimeoutError:
                return []

    def poll_now(self) -> list[MessageExt] | None:
        """poll()'s batch when one is ready and nothing else is due; None: call poll().

        The same as poll() returning at once: the last batch is put down and the next
        queue's batch taken, in the same turn. None, changing nothing, when poll() has
        more to do (an assignment or an auto commit to wait for, queue locks to take, an
        error to raise) or nothing is buffered: poll() then does it all.
        """
        if (
            self._state != "running"
            or self.uses_locks
            or (self._assignment is not None and not self._assignment.done())
            or (
                self.auto_commit
                and self._clock.now() - self._last_commit >= self.config.auto_commit_interval
            )
        ):
            return None
        for pq in self._queues.values():
            if pq.buffered:
                break
        else:
            return None
        self._put_down()
        return self._take_unlocked() or None

    async def _take(self) -> list[MessageExt]:
        if not self.uses_locks:
            return self._take_unlocked()
        queues = list(self._queues)
        for i in range(len(queues)):
            queue = queues[(self._turn + i) % len(queues)]
            pq = self._queues[queue]
            if pq.dropped or queue in self._paused or not pq.buffered:
                continue
            if not self._lease_valid(pq) or pq.consume_lock.locked():
                continue  # expired, or being released
            await pq.consume_lock.acquire()  # free: this does not wait
            self._in_hand = pq
            batch = pq.take(self.config.pull_batch_size)
            self._last = (queue, pq.commit(lent=True))
            self._lend(batch)
            self._turn = (self._turn + i + 1) % len(queues)
            return batch
        return []

    def _take_unlocked(self) -> list[MessageExt]:
        """_take() without queue locks: it needs no waiting."""
        queues = list(self._queues)
        for i in range(len(queues)):
            queue = queues[(self._turn + i) % len(queues)]
            pq = self._queues[queue]
            if pq.dropped or queue in self._paused or not pq.buffered:
                continue
            batch = pq.take(self.config.pull_batch_size)
            self._last = (queue, pq.commit(lent=True))
            self._lend(batch)
            self._turn = (self._turn + i + 1) % len(queues)
            return batch
        return []

    def _put_down(self, done: bool = True) -> None:
        """The caller is done with the last batch it polled (`done`), or gave up on it."""
        if self._last is not None:
            queue, end = self._last
            self._last = None
            if done:
                self._consumed[queue] = end
        if self._in_hand is not None:
            self._in_hand.consume_lock.release()
            self._in_hand = None

    def _lend(self, batch: list[MessageExt]) -> None:
        """Hand out `batch`; the batch `batches_lent` before it goes back to the collector.

        Not before: the caller still has the last batch while poll() waits for the next,
        and collections then would traverse it (and keep it as if long-lived).
        """
        lent = self._lent
        lent.append(batch)
        if len(lent) > self.batches_lent:
            hand_out(lent.pop(0))

    def handed_out(self, message: MessageExt) -> None:
        """The caller was given `message` of the last batch, and not yet what follows it."""
        if self._last is not None and self._last[0] == message.queue:
            self._last = (message.queue, message.queue_offset + 1)

    def abandon_last_batch(self) -> None:
        """The caller did not process the last batch poll() returned: no commit covers it.

        Auto commit, shutdown included, then stops before it, so it is delivered again.
        """
        self._put_down(done=False)

    def _lease_valid(self, pq: ProcessQueue) -> bool:
        return pq.lease_fresh(self._clock.now(), self.lock_lease)

    # ------------------------------------------------------------------ offsets
    def _take_consumed(self, queues: list[MessageQueue]) -> None:
        for queue in queues:
            if queue in self._consumed and queue in self._queues:
                self.offsets.update(queue, self._consumed[queue])

    async def commit(
        self, offsets: dict[MessageQueue, int] | None = None, *, persist: bool = True
    ) -> None:
        """Commit what poll() returned so far, or the given offsets (next to consume)."""
        self._running()
        self._put_down()
        await self._assigned()
        if offsets is None:
            queues = list(self._consumed)
            self._take_consumed(queues)
        elif not isinstance(offsets, Mapping):
            raise InvalidArgumentError(
                f"commit() takes a dict of MessageQueue to offset, not {type(offsets).__name__}"
            )
        else:
            for queue, offset in offsets.items():
                self._check_assigned(queue)
                _check_offset(offset, f"offset {offset!r} for {queue}")
                low, high, _ = await self._transport.queue_offsets(queue)
                if not low <= offset <= high:
                    raise InvalidOffsetError(
                        f"offset {offset} for {queue} is outside [{low}, {high}]"
                    )
            for queue, offset in offsets.items():
                self.offsets.update(queue, offset, increase_only=False)
                self._consumed[queue] = offset
            queues = list(offsets)
        self._last_commit = self._clock.now()
        if persist:
            await self.offsets.persist(queues)

    async def committed(self, queue: MessageQueue) -> int:
        """The group's committed offset of `queue` at the broker; -1 if it has none."""
        await self._check_queues([queue])
        offset = await self.offsets.fetch(queue)
        return -1 if offset is None else offset

    async def _starting_offset(self, queue: MessageQueue, offset: int) -> None:
        self._consumed[queue] = offset
        if self._last is not None and self._last[0] == queue:
            self._last = None  # the queue moved: the batch in hand no longer counts

    def _skipped_to(self, queue: MessageQueue, offset: int) -> None:
        # Not while the caller holds a batch of the queue: the skip would cover it. The
        # next pull that finds nothing to hand out reports the skip again.
        if self._last is None or self._last[0] != queue:
            self._consumed[queue] = max(self._consumed.get(queue, offset), offset)

    def _deliver(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        self._ready.set()

    def _credit_limit(self) -> int:
        # A share of the total: subscriptions hold their credit while others' caches fill.
        share = self.config.pull_threshold_for_all // max(1, len(self._queues))
        return max(1, min(self.config.pull_threshold_for_queue, share))

    def _may_pull(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        return queue not in self._paused and self._cached.count < self.config.pull_threshold_for_all

    async def release(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Commit the done batches of queues being taken away (auto commit), then release.

        A batch the caller still holds is not committed: the next owner gets it again.
        """
        if self.auto_commit:
            self._take_consumed(queues)
        released = await super().release(queues)
        for queue in released:
            self._consumed.pop(queue, None)
            if self._last is not None and self._last[0] == queue:
                self._last = None
        return released

    # ------------------------------------------------------------------ positioning
    def _check_assigned(self, queue: MessageQueue) -> ProcessQueue:
        pq = self._queues.get(queue)
        if pq is None:
            raise InvalidArgumentError(f"{queue} is not assigned to this consumer")
        return pq

    async def seek(self, queue: MessageQueue, offset: int) -> None:
        """Continue `queue` at `offset` (within [min, max]); drops what was cached."""
        self._running()
        await self._assigned()
        pq = self._check_assigned(queue)
        _check_offset(offset, f"cannot seek {queue} to {offset!r}")
        low, high, _ = await self._transport.queue_offsets(queue)
        if not low <= offset <= high:
            raise InvalidOffsetError(
                f"cannot seek {queue} to {offset}: it must be within [{low}, {high}] (min, max)"
            )
        await self._cancel_pulls([queue])
        pq.clear()
        pq.next_offset = offset
        await self._starting_offset(queue, offset)
        self.offsets.update(queue, offset, increase_only=False)
        self._start_pulling(queue, pq)

    async def seek_to_begin(self, queue: MessageQueue) -> None:
        """Continue `queue` at its min offset."""
        await self._assigned()
        self._check_assigned(queue)
        low, _high, _ = await self._transport.queue_offsets(queue)
        await self.seek(queue, low)

    async def seek_to_end(self, queue: MessageQueue) -> None:
        """Continue `queue` at its max offset (only new messages)."""
        await self._assigned()
        self._check_assigned(queue)
        _low, high, _ = await self._transport.queue_offsets(queue)
        await self.seek(queue, high)

    def pause(self, queues: list[MessageQueue]) -> None:
        """poll() returns nothing of these queues, and they are not pulled, until resumed."""
        self._paused.update(queues)

    def resume(self, queues: list[MessageQueue]) -> None:
        """Undo pause()."""
        self._paused.difference_update(queues)
        self._ready.set()

    def assignment(self) -> set[MessageQueue]:
        """The queues this consumer holds now."""
        return set(self._queues)

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic`."""
        return await self._transport.readable_queues(topic)

    async def offsets_for_timestamp(self, queue: MessageQueue, timestamp: float) -> int:
        """The first offset of `queue` stored at or after `timestamp` (epoch seconds)."""
        await self._check_queues([queue])
        if not -_MAX_TIMESTAMP_S < timestamp < _MAX_TIMESTAMP_S:  # NaN too
            raise InvalidArgumentError(
                f"timestamp must be seconds since the epoch (a finite number), not {timestamp}"
            )
        _low, _high, at = await self._transport.queue_offsets(queue, int(timestamp * 1000))
        return at


def _check_offset(offset: object, what: str) -> None:
    """InvalidOffsetError unless `offset` is an int (a bool is not: True would pass as 1)."""
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise InvalidOffsetError(f"{what}: an offset must be an int, not {type(offset).__name__}")


class _Done:
    """An awaitable that has nothing to wait for."""

    def __await__(self) -> Generator[None, None, None]:
        yield from ()


_DONE = _Done()


def _log_failure(task: asyncio.Task[None]) -> None:
    """An assign() nobody awaited must not fail unseen."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.warning("assign() refused: %s", exc)
