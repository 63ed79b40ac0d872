"""The `flood` group of bench/run.py: normal clients' latency next to one flooding client.

Issue 21's promise: one client sending or pulling as fast as it can must not ruin the
others' latency (their p99 within 2x of what it is without the flood).

The normal load, in this process: NORMAL_PRODUCERS sdk.aio.Producers (each its own
connection), each sending single keyed 100-byte messages at NORMAL_RATE msg/s on a fixed
schedule (each send in a task of its own, as a request handler publishing one event
would), and one sdk.aio.PushConsumer (orderly, async no-op listener) receiving them. Per
message it records the send call's latency (`await producer.send()`) and the end-to-end
latency (send time carried in the body to the listener call).

Three phases per run, on one broker: **baseline** (the normal load alone), **send flood**
(the same while bench/flooder.py, a separate process, sends pre-encoded requests of
FLOOD_BATCH messages with FLOOD_SEND_IN_FLIGHT in flight), **pull flood** (the same while
the flooder reads a stored backlog with raw pulls of MAX_PULL_MESSAGES, FLOOD_PULLS_PER_QUEUE
in flight per queue). Each broker configuration of CONFIGS gets a broker process of its
own and every phase of every run; the phases of a run follow each other, so that noise on
the machine hits them alike. Ratios (flood / baseline) are taken per run, then the median.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import consuming as cw
import workloads as wl
from figures import Figure, Run
from procs import BENCH, ServerProcess, broker_process, busy_poll_option, exchange_port_option
from prometheus_client.parser import text_string_to_metric_families

from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
)
from sdk._transport.broker_client import BrokerClient
from sdk.aio import Producer, PushConsumer

NORMAL_PRODUCERS = 4
NORMAL_RATE = 200  # msg/s per producer
NORMAL_SENDS_IN_FLIGHT = 64
SECONDS, QUICK_SECONDS = 5.0, 2.0
#: The flooder starts this long before the normal load is measured next to it.
FLOOD_SETTLE_SECONDS = 0.5
FLOOD_BATCH = 1000
FLOOD_SEND_IN_FLIGHT = 32
FLOOD_PULLS_PER_QUEUE = 2
#: The pull flooder's backlog (it reads it over and over).
PULL_BACKLOG, QUICK_PULL_BACKLOG = 200_000, 50_000
NORMAL_TOPIC = "bench-flood-normal"
SEND_TOPIC = "bench-flood-bulk"
PULL_TOPIC = "bench-flood-backlog"
PHASES = ("baseline", "send flood", "pull flood")
#: A broker loop wake-up later than this (ms; a histogram bound) counts as a stall.
LOOP_STALL_MS = 5.0
LOOP_LAG = "ordermq_event_loop_lag_seconds"
#: Broker configurations compared in one run: (name, extra mockbroker arguments).
CONFIGS: list[tuple[str, tuple[str, ...]]] = [
    ("default", ()),
    ("no fair scheduling", ("--no-fair-scheduling",)),
]


@dataclass
class Sample:
    """One phase of one run: the normal clients' latencies (ms) and what else was seen."""

    send_ms: list[float]
    e2e_ms: list[float]
    seconds: float
    sent_rate: float
    server_cpu: float | None
    #: How late (ms) a 1 ms timer of this process fired, p99: above a few ms, the normal
    #: clients themselves were held up (other processes on the machine), not the broker.
    client_stall_p99_ms: float
    flooder: dict[str, Any] = field(default_factory=dict)
    #: The broker's event loop meanwhile (ordermq_event_loop_lag_seconds): its wake-ups
    #: over LOOP_STALL_MS late, and the bucket bound (ms) the slowest one was within.
    broker_stalls: int = 0
    broker_lag_max_ms: float = 0.0


