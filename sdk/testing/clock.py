"""A fake clock for tests: time moves only when the test says so.

Pass a FakeClock to a broker (`EmbeddedBroker(config, clock=clock)`) or a client, then
`clock.advance(seconds)` instead of sleeping: every sleeper whose deadline has come wakes,
on whichever event loop (and thread) it sleeps.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field


@dataclass(order=True)
class _Sleeper:
    deadline: float
    seq: int
    loop: asyncio.AbstractEventLoop = field(compare=False)
    future: asyncio.Future[None] = field(compare=False)


class FakeClock:
    """A clock that moves only when told to; safe to advance from any thread."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._monotonic = 0.0
        self._lock = threading.Lock()
        self._sleepers: list[_Sleeper] = []
        self._seq = 0

    def now(self) -> float:
        """The fake time, in seconds since the epoch."""
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        """Seconds advanced since the clock was made (moves with now())."""
        with self._lock:
            return self._monotonic

    async def sleep_until(self, deadline: float) -> None:
        """Wait until the clock is advanced to `deadline` or beyond."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if deadline <= self._now:
                return
            future: asyncio.Future[None] = loop.create_future()
            self._seq += 1
            self._sleepers.append(_Sleeper(deadline, self._seq, loop, future))
        await future

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has come."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._move(seconds, seconds)

    def step_wall_clock(self, seconds: float) -> None:
        """Set the wall clock forward or back by `seconds`, as an NTP step would.

        monotonic() does not move; sleepers whose deadline has come wake.
        """
        self._move(seconds, 0.0)

    def _move(self, wall: float, monotonic: float) -> None:
        with self._lock:
            self._now += wall
            self._monotonic += monotonic
            due = [s for s in self._sleepers if s.deadline <= self._now]
            self._sleepers = [s for s in self._sleepers if s.deadline > self._now]
        for sleeper in sorted(due):
            if not sleeper.loop.is_closed():
                sleeper.loop.call_soon_threadsafe(_wake, sleeper.future)

    @property
    def sleepers(self) -> int:
        """How many sleepers wait (for tests that wait for a timer to be armed)."""
        with self._lock:
            return sum(not s.future.done() for s in self._sleepers)

    def sleeping_until(self, deadline: float) -> int:
        """How many sleepers wait for exactly `deadline`: a test waits for one timer armed.

        `sleep_for(clock, seconds)` waits for `clock.now() + seconds`; a test that knows
        when a timer was set can wait for it by its deadline, rather than for any sleeper.
        """
        with self._lock:
            return sum(s.deadline == deadline and not s.future.done() for s in self._sleepers)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
