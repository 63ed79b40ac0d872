"""End-to-end latency with the producer and the consumer in separate processes (issue 40).

The latency group's first e2e figures (latency.e2e.<face>.rate<r>) send and consume in
one client process, which at 2 000 msg/s is close to a core busy: their figure mixes the
producer's CPU into the consumer's. Users run producers and consumers as separate
services, so these figures (latency.e2e_procs.<face>.<flush>.rate<r>) run the paced
producer in a process of its own (bench/paced_producer.py, driven through its stdin) and
only the consumer in the benchmark's process. A body carries its send time,
time.perf_counter_ns, which on Linux is CLOCK_MONOTONIC: one clock for every process of
the machine, so receive - send is still the message's age.

Consumer faces (FACES): "push", the orderly sdk.aio.PushConsumer with delivery="push";
"concurrent", the same with a MessageListenerConcurrently; "litepull", an
sdk.aio.LitePullConsumer drained by a `while True: poll()` loop. Redis Streams' e2e at
the same rates (bench/peers/redis_streams.latency; its producer and its reader are two
threads of one process) is measured in the same run when redis-server and the `redis`
client are installed, and each figure is read against it (ratios).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any

import consuming as cw

import sdk.aio
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    MessageExt,
    MessageListenerConcurrently,
)

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
#: The consumer faces, in the order they run.
FACES = ("push", "concurrent", "litepull")
#: Send rates (msg/s) with the broker in async flush; the faces and rates (msg/s) also
#: measured with the broker in sync flush.
RATES = (2000, 20000)
SYNC_FACES, SYNC_RATES = ("push",), (2000,)
SECONDS = 5.0
#: --quick: seconds per run (a smoke run: the figures are there, not meaningful).
QUICK_SECONDS = 0.1
#: The producer process says this line once its producer is connected.
READY = "paced producer ready"
READY_TIMEOUT = 60.0
#: The broker's flush mode -> the Redis appendfsync setting read against it.
REDIS_FSYNC = {"async": "everysec", "sync": "always"}
#: litepull: how long one poll() may wait (a quiet queue just polls again).
POLL_SECONDS = 1.0
API = {
    "push": "sdk.aio.PushConsumer, orderly, delivery='push', async def no-op listener",
    "concurrent": "sdk.aio.PushConsumer, MessageListenerConcurrently, delivery='push', "
    "async def no-op listener",
    "litepull": "sdk.aio.LitePullConsumer (auto commit), `while True: await poll(1.0)` loop",
}


def figure_name(face: str, flush: str, rate: int) -> str:
    """The key prefix of one separate-process figure (".p50", ".p99", ".sent" follow)."""
    return f"latency.e2e_procs.{face}.{flush}.rate{rate}"


def plan() -> list[tuple[str, str, int]]:
    """(face, flush mode, rate) of every separate-process figure, in run order."""
    out = [(face, "async", rate) for face in FACES for rate in RATES]
    out += [(face, "sync", rate) for face in SYNC_FACES for rate in SYNC_RATES]
    return out


# ---------------------------------------------------------------------- the producer
def command(topic: str, rate: float, count: int) -> bytes:
    """One order to bench/paced_producer.py: send `count` messages to `topic` at `rate`."""
    return json.dumps({"topic": topic, "rate": rate, "count": count}).encode() + b"\n"


def parse_answer(line: bytes) -> dict[str, float]:
    """The producer's answer to one order; ValueError for anything but its JSON line."""
    if not line.strip():
        raise ValueError("the producer process ended without answering")
    answer = json.loads(line)
    if not isinstance(answer, dict) or "sent_rate" not in answer:
        raise ValueError(f"not a producer answer: {line[:200]!r}")
    return {str(k): float(v) for k, v in answer.items()}


