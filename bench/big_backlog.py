"""The `backlog` group of bench/run.py: the broker's memory with a very large backlog.

Issue 7's target: broker peak RSS at most 300 MB with a 10-million-message backlog. One
broker stores the backlog (keyed 100-byte messages over 8 queues, 4 requests of 1 000
messages in flight), is killed with SIGKILL, and a second broker recovers the same data
directory and serves every message of it back through the SDK's pull (each queue's next
pull in flight). Figures: each broker's peak RSS (VmHWM), the fill rate, the time from
starting the second broker to its ready line (recovery included), and the read rate.

Start-up after retention (issue 14): the backlog is stored in two parts, the first nine
tenths, then (after a pause of PAUSE_SECONDS, or --backlog-pause) the last tenth. Once read
back, the data directory is started cleanly STARTS times as it is (nothing deleted), then a
broker whose --retention-hours puts the retention horizon in the middle of the pause deletes
the older nine tenths (whole segments: the one holding both parts stays), and the directory
is started STARTS times again. Figures: the medians of the time from starting the process to
its ready line, with none deleted and with nine tenths deleted.

The backlog is stored once, so each other figure has one run. It needs about 230 bytes of
disk per message (2.3 GB for 10 million) and several minutes; `make bench-backlog`
(`--backlog-messages N` for a smaller backlog).
"""

from __future__ import annotations

import asyncio
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
#: Clean starts timed before and after the deletion (their median is the figure).
STARTS = 3
#: Seconds between storing the old nine tenths and the last tenth: the retention horizon
#: is put in the middle, so the deleting broker has PAUSE_SECONDS / 2 to delete them
#: (--backlog-pause: tests/examples takes a shorter one; the figures do not depend on it).
PAUSE_SECONDS = 30.0
#: Seconds the deleting broker may take to delete the old part.
DELETION_TIMEOUT = 300.0
#: Disk bytes a stored message takes (about), and the broker's default segment size.
BYTES_PER_MESSAGE, SEGMENT_BYTES = 230, 64 * 1024 * 1024


#: The brokers here delete by age only (retention hours), never because the disk is fuller
#: than the default ratios: on a shared machine other tenants' files can put the disk over
#: 75% (seen: the first nine tenths deleted during the pause, "read 0 of 16000"), and
#: what is measured is recovery and deletion by age. Sends are refused above the last.
DISK_RATIOS = ("--disk-high-ratio", "0.97", "--disk-force-ratio", "0.98",
               "--disk-refuse-ratio", "0.99")  # fmt: skip


