"""The asyncio DedupCoordinator: the twin of sdk.DedupCoordinator, over the same table."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from sdk._dedup import Decision, DedupTable, check_key
from sdk._validation import check_clock
from sdk.clock import Clock, SystemClock

T = TypeVar("T")

#: What a waiter's future holds when the run it waited for was cancelled: arrive again.
_AGAIN = object()


class DedupCoordinator:
    """Runs the work for a key once for all the tasks that ask for it together.

    `await run(key, work)` awaits `work()` in the calling task if no run of `key` is under
    way, else waits for that run and returns its value (or raises its exception). A value is
    kept for `ttl_seconds` (on `clock.monotonic()`): a call within it returns the value
    without running anything. An exception is not kept: the next call runs the work again.
    If the running task is cancelled, its waiters are not: one of them runs the work
    instead. A waiting task that is cancelled stops waiting; the run goes on for the others.

    At most `max_keys` keys are kept: for a new key at the bound, expired values and then
    the oldest values are dropped; a key being worked on is never dropped, and when every
    kept key is, the new key's call runs its work alone (neither shared nor cached).

    Use one coordinator from one event loop. In-process only: sharing runs across processes
    would go through the broker and is left for later. A `work` must not call `run` with its
    own key: it would wait for itself.

    Args:
        ttl_seconds: how long a value is shared after its run returned; > 0.
        max_keys: the most keys kept, working or done; >= 1.
        clock: the time source of expiry (sdk.testing.FakeClock in tests).

    Raises:
        InvalidArgumentError: ttl_seconds not positive, max_keys below 1, or a clock
            that is no Clock.
    """

    def __init__(
        self, *, ttl_seconds: float, max_keys: int = 10_000, clock: Clock | None = None
    ) -> None:
        self._table: DedupTable[asyncio.Future[object]] = DedupTable(ttl_seconds, max_keys)
        self._clock: Clock = check_clock(clock) or SystemClock()

    async def run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        """Return `await work()`'s value for `key`, running it only if nothing is shared.

        Raises:
            InvalidArgumentError: `key` is not a non-empty str.
            Exception: what the shared run of `work` raised.
        """
        check_key(key)
        loop = asyncio.get_running_loop()
        while True:
            waiter: asyncio.Future[object] = loop.create_future()
            arrival = self._table.arrive(key, self._clock.monotonic(), waiter)
            if arrival.decision is Decision.CACHED:
                return cast(T, arrival.value)
            if arrival.decision is Decision.UNTRACKED:
                return await work()
            if arrival.decision is Decision.RUN:
                return await self._run(key, work)
            value = await waiter
            if value is not _AGAIN:
                return cast(T, value)

    async def _run(self, key: str, work: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await work()
        except Exception as exc:
            for w in self._table.fail(key):
                if not w.done():
                    w.set_exception(exc)
            raise
        except BaseException:
            for w in self._table.fail(key):
                if not w.done():
                    w.set_result(_AGAIN)
            raise
        for w in self._table.succeed(key, value, self._clock.monotonic()):
            if not w.done():
                w.set_result(value)
        return value

    def waiting(self, key: str) -> int:
        """How many tasks wait for the run of `key` under way (0 if none is).

        A cancelled waiter counts until the run ends.
        """
        return self._table.waiting(key)

    def __len__(self) -> int:
        """How many keys are kept (working, or done and not yet dropped)."""
        return len(self._table)
