"""Orderly consumption in key mode (ProcessingOrder.KEY): in order per sharding key.

Each queue's messages go through a KeyDispatch: a key is called one batch at a time, in
offset order, and different keys of one queue are called side by side, up to
`max_keys_in_flight_per_queue` calls per queue and `consume_threads` per consumer. The
queue commits the lowest offset not yet finished (ProcessQueue.finish), so after a crash
or a rebalance the next owner starts there, and messages of other keys finished past that
point are handled again.

The broker lock and the client's two locks work as in queue mode: no call starts unless
the queue is held, not dropped or reset, and its lease is fresh; the consume lock is held
while any call of the queue runs, so rebalance (which marks the queue dropped, then takes
the consume lock) gives the queue up only once its calls have returned.

A failed call keeps its key waiting (stall): the key's batch is retried after
`context.suspend_current_queue_time`, while the queue's other keys go on. A batch that has
used its `max_reconsume_times` goes to the dead-letter queue, and its key moves on.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import cast

from sdk import metrics, tracing
from sdk.clock import Clock, sleep_for
from sdk.consumer.config import KeyFailurePolicy, PushConsumerConfig
from sdk.consumer.consume_orderly import (
    RELOCK_FAILED_DELAY,
    RELOCK_OK_DELAY,
    THREAD_HOP_SECONDS,
    OrderlyHost,
    _check_status,
)
from sdk.consumer.key_dispatch import Key, KeyDispatch
from sdk.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
)
from sdk.consumer.process_queue import ProcessQueue
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.consumer")

#: Most listener calls one key's turn carries: its waiting messages go to the listener in
#: one hand-off (one thread-pool hop, or one task), in order, with the checks before every
#: call; a hop of a plain listener also ends after THREAD_HOP_SECONDS.
KEY_CALLS_PER_HOP = 32


@dataclass(eq=False)
class _QueueRun:
    """One process queue's dispatch state, its driver task and its calls in flight."""

    pq: ProcessQueue
    generation: int
    dispatch: KeyDispatch = field(default_factory=KeyDispatch)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    calls: int = 0
    driver: asyncio.Task[None] | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # calls, then their outcome
    retries: set[asyncio.Task[None]] = field(default_factory=set)  # keys waiting to retry
    #: Keys this consumer parked, and the queue offset the broker parked each through:
    #: their messages up to there that a pull brought before are finished here.
    parked: dict[Key, int] = field(default_factory=dict)


