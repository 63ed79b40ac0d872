"""sdk.Career: the singleton career with blocking callbacks (core: sdk._career)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sdk._blocking import BlockingClient
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
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.errors import InvalidArgumentError
from sdk.tls import TLSConfig


def _in_thread(label: str, callback: Callable[[int], object]) -> Callback:
    if not callable(callback):
        raise InvalidArgumentError(f"{label} must be callable, not {callback!r}")

    async def run(epoch: int) -> object:
        # A thread cannot be cancelled: a cancelled call waits for it to return, so that
        # on_hand_over never overlaps the on_execute it follows.
        call = asyncio.ensure_future(asyncio.to_thread(callback, epoch))
        try:
            return await asyncio.shield(call)
        except asyncio.CancelledError:
            await asyncio.wait([call])
            raise

    return run


class Career(BlockingClient, CareerView):
    """One holder at a time, among every process running a career of the same `name`.

    Seed 000's leader career: the holder is inaugurated (`on_inaugurate(epoch)`), runs
    `on_execute(epoch)` over and over (every `execute_interval_seconds` after each call
    returns) while it holds the career, and hands over (`on_hand_over(epoch)`) when it
    stops: cleanly on shutdown() (the lock is then released, and another candidate is
    inaugurated within one `renew_interval_seconds`), or forcibly when its lease was
    lost (it died, was paused, or could not reach the broker): the broker then gives
    the career to another candidate once its lease (60 s by default) is over.

    It is built on the broker's queue locks: see sdk._career for the design. The
    `epoch` grows with every new holder and is the application's fence: a store that
    refuses writes with an epoch lower than the highest it has seen refuses a deposed
    holder's late writes.

    Args:
        name: The career's name (letters, digits, _ or -).
        endpoints: One broker "host:port" or several ("h1:p1;h2:p2" or a list).
        on_inaugurate, on_execute, on_hand_over: Called with the term's epoch, each in a
            worker thread. A long on_execute should check `holds(epoch)` and return
            when it is False.
        lease_seconds: The holder's own view of its lease, counted from each renewal's
            request: it stops executing once it passed without a renewal. Must be
            shorter than the broker's `lock_lease_seconds` (60 by default).
        renew_interval_seconds: How often the holder renews, and candidates try.
        execute_interval_seconds: Pause between two on_execute calls (0: none).
        topic: The topic whose first queue carries the lock (created on first use by a
            broker that creates topics).
        clock: Time source (sdk.testing.FakeClock in tests).
        tls, credentials: As for the other clients.

    Example::

        from sdk import Career

        def execute(epoch):
            store.write(report(), epoch=epoch)  # the store refuses stale epochs

        with Career("nightly-report", "127.0.0.1:8081", print, execute, print):
            wait_for_shutdown_signal()
    """

    def __init__(
        self,
        name: str,
        endpoints: str | list[str],
        on_inaugurate: Callable[[int], object],
        on_execute: Callable[[int], object],
        on_hand_over: Callable[[int], object],
        *,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        renew_interval_seconds: float = DEFAULT_RENEW_INTERVAL_SECONDS,
        execute_interval_seconds: float = DEFAULT_EXECUTE_INTERVAL_SECONDS,
        topic: str = DEFAULT_TOPIC,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        callbacks = (
            _in_thread("on_inaugurate", on_inaugurate),
            _in_thread("on_execute", on_execute),
            _in_thread("on_hand_over", on_hand_over),
        )
        self._core = CareerCore(
            name,
            lambda: connect(endpoints, tls, credentials, clock),
            *callbacks,
            lease_seconds=lease_seconds,
            renew_interval_seconds=renew_interval_seconds,
            execute_interval_seconds=execute_interval_seconds,
            topic=topic,
            clock=clock,
        )
        super().__init__(self._core, f"ordermq-career-{name}")

    def shutdown(self) -> None:
        """Hand over if holding, leave the group, close the connections.

        The running on_execute is awaited, on_hand_over runs, then the lock is released.
        """
        super().shutdown()
