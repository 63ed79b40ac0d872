"""The `dedup` group of bench/run.py: the broker's dedup window fed millions of distinct keys.

Issue 42's bound: memory stays bounded whatever the number of keys. A separate process
(this file, run as a script: its RSS is the window's alone) feeds a DedupWindow
(mockbroker/dedup.py, a fake clock so that nothing expires by time) KEYS distinct keys
as Delivery does (digest of topic and message id, find, then add), with the broker's
default count bound, and reports its peak RSS over its RSS before, per key kept, and the
time per key. 10 000 000 keys in a full run (about a minute), 1 000 000 (bound 100 000)
with --quick; one run either way (a memory bound, not a noisy rate).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
KEYS = 10_000_000
MAX_KEYS = 1_000_000
QUICK_KEYS = 1_000_000
QUICK_MAX_KEYS = 100_000


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def feed(keys: int, max_keys: int) -> dict[str, float]:
    """Feed `keys` distinct keys through a window of `max_keys`; what it cost."""
    sys.path.insert(0, str(ROOT))
    from mockbroker.dedup import DedupWindow, digest
    from sdk.testing import FakeClock

    before = _rss_bytes()
    peak = before
    window = DedupWindow(3600, max_keys, FakeClock())
    step = max(1, max_keys // 4)
    started = time.perf_counter()
    for n in range(keys):
        key = digest("bench", b"i:" + n.to_bytes(16, "big"))
        if window.find(key) is None:
            window.add(key, n & 7, n, 0)
        if n % step == 0:
            peak = max(peak, _rss_bytes())
    seconds = time.perf_counter() - started
    peak = max(peak, _rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {
        "keys": keys,
        "max_keys": max_keys,
        "kept": len(window),
        "seconds": round(seconds, 2),
        "us_per_key": round(seconds / keys * 1e6, 3),
        "rss_before_mb": round(before / 2**20, 1),
        "peak_rss_mb": round(peak / 2**20, 1),
        "bytes_per_key_kept": round((peak - before) / max_keys, 1),
    }


async def measure(
    args: argparse.Namespace, add: Callable[[Any], Any], say: Callable[[str], None]
) -> dict[str, Any]:
    """The group: one run of the feed, in a process of its own; the facts to keep."""
    from figures import Figure, Run

    keys, max_keys = (QUICK_KEYS, QUICK_MAX_KEYS) if args.quick else (KEYS, MAX_KEYS)
    params = {"keys": keys, "max_keys": max_keys, "in_process": True}
    n = f"{keys:,}".replace(",", " ")
    memory = add(Figure("dedup.bytes_per_key", f"dedup window: bytes per key kept, {n} keys",
                        "B/key", params, False))  # fmt: skip
    speed = add(Figure("dedup.us_per_key", f"dedup window: find + add per key, {n} keys",
                       "us/msg", params, False))  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, __file__, "--keys", str(keys), "--max-keys", str(max_keys)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    facts: dict[str, float] = json.loads(done.stdout)
    memory.runs.append(Run(facts["bytes_per_key_kept"], facts["seconds"], keys))
    speed.runs.append(Run(facts["us_per_key"], facts["seconds"], keys))
    say(f"  dedup: {facts}")
    return {"dedup": facts}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=KEYS)
    p.add_argument("--max-keys", type=int, default=MAX_KEYS)
    a = p.parse_args()
    print(json.dumps(feed(a.keys, a.max_keys)))


if __name__ == "__main__":
    main()
