"""The receive group's workload: SimpleConsumer workers taking a backlog as jobs (issue 36).

Each run is a fresh consumer group, so every run receives the whole backlog from its
first message. WORKERS workers share one SimpleConsumer (RocketMQ 5's way: one client,
many workers): asyncio tasks on an `sdk.aio.SimpleConsumer`, or threads on a blocking
`sdk.SimpleConsumer`. Each worker loops `receive(max_messages=BATCH)` and acks every
message it got, one ack each, until a receive answers nothing (await_duration 0: the
whole backlog is stored before the run, and nothing comes back within the long invisible
time, so an empty answer means every message is taken) or the run's count is reached.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

import sdk.aio
from sdk import MessageExt, SimpleConsumer

#: Workers sharing the consumer, messages per receive, and the time to run: far longer
#: than a run, so nothing is delivered twice.
WORKERS = 8
BATCH = 16
INVISIBLE_SECONDS = 300.0
#: Messages per run (full and --quick; acks are one request each, so runs are smaller than
#: the poll backlog).
MESSAGES, MESSAGES_QUICK = 20_000, 2_000

_groups = itertools.count()


class ReceiveTrial:
    """Receive + ack runs over one backlog; `blocking` picks the face.

    `prepare` (untimed) makes and starts the consumer in a group of its own; `run` (timed)
    runs the workers until `expected` messages were received and acked; `close` (untimed)
    shuts the consumer down.
    """

    def __init__(self, address: str, topic: str, expected: int, blocking: bool) -> None:
        self.address = address
        self.topic = topic
        self.expected = expected
        self.blocking = blocking
        self.consumer: sdk.aio.SimpleConsumer | SimpleConsumer | None = None
        self._acked = 0
        self._lock = threading.Lock()

    async def prepare(self) -> None:
        group = f"bench-receive-{next(_groups)}"
        self._acked = 0
        if self.blocking:
            blocking = SimpleConsumer(group, self.address, await_duration=0)
            blocking.subscribe(self.topic)
            await asyncio.to_thread(blocking.start)
            self.consumer = blocking
        else:
            consumer = sdk.aio.SimpleConsumer(group, self.address, await_duration=0)
            consumer.subscribe(self.topic)
            await consumer.start()
            self.consumer = consumer

    async def run(self) -> int:
        consumer = self.consumer
        if isinstance(consumer, SimpleConsumer):
            await asyncio.gather(
                *(asyncio.to_thread(self._blocking_worker, consumer) for _ in range(WORKERS))
            )
        else:
            assert consumer is not None
            await asyncio.gather(*(self._worker(consumer) for _ in range(WORKERS)))
        if self._acked < self.expected:
            raise RuntimeError(
                f"receives answered nothing after {self._acked} of {self.expected} messages"
            )
        return self._acked

    def _count(self, batch: list[MessageExt]) -> bool:
        """Count acked messages; True while the run wants more."""
        with self._lock:
            self._acked += len(batch)
            return self._acked < self.expected

    async def _worker(self, consumer: sdk.aio.SimpleConsumer) -> None:
        while batch := await consumer.receive(BATCH, INVISIBLE_SECONDS):
            for message in batch:
                await consumer.ack(message)
            if not self._count(batch):
                return

    def _blocking_worker(self, consumer: SimpleConsumer) -> None:
        while batch := consumer.receive(BATCH, INVISIBLE_SECONDS):
            for message in batch:
                consumer.ack(message)
            if not self._count(batch):
                return

    async def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if isinstance(consumer, SimpleConsumer):
            await asyncio.to_thread(consumer.shutdown)
        elif consumer is not None:
            await consumer.shutdown()
