"""Held pulls: a pull that finds nothing waits for a message instead of returning empty.

Receives (mockbroker/pop) wait here too, on every queue they take from at once.

A held pull is a coroutine waiting on a future keyed by (topic, queue), not a thread, so
thousands cost little. It is released the moment a message for its queue is appended,
when its suspend time runs out on the broker's clock, when the client cancels the call
(the handler is cancelled and the slot freed at once), or when the broker shuts down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from sdk.clock import Clock, SystemClock

QueueKey = tuple[str, int]


class PullHolder:
    """Where held pulls wait for appends."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        #: Each waiter's future: True once an append (or the stop) released it, False
        #: when its deadline passed (the real clock's timer sets that).
        self._waiting: dict[QueueKey, set[asyncio.Future[bool]]] = {}
        #: The waits of each shared deadline (wait_any's `shared`), its timer's to expire.
        self._shared: dict[float, set[asyncio.Future[bool]]] = {}
        self._closed = False
        self.held = 0

    @property
    def closed(self) -> bool:
        """True once the broker is stopping: waits return at once."""
        return self._closed

    async def wait(self, queue: QueueKey, deadline: float) -> bool:
        """Wait for an append to `queue` until `deadline`; True when woken by one."""
        return await self.wait_any((queue,), deadline)

    async def wait_any(
        self, queues: Iterable[QueueKey], deadline: float, *, shared: bool = False
    ) -> bool:
        """Wait for an append to any of `queues` until `deadline`; True when woken by one.

        `shared`: other waits will have the same deadline (a push subscription waits once
        per batch until its next recheck): on the real clock its timer is kept for them
        until it fires, not made and cancelled per wait.
        """
        if self._closed or self._clock.now() >= deadline:
            return False
        keys = tuple(queues)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        waiting = self._waiting
        joined: list[set[asyncio.Future[bool]]] = []
        for queue in keys:  # no set made for a key already waited on
            waiters = waiting.get(queue)
            if waiters is None:
                waiters = waiting[queue] = set()
            waiters.add(future)
            joined.append(waiters)
        self.held += 1
        try:
            if type(self._clock) is SystemClock:
                # The real clock's deadline is a timer on the loop, not a task sleeping
                # beside the wait: a push subscription waits once per batch at low rates.
                if shared:
                    return await self._wait_shared(future, deadline)
                timer = loop.call_later(deadline - self._clock.now(), _expire, future)
                try:
                    return await future and not self._closed
                finally:
                    timer.cancel()
            sleeper = asyncio.ensure_future(self._clock.sleep_until(deadline))
            try:
                await asyncio.wait((future, sleeper), return_when=asyncio.FIRST_COMPLETED)
                return future.done() and not self._closed
            finally:
                sleeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.gather(sleeper, return_exceptions=True)
        finally:
            self.held -= 1
            for queue, waiters in zip(keys, joined, strict=True):
                waiters.discard(future)
                if not waiters and self._waiting.get(queue) is waiters:
                    del self._waiting[queue]

    async def _wait_shared(self, future: asyncio.Future[bool], deadline: float) -> bool:
        waits = self._shared.get(deadline)
        if waits is None:
            waits = self._shared[deadline] = set()
            delay = deadline - self._clock.now()
            asyncio.get_running_loop().call_later(delay, self._expire_shared, deadline)
        waits.add(future)
        try:
            return await future and not self._closed
        finally:
            waits.discard(future)

    def _expire_shared(self, deadline: float) -> None:
        for future in self._shared.pop(deadline, ()):
            _expire(future)

    def notify(self, topic: str, queue_id: int) -> None:
        """A message was appended to (topic, queue_id): release its held pulls."""
        waiters = self._waiting.pop((topic, queue_id), None)
        if waiters:
            for future in waiters:
                if not future.done():
                    future.set_result(True)

    def close(self) -> None:
        """Release every held pull and hold no more (the broker is stopping)."""
        self._closed = True
        for waiters in self._waiting.values():
            for future in waiters:
                if not future.done():
                    future.set_result(True)
        self._waiting.clear()


def _expire(future: asyncio.Future[bool]) -> None:
    if not future.done():
        future.set_result(False)