class PhaseRecorder(MessageListenerOrderly):
    """An `async def` orderly listener recording each message's e2e latency, for one phase.

    The body starts with the send time (perf_counter_ns, 8 bytes) and the phase number
    (4 bytes): a message of an earlier phase arriving late is counted apart (`late`), and
    a message delivered twice (after a lock was lost) once.
    """

    def __init__(self) -> None:
        self.phase = 0
        self.expected = 0
        self.samples: dict[int, float] = {}
        self.late = 0
        self.done = asyncio.Event()

    def expect(self, count: int) -> int:
        """Start a new phase of `count` messages; its number."""
        self.phase += 1
        self.expected = count
        self.samples = {}
        self.done.clear()
        return self.phase

    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        now = time.perf_counter_ns()
        for m in msgs:
            sent = int.from_bytes(m.body[:8], "little")
            if int.from_bytes(m.body[8:12], "little") != self.phase:
                self.late += 1
                continue
            self.samples.setdefault(sent, (now - sent) / 1e6)
        if len(self.samples) >= self.expected:
            self.done.set()
        return ConsumeOrderlyStatus.SUCCESS


class NormalLoad:
    """NORMAL_PRODUCERS paced producers and one orderly push consumer on NORMAL_TOPIC."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.producers = [Producer(address) for _ in range(NORMAL_PRODUCERS)]
        self.recorder = PhaseRecorder()
        self.consumer = PushConsumer(
            "bench-flood-normal", address, consume_from_where=ConsumeFromWhere.LAST_OFFSET
        )
        keys = wl.make_keys()
        # Producer p sends keys p, p + NORMAL_PRODUCERS, ...: no key is sent by two.
        self.keys = [keys[p::NORMAL_PRODUCERS] for p in range(NORMAL_PRODUCERS)]

    async def start(self, admin: BrokerClient) -> None:
        await admin.create_topic(NORMAL_TOPIC, wl.QUEUES)
        for producer in self.producers:
            await producer.start()
        self.consumer.subscribe(NORMAL_TOPIC)
        self.consumer.register_message_listener(self.recorder)
        await self.consumer.start()
        await cw.until_held(admin, wl.QUEUES)  # every queue's pull is waiting
        await self.run(0.5)  # warm up

    async def run(self, seconds: float) -> tuple[list[float], list[float], float]:
        """The normal load for `seconds`: (send latencies, e2e latencies, rate sent)."""
        sends, sent_rate = await self.send(seconds)
        if not await self.received():
            raise RuntimeError(self.missing())
        return sends, self.e2e(), sent_rate

    async def send(self, seconds: float) -> tuple[list[float], float]:
        """Send for `seconds`: (send latencies, rate sent); the consumer is told to expect
        them."""
        count = int(NORMAL_RATE * seconds)
        phase = self.recorder.expect(count * NORMAL_PRODUCERS)
        sends: list[float] = []
        started = time.perf_counter()
        await asyncio.gather(
            *(
                paced_sends(p, self.keys[i], count, phase, sends)
                for i, p in enumerate(self.producers)
            )
        )
        return sends, len(sends) / (time.perf_counter() - started)

    async def received(self) -> bool:
        """Wait up to CONSUME_STALL_SECONDS for the consumer to see every message sent."""
        try:
            await asyncio.wait_for(self.recorder.done.wait(), cw.CONSUME_STALL_SECONDS)
        except TimeoutError:
            return False
        return True

    def missing(self) -> str:
        return (
            f"flood: the consumer saw {len(self.recorder.samples)} of {self.recorder.expected} "
            f"messages {cw.CONSUME_STALL_SECONDS:.0f} s after the last send"
        )

    def unreceived(self) -> int:
        """Messages of this phase the consumer has not seen."""
        return self.recorder.expected - len(self.recorder.samples)

    def e2e(self) -> list[float]:
        return list(self.recorder.samples.values())

    async def close(self) -> None:
        await self.consumer.shutdown()
        for producer in self.producers:
            await producer.shutdown()


async def paced_sends(
    producer: Producer, keys: list[str], count: int, phase: int, out: list[float]
) -> None:
    """`count` single sends at NORMAL_RATE on a fixed schedule; each call's latency (ms) to
    `out`. The body starts with the send time (perf_counter_ns) and the phase number."""
    pad = phase.to_bytes(4, "little") + bytes(wl.BODY_BYTES - 12)
    slots = asyncio.Semaphore(NORMAL_SENDS_IN_FLIGHT)
    tasks: set[asyncio.Task[None]] = set()
    period = 1e9 / NORMAL_RATE

    async def one(message: Message, sent: int) -> None:
        try:
            await producer.send(message)
            out.append((time.perf_counter_ns() - sent) / 1e6)
        finally:
            slots.release()

    start = time.perf_counter_ns()
    for i in range(count):
        due = start + int(i * period)
        if due > time.perf_counter_ns():
            await asyncio.sleep((due - time.perf_counter_ns()) / 1e9)
        await slots.acquire()
        now = time.perf_counter_ns()
        message = Message(
            NORMAL_TOPIC, now.to_bytes(8, "little") + pad, sharding_key=keys[i % len(keys)]
        )
        task = asyncio.create_task(one(message, now))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


@contextlib.contextmanager
def flooder(address: str, mode: str, topic: str, stats: dict[str, Any]) -> Iterator[None]:
    """bench/flooder.py flooding `address` while the block runs; its counters into `stats`."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    cmd = [
        sys.executable, str(BENCH / "flooder.py"), "--address", address, "--mode", mode,
        "--topic", topic, "--stats", str(path), "--batch", str(FLOOD_BATCH),
        "--in-flight", str(FLOOD_SEND_IN_FLIGHT if mode == "send" else FLOOD_PULLS_PER_QUEUE),
    ]  # fmt: skip
    proc = ServerProcess(f"flooder ({mode})", cmd, "flooder ready")
    proc.start(timeout=60)
    try:
        yield
    finally:
        code = proc.stop()
        try:
            if code == 0:
                stats.update(json.loads(path.read_text()))
            else:  # no counts: the phase's line says so rather than showing 0 msg/s
                stats["flooder_exit"] = code
        finally:
            path.unlink(missing_ok=True)


