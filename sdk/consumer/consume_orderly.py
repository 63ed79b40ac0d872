"""Orderly consumption: each queue's messages reach the listener one batch at a time.

Per queue there are two client-side locks on top of the broker's lease:
- the object lock (`ProcessQueue.object_lock`): one consume task per process queue at a
  time, covering take-messages, the listener calls and the offset commit;
- the consume lock (`ProcessQueue.consume_lock`): held around listener calls (and the
  checks just before each), never while waiting to retry or re-lock; rebalance takes it
  before it may drop a queue and unlock it at the broker.
Before each listener call (in the worker thread for plain listeners) the consumer must not
be closing, the queue must not be dropped or reset, its broker lock must be held and not
older than the client's lease, and the queue must not have been consumed for longer than
max_continuous; otherwise the task stops, and re-locks (with neither lock held) when the
lease was the reason.

Plain listeners run on the thread pool, up to THREAD_CALLS_PER_HOP calls per hop (what
the queue has buffered, usually: a hop between the loop and a worker thread costs far
more than a small call, and waits for the GIL besides); coroutine listeners run on the
loop, CALLS_PER_HOP calls per turn. Both make the same checks before every call, each
in its own loop (`_call`, `_calls_in_thread`): written once, behind a generator, they
made a small call's dispatch a third dearer (a function, a fifth), and the usual orderly
listener is a small call at batch size 1. A context the last call left as it was given is passed
again (it costs about as much as a small call to build); one the listener changed is
replaced, so every call starts from the consumer's suspend time.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Protocol, cast

from sdk import metrics, tracing
from sdk.clock import Clock, sleep_for
from sdk.consumer.config import PushConsumerConfig
from sdk.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
)
from sdk.consumer.process_queue import ProcessQueue
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.consumer")

#: Wait before re-checking a queue whose lock is missing (RocketMQ: 3 s after a failed
#: lock, moments after a successful one).
RELOCK_FAILED_DELAY = 3.0
RELOCK_OK_DELAY = 0.01
#: Consecutive calls of a coroutine listener per turn on the loop, and the calls between
#: two checks whether tracing or metrics were switched on (each check costs about as much
#: as a small call).
CALLS_PER_HOP = 32
TRACING_CHECK_CALLS = CALLS_PER_HOP
#: Most calls of a plain listener per thread-pool hop. One hop (submit, a worker's
#: wake-up, the GIL taken from a busy loop, the answer posted back) costs tens of
#: microseconds, or milliseconds while the loop decodes: a hop carries what the queue
#: has buffered, as the checks before every call stop it at once when they fail.
THREAD_CALLS_PER_HOP = 1024
#: ... and the longest a hop goes on calling (at least one call), on the consumer's clock
#: (the reading the checks before each call take): slow listeners give their worker
#: thread back as often as 32 calls used to, or more often, so that with more queues
#: than threads every queue gets its turn.
THREAD_HOP_SECONDS = 0.05
#: What a consume turn answers when the lease ran out: re-lock, then go on.
_RELOCK = -1.0


class OrderlyHost(Protocol):
    """What the orderly service needs from its consumer."""

    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Record `offset` as the next to consume on `queue`."""

    async def send_to_dead_letter(self, message: MessageExt, reconsume_times: int) -> bool:
        """Move a message that failed too often to the DLQ; False if that failed."""

    async def relock(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        """Try to take the broker lock again now."""

    async def park_key(self, message: MessageExt, pq: ProcessQueue, reason: str) -> int | None:
        """Park the message's key from it on; the offset it is parked through, or None."""


class ConsumeOrderlyService:
    """Runs an orderly listener over the queues the consumer holds."""

    def __init__(
        self,
        listener: MessageListenerOrderly,
        host: OrderlyHost,
        executor: Executor,
        clock: Clock,
        config: PushConsumerConfig,
        *,
        locks: bool = True,
        group: str = "",
    ) -> None:
        self._group = group
        self._listener = listener
        self._locks = locks  # broadcasting members take none: order is per member
        self._host = host
        self._executor = executor
        self._clock = clock
        self._batch_size = config.consume_message_batch_max_size
        self._lease = config.lock_lease
        self._max_continuous = config.max_continuous_consume
        self._suspend_time = config.suspend_current_queue_time
        self._max_reconsume = config.max_reconsume_times  # None: unlimited
        self._tasks: dict[MessageQueue, tuple[asyncio.Task[None], ProcessQueue]] = {}
        self._async_listener = inspect.iscoroutinefunction(listener.consume_message)
        self._closed = False
        self.listener_calls = 0

    def submit(self, queue: MessageQueue, pq: ProcessQueue, delay: float = 0.0) -> None:
        """Make sure a consume task runs for `pq` (at most one per process queue).

        A task still running for an earlier process queue of `queue` (released, and
        stopping) does not stand in for this one.
        """
        if self._closed:
            return
        running = self._tasks.get(queue)
        if running is not None and not running[0].done() and running[1] is pq:
            pq.more = True
            return
        self._tasks[queue] = (asyncio.create_task(self._run(queue, pq, delay)), pq)

    async def _run(self, queue: MessageQueue, pq: ProcessQueue, delay: float) -> None:
        if delay:
            await sleep_for(self._clock, delay)
        try:
            again = await self._consume(queue, pq)
            if again == _RELOCK:  # with neither lock held: rebalance may need them
                again = (
                    RELOCK_OK_DELAY if await self._host.relock(queue, pq) else RELOCK_FAILED_DELAY
                )
        except Exception:
            log.exception("orderly consume of %s failed", queue)
            again = self._suspend_time
        if self._closed:
            return
        if pq.more and again is None:
            again = 0.0  # a submit came in after the last take
        current = self._tasks.get(queue)
        if again is not None and not pq.dropped and current is not None and current[1] is pq:
            self._tasks.pop(queue, None)
            self.submit(queue, pq, again)

    def lease_valid(self, pq: ProcessQueue, now: float | None = None) -> bool:
        """True when the queue's broker lock is held and was renewed within the lease.

        `now` is the clock's reading when the caller has just taken one.
        """
        if not self._locks:
            return True
        return pq.lease_fresh(self._clock.now() if now is None else now, self._lease)

    async def _consume(self, queue: MessageQueue, pq: ProcessQueue) -> float | None:
        """Consume until the buffer is empty or a check or a call fails.

        Returns the delay before the next turn, _RELOCK, or None (nothing to do).
        """
        size = self._batch_size
        per_turn = size * (CALLS_PER_HOP if self._async_listener else THREAD_CALLS_PER_HOP)
        async with pq.object_lock:
            started = self._clock.now()
            while True:
                pq.more = False
                if pq.dropped or self._closed:
                    return None
                now = self._clock.now()
                if not self.lease_valid(pq, now):
                    return _RELOCK
                if now - started > self._max_continuous:
                    return RELOCK_OK_DELAY  # let the other queues have the threads
                taken = pq.take(per_turn)
                if not taken:
                    return None
                generation = pq.generation
                async with pq.consume_lock:  # released only once the calls are committed
                    done, context = await self._call(queue, pq, taken, generation, started)
                    self.listener_calls += done + (context is not None)
                    if pq.generation != generation:
                        continue  # reset during the calls: what they took is stale
                    offset = pq.settle(done * size)
                    if offset >= 0:
                        self._host.commit(queue, offset)
                if context is None:
                    continue  # all consumed, or a check failed: the loop top handles it
                failed = taken[done * size : (done + 1) * size]
                delay = await self._retry_later(queue, pq, failed, context)
                if delay is not None:
                    return delay

    async def _call(
        self,
        queue: MessageQueue,
        pq: ProcessQueue,
        taken: list[MessageExt],
        generation: int,
        started: float,
    ) -> tuple[int, ConsumeOrderlyContext | None]:
        """Call the listener batch by batch over `taken`, checking before each call.

        Returns how many batches said SUCCESS and the context of the call that did not
        (None when all did, or when a check before a call failed).
        """
        if not self._async_listener:
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._calls_in_thread, queue, pq, taken, generation, started
                )
            except RuntimeError:  # the pool was shut down under us: the consumer is ending
                log.warning(
                    "no listener calls on %s: the consumer's thread pool is shut down", queue
                )
                self._closed = True
                return 0, None
        traced, timed = tracing.enabled(), metrics.enabled()
        listener = cast(Callable[..., Awaitable[object]], self._listener.consume_message)
        group, success, done = self._group, ConsumeOrderlyStatus.SUCCESS, 0
        size, suspend, clock_now = self._batch_size, self._suspend_time, self._clock.now
        max_continuous, locks, lease = self._max_continuous, self._locks, self._lease
        context = ConsumeOrderlyContext(queue, suspend)
        for i in range(0, len(taken), size):
            now = clock_now()
            if (  # the checks (module docstring), as _calls_in_thread makes them
                self._closed
                or pq.dropped
                or pq.generation != generation
                or (locks and not (pq.locked and now - pq.last_lock_time <= lease))
                or now - started > max_continuous
            ):
                break
            if context.suspend_current_queue_time != suspend or context.queue is not queue:
                context = ConsumeOrderlyContext(queue, suspend)  # the last call changed it
            batch = [taken[i]] if size == 1 else taken[i : i + size]
            began = time.perf_counter() if timed else 0.0
            try:
                if traced:
                    with tracing.consume_span(group, batch):
                        result = await listener(batch, context)
                else:
                    result = await listener(batch, context)
            except Exception:
                log.exception("orderly listener raised on %s; retrying it", queue)
                result = None
            finally:
                if timed:  # no clock readings when nobody records them
                    metrics.observe_consume(group, batch[0].topic, time.perf_counter() - began)
            if result is not success:
                _check_status(result)
                return done, context
            done += 1
        return done, None

    def _calls_in_thread(
        self,
        queue: MessageQueue,
        pq: ProcessQueue,
        taken: list[MessageExt],
        generation: int,
        started: float,
    ) -> tuple[int, ConsumeOrderlyContext | None]:
        """`_call` for a plain listener, in a worker thread: the run in one hop.

        The hop ends early (what is left goes back in front of the queue) once it has
        called for THREAD_HOP_SECONDS.
        """
        listener, done = self._listener.consume_message, 0
        group, success = self._group, ConsumeOrderlyStatus.SUCCESS
        size, suspend, clock_now = self._batch_size, self._suspend_time, self._clock.now
        max_continuous, locks, lease = self._max_continuous, self._locks, self._lease
        context = ConsumeOrderlyContext(queue, suspend)
        traced = timed = observed = False
        hop_ends = clock_now() + THREAD_HOP_SECONDS  # the checks' clock reading serves it
        for i in range(0, len(taken), size):
            now = clock_now()
            if (  # the checks (module docstring), as _call makes them, and the hop's time
                self._closed
                or pq.dropped
                or pq.generation != generation
                or (locks and not (pq.locked and now - pq.last_lock_time <= lease))
                or now - started > max_continuous
                or (done and now > hop_ends)
            ):
                break
            if not done % TRACING_CHECK_CALLS:  # each check costs about a small call
                traced, timed = tracing.enabled(), metrics.enabled()
                observed = traced or timed
            if context.suspend_current_queue_time != suspend or context.queue is not queue:
                context = ConsumeOrderlyContext(queue, suspend)  # the last call changed it
            batch = [taken[i]] if size == 1 else taken[i : i + size]
            try:
                if observed:
                    result = _observed_call(group, listener, batch, context, traced, timed)
                else:
                    result = listener(batch, context)
            except Exception:
                log.exception("orderly listener raised on %s; retrying it", queue)
                result = None
            if result is not success:
                _check_status(result)
                return done, context
            done += 1
        return done, None

    async def _retry_later(
        self,
        queue: MessageQueue,
        pq: ProcessQueue,
        failed: list[MessageExt],
        context: ConsumeOrderlyContext,
    ) -> float | None:
        """After a failed call (its batch back in front): the wait before it is retried.

        RocketMQ's rule: a message is tried once, then retried up to max_reconsume_times
        times. The batch is suspended while any of its messages has retries left; the
        exhausted ones at its front go to the DLQ first and the queue commits past them
        (never past a message that neither succeeded nor was dead-lettered). None when
        the whole batch went to the DLQ and the queue moves on.
        """
        limit = self._max_reconsume
        exhausted = moved = 0
        if limit is not None:
            while exhausted < len(failed) and failed[exhausted].reconsume_times >= limit:
                exhausted += 1
        if exhausted:
            moved = await self._dead_letter(failed[:exhausted])
            if moved:
                pq.take(moved)
                self._host.commit(queue, pq.commit())
            if moved == len(failed):
                return None
        for m in failed[exhausted:]:
            m.reconsume_times += 1
        metrics.retried(self._group, len(failed) - moved, local=True)
        return max(0.01, min(30.0, context.suspend_current_queue_time))

    async def _dead_letter(self, batch: list[MessageExt]) -> int:
        """Send messages to the DLQ in order; how many went before one failed."""
        for sent, m in enumerate(batch):
            if not await self._host.send_to_dead_letter(m, m.reconsume_times):
                return sent
        return len(batch)

    async def shutdown(self, timeout: float) -> None:
        """Let listener calls in flight finish (up to `timeout` seconds); stop the rest.

        No consume task starts after this.
        """
        self._closed = True
        calling = []
        for task, pq in self._tasks.values():
            if task.done():
                continue
            if pq.consume_lock.locked():
                calling.append(task)
            else:
                task.cancel()  # waiting to retry, or between calls: nothing to finish
        if calling:
            _done, pending = await asyncio.wait(calling, timeout=timeout)
            for task in pending:
                task.cancel()
        self._tasks.clear()


def _observed_call(
    group: str,
    listener: Callable[[list[MessageExt], ConsumeOrderlyContext], object],
    batch: list[MessageExt],
    context: ConsumeOrderlyContext,
    traced: bool,
    timed: bool,
) -> object:
    """A plain listener's call, in a span when `traced`, its time recorded when `timed`."""
    began = time.perf_counter()
    try:
        if not traced:
            return listener(batch, context)
        with tracing.consume_span(group, batch):
            return listener(batch, context)
    finally:
        if timed:
            metrics.observe_consume(group, batch[0].topic, time.perf_counter() - began)


def _check_status(result: object) -> None:
    """Log a listener answer that is not a ConsumeOrderlyStatus (taken as a failure)."""
    if result is not None and not isinstance(result, ConsumeOrderlyStatus):
        log.error("orderly listener returned %r, not a ConsumeOrderlyStatus", result)