def segment_option(messages: int) -> tuple[str, ...]:
    """The broker's default 64 MiB segments, smaller for a small backlog (--backlog-messages)
    so that it still fills 32 of them: retention deletes whole segments."""
    size = min(SEGMENT_BYTES, max(1 << 20, messages * BYTES_PER_MESSAGE // 32))
    return ("--segment-bytes", str(size))


async def measure(
    messages: int,
    tmp: Path,
    add: Callable[[Figure], Figure],
    say: Callable[[str], None],
    pause: float = PAUSE_SECONDS,
) -> dict[str, Any]:
    """Fill, kill -9, recover and read back `messages` messages; add the figures.

    `pause`: seconds between storing the old nine tenths and the rest.

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
    facts: dict[str, Any] = {"backlog_pause_seconds": pause}
    try:
        segments = (*segment_option(messages), *DISK_RATIOS)
        first = broker_process(data_dir, "async", extra=segments)
        first.start()
        try:
            old_part = messages - messages // 10
            say(f"backlog: storing {messages:,} messages ({old_part:,}, a pause, the rest)")
            started = time.perf_counter()
            stored = await wl.fill_backlog(first.address, TOPIC, old_part)
            seconds = time.perf_counter() - started
            old_stored_by = time.time()
            await asyncio.sleep(pause)
            horizon = old_stored_by + pause / 2
            started = time.perf_counter()
            stored += await wl.fill_backlog(first.address, TOPIC, messages - old_part)
            seconds += time.perf_counter() - started
            fill.runs.append(Run(stored / seconds, seconds, stored))
            fill_rss.runs.append(Run(_rss(first.peak_rss_mb()), 0.0, stored))
        finally:
            first.kill()  # recovery must not rely on a clean shutdown
        facts["backlog_disk_bytes"] = _disk_bytes(data_dir)
        second = broker_process(data_dir, "async", extra=segments)
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
        await _measure_starts(data_dir, stored, horizon, segments, params, add, say, facts)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return facts


async def _measure_starts(
    data_dir: Path,
    stored: int,
    horizon: float,
    segments: tuple[str, ...],
    params: dict[str, Any],
    add: Callable[[Figure], Figure],
    say: Callable[[str], None],
    facts: dict[str, Any],
) -> None:
    """Clean starts with none deleted, the deletion of the old part, clean starts again."""
    span = {"from": "process start", "to": "ready line", "shutdown": "clean"}
    full = add(
        Figure("backlog.start.full", "big backlog: clean start, none deleted", "s",
               {**params, **span, "stored_messages": stored}, higher_is_better=False,
               per="start")
    )  # fmt: skip
    say(f"  clean starts with all {stored:,} messages stored")
    full.runs += [_start(data_dir, segments) for _ in range(STARTS)]
    facts["backlog_allocated_bytes_before_deletion"] = _allocated_bytes(data_dir)
    deleted = await _delete_older_than(data_dir, horizon, segments)
    facts["backlog_allocated_bytes_after_deletion"] = _allocated_bytes(data_dir)
    facts["backlog_deleted_messages"] = deleted
    trimmed = add(
        Figure("backlog.start.trimmed", "big backlog: clean start, 9/10 past retention", "s",
               {**params, **span, "stored_messages": stored - deleted,
                "deleted_messages": deleted}, higher_is_better=False, per="start")
    )  # fmt: skip
    say(f"  {deleted:,} deleted; clean starts with {stored - deleted:,} left")
    trimmed.runs += [_start(data_dir, segments) for _ in range(STARTS)]


def _start(data_dir: Path, segments: tuple[str, ...]) -> Run:
    """Start a broker on `data_dir`, time it to its ready line, and stop it cleanly."""
    broker = broker_process(data_dir, "async", extra=segments)
    started = time.perf_counter()
    broker.start(timeout=RECOVERY_TIMEOUT)
    seconds = time.perf_counter() - started
    broker.stop()
    return Run(seconds, seconds, 1)


async def _delete_older_than(data_dir: Path, horizon: float, segments: tuple[str, ...]) -> int:
    """Run a broker whose retention horizon is `horizon` (a time) until it deleted what
    lies before; the number of messages it deleted."""
    hours = (time.time() - horizon) / 3600
    broker = broker_process(
        data_dir, "async", extra=(*segments, "--retention-hours", f"{hours:.6f}",
                                  "--disk-check-seconds", "0.2")
    )  # fmt: skip
    broker.start(timeout=RECOVERY_TIMEOUT)
    client = BrokerClient(broker.address)
    try:
        deadline = time.monotonic() + DELETION_TIMEOUT
        last = -1
        while time.monotonic() < deadline:
            deleted = int((await client.admin("BrokerStatus"))["retention_deleted_messages"])
            if deleted and deleted == last:
                return deleted  # nothing more went in a second: the old part is gone
            last = deleted
            await asyncio.sleep(1.0)
        raise RuntimeError(f"big backlog: the old part was not deleted (deleted {last})")
    finally:
        await client.close()
        broker.stop()


def _disk_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())


def _allocated_bytes(data_dir: Path) -> int:
    """Disk blocks in use (the trimmed index heads are holes: their size stays)."""
    return sum(p.stat().st_blocks * 512 for p in data_dir.rglob("*") if p.is_file())


def _rss(value: float | None) -> float:
    if value is None:
        raise RuntimeError("the broker's peak RSS is unreadable (no /proc?)")
    return value