async def measure(
    args: Any, tmp: Path, add: Callable[[Figure], Figure], say: Callable[[str], None]
) -> dict[str, Any]:
    """Every configuration's phases, --runs times; adds the figures, returns facts."""
    seconds = QUICK_SECONDS if args.quick else SECONDS
    backlog = QUICK_PULL_BACKLOG if args.quick else PULL_BACKLOG
    facts: dict[str, Any] = {}
    for name, extra in CONFIGS:
        samples: dict[str, list[Sample]] = {phase: [] for phase in PHASES}
        data_dir = Path(tempfile.mkdtemp(prefix=f"flood-{name}-", dir=tmp))
        say(f"flood ({name}): starting a broker {' '.join(extra)}")
        # Retention off (disk-use ratios at 1): the send floods write gigabytes, and on a
        # disk near the broker's 75% mark it deleted the pull flooder's backlog early.
        no_retention = ("--disk-high-ratio", "1", "--disk-force-ratio", "1",
                        "--disk-refuse-ratio", "1")  # fmt: skip
        metrics = ("--metrics-port", "0")  # the loop lag of each phase
        # The normal clients on the port (unless --no-exchange-port), the flooder's raw
        # requests on gRPC.
        port = (*exchange_port_option(args), *busy_poll_option(args))
        options = (*extra, *no_retention, *metrics, *port)
        with broker_process(data_dir, "async", extra=options) as broker:
            metrics_url = _metrics_url(broker)
            stored = await wl.fill_backlog(broker.address, PULL_TOPIC, backlog)
            say(f"  pull flooder's backlog: {stored} messages")
            admin = BrokerClient(broker.address)
            load = NormalLoad(broker.address)
            try:
                await load.start(admin)
                for i in range(args.runs):
                    for phase in PHASES:
                        sample = await _phase(load, broker, metrics_url, phase, seconds)
                        samples[phase].append(sample)
                        say(f"  {name} run {i + 1}/{args.runs} {phase}: {_describe(sample)}")
            finally:
                await load.close()
                await admin.close()
        _figures(name, extra, samples, seconds, add)
        facts[f"flood_{name}_broker_args"] = list(extra)
    return facts


def _metrics_url(broker: ServerProcess) -> str:
    """The broker's /metrics URL, from the line it prints after its ready line."""
    prefix = "mockbroker serving metrics and health checks on "
    assert broker.lines is not None
    for _ in range(5):
        line = broker.lines.readline(10.0)
        if line.startswith(prefix):
            return f"http://{line.removeprefix(prefix).strip()}/metrics"
    raise RuntimeError(f"{broker.name} printed no metrics address")


