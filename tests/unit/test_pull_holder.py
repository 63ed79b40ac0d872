"""PullHolder (mockbroker/long_polling.py) on the real clock: its deadline is a loop timer.

The fake clock's path (a task sleeping on the clock beside the wait) is driven through the
broker in tests/component/test_long_polling.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from mockbroker.delivery import next_recheck
from mockbroker.long_polling import PullHolder
from sdk.clock import SystemClock


def run(test: Coroutine[Any, Any, None]) -> None:
    asyncio.run(test)


def idle(holder: PullHolder) -> bool:
    return holder.held == 0 and not holder._waiting


def test_an_append_to_any_of_the_queues_releases_the_wait() -> None:
    async def main() -> None:
        clock = SystemClock()
        holder = PullHolder(clock)
        waiter = asyncio.create_task(holder.wait_any([("t", 0), ("t", 1)], clock.now() + 60))
        await asyncio.sleep(0)
        assert holder.held == 1 and not waiter.done()
        holder.notify("t", 2)  # another queue
        await asyncio.sleep(0)
        assert not waiter.done()
        holder.notify("t", 1)
        assert await waiter is True
        assert idle(holder)

    run(main())


def test_a_passed_deadline_ends_the_wait_unwoken() -> None:
    async def main() -> None:
        clock = SystemClock()
        holder = PullHolder(clock)
        assert await holder.wait_any([("t", 0)], clock.now() + 0.01) is False
        assert idle(holder)
        holder.notify("t", 0)  # nobody waits: nothing happens
        assert await holder.wait_any([("t", 0)], clock.now() - 1) is False  # already passed

    run(main())


def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    async def main() -> None:
        clock = SystemClock()
        holder = PullHolder(clock)
        waiter = asyncio.create_task(holder.wait_any([("t", 0)], clock.now() + 60))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert idle(holder)
        holder.notify("t", 0)

    run(main())


def test_closing_releases_the_waits_as_not_woken_and_holds_no_more() -> None:
    async def main() -> None:
        clock = SystemClock()
        holder = PullHolder(clock)
        waiter = asyncio.create_task(holder.wait_any([("t", 0)], clock.now() + 60))
        await asyncio.sleep(0)
        holder.close()
        assert await waiter is False
        assert idle(holder)
        assert await holder.wait_any([("t", 0)], clock.now() + 60) is False

    run(main())


def test_waits_with_a_shared_deadline_share_one_timer_that_expires_them() -> None:
    async def main() -> None:
        clock = SystemClock()
        holder = PullHolder(clock)
        loop = asyncio.get_running_loop()
        timers: list[float] = []
        call_later = loop.call_later

        def counted(delay: float, *args: Any) -> asyncio.TimerHandle:
            timers.append(delay)
            return call_later(delay, *args)

        loop.call_later = counted  # type: ignore[method-assign]
        deadline = clock.now() + 0.2
        for _ in range(3):  # a subscription's batches: each wait woken by an append
            waiter = asyncio.create_task(holder.wait_any([("t", 0)], deadline, shared=True))
            await asyncio.sleep(0)
            holder.notify("t", 0)
            assert await waiter is True
            assert idle(holder)
        assert len(timers) == 1
        # Two waits still there at the deadline both end unwoken, by that one timer.
        waiters = [
            asyncio.create_task(holder.wait_any([("t", q)], deadline, shared=True)) for q in (0, 1)
        ]
        assert await asyncio.gather(*waiters) == [False, False]
        assert len(timers) == 1
        assert idle(holder) and not holder._shared
        # A wait of another deadline has a timer of its own.
        assert await holder.wait_any([("t", 0)], clock.now() + 0.01, shared=True) is False
        assert len(timers) == 2 and not holder._shared

    run(main())


def test_a_subscriptions_waits_share_a_deadline_at_most_a_recheck_ahead() -> None:
    # Delivery.subscribe's deadline: kept while ahead, renewed once passed; a clock set
    # back an hour does not leave its lock unchecked for that hour.
    assert next_recheck(0.0, 100.0, 1.0) == 101.0  # the first wait
    assert next_recheck(101.0, 100.5, 1.0) == 101.0  # the waits until then share it
    assert next_recheck(101.0, 101.0, 1.0) == 102.0  # passed
    assert next_recheck(101.0, 100.0 - 3600, 1.0) == 100.0 - 3600 + 1.0  # set back
