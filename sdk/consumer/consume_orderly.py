"""Orderly consumption: each queue's messages reach the listener one batch at a time.

Per queue there are two client-side locks on top of the broker's lease:
- the object lock (`ProcessQueue.object_lock`): one consume task per queue at a time,
  covering take-messages, the listener call and the offset commit;
- the consume lock (`ProcessQueue.consume_lock`): held around the listener call (and the
  checks just before it), never while waiting to retry or re-lock; rebalance takes it
  before it may drop a queue and unlock it at the broker.
Before each listener call the queue must not be dropped and its broker lock must be held
and not older than the client's lease; otherwise the task stops and asks to re-lock.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from concurrent.futures import Executor
from typing import Protocol

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
#: Consecutive calls of a plain listener made in one thread-pool hop.
CALLS_PER_HOP = 32
#: Coroutine-listener calls between two checks whether tracing was switched on (the
#: check costs about as much as a small listener call).
TRACING_CHECK_CALLS = 32


class OrderlyHost(Protocol):
    """What the orderly service needs from its consumer."""

    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Record `offset` as the next to consume on `queue`."""

    async def send_to_dead_letter(self, message: MessageExt, reconsume_times: int) -> bool:
        """Move a message that failed too often to the DLQ; False if that failed."""

    async def relock(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        """Try to take the broker lock again now."""


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
        self.listener_calls = 0

    def submit(self, queue: MessageQueue, pq: ProcessQueue, delay: float = 0.0) -> None:
        """Make sure a consume task runs for `queue` (at most one per queue)."""
        running = self._tasks.get(queue)
        if running is not None and not running[0].done():
            pq.more = True
            return
        self._tasks[queue] = (asyncio.create_task(self._run(queue, pq, delay)), pq)

    async def _run(self, queue: MessageQueue, pq: ProcessQueue, delay: float) -> None:
        if delay:
            await sleep_for(self._clock, delay)
        consume = self._consume_on_loop if self._async_listener else self._consume_in_threads
        try:
            again = await consume(queue, pq)
        except Exception:
            log.exception("orderly consume of %s failed", queue)
            again = self._suspend_time
        if pq.more and again is None:
            again = 0.0  # a submit came in after the last take
        if again is not None and not pq.dropped:
            self._tasks.pop(queue, None)
            self.submit(queue, pq, again)

    def lease_valid(self, pq: ProcessQueue, now: float | None = None) -> bool:
        """True when the queue's broker lock is held and was renewed within the lease.

        `now` is the clock's reading when the caller has just taken one.
        """
        if not self._locks:
            return True
        if now is None:
            now = self._clock.now()
        return pq.locked and now - pq.last_lock_time <= self._lease

    async def _consume_on_loop(self, queue: MessageQueue, pq: ProcessQueue) -> float | None:
        """Consume with a coroutine listener until the buffer is empty.

        Returns the delay before the next run, or None. One listener call per turn; its
        checks run with the consume lock held, right before the call, on one clock read.
        """
        clock, listener, commit = self._clock, self._listener.consume_message, self._host.commit
        group, size, suspend_time = self._group, self._batch_size, self._suspend_time
        max_continuous = self._max_continuous
        consume_lock = pq.consume_lock
        traced, calls_until_check = False, 0
        async with pq.object_lock:
            started = clock.now()
            while True:
                pq.more = False
                await consume_lock.acquire()  # not `async with`: that costs as much again
                try:
                    if pq.dropped:
                        return None
                    now = clock.now()
                    expired = not self.lease_valid(pq, now)
                    if not expired:
                        if now - started > max_continuous:
                            return RELOCK_OK_DELAY  # let the other queues have the loop
                        batch = pq.take(size)
                        if not batch:
                            return None
                        if not calls_until_check:
                            traced, calls_until_check = tracing.enabled(), TRACING_CHECK_CALLS
                        calls_until_check -= 1
                        context = ConsumeOrderlyContext(queue, suspend_time)
                        self.listener_calls += 1
                        started_call = time.perf_counter()
                        try:
                            if traced:
                                with tracing.consume_span(group, batch):
                                    status = await listener(batch, context)  # type: ignore[misc]
                            else:
                                status = await listener(batch, context)  # type: ignore[misc]
                        except Exception:
                            log.exception("orderly listener raised on %s; retrying it", queue)
                            status = None
                        finally:
                            elapsed = time.perf_counter() - started_call
                            metrics.observe_consume(group, batch[0].topic, elapsed)
                        if status is ConsumeOrderlyStatus.SUCCESS:
                            commit(queue, pq.commit())
                            continue
                        pq.settle(0)
                finally:
                    consume_lock.release()
                if expired:  # re-lock without the consume lock: rebalance may need it
                    ok = await self._host.relock(queue, pq)
                    return RELOCK_OK_DELAY if ok else RELOCK_FAILED_DELAY
                delay = await self._retry_later(queue, pq, batch, context)
                if delay is not None:
                    return delay

    async def _consume_in_threads(self, queue: MessageQueue, pq: ProcessQueue) -> float | None:
        """Consume with a plain listener until the buffer is empty.

        Returns the delay before the next run, or None. A plain listener gets several
        consecutive calls per thread-pool hop (a hop costs more than a small listener
        call); each call keeps its own checks.
        """
        size = self._batch_size
        loop = asyncio.get_running_loop()
        async with pq.object_lock:
            started = self._clock.now()
            while True:
                pq.more = False
                if pq.dropped:
                    return None
                if not self.lease_valid(pq):
                    ok = await self._host.relock(queue, pq)
                    return RELOCK_OK_DELAY if ok else RELOCK_FAILED_DELAY
                if self._clock.now() - started > self._max_continuous:
                    return RELOCK_OK_DELAY  # let the other queues have the threads
                taken = pq.take(size * CALLS_PER_HOP)
                if not taken:
                    return None
                traced = tracing.enabled()
                async with pq.consume_lock:
                    done, context = await loop.run_in_executor(
                        self._executor, self._call_in_thread, queue, pq, taken, traced
                    )
                self.listener_calls += done + (context is not None)
                offset = pq.settle(done * size)
                if offset >= 0:
                    self._host.commit(queue, offset)
                if context is None:
                    continue  # all consumed, or a check failed: the loop top handles it
                failed = taken[done * size : (done + 1) * size]
                delay = await self._retry_later(queue, pq, failed, context)
                if delay is not None:
                    return delay

    def _call_in_thread(
        self, queue: MessageQueue, pq: ProcessQueue, taken: list[MessageExt], traced: bool
    ) -> tuple[int, ConsumeOrderlyContext | None]:
        """Call the listener batch by batch.

        Returns how many batches said SUCCESS and the context of the call that did not
        (None when all did, or when a check before a call failed).
        """
        listener, group, size = self._listener.consume_message, self._group, self._batch_size
        for done, i in enumerate(range(0, len(taken), size)):
            if not self._may_call(pq):
                return done, None
            batch = taken[i : i + size]
            context = ConsumeOrderlyContext(queue, self._suspend_time)
            started = time.perf_counter()
            try:
                if traced:
                    with tracing.consume_span(group, batch):
                        result = listener(batch, context)
                else:
                    result = listener(batch, context)
            except Exception:
                log.exception("orderly listener raised on %s; retrying it", queue)
                return done, context
            finally:
                metrics.observe_consume(group, batch[0].topic, time.perf_counter() - started)
            if result is not ConsumeOrderlyStatus.SUCCESS:
                if result is not None and not isinstance(result, ConsumeOrderlyStatus):
                    log.error("orderly listener returned %r, not a ConsumeOrderlyStatus", result)
                return done, context
        return -(-len(taken) // size), None

    def _may_call(self, pq: ProcessQueue) -> bool:
        """Checked before every plain listener call, in the worker thread."""
        return not pq.dropped and self.lease_valid(pq)

    async def _retry_later(
        self,
        queue: MessageQueue,
        pq: ProcessQueue,
        failed: list[MessageExt],
        context: ConsumeOrderlyContext,
    ) -> float | None:
        """After a failed call (its batch back in front): the wait before it is retried.

        None when its exhausted messages went to the DLQ and the queue moves on.
        """
        for m in failed:
            m.reconsume_times += 1
        exhausted = [
            m
            for m in failed
            if self._max_reconsume is not None and m.reconsume_times >= self._max_reconsume
        ]
        if exhausted and await self._dead_letter(exhausted):
            pq.take(len(failed))
            self._host.commit(queue, pq.commit())
            return None
        return max(0.01, min(30.0, context.suspend_current_queue_time))

    async def _dead_letter(self, batch: list[MessageExt]) -> bool:
        for m in batch:
            if not await self._host.send_to_dead_letter(m, m.reconsume_times):
                return False
        return True

    async def shutdown(self, timeout: float) -> None:
        """Let listener calls in flight finish (up to `timeout` seconds); stop the rest."""
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
