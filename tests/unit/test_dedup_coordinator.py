"""sdk.DedupCoordinator and sdk.aio.DedupCoordinator with real threads and tasks.

50 callers of one key at once: the work runs once and each gets its value; a failure
reaches every waiter and is not kept; a value expires on a FakeClock; a cancelled
running task hands the run to a waiter. Runs wait for the waiters to be counted
(`waiting(key)`), not for time to pass.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

import sdk
import sdk.aio
from sdk.errors import InvalidArgumentError
from sdk.testing import FakeClock

N = 50
LIMIT = 30.0  # real seconds: only a hang reaches it


def wait_until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + LIMIT
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


class Boom(Exception):
    pass


def run_threads(target: Callable[[], object], n: int) -> list[object]:
    """Run `target` in n threads; each thread's value, or the exception it raised."""
    results: list[object] = [None] * n

    def one(i: int) -> None:
        try:
            results[i] = target()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(LIMIT)
        assert not t.is_alive()
    return results


# ---------------------------------------------------------------------- blocking


def test_fifty_threads_one_run_one_value() -> None:
    dedup = sdk.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
    runs = []

    def work() -> str:
        runs.append(threading.get_ident())
        wait_until(lambda: dedup.waiting("user:7") == N - 1)  # every other thread waits
        return "alice"

    assert run_threads(lambda: dedup.run("user:7", work), N) == ["alice"] * N
    assert len(runs) == 1
    assert dedup.run("user:7", work) == "alice" and len(runs) == 1  # kept: not run again


def test_a_failure_reaches_every_waiter_and_is_not_kept() -> None:
    dedup = sdk.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
    runs = []

    def work() -> str:
        runs.append(1)
        wait_until(lambda: dedup.waiting("k") == N - 1)
        raise Boom("lookup failed")

    results = run_threads(lambda: dedup.run("k", work), N)
    assert len(runs) == 1
    assert all(isinstance(r, Boom) for r in results), results
    assert dedup.run("k", lambda: "second try") == "second try"


def test_a_value_expires_after_its_ttl() -> None:
    clock = FakeClock()
    dedup = sdk.DedupCoordinator(ttl_seconds=5, clock=clock)
    calls = iter(["v1", "v2"])
    assert dedup.run("k", lambda: next(calls)) == "v1"
    clock.advance(4.9)
    assert dedup.run("k", lambda: next(calls)) == "v1"
    clock.advance(0.1)
    assert dedup.run("k", lambda: next(calls)) == "v2"


def test_keys_are_independent_and_bounded() -> None:
    dedup = sdk.DedupCoordinator(ttl_seconds=60, max_keys=2, clock=FakeClock())
    assert [dedup.run(k, lambda k=k: k.upper()) for k in "abc"] == ["A", "B", "C"]
    assert len(dedup) == 2  # "a", the oldest value, was dropped for "c"
    assert dedup.run("a", lambda: "again") == "again"
    assert dedup.run("c", lambda: "not run") == "C"


def test_an_interrupted_run_hands_over_to_a_waiter() -> None:
    dedup = sdk.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
    runs = []

    def work() -> str:
        runs.append(1)
        if len(runs) == 1:
            wait_until(lambda: dedup.waiting("k") == 2)
            raise KeyboardInterrupt  # a BaseException: the run is abandoned, not failed
        return "second run"

    def call() -> object:
        try:
            return dedup.run("k", work)
        except KeyboardInterrupt:
            return "interrupted"

    assert sorted(map(str, run_threads(call, 3))) == ["interrupted", "second run", "second run"]
    assert len(runs) == 2


@pytest.mark.parametrize("make", [sdk.DedupCoordinator, sdk.aio.DedupCoordinator])
@pytest.mark.parametrize(
    "kwargs", [{"ttl_seconds": 0}, {"ttl_seconds": -1}, {"ttl_seconds": 1, "max_keys": 0}]
)
def test_bad_settings_raise(make: Callable[..., object], kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgumentError):
        make(**kwargs)


def test_an_empty_key_raises() -> None:
    with pytest.raises(InvalidArgumentError):
        sdk.DedupCoordinator(ttl_seconds=1).run("", lambda: 1)

    async def work() -> int:
        return 1

    async def main() -> None:
        await sdk.aio.DedupCoordinator(ttl_seconds=1).run("", work)

    with pytest.raises(InvalidArgumentError):
        asyncio.run(main())


# ---------------------------------------------------------------------- asyncio


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def test_fifty_tasks_one_run_one_value() -> None:
    async def main() -> None:
        dedup = sdk.aio.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
        runs = []

        async def work() -> str:
            runs.append(1)
            await until(lambda: dedup.waiting("user:7") == N - 1)
            return "alice"

        values = await asyncio.gather(*(dedup.run("user:7", work) for _ in range(N)))
        assert values == ["alice"] * N
        assert len(runs) == 1
        assert await dedup.run("user:7", work) == "alice" and len(runs) == 1

    asyncio.run(main())


def test_a_failure_reaches_every_waiting_task() -> None:
    async def main() -> None:
        dedup = sdk.aio.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
        runs = []

        async def work() -> str:
            runs.append(1)
            await until(lambda: dedup.waiting("k") == N - 1)
            raise Boom("lookup failed")

        results = await asyncio.gather(*(dedup.run("k", work) for _ in range(N)),
                                       return_exceptions=True)  # fmt: skip
        assert len(runs) == 1
        assert all(isinstance(r, Boom) for r in results), results

        async def again() -> str:
            return "second try"

        assert await dedup.run("k", again) == "second try"

    asyncio.run(main())


def test_a_value_expires_after_its_ttl_asyncio() -> None:
    async def main() -> None:
        clock = FakeClock()
        dedup = sdk.aio.DedupCoordinator(ttl_seconds=5, clock=clock)
        calls = iter(["v1", "v2"])

        async def work() -> str:
            return next(calls)

        assert await dedup.run("k", work) == "v1"
        clock.advance(4.9)
        assert await dedup.run("k", work) == "v1"
        clock.advance(0.1)
        assert await dedup.run("k", work) == "v2"

    asyncio.run(main())


def test_a_cancelled_running_task_hands_the_run_to_a_waiter() -> None:
    async def main() -> None:
        dedup = sdk.aio.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
        started: list[asyncio.Event] = []

        async def work() -> str:
            started.append(asyncio.Event())
            await started[-1].wait()
            return f"run {len(started)}"

        first = asyncio.create_task(dedup.run("k", work))
        await until(lambda: len(started) == 1)
        others = [asyncio.create_task(dedup.run("k", work)) for _ in range(3)]
        await until(lambda: dedup.waiting("k") == 3)
        first.cancel()
        await until(lambda: len(started) == 2)  # a waiter took the run over
        assert dedup.waiting("k") == 2
        started[1].set()
        assert await asyncio.gather(*others) == ["run 2"] * 3
        assert first.cancelled()

    asyncio.run(main())


def test_a_cancelled_waiter_does_not_stop_the_run() -> None:
    async def main() -> None:
        dedup = sdk.aio.DedupCoordinator(ttl_seconds=60, clock=FakeClock())
        gate = asyncio.Event()

        async def work() -> str:
            await gate.wait()
            return "value"

        tasks = [asyncio.create_task(dedup.run("k", work)) for _ in range(3)]
        await until(lambda: dedup.waiting("k") == 2)
        tasks[1].cancel()
        gate.set()
        assert await tasks[0] == "value" and await tasks[2] == "value"
        assert tasks[1].cancelled()

    asyncio.run(main())
