"""Clocks: where every lease, delay, timeout and expiry in ordermq gets its time.

A clock tells the time and sleeps until a time, so that a fake clock (sdk.testing.FakeClock)
can make every timer deterministic: tests advance it instead of sleeping. Besides wall time
it gives a monotonic reading, for durations that must not jump when the wall clock is set
(lock leases).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Protocol


class Clock(Protocol):
    """The time source of a broker or client."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds since an arbitrary point; never goes backwards (for durations only)."""
        ...

    async def sleep_until(self, deadline: float) -> None:
        """Return once now() >= deadline."""
        ...


class SystemClock:
    """The real clock: wall time, asyncio sleeps."""

    def now(self) -> float:
        """Seconds since the epoch."""
        return time.time()

    def monotonic(self) -> float:
        """time.monotonic(): unaffected by changes to the system clock."""
        return time.monotonic()

    async def sleep_until(self, deadline: float) -> None:
        """Sleep until `deadline` (wall clock)."""
        delay = deadline - time.time()
        if delay > 0:
            await asyncio.sleep(delay)


async def sleep_for(clock: Clock, seconds: float) -> None:
    """Sleep `seconds` on `clock`."""
    await clock.sleep_until(clock.now() + seconds)


async def wait_within(clock: Clock, work: Awaitable[object], seconds: float) -> bool:
    """Wait for `work` at most `seconds` on `clock`; False if the time ran out first.

    When the time runs out `work` is cancelled, and its end awaited. An exception of `work`
    is raised.
    """
    task = asyncio.ensure_future(work)
    timer = asyncio.ensure_future(sleep_for(clock, seconds))
    try:
        await asyncio.wait((task, timer), return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait((task,))
    if task.cancelled():
        return False
    task.result()  # raises what `work` raised
    return True
