"""How late the broker's event loop runs what is due: its stalls, as a histogram.

Every client's work runs on one event loop, so anything that holds it (a write the file
system makes wait while it writes back, a long callback, a garbage collection) delays
every client at once. A task asks to wake every PROBE_INTERVAL_SECONDS and records how
much later than asked it woke (`ordermq_event_loop_lag_seconds`). A stall shorter than
the interval is seen only when the wake-up falls inside it: the histogram samples the
loop's lateness, it does not list every stall.

Real time, not the broker's clock: what is measured is the loop's own scheduling.
"""

from __future__ import annotations

import asyncio

from mockbroker.histogram import Histogram

#: How often the probe wakes: 50 wake-ups a second, a few microseconds each.
PROBE_INTERVAL_SECONDS = 0.02


class LoopLag:
    """The lateness of the probe's wake-ups on the running loop, in seconds."""

    def __init__(self, interval: float = PROBE_INTERVAL_SECONDS) -> None:
        self.interval = interval
        self.seconds = Histogram()

    async def run(self) -> None:
        """Wake every `interval` and observe how late; until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            self.seconds.observe(max(0.0, loop.time() - due))
