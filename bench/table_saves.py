"""Quick probe: the event loop's time a save of the broker's offset or lock table costs.

Every commit, and every grant of a lock to a new owner, is saved before it is answered;
the save's snapshot is made on the broker's event loop (the file is written in a thread).
For tables of 320, 3 200 and 32 000 entries (10, 100 and 1 000 groups of 4 topics x 8
queues) it prints the median over 20 changes of one group: for offsets, the time from a
commit's call to its write's start; for locks, the snapshot after one grant. And what
retention's count of skipped messages costs the loop when a segment deletion trims every
queue of the table (`ConsumerOffsets.note_trimmed`, in the store's retention pass): with
every group past the trim, and with one group behind it on each queue.

    .venv/bin/python bench/table_saves.py
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
from mockbroker.lock_manager import RebalanceLockManager
from mockbroker.offsets import ConsumerOffsets
from sdk.clock import SystemClock

CHANGES = 20
QUEUES = [(f"topic-{t}", q) for t in range(4) for q in range(8)]


async def offsets_save(groups: int, data_dir: Path) -> float:
    """Median seconds from a one-queue commit to its file write, in a table of `groups`."""
    table = ConsumerOffsets(data_dir / "offsets.json")
    await table.commit({(f"group-{g}", t, q): 1000 for g in range(groups) for t, q in QUEUES})
    write = offsets_module.write_atomically
    times: list[float] = []
    started = 0.0

    def timed(path: Path, data: bytes) -> None:
        times.append(time.perf_counter() - started)
        write(path, data)

    offsets_module.write_atomically = timed
    try:
        for n in range(CHANGES):
            started = time.perf_counter()
            await table.commit({(f"group-{n % groups}", "topic-0", 0): 2000 + n})
    finally:
        offsets_module.write_atomically = write
    return statistics.median(times)


def locks_snapshot(groups: int, data_dir: Path) -> float:
    """Median seconds of the lock table's snapshot after one grant, in `groups` groups."""
    locks = RebalanceLockManager(SystemClock(), path=data_dir / "locks.json")
    for g in range(groups):
        locks.lock_batch(f"group-{g}", f"client-{g}", QUEUES)
    locks._snapshot()  # the part of save() that runs on the loop
    times = []
    for n in range(CHANGES):
        locks.lock_batch(f"group-{n % groups}", "client-x", [("topic-9", n)])
        started = time.perf_counter()
        locks._snapshot()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def trims(groups: int, data_dir: Path, *, lagging: bool) -> float:
    """Median seconds of trimming every queue once, over 20 trims, in `groups` groups."""
    table = ConsumerOffsets(data_dir / "offsets.json")
    table.accept({(f"group-{g}", t, q): 1_000_000 for g in range(groups) for t, q in QUEUES})
    if lagging:
        table.accept({("group-0", t, q): 0 for t, q in QUEUES})
    times = []
    for n in range(CHANGES):
        started = time.perf_counter()
        for t, q in QUEUES:
            table.note_trimmed(t, q, n * 1000, (n + 1) * 1000)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


async def main() -> None:
    for groups in (10, 100, 1000):
        with tempfile.TemporaryDirectory() as tmp:
            offsets = await offsets_save(groups, Path(tmp))
            locks = locks_snapshot(groups, Path(tmp))
            caught_up = trims(groups, Path(tmp), lagging=False)
            behind = trims(groups, Path(tmp), lagging=True)
        print(
            f"{groups * 32:6d} entries: offsets {offsets * 1e3:6.3f} ms from a commit to its "
            f"write, locks {locks * 1e3:6.3f} ms a snapshot after a grant; a trim of all "
            f"{len(QUEUES)} queues {caught_up * 1e3:6.3f} ms (every group past it), "
            f"{behind * 1e3:6.3f} ms (one behind on each)"
        )


if __name__ == "__main__":
    asyncio.run(main())
