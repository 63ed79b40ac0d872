"""Concurrent consumption: batches run in parallel; failures go back through the broker.

A batch the listener rejects (RECONSUME_LATER, an exception or None) is sent back to the
group's retry topic with a delay level; if even that fails it is retried locally later.
A queue's offset advances only to its lowest unfinished message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import Protocol

from sdk import metrics, tracing
from sdk.clock import Clock, sleep_for
from sdk.consumer.config import PushConsumerConfig
from sdk.consumer.invoke import call_listener
from sdk.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    MessageListenerConcurrently,
)
from sdk.consumer.process_queue import ProcessQueue
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.consumer")

#: RocketMQ's default for concurrent consumers.
DEFAULT_MAX_RECONSUME_TIMES = 16
#: Wait before a local retry when the broker would not take the message back.
LOCAL_RETRY_DELAY = 5.0


class ConcurrentHost(Protocol):
    """What the concurrent service needs from its consumer."""

    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Record `offset` as the next to consume on `queue`."""

    async def send_back(self, message: MessageExt, delay_level: int, max_times: int) -> bool:
        """Return a failed message to the broker for a later retry; False if that failed."""


class ConsumeConcurrentlyService:
    """Runs a concurrent listener with at most `consume_threads` calls at once."""

    def __init__(
        self,
        listener: MessageListenerConcurrently,
        host: ConcurrentHost,
        executor: Executor,
        clock: Clock,
        config: PushConsumerConfig,
        *,
        group: str = "",
    ) -> None:
        self._group = group
        self._listener = listener
        self._host = host
        self._executor = executor
        self._clock = clock
        self._config = config
        self._max_times = config.max_reconsume_times or DEFAULT_MAX_RECONSUME_TIMES
        self._slots = asyncio.Semaphore(config.consume_threads)
        self._tasks: set[asyncio.Task[None]] = set()
        self.listener_calls = 0

    def submit(self, queue: MessageQueue, pq: ProcessQueue, delay: float = 0.0) -> None:
        """Hand every buffered message of `queue` to the listener, batch by batch."""
        size = self._config.consume_message_batch_max_size
        while batch := pq.take_all(size):
            task = asyncio.create_task(self._consume(queue, pq, batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _consume(
        self, queue: MessageQueue, pq: ProcessQueue, batch: list[MessageExt]
    ) -> None:
        async with self._slots:
            if pq.dropped:
                return
            context = ConsumeConcurrentlyContext(queue)
            self.listener_calls += 1
            started = time.perf_counter()
            try:
                with tracing.consume_span(self._group, batch):
                    status = await call_listener(
                        self._listener.consume_message, self._executor, batch, context
                    )
                metrics.observe_consume(self._group, queue.topic, time.perf_counter() - started)
            except Exception:
                log.exception("listener raised on %s; the batch will be retried", queue)
                status = None
        if status is ConsumeConcurrentlyStatus.CONSUME_SUCCESS:
            done: list[MessageExt] = batch
        else:
            done = []
            failed: list[MessageExt] = []
            for m in batch:
                level = context.delay_level_when_next_consume
                sent = await self._host.send_back(m, level, self._max_times)
                (done if sent else failed).append(m)
            if failed:  # the broker would not take them back: retry here, later
                metrics.retried(self._group, len(failed), local=True)
                task = asyncio.create_task(self._retry_later(queue, pq, failed))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        if done and not pq.dropped:
            self._host.commit(queue, pq.finish(done))

    async def _retry_later(
        self, queue: MessageQueue, pq: ProcessQueue, batch: list[MessageExt]
    ) -> None:
        await sleep_for(self._clock, LOCAL_RETRY_DELAY)
        if not pq.dropped:
            for m in batch:
                m.reconsume_times += 1
            await self._consume(queue, pq, batch)

    async def shutdown(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds of real time) for listener calls in flight."""
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
            for t in pending:
                t.cancel()