class ConsumeByKeyService:
    """Runs an orderly listener over the queues the consumer holds, key by key."""

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
        self._locks = locks
        self._host = host
        self._executor = executor
        self._clock = clock
        self._batch_size = config.consume_message_batch_max_size
        self._lease = config.lock_lease
        self._suspend_time = config.suspend_current_queue_time
        self._max_reconsume = config.max_reconsume_times
        self._per_queue = config.max_keys_in_flight_per_queue
        self._park = config.key_failure_policy is KeyFailurePolicy.PARK
        self._slots = asyncio.Semaphore(config.consume_threads)
        self._runs: dict[MessageQueue, _QueueRun] = {}
        self._async_listener = inspect.iscoroutinefunction(listener.consume_message)
        self._closed = False
        self.listener_calls = 0

    def submit(self, queue: MessageQueue, pq: ProcessQueue, delay: float = 0.0) -> None:
        """New messages are buffered in `pq`: make sure its driver hands them out."""
        if self._closed:
            return
        run = self._runs.get(queue)
        if run is None or run.pq is not pq or run.driver is None or run.driver.done():
            run = _QueueRun(pq, pq.generation)
            self._runs[queue] = run
            run.driver = asyncio.create_task(self._drive(queue, run))
        run.wake.set()

    def lease_valid(self, pq: ProcessQueue) -> bool:
        """True when the queue's broker lock is held and was renewed within the lease."""
        return not self._locks or pq.lease_fresh(self._clock.now(), self._lease)

    async def _drive(self, queue: MessageQueue, run: _QueueRun) -> None:
        """Start calls for free keys as long as the queue is ours; sleep while none can.

        An unexpected error is logged and the driver goes on after RELOCK_FAILED_DELAY
        with the same state: the messages it had taken stay in its dispatch (a new driver
        with an empty one would never call them, and they would hold the commit).
        """
        pq = run.pq
        while not self._closed and not pq.dropped:
            try:
                await self._step(queue, run)
            except Exception:
                log.exception("key-mode consume of %s failed; going on", queue)
                await sleep_for(self._clock, RELOCK_FAILED_DELAY)

    async def _step(self, queue: MessageQueue, run: _QueueRun) -> None:
        """Take what the queue buffered; start the calls that can start; wait for news."""
        pq = run.pq
        run.wake.clear()
        if pq.generation != run.generation:  # reset: what was taken is stale
            run.dispatch.clear()
            run.parked.clear()
            run.generation = pq.generation
        taken = pq.take_all(pq.buffered)
        if run.parked:
            taken = self._without_parked(queue, run, taken)
        run.dispatch.add(taken)
        if not self.lease_valid(pq):
            if run.calls == 0:  # re-lock with no call running, as queue mode does
                relocked = await self._host.relock(queue, pq)
                await sleep_for(self._clock, RELOCK_OK_DELAY if relocked else RELOCK_FAILED_DELAY)
                return
        else:
            await self._start_calls(queue, run)
        await run.wake.wait()

    async def _start_calls(self, queue: MessageQueue, run: _QueueRun) -> None:
        pq = run.pq
        while run.calls < self._per_queue:
            item = run.dispatch.next_call(self._batch_size * KEY_CALLS_PER_HOP)
            if item is None:
                return
            key, batch = item
            await self._slots.acquire()
            if run.calls == 0:
                await pq.consume_lock.acquire()  # rebalance waits on it while calls run
            if self._closed or pq.dropped or pq.generation != run.generation:
                self._end_call(run, stale=True)
                return
            run.calls += 1
            task = asyncio.create_task(self._call(queue, run, key, batch))
            run.tasks.add(task)
            task.add_done_callback(run.tasks.discard)

    def _end_call(self, run: _QueueRun, *, stale: bool = False) -> None:
        """Give back the call's slot, and the consume lock with the queue's last call."""
        if not stale:
            run.calls -= 1
        self._slots.release()
        if run.calls == 0:
            run.pq.consume_lock.release()
        run.wake.set()

    async def _call(
        self, queue: MessageQueue, run: _QueueRun, key: Key, taken: list[MessageExt]
    ) -> None:
        """Call the listener on `taken`, the key's oldest messages, batch by batch.

        Then settle: commit what succeeded, put the rest back, retry a failure later.
        """
        pq, generation, size = run.pq, run.generation, self._batch_size
        try:
            if self._async_listener:
                done, context = await self._calls_on_loop(queue, run, taken)
            else:
                done, context = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._calls_in_thread, queue, run, taken
                )
        except RuntimeError:  # the pool was shut down under us: the consumer is ending
            done, context = 0, None
        finally:
            self._end_call(run)
        self.listener_calls += done + (context is not None)
        if pq.dropped or pq.generation != generation or self._closed:
            return  # the queue moved on: its next owner, or the reset, takes it from there
        finished, rest = taken[: done * size], taken[done * size :]
        if finished:
            self._host.commit(queue, pq.finish(finished))
        if context is None:  # all done, or a check stopped the run: the rest waits its turn
            run.dispatch.put_back(key, rest)
            run.dispatch.done(key)
            run.wake.set()
            return
        run.dispatch.put_back(key, rest[size:])
        await self._after_failure(queue, run, key, rest[:size], context)

    def _batches(
        self, queue: MessageQueue, run: _QueueRun, taken: list[MessageExt], hop_seconds: float
    ) -> Iterator[tuple[list[MessageExt], ConsumeOrderlyContext]]:
        """`taken` batch by batch, each with a fresh context, while the checks pass.

        The checks, right before every call: the consumer is not closing, the queue was not
        dropped or reset, its lease is fresh; and (after the first call) the run has not
        gone on for `hop_seconds`.
        """
        pq, size, began = run.pq, self._batch_size, time.perf_counter()
        for i in range(0, len(taken), size):
            if (
                self._closed
                or pq.dropped
                or pq.generation != run.generation
                or not self.lease_valid(pq)
                or (i and time.perf_counter() - began > hop_seconds)
            ):
                return
            yield taken[i : i + size], ConsumeOrderlyContext(queue, self._suspend_time)

    async def _calls_on_loop(
        self, queue: MessageQueue, run: _QueueRun, taken: list[MessageExt]
    ) -> tuple[int, ConsumeOrderlyContext | None]:
        """Batches of `taken` to an `async def` listener while the checks pass.

        Returns how many succeeded, and the context of the call that did not (None: none).
        """
        listener = cast(Callable[..., Awaitable[object]], self._listener.consume_message)
        done = 0
        for batch, context in self._batches(queue, run, taken, math.inf):
            began = time.perf_counter()
            try:
                with tracing.consume_span(self._group, batch):
                    status = await listener(batch, context)
            except Exception:
                log.exception("orderly listener raised on %s; retrying the key", queue)
                status = None
            finally:
                metrics.observe_consume(self._group, queue.topic, time.perf_counter() - began)
            if status is not ConsumeOrderlyStatus.SUCCESS:
                _check_status(status)
                return done, context
            done += 1
        return done, None

    def _calls_in_thread(
        self, queue: MessageQueue, run: _QueueRun, taken: list[MessageExt]
    ) -> tuple[int, ConsumeOrderlyContext | None]:
        """`_calls_on_loop` for a plain listener, in a pool thread: the key's run in one hop.

        The hop ends early (the rest waits its turn) once it has called for
        THREAD_HOP_SECONDS.
        """
        listener, done = self._listener.consume_message, 0
        for batch, context in self._batches(queue, run, taken, THREAD_HOP_SECONDS):
            began = time.perf_counter()
            try:
                with tracing.consume_span(self._group, batch):
                    status = listener(batch, context)
            except Exception:
                log.exception("orderly listener raised on %s; retrying the key", queue)
                status = None
            finally:
                metrics.observe_consume(self._group, queue.topic, time.perf_counter() - began)
            if status is not ConsumeOrderlyStatus.SUCCESS:
                _check_status(status)
                return done, context
            done += 1
        return done, None

    async def _after_failure(
        self,
        queue: MessageQueue,
        run: _QueueRun,
        key: Key,
        batch: list[MessageExt],
        context: ConsumeOrderlyContext,
    ) -> None:
        """The key retries its batch, or (retries used up) dead-letters it or parks.

        A key the broker did not park (its disk full, say) stalls and tries again later:
        it is never dead-lettered instead, which would let its next message go first.
        """
        limit = self._max_reconsume
        if limit is not None and all(m.reconsume_times >= limit for m in batch):
            if self._park:
                if await self._parked(queue, run, key, batch):
                    return
            else:
                moved = 0
                for m in batch:
                    if not await self._host.send_to_dead_letter(m, m.reconsume_times):
                        break
                    moved += 1
                if moved:
                    self._host.commit(queue, run.pq.finish(batch[:moved]))
                if moved == len(batch):
                    run.dispatch.done(key)
                    run.wake.set()
                    return
                batch = batch[moved:]
        else:
            for m in batch:
                m.reconsume_times += 1
        metrics.retried(self._group, len(batch), local=True)
        run.dispatch.put_back(key, batch)
        delay = max(0.01, min(30.0, context.suspend_current_queue_time))
        task = asyncio.create_task(self._resume_later(run, key, delay))
        run.retries.add(task)
        task.add_done_callback(run.retries.discard)

    async def _parked(
        self, queue: MessageQueue, run: _QueueRun, key: Key, batch: list[MessageExt]
    ) -> bool:
        """Park the key from its failed batch on; True when the broker took it.

        The key's messages held here up to where the broker parked it are finished: the
        broker keeps them, in order, and the group's pulls skip the rest of the key.
        """
        first = batch[0]
        reason = (f"{1 + first.reconsume_times} listener calls failed on message "
                  f"{first.msg_id} (offset {first.queue_offset})")  # fmt: skip
        through = await self._host.park_key(first, run.pq, reason)
        if through is None:
            return False
        run.parked[key] = through
        held = batch + run.dispatch.take_key(key)
        parked = [m for m in held if m.queue_offset <= through]
        run.dispatch.put_back(key, [m for m in held if m.queue_offset > through])
        run.dispatch.done(key)
        self._host.commit(queue, run.pq.finish(parked))
        run.wake.set()
        return True

    def _without_parked(
        self, queue: MessageQueue, run: _QueueRun, taken: list[MessageExt]
    ) -> list[MessageExt]:
        """`taken` without the messages of keys parked through their offsets (finished)."""
        gone = [m for m in taken if m.queue_offset <= run.parked.get(m.sharding_key, -1)]
        if not gone:
            return taken
        self._host.commit(queue, run.pq.finish(gone))
        return [m for m in taken if m.queue_offset > run.parked.get(m.sharding_key, -1)]

    async def _resume_later(self, run: _QueueRun, key: Key, delay: float) -> None:
        generation = run.generation
        await sleep_for(self._clock, delay)
        if run.generation == generation:
            run.dispatch.resume(key)
            run.wake.set()

    async def shutdown(self, timeout: float) -> None:
        """Let listener calls in flight finish (up to `timeout` seconds); stop the rest."""
        self._closed = True
        calling: set[asyncio.Task[None]] = set()
        for run in self._runs.values():
            if run.driver is not None:
                run.driver.cancel()
            for task in run.retries:
                task.cancel()  # waiting to retry: nothing to finish
            calling |= run.tasks
        if calling:
            _done, pending = await asyncio.wait(calling, timeout=timeout)
            for task in pending:
                task.cancel()
        self._runs.clear()