def _loop_lag(url: str) -> dict[float, float]:
    """The broker's loop-lag histogram now: upper bound (s) -> wake-ups at or below it."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    for family in text_string_to_metric_families(text):
        if family.name == LOOP_LAG:
            return {
                float(sample.labels["le"]): sample.value
                for sample in family.samples
                if sample.name == f"{LOOP_LAG}_bucket"
            }
    raise RuntimeError(f"the broker exports no {LOOP_LAG}")


def _stalls(before: dict[float, float], after: dict[float, float]) -> tuple[int, float]:
    """Wake-ups over LOOP_STALL_MS late between two scrapes, and the bound (ms) the
    slowest of them was within (0: no wake-up observed)."""
    bounds = sorted(after)
    grown = [after[b] - before.get(b, 0.0) for b in bounds]  # cumulative, as scraped
    total = grown[-1]
    if not total:
        return 0, 0.0
    stalls = total - grown[bounds.index(LOOP_STALL_MS / 1000)]
    slowest = next(b for b, n in zip(bounds, grown, strict=True) if n == total)
    return int(stalls), slowest * 1000


async def _phase(
    load: NormalLoad, broker: ServerProcess, metrics_url: str, phase: str, seconds: float
) -> Sample:
    stats: dict[str, Any] = {}
    flood: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if phase == "send flood":
        flood = flooder(broker.address, "send", SEND_TOPIC, stats)
    elif phase == "pull flood":
        flood = flooder(broker.address, "pull", PULL_TOPIC, stats)
    with flood:
        if phase != "baseline":
            await asyncio.sleep(FLOOD_SETTLE_SECONDS)
        cpu_before = broker.cpu_seconds()
        lag_before = _loop_lag(metrics_url)
        started = time.perf_counter()
        stalls: list[float] = []
        watch = asyncio.create_task(_timer_lateness(stalls))
        try:
            sends, rate = await load.send(seconds)
        finally:
            watch.cancel()
        elapsed = time.perf_counter() - started
        cpu_after = broker.cpu_seconds()
        loop_stalls, lag_max_ms = _stalls(lag_before, _loop_lag(metrics_url))
        # Without protection a flood can starve the consumer: then the rest arrives once
        # the flooder stopped (their latency counts), and the phase says so.
        starved = not await load.received()
    if starved:
        await load.received()
    stats["consumer_starved"] = starved
    stats["never_received"] = load.unreceived()  # 60 s after the last send
    e2e = load.e2e()
    server_cpu = None
    if cpu_before is not None and cpu_after is not None:
        server_cpu = (cpu_after - cpu_before) / elapsed
    stall = cw.percentile(stalls, 99) if stalls else 0.0
    return Sample(sends, e2e, elapsed, rate, server_cpu, stall, stats, loop_stalls, lag_max_ms)


async def _timer_lateness(out: list[float]) -> None:
    """How late (ms) a 1 ms sleep of this process wakes, again and again."""
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        out.append((time.perf_counter() - started - 0.001) * 1000)


def _describe(s: Sample) -> str:
    p = cw.percentile
    text = (
        f"send p50 {p(s.send_ms, 50):.2f} p99 {p(s.send_ms, 99):.2f} ms, "
        f"e2e p50 {p(s.e2e_ms, 50):.2f} p99 {p(s.e2e_ms, 99):.2f} ms, "
        f"sent {s.sent_rate:.0f} msg/s, broker CPU "
        + ("-" if s.server_cpu is None else f"{s.server_cpu * 100:.0f}%")
        + f", client stalls p99 {s.client_stall_p99_ms:.1f} ms, broker loop: "
        + f"{s.broker_stalls} wake-ups over {LOOP_STALL_MS:g} ms late, the slowest within "
        + f"{s.broker_lag_max_ms:g} ms"
    )
    if s.flooder.get("never_received"):
        text += (
            f"; the consumer never got {s.flooder['never_received']} messages "
            "(not in the e2e figures)"
        )
    elif s.flooder.get("consumer_starved"):
        text += "; the consumer got the last messages only after the flood stopped"
    if "flooder_exit" in s.flooder:
        text += f"; the flooder exited with {s.flooder['flooder_exit']}: no counts"
    if "messages_per_second" in s.flooder:
        text += (
            f"; flooder {s.flooder.get('messages_per_second', 0):,.0f} msg/s, "
            f"{s.flooder.get('refused', 0)} refused"
        )
        if s.flooder.get("pull_statuses"):
            text += f", pulls answered {s.flooder['pull_statuses']}"
    return text


def _figures(
    name: str,
    extra: tuple[str, ...],
    samples: dict[str, list[Sample]],
    seconds: float,
    add: Callable[[Figure], Figure],
) -> None:
    params = {
        "broker_args": list(extra),
        "normal_producers": NORMAL_PRODUCERS,
        "normal_rate_per_producer": NORMAL_RATE,
        "seconds_per_phase": seconds,
        "flood_send_batch": FLOOD_BATCH,
        "flood_send_in_flight": FLOOD_SEND_IN_FLIGHT,
        "flood_pulls_per_queue": FLOOD_PULLS_PER_QUEUE,
        "body_bytes": wl.BODY_BYTES,
    }
    label = f"flood [{name}]"
    for phase in PHASES:
        for metric, pick in (("send", _sends), ("e2e", _e2e)):
            for q in (50, 99):
                figure = add(
                    Figure(
                        f"flood.{name}.{phase.replace(' ', '_')}.{metric}.p{q}",
                        f"{label} {phase}: normal {metric} p{q}",
                        "ms",
                        {**params, "phase": phase, "metric": metric, "percentile": q},
                        higher_is_better=False,
                        per="msg",
                    )
                )
                for s in samples[phase]:
                    figure.runs.append(
                        Run(cw.percentile(pick(s), q), s.seconds, len(pick(s)),
                            server_cpu=s.server_cpu, rate=s.sent_rate,
                            detail={"client_stall_p99_ms": round(s.client_stall_p99_ms, 3),
                                    "broker_loop_stalls": s.broker_stalls,
                                    "broker_loop_lag_max_ms": s.broker_lag_max_ms})
                    )  # fmt: skip
        if phase == "baseline":
            continue
        rate = add(
            Figure(
                f"flood.{name}.{phase.replace(' ', '_')}.flooder_rate",
                f"{label} {phase}: the flooder's rate",
                "msg/s",
                {**params, "phase": phase},
            )
        )
        for s in samples[phase]:
            value = float(s.flooder.get("messages_per_second", 0.0))
            rate.runs.append(
                Run(value, s.seconds, int(s.flooder.get("messages", 0)),
                    detail={"refused": float(s.flooder.get("refused", 0))})
            )  # fmt: skip
        for metric, pick in (("send", _sends), ("e2e", _e2e)):
            ratio = add(
                Figure(
                    f"flood.{name}.{phase.replace(' ', '_')}.{metric}.p99_ratio",
                    f"{label} {phase}: normal {metric} p99 / baseline's",
                    "x",
                    {**params, "phase": phase, "metric": metric, "target": "<= 2"},
                    higher_is_better=False,
                    per="run",
                )
            )
            for base, flood in zip(samples["baseline"], samples[phase], strict=True):
                ratio.runs.append(
                    Run(cw.percentile(pick(flood), 99) / cw.percentile(pick(base), 99),
                        flood.seconds, 1)
                )  # fmt: skip


def _sends(s: Sample) -> list[float]:
    return s.send_ms


def _e2e(s: Sample) -> list[float]:
    return s.e2e_ms


def summary(figures: list[Figure]) -> str:
    """Lines setting each flood's p99 ratios against the target (if the group ran)."""
    lines = []
    for f in figures:
        if f.key.startswith("flood.") and f.key.endswith("p99_ratio") and f.values():
            median = statistics.median(f.values())
            verdict = "met" if median <= 2 else "NOT MET"
            lines.append(f"{f.title}: {median:.2f}x (target <= 2x: {verdict})")
    return "\n".join(lines)
