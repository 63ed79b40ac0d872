"""The accumulator: messages grouped per queue into batch sends.

Each queue has its own buffer and at most one batch in flight, so messages of one queue
(and so of one sharding key) reach the broker in the order they were accepted. A batch
leaves when it is full (messages or bytes) or its first message has waited `linger`.
The buffer over all queues is bounded: a send into a full buffer waits for room (up to
`block_timeout`) or fails at once with BufferFullError, as configured.

Sends are numbered (tickets) as they are made. When a batch fails, or a send fails before
it was queued (no route, no room), the sends made until then that still wait to go to
that queue (or topic) fail too, unsent, with EarlierSendFailedError: no message is stored
after an earlier one of its queue that failed. Sends made after the failure go ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from sdk.clock import Clock
from sdk.errors import BufferFullError
from sdk.message import MessageQueue, SendResult
from sdk.producer.config import AccumulatorConfig
from sdk.producer.retry import EarlierSendFailedError, describe, holds_back

#: Sends (queue, prepared messages, their ids): one request; the results in order.
SendBatch = Callable[[MessageQueue, list[bytes], list[bytes]], Awaitable[list[SendResult]]]


@dataclass
class _Pending:
    prepared: bytes  # as the transport prepared it
    msg_id: bytes
    future: asyncio.Future[SendResult]
    since: float
    ticket: int


class _QueueBuffer:
    def __init__(self) -> None:
        self.items: deque[_Pending] = deque()
        self.bytes = 0
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None


class Accumulator:
    """Per-queue batching in front of a batch-send function."""

    def __init__(self, config: AccumulatorConfig, send: SendBatch, clock: Clock) -> None:
        self._config = config
        self._send = send
        self._clock = clock
        self._queues: dict[MessageQueue, _QueueBuffer] = {}
        self._pending = 0
        self._room = asyncio.Condition()
        self._closed = False
        self._tickets = 0
        # topic or queue -> (the last ticket issued when a send to it failed, the failure)
        self._holds: dict[str | MessageQueue, tuple[int, BaseException]] = {}

    @property
    def pending(self) -> int:
        """Messages accepted and not yet answered by the broker."""
        return self._pending

    def ticket(self) -> int:
        """Number a send as it is made, before it waits for anything (see `hold`)."""
        self._tickets += 1
        return self._tickets

    def hold(self, where: str | MessageQueue, failure: BaseException) -> None:
        """Note that a send to `where` (a topic, or a queue) failed.

        The sends made until now that have yet to go there fail with EarlierSendFailedError.
        """
        self._holds[where] = (self._tickets, failure)

    def _check_holds(self, queue: MessageQueue, ticket: int) -> None:
        for where in (queue.topic, queue):
            held = self._holds.get(where)
            if held is not None and ticket <= held[0]:
                text = describe(queue) if where is queue else f"topic {queue.topic!r}"
                raise EarlierSendFailedError(text, held[1])

    async def enqueue(
        self, queue: MessageQueue, prepared: bytes, msg_id: bytes, ticket: int
    ) -> asyncio.Future[SendResult]:
        """Queue one prepared message (waiting for room); the future of its SendResult.

        EarlierSendFailedError when an earlier send to its topic or queue failed.
        """
        self._check_holds(queue, ticket)
        await self._wait_for_room()
        self._check_holds(queue, ticket)  # a batch of its queue may have failed meanwhile
        buffer = self._queues.get(queue)
        if buffer is None:
            buffer = self._queues[queue] = _QueueBuffer()
            buffer.task = asyncio.create_task(self._drain(queue, buffer))
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        buffer.items.append(_Pending(prepared, msg_id, future, self._clock.now(), ticket))
        buffer.bytes += len(prepared)
        self._pending += 1
        buffer.wake.set()
        return future

    async def _wait_for_room(self) -> None:
        limit = self._config.buffer_max_messages
        if self._pending < limit:
            return
        if self._config.when_full == "fail":
            raise BufferFullError(f"{self._pending} messages wait to be sent (limit {limit})")
        async with self._room:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that arrives as room frees up, and the send would go on.
                async with asyncio.timeout(self._config.block_timeout):
                    await self._room.wait_for(lambda: self._pending < limit)
            except TimeoutError:
                raise BufferFullError(
                    f"no room in the send buffer within {self._config.block_timeout}s "
                    f"({self._pending} messages wait; limit {limit})"
                ) from None

    async def _drain(self, queue: MessageQueue, buffer: _QueueBuffer) -> None:
        config = self._config
        while True:
            if not buffer.items:
                buffer.wake.clear()
                await buffer.wake.wait()
                continue
            full = len(buffer.items) >= config.batch_max_messages or (
                buffer.bytes >= config.batch_max_bytes
            )
            if not full and not self._closed:
                deadline = buffer.items[0].since + config.linger
                if self._clock.now() < deadline:
                    buffer.wake.clear()
                    await self._sleep_or_wake(deadline, buffer.wake)
                    continue
            batch: list[_Pending] = []
            size = 0
            while buffer.items and len(batch) < config.batch_max_messages:
                if batch and size + len(buffer.items[0].prepared) > config.batch_max_bytes:
                    break
                item = buffer.items.popleft()
                batch.append(item)
                size += len(item.prepared)
            buffer.bytes -= size
            try:
                results = await self._send(
                    queue, [p.prepared for p in batch], [p.msg_id for p in batch]
                )
            except Exception as exc:
                _fail(batch, exc)
                if holds_back(exc):  # every message waiting behind it was sent before now
                    self.hold(queue, exc)
                    behind = list(buffer.items)
                    buffer.items.clear()
                    buffer.bytes = 0
                    _fail(behind, EarlierSendFailedError(describe(queue), exc))
                    self._pending -= len(behind)
            else:
                for p, result in zip(batch, results, strict=True):
                    if not p.future.done():
                        p.future.set_result(result)
            self._pending -= len(batch)
            async with self._room:
                self._room.notify_all()

    async def _sleep_or_wake(self, deadline: float, wake: asyncio.Event) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep_until(deadline))
        waker = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def close(self) -> None:
        """Send what is buffered (no more lingering), then stop the senders."""
        self._closed = True
        for buffer in self._queues.values():
            buffer.wake.set()
        pending = [p.future for b in self._queues.values() for p in b.items]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        for buffer in self._queues.values():
            if buffer.task is not None:
                buffer.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await buffer.task


def _fail(items: list[_Pending], exc: BaseException) -> None:
    for p in items:
        if not p.future.done():
            p.future.set_exception(exc)