class ProducerProcess:
    """bench/paced_producer.py, started for a broker and stopped (by its pid) at the end."""

    def __init__(self, address: str, in_flight: int) -> None:
        self.address = address
        self.in_flight = in_flight
        self.proc: asyncio.subprocess.Process | None = None
        self._stderr: IO[str] = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop)

    async def start(self) -> None:
        """Start the process; return once its producer is connected."""
        path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(BENCH / "paced_producer.py"),
            "--address",
            self.address,
            "--in-flight",
            str(self.in_flight),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        async with asyncio.timeout(READY_TIMEOUT):
            line = await self.proc.stdout.readline()
        if line.decode().strip() != READY:
            raise RuntimeError(f"the producer process did not start: {line!r}\n{self.stderr()}")

    async def send(self, topic: str, rate: float, count: int) -> dict[str, float]:
        """Have the process send `count` messages at `rate`; its details (paced_send's)."""
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(command(topic, rate, count))
        await proc.stdin.drain()
        # a producer that falls behind takes longer than count / rate: allow for it
        async with asyncio.timeout(60.0 + 10 * count / rate):
            line = await proc.stdout.readline()
        try:
            return parse_answer(line)
        except ValueError as exc:
            raise RuntimeError(f"{exc}\n{self.stderr()}") from None

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read()[-2000:]

    async def stop(self) -> None:
        """End its input (it shuts its producer down and exits); kill it if it does not."""
        proc, self.proc = self.proc, None
        try:
            if proc is not None and proc.returncode is None:
                assert proc.stdin is not None
                proc.stdin.close()
                try:
                    async with asyncio.timeout(15.0):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
        finally:
            self._stderr.close()


@contextlib.asynccontextmanager
async def producer_process(address: str, in_flight: int) -> AsyncIterator[ProducerProcess]:
    """A started ProducerProcess for `address`, stopped when the block ends."""
    producer = ProducerProcess(address, in_flight)
    try:
        await producer.start()
        yield producer
    finally:
        await producer.stop()


# ---------------------------------------------------------------------- the consumer
class ConcurrentLatencyRecorder(MessageListenerConcurrently):
    """The concurrent-listener face of a LatencyRecorder (an `async def` listener)."""

    def __init__(self, recorder: cw.LatencyRecorder) -> None:
        self._recorder = recorder

    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        if self._recorder.record(msgs):
            self._recorder.done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


async def poll_into(consumer: sdk.aio.LitePullConsumer, recorder: cw.LatencyRecorder) -> None:
    """Poll `consumer` for ever, recording each batch (cancel the task to stop)."""
    while True:
        batch = await consumer.poll(POLL_SECONDS)
        if batch and recorder.record(batch):
            recorder.done.set()


async def wait_recorded(
    recorder: cw.LatencyRecorder, stall: float = cw.CONSUME_STALL_SECONDS
) -> None:
    """Wait until the recorder saw what it expects; RuntimeError once it sees nothing new
    for `stall` seconds (a consumer that falls behind a fast producer is still going)."""
    seen, quiet_since = -1, time.monotonic()
    while not recorder.done.is_set():
        if len(recorder.samples) != seen:
            seen, quiet_since = len(recorder.samples), time.monotonic()
        elif time.monotonic() - quiet_since > stall:
            raise RuntimeError(
                f"the consumer saw {seen} of {recorder.expected} messages, "
                f"nothing new for {stall:.0f} s"
            )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(1.0):
                await recorder.done.wait()


async def e2e_latency(
    producer: ProducerProcess,
    recorder: cw.LatencyRecorder,
    topic: str,
    rate: float,
    count: int,
) -> tuple[list[float], dict[str, float]]:
    """As consuming.e2e_latency, with the paced sends made by the producer process."""
    recorder.expect(count)
    detail = await producer.send(topic, rate, count)
    await wait_recorded(recorder)
    samples = [ns / 1e6 for ns in recorder.samples]
    detail.update(max_ms=max(samples), mean_ms=statistics.fmean(samples))
    return samples, detail


