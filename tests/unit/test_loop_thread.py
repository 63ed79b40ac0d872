"""The private loop of a blocking client: stopping it lets what still runs finish."""

from __future__ import annotations

import asyncio
import threading

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
