"""The private loop of a blocking client: stopping it lets what still runs finish."""

from __future__ import annotations

import asyncio
import threading

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
