"""Orderly consumption: each queue's messages reach the listener one batch at a time.

Per queue there are two client-side locks on top of the broker's lease:
- the object lock (`ProcessQueue.object_lock`): one consume task per queue at a time,
  covering take-messages, the listener call and the offset commit;
- the consume lock (`ProcessQueue.consume_lock`): held around the listener call only;
  rebalance takes it before it may drop a queue and unlock it at the broker.
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
_STOPPED = object()  # a check before a call failed: the queue was dropped or its lease ran out


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
        self._config = config
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
        try:
            again = await self._consume(queue, pq)
        except Exception:
            log.exception("orderly consume of %s failed", queue)
            again = self._config.suspend_current_queue_time
        if pq.more and again is None:
            again = 0.0  # a submit came in after the last take
        if again is not None and not pq.dropped:
            self._tasks.pop(queue, None)
            self.submit(queue, pq, again)

    def lease_valid(self, pq: ProcessQueue) -> bool:
        """True when the queue's broker lock is held and was renewed within the lease."""
        if not self._locks:
            return True
        return pq.locked and self._clock.now() - pq.last_lock_time <= self._config.lock_lease

    async def _consume(self, queue: MessageQueue, pq: ProcessQueue) -> float | None:
        """Consume until the buffer is empty; the delay before the next run, or None."""
        size = self._config.consume_message_batch_max_size
        # A plain listener gets several consecutive calls per thread-pool hop (a hop
        # costs more than a small listener call); each call keeps its own checks.
        calls = 1 if self._async_listener else CALLS_PER_HOP
        async with pq.object_lock:
            started = self._clock.now()
            while True:
                pq.more = False
                if pq.dropped:
                    return None
                if not self.lease_valid(pq):
                    ok = await self._host.relock(queue, pq)
                    return RELOCK_OK_DELAY if ok else RELOCK_FAILED_DELAY
                if self._clock.now() - started > self._config.max_continuous_consume:
                    return RELOCK_OK_DELAY  # let the other queues have the threads
                taken = pq.take(size * calls)
                if not taken:
                    return None
                batches = [taken[i : i + size] for i in range(0, len(taken), size)]
                contexts = [
                    ConsumeOrderlyContext(queue, self._config.suspend_current_queue_time)
                    for _ in batches
                ]
                done, status = await self._call(pq, batches, contexts)
                offset = pq.settle(sum(len(b) for b in batches[:done]))
                if offset >= 0:
                    self._host.commit(queue, offset)
                if done == len(batches) or status is _STOPPED:
                    continue  # all consumed, or a check failed: the loop top handles it
                failed = batches[done]
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
                    continue
                suspend = contexts[done].suspend_current_queue_time
                return max(0.01, min(30.0, suspend))

    async def _call(
        self,
        pq: ProcessQueue,
        batches: list[list[MessageExt]],
        contexts: list[ConsumeOrderlyContext],
    ) -> tuple[int, object]:
        """Call the listener batch by batch: (how many said SUCCESS, why it stopped)."""
        async with pq.consume_lock:
            if self._async_listener:
                if not self._may_call(pq):
                    return 0, _STOPPED
                self.listener_calls += 1
                started = time.perf_counter()
                try:
                    with tracing.consume_span(self._group, batches[0]):
                        result = await self._listener.consume_message(batches[0], contexts[0])  # type: ignore[misc]
                except Exception:
                    log.exception("orderly listener raised on %s; retrying it", batches[0][0].queue)
                    return 0, None
                finally:
                    elapsed = time.perf_counter() - started
                    metrics.observe_consume(self._group, batches[0][0].topic, elapsed)
                return (1, result) if result is ConsumeOrderlyStatus.SUCCESS else (0, result)
            loop = asyncio.get_running_loop()
            done, status = await loop.run_in_executor(
                self._executor, self._call_in_thread, pq, batches, contexts
            )
            self.listener_calls += done + (status is not _STOPPED and done < len(batches))
            return done, status

    def _call_in_thread(
        self,
        pq: ProcessQueue,
        batches: list[list[MessageExt]],
        contexts: list[ConsumeOrderlyContext],
    ) -> tuple[int, object]:
        for i, (batch, context) in enumerate(zip(batches, contexts, strict=True)):
            if not self._may_call(pq):
                return i, _STOPPED
            started = time.perf_counter()
            try:
                with tracing.consume_span(self._group, batch):
                    result = self._listener.consume_message(batch, context)
            except Exception:
                log.exception("orderly listener raised on %s; retrying it", batch[0].queue)
                return i, None
            finally:
                metrics.observe_consume(self._group, batch[0].topic, time.perf_counter() - started)
            if result is not ConsumeOrderlyStatus.SUCCESS:
                if result is not None and not isinstance(result, ConsumeOrderlyStatus):
                    log.error("orderly listener returned %r, not a ConsumeOrderlyStatus", result)
                return i, result
        return len(batches), ConsumeOrderlyStatus.SUCCESS

    def _may_call(self, pq: ProcessQueue) -> bool:
        """Checked before every listener call (also from the worker thread)."""
        return not pq.dropped and self.lease_valid(pq)

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
