"""`async with` for the asyncio clients: start() on entry, shutdown() on exit."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClientContext:
    """`async with client:` starts it and shuts it down; the client defines both."""

    async def start(self) -> None:
        """Start the client (each client says what that does)."""
        raise NotImplementedError

    async def shutdown(self) -> None:
        """Stop the client (each client says what it finishes first)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.shutdown()
