"""sdk.clock.wait_within: a bounded wait on an injected clock."""

from __future__ import annotations

import asyncio

import pytest

from sdk.clock import wait_within
from sdk.testing import FakeClock


def test_work_that_ends_in_time_is_waited_for() -> None:
    async def main() -> bool:
        return await wait_within(FakeClock(), asyncio.sleep(0), 5)

    assert asyncio.run(main()) is True


def test_work_still_running_when_the_clock_passes_the_bound_is_cancelled() -> None:
    clock = FakeClock()
    cancelled = asyncio.Event()

    async def never() -> None:
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            cancelled.set()

    async def main() -> bool:
        waiting = asyncio.ensure_future(wait_within(clock, never(), 5))
        for _ in range(100):  # until the bound's timer sleeps on the clock
            await asyncio.sleep(0)
            clock.advance(1)
            if waiting.done():
                break
        return await waiting

    assert asyncio.run(main()) is False
    assert cancelled.is_set()


def test_an_error_of_the_work_is_raised() -> None:
    async def failing() -> None:
        raise OSError("peer gone")

    with pytest.raises(OSError, match="peer gone"):
        asyncio.run(wait_within(FakeClock(), failing(), 5))