# ---------------------------------------------------------------------- Redis Streams
def redis_missing() -> str | None:
    """Why Redis Streams cannot be measured here, or None when it can."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (make bench-peers installs it)"
    if importlib.util.find_spec("redis") is None:
        return "the redis client is not installed (make bench-peers installs it)"
    return None


def redis_latency(
    settings: dict[str, tuple[int, ...]],
    seconds: float,
    runs: int,
    say: Callable[[str], None],
) -> dict[str, dict[int, dict[str, float]]]:
    """Redis Streams' e2e latency: appendfsync setting -> rate -> median p50/p99/max (ms)
    and the rate sent, over `runs` runs of `seconds` each, one fresh server per setting
    (bench/peers/redis_streams.latency: XADDs paced from one thread, a blocking
    XREADGROUP reader on another thread of the same process)."""
    peers = str(BENCH / "peers")
    if peers not in sys.path:
        sys.path.insert(0, peers)
    import redis_streams as rs
    import servers

    out: dict[str, dict[int, dict[str, float]]] = {}
    for fsync, rates in settings.items():
        with tempfile.TemporaryDirectory(prefix="ordermq-bench-redis-") as tmp:
            server, port = servers.start_redis(Path(tmp), fsync)
            try:
                client = rs.connect(port)
                out[fsync] = {}
                for rate in rates:
                    got: list[dict[str, float]] = []
                    for i in range(runs):
                        rs.prepare(client)
                        got.append(rs.latency(client, port, rate, seconds))
                        say(
                            f"  redis-{fsync} e2e at {rate:,} msg/s run {i + 1}/{runs}: "
                            f"p50 {got[-1]['e2e_p50_ms']:.3f} ms, "
                            f"p99 {got[-1]['e2e_p99_ms']:.3f} ms, "
                            f"sent {got[-1]['e2e_sent_rate']:,.0f} msg/s"
                        )
                    out[fsync][rate] = {k: statistics.median(g[k] for g in got) for k in got[0]}
                client.close()
            finally:
                server.stop()
    return out


# ---------------------------------------------------------------------- reading them
def ratios(
    medians: dict[str, float], redis: dict[str, dict[int, dict[str, float]]]
) -> dict[str, dict[str, float | None]]:
    """Each separate-process figure's p50 and p99 over Redis Streams' at the same rate
    (async flush against appendfsync everysec, sync against always), and the rates sent.

    `medians`: figure key -> median (the p50, p99 and sent figures of `plan()`); keys
    missing from it are left out. A ratio is None where Redis has no figure.
    """
    out: dict[str, dict[str, float | None]] = {}
    for face, flush, rate in plan():
        name = figure_name(face, flush, rate)
        if f"{name}.p50" not in medians:
            continue
        peer = redis.get(REDIS_FSYNC[flush], {}).get(rate, {})
        row: dict[str, float | None] = {"sent_rate": medians.get(f"{name}.sent")}
        for q in ("p50", "p99"):
            ours, theirs = medians.get(f"{name}.{q}"), peer.get(f"e2e_{q}_ms")
            row[q] = ours
            row[f"{q}_vs_redis"] = ours / theirs if ours is not None and theirs else None
        row["redis_sent_rate"] = peer.get("e2e_sent_rate")
        out[name] = row
    return out


def comparison(
    rows: dict[str, dict[str, float | None]],
    redis: dict[str, dict[int, dict[str, float]]],
    redis_note: str | None,
) -> str:
    """The separate-process figures as a table: p50/p99 and the rate sent per face, flush
    mode and rate, and Redis Streams' of the same rate beside them (ratio ordermq/Redis)."""
    if not rows:
        return ""
    lines = [
        "end-to-end latency, producer and consumer in separate processes (ms; ratio: "
        "ordermq / Redis Streams at the same rate, lower is better)",
        f"{'face':<11} {'flush':<8} {'rate':>7} {'sent':>8} {'p50':>8} {'p99':>8} "
        f"{'p50 x':>6} {'p99 x':>6}",
    ]
    for name, row in rows.items():
        _, _, face, flush, rate = name.split(".")
        lines.append(
            f"{face:<11} {flush:<8} {int(rate.removeprefix('rate')):>7,} "
            f"{_num(row['sent_rate'], ',.0f'):>8} {_num(row['p50'], '.2f'):>8} "
            f"{_num(row['p99'], '.2f'):>8} {_x(row['p50_vs_redis']):>6} "
            f"{_x(row['p99_vs_redis']):>6}"
        )
    for fsync, by_rate in redis.items():
        for rate, f in by_rate.items():
            lines.append(
                f"{'redis':<11} {fsync:<8} {rate:>7,} {f['e2e_sent_rate']:>8,.0f} "
                f"{f['e2e_p50_ms']:>8.2f} {f['e2e_p99_ms']:>8.2f}"
            )
    if redis_note:
        lines.append(f"note: Redis Streams not measured: {redis_note}")
    return "\n".join(lines)


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def medians(figures: list[Any]) -> dict[str, float]:
    """Figure key -> median of its runs, for the separate-process figures that have runs."""
    return {
        f.key: statistics.median(f.values())
        for f in figures
        if f.key.startswith("latency.e2e_procs.") and f.runs
    }
