"""Quick probe: how long a broker stops serving when many clients expire at once.

A network partition silences many clients together; the broker's next expiry sweep finds
them all gone. For 1 000 groups (2 orderly members each, every group holding 32 locks:
scrape_pauses.populated) it starts a broker in this process, makes every client silent
past its timeout, runs what the sweep runs (the groups' expiry, `release_gone`, the lock
table's save) and prints how long that took and the longest the event loop went without
a turn meanwhile.

    .venv/bin/python bench/expiry_pauses.py
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scrape_pauses import populated

from mockbroker.expiry import release_gone

GROUPS = 1000


async def longest_wait(work: asyncio.Future[object]) -> float:
    """The longest the loop went without a turn until `work` is done (seconds)."""
    longest, last = 0.0, time.perf_counter()
    while not work.done():
        await asyncio.sleep(0)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    await work
    return longest


async def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))  # noqa: SIM115
    with tempfile.TemporaryDirectory() as tmp:
        broker = await populated(GROUPS, Path(tmp))
        try:
            state = broker.state
            assert state is not None
            for client in state.groups._clients.values():
                client.last_seen -= 10 * broker.config.client_timeout_seconds
            gone: list[int] = []

            async def sweep() -> None:
                expired = state.groups.expire()
                gone.append(len(expired))
                await release_gone(state.locks, expired)
                await state.locks.save()

            started = time.perf_counter()
            longest = await longest_wait(asyncio.ensure_future(sweep()))
            took = time.perf_counter() - started
        finally:
            await broker.stop()
    print(
        f"{gone[0]} clients of {GROUPS} groups expired at once: the sweep took "
        f"{took * 1e3:.1f} ms, the loop waited at most {longest * 1e3:.1f} ms for a turn"
    )


if __name__ == "__main__":
    asyncio.run(main())
