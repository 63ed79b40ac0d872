"""sdk.aio.wait_for_shutdown_signal: the asyncio twin of sdk.wait_for_shutdown_signal."""

from __future__ import annotations

import asyncio
import signal

from sdk._blocking import catchable_signals
from sdk.errors import ClientStateError


async def wait_for_shutdown_signal(
    signals: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM),
) -> signal.Signals:
    """Wait until one of `signals` arrives (Ctrl+C or SIGTERM by default); return it.

    While it waits, those signals only end the wait; their previous handlers are back
    when it returns (asyncio.run's own Ctrl+C handling among them). Shut down after it::

        async with consumer:
            await wait_for_shutdown_signal()

    Needs the main thread's event loop, on Unix (loop.add_signal_handler); otherwise
    ClientStateError.
    """
    wanted = catchable_signals(signals)
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:
        if not received.done():
            received.set_result(sig)

    previous = {sig: signal.getsignal(sig) for sig in wanted}
    added: list[signal.Signals] = []
    try:
        for sig in wanted:
            try:
                loop.add_signal_handler(sig, on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError) as exc:
                raise ClientStateError(
                    f"cannot wait for {sig.name} here (it needs the main thread's event loop, "
                    f"on Unix): {exc}"
                ) from None
            added.append(sig)
        return await received
    finally:
        for sig in added:
            loop.remove_signal_handler(sig)  # leaves the default, not what was there
            if previous[sig] is not None:
                signal.signal(sig, previous[sig])
