"""`make bench-profile`: where the broker's and the client's CPU goes, as shares.

Runs one workload of bench/run.py against a fresh broker process while py-spy samples
both processes (native frames included, so gRPC's C core and the kernel calls count),
then folds every sample into a named part and prints each part's share of the process's
busy samples. Samples whose innermost frame is a wait (epoll, condition variables,
sleeping in the thread pool) are idle and not counted.

Workloads (the same inputs as bench/run.py):
- produce: send_batch of 100 keyed messages, 1 batch in flight, async flush;
- produce-mixed: the same with each batch's keys spread over every queue (one request
  in parts, written in one pass);
- produce-callers: single `send()` calls from 8 concurrent callers, keys in arrival
  order, on a producer with natural batching (bench/run.py's callers figure);
- consume: an orderly sdk.aio.PushConsumer with a no-op async listener, batch 1 or 32,
  reading a backlog; consume-threads-batch1: the same with a plain `def` listener on
  the consumer's thread pool, batch 1; consume-push-batch1 / consume-push-batch32: the
  async ones with push delivery (the broker sends within the consumer's credit), and
  consume-push-threads-batch1 the thread-pool one;
- poll-aio / poll-blocking: the poll loop of bench/run.py's poll figures over the same
  backlog, sdk.aio.LitePullConsumer or the blocking sdk.LitePullConsumer;
- e2e: single sends at a fixed rate to an orderly blocking sdk.PushConsumer;
- e2e-push: the same to an orderly sdk.aio.PushConsumer with push delivery and an
  `async def` listener (bench/run.py's latency.e2e.push face).

    python bench/profile_shares.py                       # all three, ~1 minute
    python bench/profile_shares.py --only produce --seconds 10
    python bench/profile_shares.py --no-exchange-port   # the clients on gRPC, not the port

py-spy comes with the `bench` extra (pip install -e '.[bench]'); it needs permission to
ptrace the processes it samples (root, or kernel.yama.ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import consuming as cw
import workloads as wl
from procs import ROOT, broker_process, exchange_port_option

from sdk import (
    AccumulatorConfig,
    ConsumeFromWhere,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
    aio,
)
from sdk._transport.broker_client import BrokerClient
from sdk.aio import Producer

RESULTS = Path(__file__).resolve().parent / "results"
#: Frames that mean the thread was waiting, not working, when they are in the native
#: calls below a sample's innermost Python frame (libc's own frames are often unnamed).
IDLE_FRAMES = (
    "epoll_wait", "poll (libc", "select (libc", "pthread_cond_wait", "pthread_cond_timedwait",
    "sem_wait", "sem_timedwait", "futex", "clock_nanosleep", "nanosleep",
    "_queue_SimpleQueue_get", "PyThread_acquire_lock", "select_epoll_poll", "time_sleep",
    "lock_PyThread_acquire_lock", "gpr_cv_wait",
)  # fmt: skip
#: Parts a busy sample is counted in: the part of the innermost frame of its stack that
#: belongs to one, so a hot function is named rather than its callers, and what our code
#: calls into (gRPC, asyncio, protobuf) is counted there. Frames of no part (system calls,
#: libc, zlib) count for their caller.
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("fsync", ("fdatasync", "os_fsync")),
    ("check frames (validation)", ("check_frames",)),
    ("build records (layout, CRC)", ("build_records", "lay_out_records", "lay_out_parts")),
    ("id/key index", ("IdKeyEntries", "message_index.py")),
    ("pull: read records, long polling", ("MessageStore.get ", "_read_records", "long_polling.py")),
    ("push delivery (credits, subscriptions)", ("mockbroker/push.py", "Delivery.subscribe ")),
    ("Exchange port framing (both sides)", ("exchange_port.py",)),
    ("commit log / consume queue writes", ("commitlog.py", "consumequeue.py")),
    ("locks, groups, offsets", ("lock_manager.py", "groups.py", "offsets.py", "offset_store.py")),
    ("other broker code", ("(mockbroker/",)),  # entry frames excepted, see ENTRY_FRAMES
    ("message build (Message())", ("(sdk/message.py", "(sdk/_validation.py")),
    ("encode", ("encode_message", "encode_frame")),
    ("decode", ("decode_records",)),
    ("orderly dispatch", ("consume_orderly.py", "process_queue.py", "invoke.py")),
    ("consumer pull loop, rebalance", ("push_core.py", "consumer/core.py", "rebalance.py")),
    ("producer", ("(sdk/producer/",)),
    ("SDK transport", ("(sdk/_transport/",)),
    ("other SDK code", ("(sdk/",)),
    ("benchmark driver", ("bench/",)),
    ("protobuf", ("protobuf", "upb")),
    ("gRPC runtime (C core, cython, its system calls)", ("cygrpc", "grpc/")),
    ("asyncio event loop", ("asyncio/", "_asynciomodule", "selectors.py")),
    ("threads (pool, hand-offs)", ("threading.py", "concurrent/futures", "queue.py")),
]
#: Outer frames every sample of a process has (its entry point): never a part.
ENTRY_FRAMES = ("__main__.py", "mockbroker/server.py", "profile_shares.py", "runpy")


@dataclass
class Shares:
    """Busy samples per part, for one process."""

    busy: int
    idle: int
    parts: dict[str, int]
    #: The process's CPU time (user + system, every thread) while it was sampled; None
    #: where /proc does not tell it.
    cpu_seconds: float | None = None

    def table(self, title: str) -> str:
        lines = [f"{title}: {self.busy} busy samples ({self.idle} idle not counted)"]
        for name, n in sorted(self.parts.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {100 * n / max(1, self.busy):5.1f}%  {name}")
        return "\n".join(lines)


def fold(raw: str) -> Shares:
    """Shares of py-spy's raw (collapsed) output: `frame;frame;...;leaf count` lines."""
    parts: collections.Counter[str] = collections.Counter()
    busy = idle = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        if _waiting(frames):
            idle += n
            continue
        busy += n
        parts[_part(frames)] += n
    return Shares(busy, idle, dict(parts))


