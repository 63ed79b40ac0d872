"""paused(): a blocking client frozen, as a process stopped by SIGSTOP or a long GC pause."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sdk._blocking import BlockingClient


@contextlib.contextmanager
def paused(client: BlockingClient) -> Iterator[None]:
    """Freeze a started blocking client (sdk.PushConsumer, sdk.Producer, ...) in the block.

    Its event loop does nothing until the block ends: no heartbeats, no lock renewals, no
    pulls, no commits, and listener calls that finish meanwhile are not answered. Give
    the broker and the client one `FakeClock` and advance it inside the block to pause
    the client past its lease; the broker then hands its queues to another member, and
    the client, once thawed, finds its lease gone and stops calling its listener for
    them (the fencing epochs refuse whatever it still commits).

    Listener calls already running on the client's threads go on, as the threads of a
    paused process would not: each checks the lease (on the client's clock) before it
    starts, so none starts once the clock is past it.
    """
    if not isinstance(client, BlockingClient):
        raise TypeError(
            f"paused() takes a blocking client (sdk.PushConsumer, ...), not "
            f"{type(client).__name__}: an asyncio client shares the test's own loop"
        )
    loop = client._live_loop()  # ClientStateError unless started
    release = loop.hold()
    try:
        yield
    finally:
        release.set()
