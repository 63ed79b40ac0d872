"""Calling a user's listener: async ones on the loop, plain ones on the thread pool."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any


async def call_listener(fn: Callable[..., Any], executor: Executor, *args: Any) -> Any:
    """Run `fn(*args)`: awaited when it is a coroutine function, else on `executor`."""
    if inspect.iscoroutinefunction(fn):
        return await fn(*args)
    result = await asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    if inspect.isawaitable(result):
        return await result
    return result