def _waiting(frames: list[str]) -> bool:
    native = []
    for frame in reversed(frames):
        if ".py" in frame:  # the innermost Python frame: what is below it is native
            break
        native.append(frame)
    return any(mark in frame for frame in native for mark in IDLE_FRAMES)


def _part(frames: list[str]) -> str:
    for frame in reversed(frames):
        if any(e in frame for e in ENTRY_FRAMES):
            continue
        for name, markers in PARTS:
            if any(m in frame for m in markers):
                return name
    return "other"


class Sampler:
    """py-spy recording one process until stopped."""

    def __init__(self, pid: int, out: Path, rate: int) -> None:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        self.out = out
        self.pid = pid
        self.cpu_before = _cpu_seconds(pid)
        self.proc = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--native", "--rate", str(rate),
             "--format", "raw", "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def stop(self) -> Shares:
        after = _cpu_seconds(self.pid)
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl+C
        _, err = self.proc.communicate(timeout=60)
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote nothing: {err.strip()[-500:]}")
        shares = fold(self.out.read_text())
        if after is not None and self.cpu_before is not None:
            shares.cpu_seconds = after - self.cpu_before
        return shares


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux /proc), else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def produce(address: str, seconds: float, *, mixed: bool = False) -> int:
    """send_batch of 100 keyed messages, 1 in flight, for about `seconds`.

    Each batch's keys are of one queue, or (`mixed`) of every queue: one request in parts.
    """
    admin = BrokerClient(address)
    await admin.create_topic("profile-produce", wl.QUEUES)
    await admin.close()
    producer = Producer(address)
    await producer.start()
    try:
        batches = wl.make_mixed_batches(10_000) if mixed else wl.make_batches(10_000)
        done, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            done += await wl.produce(producer, "profile-produce", batches[:100], 1)
        return done
    finally:
        await producer.shutdown()


async def produce_callers(address: str, seconds: float) -> int:
    """Single sends from wl.CALLERS tasks on one producer with natural batching
    (AccumulatorConfig(linger=0)), for about `seconds`."""
    admin = BrokerClient(address)
    await admin.create_topic("profile-produce", wl.QUEUES)
    await admin.close()
    producer = Producer(address, config=ProducerConfig(accumulator=AccumulatorConfig(linger=0)))
    await producer.start()
    try:
        singles = wl.make_singles(wl.CALLERS * 500)
        done, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            done += await wl.send_from_callers(producer, "profile-produce", singles)
        return done
    finally:
        await producer.shutdown()


async def consume(trial: cw.ConsumeTrial | cw.PollTrial) -> int:
    """An orderly aio push consumer draining the trial's backlog."""
    await trial.prepare()
    try:
        return await trial.run()
    finally:
        await trial.close()


async def e2e(address: str, seconds: float, rate: int, *, push: bool = False) -> int:
    """Single sends at `rate`/s to an orderly blocking push consumer, or (`push`) to an
    orderly aio one with push delivery and an `async def` listener."""
    admin = BrokerClient(address)
    producer = Producer(address)
    recorder = cw.LatencyRecorder()
    consumer: PushConsumer | aio.PushConsumer
    if push:
        consumer = aio.PushConsumer(
            "profile-e2e",
            address,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            config=PushConsumerConfig(delivery="push"),
        )
        consumer.register_message_listener(recorder)
    else:
        consumer = PushConsumer(
            "profile-e2e", address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
        )
        consumer.register_message_listener(cw.BlockingLatencyRecorder(recorder))
    try:
        await admin.create_topic("profile-e2e", wl.QUEUES)
        await producer.start()
        consumer.subscribe("profile-e2e")
        if isinstance(consumer, aio.PushConsumer):
            await consumer.start()
        else:
            await asyncio.to_thread(consumer.start)
        await cw.until_held(admin, wl.QUEUES)
        count = int(rate * seconds)
        await cw.e2e_latency(producer, recorder, "profile-e2e", wl.make_keys(), rate, count, 64)
        return count
    finally:
        if isinstance(consumer, aio.PushConsumer):
            await consumer.shutdown()
        else:
            await asyncio.to_thread(consumer.shutdown)
        await producer.shutdown()
        await admin.close()


