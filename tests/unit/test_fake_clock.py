"""sdk.testing.FakeClock: time that moves only when a test moves it."""

from __future__ import annotations

import asyncio

from sdk.clock import sleep_for
from sdk.testing import FakeClock


def test_a_test_can_wait_for_one_timer_by_its_deadline() -> None:
    clock = FakeClock()

    async def main() -> list[int]:
        start = clock.now()
        seen = [clock.sleeping_until(start + 3)]
        short = asyncio.ensure_future(sleep_for(clock, 3))
        other = asyncio.ensure_future(sleep_for(clock, 5))
        await asyncio.sleep(0)  # both timers armed
        seen += [clock.sleeping_until(start + 3), clock.sleeping_until(start + 5), clock.sleepers]
        clock.advance(3)
        await short
        seen += [clock.sleeping_until(start + 3), clock.sleeping_until(start + 5)]
        other.cancel()
        return seen

    assert asyncio.run(main()) == [0, 1, 1, 2, 0, 1]
