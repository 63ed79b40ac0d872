"""The common shape of the blocking clients: an async core run on a private loop thread."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from sdk._loop import LoopThread
from sdk.errors import ClientStateError

T = TypeVar("T")


class AsyncCore(Protocol):
    """What a blocking client runs: an async core that starts and shuts down."""

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...


class BlockingClient:
    """start(), shutdown() and `with` for a core, on a loop thread of the client's own."""

    def __init__(self, core: AsyncCore, thread_name: str) -> None:
        self._async_core = core
        self._thread_name = thread_name
        self._loop: LoopThread | None = None

    def start(self) -> None:
        """Start the client; its background work runs until shutdown()."""
        if self._loop is not None:
            raise ClientStateError(f"{type(self).__name__} already started")
        self._loop = LoopThread(self._thread_name)
        try:
            self._loop.run(self._async_core.start())
        except BaseException:
            self._loop.stop()
            self._loop = None
            raise

    def shutdown(self) -> None:
        """Stop the client (see the subclass for what it finishes first)."""
        if self._loop is None:
            return
        try:
            self._loop.run(self._async_core.shutdown())
        finally:
            self._loop.stop()

    def _running(self, coro: Coroutine[Any, Any, Any]) -> LoopThread:
        if self._loop is None:
            coro.close()
            raise ClientStateError(f"{type(self).__name__} is not started; call start() first")
        return self._loop

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the client's loop and wait; ClientStateError before start()."""
        return self._running(coro).run(coro)

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start `coro` on the client's loop; its future."""
        return self._running(coro).submit(coro)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()
