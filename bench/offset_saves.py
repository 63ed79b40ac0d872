"""Quick probe: the event loop's time a save of the broker's offset table costs.

Every commit is saved before it is answered, and the save's snapshot is made on the
broker's event loop (the file is written in a thread). For tables of 320, 3 200 and
32 000 offsets (10, 100 and 1 000 groups of 4 topics x 8 queues) it commits one group's
queue 20 times and prints the median time from the commit's call to the write's start.

    .venv/bin/python bench/offset_saves.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mockbroker import offsets as offsets_module
from mockbroker.offsets import ConsumerOffsets

COMMITS = 20


async def loop_time(groups: int, data_dir: Path) -> float:
    """Median seconds from a one-queue commit to its file write, in a table of `groups`."""
    table = ConsumerOffsets(data_dir / "offsets.json")
    await table.commit(
        {
            (f"group-{g}", f"topic-{t}", q): 1000
            for g in range(groups)
            for t in range(4)
            for q in range(8)
        }
    )
    write = offsets_module.write_atomically
    times: list[float] = []
    started = 0.0

    def timed(path: Path, data: bytes) -> None:
        times.append(time.perf_counter() - started)
        write(path, data)

    offsets_module.write_atomically = timed
    try:
        for n in range(COMMITS):
            started = time.perf_counter()
            await table.commit({(f"group-{n % groups}", "topic-0", 0): 2000 + n})
    finally:
        offsets_module.write_atomically = write
    return statistics.median(times)


async def main() -> None:
    for groups in (10, 100, 1000):
        with tempfile.TemporaryDirectory() as tmp:
            seconds = await loop_time(groups, Path(tmp))
        print(f"{groups * 32:6d} offsets: {seconds * 1e3:6.3f} ms from a commit to its write")


if __name__ == "__main__":
    asyncio.run(main())
