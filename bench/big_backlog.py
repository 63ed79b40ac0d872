"""The `backlog` group of bench/run.py: the broker's memory with a very large backlog.

Issue 7's target: broker peak RSS at most 300 MB with a 10-million-message backlog. One
broker stores the backlog (keyed 100-byte messages over 8 queues, 4 requests of 1 000
messages in flight), is killed with SIGKILL, and a second broker recovers the same data
directory and serves every message of it back through the SDK's pull (each queue's next
pull in flight). Figures: each broker's peak RSS (VmHWM), the fill rate, the time from
starting the second broker to its ready line (recovery included), and the read rate.

The backlog is stored once, so each figure has one run. It needs about 230 bytes of disk
per message (2.3 GB for 10 million) and a couple of minutes; `make bench-backlog`.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import workloads as wl
from figures import Figure, Run
from procs import broker_process

from sdk._transport.broker_client import BrokerClient

TOPIC = "bench-big-backlog"
#: Default backlog of the group (the target's size) and of --quick.
MESSAGES, QUICK_MESSAGES = 10_000_000, 1_000_000
#: Seconds a broker may take to recover the backlog and print its ready line.
RECOVERY_TIMEOUT = 600.0


async def measure(
    messages: int, tmp: Path, add: Callable[[Figure], Figure], say: Callable[[str], None]
) -> dict[str, Any]:
    """Fill, kill -9, recover and read back `messages` messages; add the figures.

    Returns facts for the report (disk use); each broker's peak RSS is a figure.
    """
    params = {"backlog_messages": messages, "body_bytes": wl.BODY_BYTES, "queues": wl.QUEUES}
    rss_params = {**params, "what": "VmHWM of the broker process (/proc/PID/status), MB = 10^6"}
    fill = add(Figure("backlog.fill", "big backlog: fill rate", "msg/s", params))
    fill_rss = add(
        Figure("broker.rss.bigbacklog.fill", "big backlog: RSS, storing it", "MB", rss_params,
               higher_is_better=False)
    )  # fmt: skip
    ready = add(
        Figure("backlog.recovery", "big backlog: start after kill -9", "s",
               {**params, "from": "process start", "to": "ready line (recovery done)"},
               higher_is_better=False, per="start")
    )  # fmt: skip
    read = add(Figure("backlog.read", "big backlog: read back (pull)", "msg/s", params))
    read_rss = add(
        Figure("broker.rss.bigbacklog", "big backlog: RSS, recovered and read", "MB",
               rss_params, higher_is_better=False)
    )  # fmt: skip
    data_dir = Path(tempfile.mkdtemp(prefix="big-backlog-", dir=tmp))
    facts: dict[str, Any] = {}
    try:
        first = broker_process(data_dir, "async")
        first.start()
        try:
            say(f"backlog: storing {messages:,} messages")
            started = time.perf_counter()
            stored = await wl.fill_backlog(first.address, TOPIC, messages)
            seconds = time.perf_counter() - started
            fill.runs.append(Run(stored / seconds, seconds, stored))
            fill_rss.runs.append(Run(_rss(first.peak_rss_mb()), 0.0, stored))
        finally:
            first.kill()  # recovery must not rely on a clean shutdown
        facts["backlog_disk_bytes"] = sum(
            p.stat().st_size for p in data_dir.rglob("*") if p.is_file()
        )
        second = broker_process(data_dir, "async")
        started = time.perf_counter()
        second.start(timeout=RECOVERY_TIMEOUT)
        try:
            seconds = time.perf_counter() - started
            ready.runs.append(Run(seconds, seconds, 1))
            say(f"  recovered in {seconds:.1f} s; reading it back")
            client = BrokerClient(second.address)
            try:
                started = time.perf_counter()
                got = await wl.pull_prefetch(client, wl.queues_of(TOPIC))
                seconds = time.perf_counter() - started
            finally:
                await client.close()
            if got != stored:
                raise RuntimeError(f"big backlog: read {got} of the {stored} messages stored")
            read.runs.append(Run(got / seconds, seconds, got))
            read_rss.runs.append(Run(_rss(second.peak_rss_mb()), 0.0, got))
        finally:
            second.stop()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return facts


def _rss(value: float | None) -> float:
    if value is None:
        raise RuntimeError("the broker's peak RSS is unreadable (no /proc?)")
    return value
