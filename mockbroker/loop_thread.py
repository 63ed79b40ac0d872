"""A server's event loop in a daemon thread: what the embedded broker and name server share."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Self, TypeVar

T = TypeVar("T")


class LoopThread:
    """Runs `start()` on a new event loop in a daemon thread, then serves until `stop()`."""

    def __init__(
        self,
        name: str,
        start: Callable[[], Awaitable[None]],
        stop: Callable[[], Awaitable[None]],
    ) -> None:
        self._name = name
        self._start, self._stop = start, stop
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        """True between a successful start() and stop()."""
        return self._thread is not None

    def start(self) -> None:
        """Return once `start()` has run on the loop (raising what it raised)."""
        if self._thread is not None:
            raise RuntimeError(f"the {self._name} is already running")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop())
            loop.close()

        thread = threading.Thread(target=run, name=f"ordermq-{self._name}", daemon=True)
        thread.start()
        ready.wait()
        if failure:
            thread.join()
            raise failure[0]
        self._loop, self._thread = loop, thread

    def call(self, work: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        """Run `work()` on the loop from another thread; its result (or what it raised)."""
        if self._loop is None:
            raise RuntimeError(f"the {self._name} is not running")

        async def run() -> T:
            return await work()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def stop(self) -> None:
        """Run `stop()` on the loop, close it and join the thread (nothing if not running)."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = self._loop = None


class InBackground:
    """start(), stop() and a context manager over a LoopThread (`_runner`)."""

    _runner: LoopThread

    def start(self) -> None:
        """Start serving; returns once it serves (raises what its start raised)."""
        self._runner.start()

    def stop(self) -> None:
        """Stop serving, close everything and join the thread."""
        self._runner.stop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
