"""Quick probe: how long a broker with many groups stops serving for garbage collection.

For 100 and 1 000 groups (2 orderly members each, 4 topics x 8 queues: every group
holds 32 locks and has 32 committed offsets) it starts a broker in this process, as
`python -m mockbroker` does (its start-up heap frozen), and prints:
- a full garbage collection's time: it walks every object the collector tracks, and
  every thread of the process waits meanwhile, the broker's event loop included;
- over SCRAPES scrapes of `/metrics` (over HTTP, from a thread): the longest the event
  loop went without a turn, and the collections that ran meanwhile (full ones, and the
  longest of any generation).

    .venv/bin/python bench/scrape_pauses.py
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mockbroker.config import BrokerConfig
from mockbroker.groups import GroupMembership
from mockbroker.http_status import StatusServer
from mockbroker.server import Broker

SCRAPES = 5
TOPICS = [f"topic-{t}" for t in range(4)]
QUEUES = [(topic, q) for topic in TOPICS for q in range(8)]


def full_collection_seconds() -> float:
    """The least of five full collections' times."""
    gc.collect()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    return min(times)


async def populated(groups: int, data_dir: Path) -> Broker:
    """A started broker whose groups each hold their queues' locks and offsets."""
    broker = Broker(BrokerConfig(data_dir=data_dir, port=0))
    await broker.start()
    gc.collect()
    gc.freeze()  # as python -m mockbroker does once started
    state = broker.state
    assert state is not None
    for topic in TOPICS:
        state.store.create_topic(topic, 8)
    subscriptions = tuple((topic, "*") for topic in TOPICS)
    for g in range(groups):
        membership = {f"group-{g}": GroupMembership("CONSUME_ORDERLY", "CLUSTERING", subscriptions)}
        for m in range(2):
            state.groups.heartbeat(f"client-{g}-{m}", membership)
        state.locks.lock_batch(f"group-{g}", f"client-{g}-0", QUEUES)
    await state.locks.save()  # as each grant is saved (else the next expiry sweep saves all)
    await state.offsets.commit({(f"group-{g}", t, q): 0 for g in range(groups) for t, q in QUEUES})
    return broker


async def scrapes(port: int) -> tuple[float, list[tuple[int, float]], int]:
    """SCRAPES scrapes: the loop's longest wait for a turn, the collections, the series."""
    collections: list[tuple[int, float]] = []
    began = [0.0]

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - began[0]))

    def scrape() -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=60) as answer:
            return str(answer.read().decode())

    longest, series = 0.0, 0
    gc.callbacks.append(note)
    try:
        for _ in range(SCRAPES):
            done = asyncio.ensure_future(asyncio.to_thread(scrape))
            last = time.perf_counter()
            while not done.done():
                await asyncio.sleep(0)
                now = time.perf_counter()
                longest, last = max(longest, now - last), now
            series = sum(1 for line in (await done).splitlines() if not line.startswith("#"))
    finally:
        gc.callbacks.remove(note)
    return longest, collections, series


async def main() -> None:
    for groups in (100, 1000):
        with tempfile.TemporaryDirectory() as tmp:
            broker = await populated(groups, Path(tmp))
            try:
                full = full_collection_seconds()
                server = StatusServer(broker, "127.0.0.1", 0)
                try:
                    longest, collections, series = await scrapes(server.port)
                finally:
                    server.close()
            finally:
                await broker.stop()
                gc.unfreeze()
        fulls = [seconds for generation, seconds in collections if generation == 2]
        slowest = max((seconds for _, seconds in collections), default=0.0)
        print(
            f"{groups:5d} groups ({2 * groups} clients, {len(QUEUES) * groups} locks and "
            f"offsets): a full collection {full * 1e3:.1f} ms; {SCRAPES} scrapes of {series} "
            f"series: the loop waited at most {longest * 1e3:.1f} ms for a turn, "
            f"{len(collections)} collections ({len(fulls)} full), the longest "
            f"{slowest * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
