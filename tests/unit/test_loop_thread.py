"""The private loop of a blocking client: stopping it lets what still runs finish."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any

import pytest

from sdk._loop import LoopThread


def test_stop_cancels_pending_tasks_and_lets_them_clean_up_before_closing() -> None:
    loop_thread = LoopThread("test-loop")
    cleaned = threading.Event()
    started = threading.Event()

    async def forever() -> None:
        try:
            started.set()
            await asyncio.Event().wait()
        finally:
            cleaned.set()

    async def spawn() -> None:
        asyncio.get_running_loop().create_task(forever())

    loop_thread.run(spawn())
    assert started.wait(5)
    loop_thread.stop()
    # Without the drain the task would be destroyed with the loop, its finally never run.
    assert cleaned.is_set()


def test_run_or_call_answers_from_the_function_or_else_from_the_coroutine() -> None:
    loop_thread = LoopThread("test-loop")
    threads: list[str] = []

    def now(answer: int | None) -> int | None:
        threads.append(threading.current_thread().name)
        return answer

    async def later() -> int:
        await asyncio.sleep(0)  # a real wait: it runs as a task
        threads.append(threading.current_thread().name)
        return 2

    def refuse() -> int | None:
        raise ValueError("no")

    async def fail() -> int:
        raise KeyError("later")

    try:
        assert loop_thread.run_or_call(lambda: now(1), later) == 1
        assert loop_thread.run_or_call(lambda: now(None), later) == 2
        assert threads == ["test-loop"] * 3
        with pytest.raises(ValueError, match="no"):
            loop_thread.run_or_call(refuse, later)
        with pytest.raises(KeyError, match="later"):
            loop_thread.run_or_call(lambda: None, fail)
    finally:
        loop_thread.stop()


def test_calls_from_many_threads_while_the_loop_is_busy_share_one_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop_thread = LoopThread("test-loop")
    wakes = 0
    call_soon_threadsafe = loop_thread._loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any) -> Any:
        nonlocal wakes
        wakes += 1
        return call_soon_threadsafe(callback, *args)

    async def double(n: int) -> int:
        await asyncio.sleep(0)
        return 2 * n

    results: dict[int, int] = {}
    release = loop_thread.hold()
    try:
        monkeypatch.setattr(loop_thread._loop, "call_soon_threadsafe", counting)
        callers = [
            threading.Thread(target=lambda n=n: results.update({n: loop_thread.run(double(n))}))
            for n in range(8)
        ]
        for caller in callers:
            caller.start()
        deadline = time.monotonic() + 5
        while len(loop_thread._incoming) < len(callers) and time.monotonic() < deadline:
            time.sleep(0.001)  # until every call waits for the loop
        release.set()
        for caller in callers:
            caller.join(5)
        assert results == {n: 2 * n for n in range(8)}
        assert wakes == 1  # one write to the loop's wake-up pipe, not eight
    finally:
        release.set()
        loop_thread.stop()


def test_a_call_after_stop_raises_instead_of_waiting() -> None:
    loop_thread = LoopThread("test-loop")
    loop_thread.stop()

    async def nothing() -> None:
        return None

    coro = nothing()
    with pytest.raises(RuntimeError, match="closed"):
        loop_thread.run(coro)
    coro.close()


def test_a_coroutine_that_cannot_be_made_is_raised_to_its_caller_not_left_waiting() -> None:
    loop_thread = LoopThread("test-loop")
    raised: list[BaseException] = []

    def later() -> Any:
        raise ValueError("cannot make it")

    def call() -> None:
        try:
            loop_thread.run_or_call(lambda: None, later)
        except ValueError as exc:
            raised.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    try:
        caller.start()
        caller.join(5)
        assert [str(e) for e in raised] == ["cannot make it"]
    finally:
        loop_thread.stop()


def test_grpc_completions_for_a_closed_client_loop_are_dropped_not_raised() -> None:
    """gRPC's poller passes a call's completion on with its loop's call_soon_threadsafe,
    from whichever loop read it: one for a call cancelled at shutdown may come after the
    client's loop closed, and raised "Event loop is closed" in another client's loop."""
    from grpc._cython import cygrpc

    loop_thread = LoopThread("test-loop")
    loop_thread.stop()
    loop = loop_thread._loop
    assert loop.is_closed()
    loop.call_soon_threadsafe(cygrpc._handle_callback_wrapper, None, 0)  # dropped
    # Anything else still raises: a caller of a stopped client is told, not left waiting.
    with pytest.raises(RuntimeError, match="closed"):
        loop.call_soon_threadsafe(print)


def test_run_started_waits_on_a_returned_future_without_a_task_and_runs_a_coroutine() -> None:
    loop_thread = LoopThread("test-loop")
    made: list[str] = []

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop_thread._loop.set_task_factory(counting)

    def settled_soon() -> asyncio.Future[int]:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.set_result, 7)
        return future

    async def later() -> int:
        await asyncio.sleep(0)
        return 8

    def refuse() -> asyncio.Future[int]:
        raise ValueError("refused before it began")

    def failing() -> asyncio.Future[int]:
        future = asyncio.get_running_loop().create_future()
        future.set_exception(KeyError("failed later"))
        return future

    try:
        assert loop_thread.run_started(settled_soon) == 7
        assert made == []  # the future was waited on as it is
        assert loop_thread.run_started(later) == 8
        assert made == [later.__qualname__]
        with pytest.raises(ValueError, match="refused before it began"):
            loop_thread.run_started(refuse)
        with pytest.raises(KeyError, match="failed later"):
            loop_thread.run_started(failing)
    finally:
        loop_thread.stop()


def test_begin_starts_in_turn_with_blocking_calls_and_cannot_be_cancelled_once_begun() -> None:
    loop_thread = LoopThread("test-loop")
    began: list[str] = []

    def start(name: str) -> asyncio.Future[str]:
        began.append(name)
        future = asyncio.get_running_loop().create_future()
        future.set_result(name)
        return future

    def broken() -> asyncio.Future[str]:
        raise ValueError("bad")

    release = loop_thread.hold()
    try:
        first = loop_thread.begin(lambda: start("first"))
        withdrawn = loop_thread.begin(lambda: start("withdrawn"))
        assert withdrawn.cancel()  # not begun yet: it never will
        release.set()
        # A blocking call made after them begins after them.
        assert loop_thread.run_started(lambda: start("blocking")) == "blocking"
        assert first.result(5) == "first"
        assert began == ["first", "blocking"]
        assert not first.cancel()  # begun: it goes on
        with pytest.raises(ValueError, match="bad"):
            loop_thread.begin(broken).result(5)
    finally:
        release.set()
        loop_thread.stop()


def test_work_cancelled_on_the_loop_answers_cancelled_to_the_waiting_thread() -> None:
    """A future or task cancelled on the loop (the loop stopping under it, a send's future
    cancelled there) answers the thread waiting on it with CancelledError, as a Future
    would, for run_started and begin alike."""
    loop_thread = LoopThread("test-loop")

    def cancelled_soon() -> asyncio.Future[int]:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(future.cancel)
        return future

    async def cancelled_itself() -> int:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(0)
        return 1

    try:
        for start in (cancelled_soon, cancelled_itself):
            with pytest.raises(concurrent.futures.CancelledError):
                loop_thread.run_started(start)
            began = loop_thread.begin(start)
            with pytest.raises(concurrent.futures.CancelledError):
                began.result(5)
            assert began.done() and not began.cancelled()  # begun: answered, not withdrawn
    finally:
        loop_thread.stop()
