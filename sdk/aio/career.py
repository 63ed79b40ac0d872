"""sdk.aio.Career: the singleton career on the caller's event loop (core: sdk._career)."""

from __future__ import annotations

from sdk._career import (
    DEFAULT_EXECUTE_INTERVAL_SECONDS,
    DEFAULT_LEASE_SECONDS,
    DEFAULT_RENEW_INTERVAL_SECONDS,
    DEFAULT_TOPIC,
    Callback,
    CareerCore,
    CareerView,
)
from sdk._transport import connect
from sdk.aio._context import AsyncClientContext
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.tls import TLSConfig


class Career(CareerView, AsyncClientContext):
    """The asyncio career; arguments and behaviour as sdk.Career, with async callbacks.

    A deposed holder's running on_execute is cancelled at once.

    Example::

        async with sdk.aio.Career("nightly-report", "127.0.0.1:8081",
                                  inaugurate, execute, hand_over) as career:
            await sdk.aio.wait_for_shutdown_signal()
    """

    def __init__(
        self,
        name: str,
        endpoints: str | list[str],
        on_inaugurate: Callback,
        on_execute: Callback,
        on_hand_over: Callback,
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        renew_interval_seconds: float = DEFAULT_RENEW_INTERVAL_SECONDS,
        execute_interval_seconds: float = DEFAULT_EXECUTE_INTERVAL_SECONDS,
        topic: str = DEFAULT_TOPIC,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._core = CareerCore(
            name,
            lambda: connect(endpoints, tls, credentials, clock),
            on_inaugurate,
            on_execute,
            on_hand_over,
            lease_seconds=lease_seconds,
            renew_interval_seconds=renew_interval_seconds,
            execute_interval_seconds=execute_interval_seconds,
            topic=topic,
            clock=clock,
        )

    async def start(self) -> None:
        """Start campaigning; the callbacks run in the background."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Hand over if holding, then leave the group and close the connections."""
        await self._core.shutdown()
