"""Disk and memory per million messages: `make bench-sizing` (docs/production.md quotes it).

For each message shape (1 KB and 100 B bodies with a sharding key; 100 B with a tag and a
lookup key too) a fresh broker (`python -m mockbroker`, async flush, its own temporary
data directory) stores N messages sent with `sdk.aio.Producer.send_batch` (batches of
1 000 keyed messages, 1 000 keys over 8 queues, 4 batches in flight), then serves all of
them back through pulls. It reports:

- the data directory's bytes per message, and per part: the commit log, the consume
  queues, the id/key index (file sizes; MB = 10^6 bytes), as MB per million messages;
- the broker's resident memory (VmRSS, /proc/PID/status) idle after start, after storing
  the N messages and after serving them, and its peak (VmHWM): the difference between
  idle and loaded is what the backlog costs in memory.

    python bench/sizing.py                      # N = 1 000 000 per shape (about 2 minutes)
    python bench/sizing.py --messages 100000    # quicker, same per-message figures
    python bench/sizing.py --output bench/results/sizing.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import workloads as wl
from procs import ServerProcess, broker_process

from sdk import Message
from sdk._transport.broker_client import BrokerClient
from sdk.aio import Producer

TOPIC = "sizing"
BATCH = 1000
IN_FLIGHT = 4


@dataclass(frozen=True)
class Shape:
    """What one stored message looks like."""

    name: str
    body_bytes: int
    tagged: bool = False  # a tag and one lookup key (`keys=`) besides the sharding key


SHAPES = (
    Shape("1 KB body, sharding key", 1024),
    Shape("100 B body, sharding key", 100),
    Shape("100 B body, sharding key, tag, lookup key", 100, tagged=True),
)


@dataclass
class Result:
    """One shape's measurements."""

    shape: str
    messages: int
    disk_bytes: dict[str, int]
    rss_mb: dict[str, float]
    store_seconds: float

    def mb_per_million(self, part: str) -> float:
        """A part of the data directory, in MB per million messages."""
        return self.disk_bytes[part] / self.messages  # bytes per message = MB per million


def rss_mb(server: ServerProcess, field: str) -> float:
    """VmRSS (current) or VmHWM (peak) of the server, in MB (10^6 bytes)."""
    assert server.proc is not None
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no {field} in /proc/{server.proc.pid}/status")


def disk_bytes(data_dir: Path) -> dict[str, int]:
    """Bytes of each part of a data directory, and the total."""

    def size(path: Path) -> int:
        files = [path] if path.is_file() else path.rglob("*")
        return sum(p.stat().st_size for p in files if p.is_file())

    parts = {
        "commit log": size(data_dir / "commitlog"),
        "consume queues": size(data_dir / "consumequeue"),
        "id/key index": size(data_dir / "index"),
    }
    parts["total"] = size(data_dir)
    return parts


async def store(address: str, shape: Shape, messages: int) -> None:
    """Send `messages` messages of `shape`, IN_FLIGHT batches of BATCH at a time."""
    rng = random.Random(1)
    bodies = [rng.randbytes(shape.body_bytes) for _ in range(wl.KEYS)]
    keys = wl.make_keys()
    batches = iter(range(messages // BATCH))
    async with Producer(address) as producer:

        async def worker() -> None:
            for i in batches:
                base = i * BATCH
                batch = [
                    Message(
                        TOPIC, bodies[(base + j) % len(bodies)],
                        sharding_key=keys[(base + j) % len(keys)],
                        tags="paid" if shape.tagged else None,
                        keys=(f"order-{base + j}",) if shape.tagged else (),
                    )
                    for j in range(BATCH)
                ]  # fmt: skip
                await producer.send_batch(batch)

        await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))


async def read_back(address: str) -> int:
    """Pull every message of the topic once, as a consumer of the whole backlog would."""
    client = BrokerClient(address)
    try:
        return await wl.pull_prefetch(client, wl.queues_of(TOPIC))
    finally:
        await client.close()


async def measure(shape: Shape, messages: int, tmp: Path) -> Result:
    """One fresh broker: store, measure, read back, measure."""
    data_dir = Path(tempfile.mkdtemp(prefix="sizing-", dir=tmp))
    broker = broker_process(data_dir, "async")
    broker.start()
    try:
        rss = {"idle": rss_mb(broker, "VmRSS")}
        client = BrokerClient(broker.address)
        try:
            await client.create_topic(TOPIC, wl.QUEUES)
        finally:
            await client.close()
        started = time.perf_counter()
        await store(broker.address, shape, messages)
        seconds = time.perf_counter() - started
        rss["stored"] = rss_mb(broker, "VmRSS")
        served = await read_back(broker.address)
        if served != messages:
            raise RuntimeError(f"{shape.name}: read {served} of the {messages} stored")
        rss["served"] = rss_mb(broker, "VmRSS")
        rss["peak"] = rss_mb(broker, "VmHWM")
    finally:
        broker.stop()
    try:
        return Result(shape.name, messages, disk_bytes(data_dir), rss, seconds)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def table(results: list[Result]) -> str:
    """The report: disk per million messages by part, and broker memory."""
    lines = [
        "| message | commit log | consume queues | id/key index | total disk "
        "| RSS idle | RSS stored | RSS served | RSS peak |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        disk = " | ".join(
            f"{r.mb_per_million(p):,.0f} MB"
            for p in ("commit log", "consume queues", "id/key index", "total")
        )
        rss = " | ".join(f"{r.rss_mb[k]:.0f} MB" for k in ("idle", "stored", "served", "peak"))
        lines.append(f"| {r.shape} | {disk} | {rss} |")
    n = results[0].messages if results else 0
    lines.append(f"\nDisk: MB per million messages, measured with {n:,} messages per row.")
    lines.append("RSS: the broker process's, idle after start and with the backlog stored.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000, help="messages per shape")
    p.add_argument("--output", type=Path, default=None, help="JSON file to write")
    a = p.parse_args(argv)
    if a.messages < BATCH or a.messages % BATCH:
        p.error(f"--messages must be a multiple of {BATCH}")
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="ordermq-sizing-") as tmp:
        for shape in SHAPES:
            print(f"{shape.name}: storing {a.messages:,} messages", file=sys.stderr)
            results.append(asyncio.run(measure(shape, a.messages, Path(tmp))))
    print(table(results))
    if a.output is not None:
        a.output.parent.mkdir(parents=True, exist_ok=True)
        report = {"messages": a.messages, "results": [asdict(r) for r in results]}
        a.output.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