async def profile(name: str, args: argparse.Namespace, tmp: Path) -> tuple[dict[str, Shares], int]:
    """Run workload `name` against a fresh broker: the broker's and the client's shares,
    and how many messages the workload sent or consumed."""
    data_dir = Path(tempfile.mkdtemp(dir=tmp))
    extra = exchange_port_option(args)
    with broker_process(data_dir, "async", extra=extra) as broker:
        assert broker.proc is not None
        trial = None
        if name.startswith("consume"):  # filled before sampling starts
            await wl.fill_backlog(broker.address, "profile-consume", args.backlog)
            listener = "orderly-sync" if "-threads-" in name else "orderly-async"
            batch = int(name.rpartition("-batch")[2])
            delivery = "push" if name.startswith("consume-push") else "pull"
            trial = cw.ConsumeTrial(
                broker.address, "profile-consume", args.backlog, listener, batch, delivery=delivery
            )
        elif name.startswith("poll"):
            await wl.fill_backlog(broker.address, "profile-consume", args.backlog)
            trial = cw.PollTrial(
                broker.address, "profile-consume", args.backlog, name == "poll-blocking"
            )
        samplers = {
            "broker": Sampler(broker.proc.pid, tmp / f"{name}-broker.txt", args.rate),
            "client": Sampler(os.getpid(), tmp / f"{name}-client.txt", args.rate),
        }
        messages = 0
        try:
            if name == "produce-callers":
                messages = await produce_callers(broker.address, args.seconds)
            elif name.startswith("produce"):
                messages = await produce(
                    broker.address, args.seconds, mixed=name == "produce-mixed"
                )
            elif name.startswith("e2e"):
                messages = await e2e(
                    broker.address, args.seconds, args.e2e_rate, push=name == "e2e-push"
                )
            else:
                assert trial is not None
                messages = await consume(trial)
        finally:
            shares = {side: s.stop() for side, s in samplers.items()}
    shutil.rmtree(data_dir, ignore_errors=True)
    return shares, messages


WORKLOADS = (
    "produce", "produce-mixed", "produce-callers", "consume-batch1", "consume-batch32",
    "consume-threads-batch1", "consume-push-batch1", "consume-push-batch32",
    "consume-push-threads-batch1", "poll-aio",
    "poll-blocking", "e2e", "e2e-push",
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=",".join(WORKLOADS), help=f"of {', '.join(WORKLOADS)}")
    ap.add_argument("--seconds", type=float, default=8.0, help="produce and e2e run time")
    ap.add_argument("--backlog", type=int, default=300_000, help="consume backlog")
    ap.add_argument("--e2e-rate", type=int, default=500, help="e2e send rate, msg/s")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--output", type=Path, default=RESULTS / "profile.json")
    ap.add_argument(
        "--no-exchange-port",
        action="store_true",
        help="start the broker without its Exchange port: the clients' sends, pulls and "
        "subscriptions go over gRPC instead of framed TCP",
    )
    ap.add_argument("--keep", type=Path, help="keep py-spy's raw stacks in this directory")
    args = ap.parse_args(argv)
    chosen = [w.strip() for w in args.only.split(",") if w.strip()]
    if not chosen or set(chosen) - set(WORKLOADS):
        ap.error(f"--only takes {', '.join(WORKLOADS)}")
    report: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="ordermq-profile-") as tmp:
        for name in chosen:
            print(f"profiling {name} ...", file=sys.stderr, flush=True)
            shares, messages = asyncio.run(profile(name, args, Path(tmp)))
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                for raw in Path(tmp).glob(f"{name}-*.txt"):
                    shutil.copy(raw, args.keep / raw.name)
            for side, s in shares.items():
                # Busy CPU per message: samples are taken `rate` times a second.
                per_message_us = s.busy / args.rate / max(1, messages) * 1e6
                print(s.table(f"{name}, {side}"))
                cpu = s.cpu_seconds
                cpu_us = None if cpu is None else cpu / max(1, messages) * 1e6
                told = "" if cpu_us is None else f", process CPU time {cpu_us:.1f} us/msg"
                print(f"  {messages} messages, busy CPU {per_message_us:.1f} us/msg{told}")
                report.setdefault(name, {})[side] = {
                    "messages": messages,
                    "busy_us_per_message": round(per_message_us, 2),
                    "process_cpu_us_per_message": None if cpu_us is None else round(cpu_us, 2),
                    "busy_samples": s.busy,
                    "idle_samples": s.idle,
                    "shares": {k: round(v / max(1, s.busy), 4) for k, v in s.parts.items()},
                }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"root": str(ROOT), "profiles": report}, indent=2) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
