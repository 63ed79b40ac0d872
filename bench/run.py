"""`make bench`: ordermq's throughput and latency figures, as a table and as JSON.

Figures (see bench/README.md for what each one measures and how to read it):

- produce: sdk.aio.Producer.send_batch, batches of 100 keyed 100-byte messages, each batch
  for one of 8 queues, 1 or 4 batches in flight, broker in async or sync flush mode; and
  the keyed workload of issue 35, printed first in a table of its own: batches of 100
  mixed keys in arrival order, and single send() calls from 8 concurrent callers (natural
  batching), with broker CPU per message and ratios to the gRPC floor of the same run and
  to Redis Streams (measured now if Redis is installed, else the last make bench-peers):
  to its pipelined batches of 100 XADD and, for the 8 callers, also to 8 concurrent
  callers of single XADDs, the same shape;
- send: sdk.aio.Producer.send of single messages, one at a time, 64 send tasks in flight,
  and through the accumulator (64 or 1 000 in flight), against send_batch above;
- pull: reading a backlog of 200 000 messages back with the SDK's pull, decode included,
  one pull at a time or with every queue's next pull in flight;
- consume: one sdk.aio.PushConsumer reading a 200 000-message backlog with a no-op
  listener (orderly async at batch 1 and 32, orderly on the thread pool, concurrent),
  each with pull delivery and with push delivery (credits), the two taking turns;
- poll: one lite pull consumer (sdk.aio and blocking) draining the same backlog with a
  plain `while batch := poll(timeout)` loop; and the blocking loop handing each message
  to the orderly thread-pool figure's listener, as a loop that processes what it polls;
- receive: 8 workers sharing one SimpleConsumer (asyncio tasks on sdk.aio's, threads on
  the blocking one) receiving and acking a backlog of keyed messages over 8 queues as
  jobs, next to one sdk.aio.LitePullConsumer's poll loop draining the same backlog
  (bench/receiving.py);
- latency: how fast a held (long-polling) pull wakes when a message arrives, and the
  end-to-end latency of single messages sent at 500 and 2 000 msg/s to an orderly push
  consumer; then the same with the paced producer in a process of its own, at 2 000 and
  20 000 msg/s, through the orderly and the concurrent push consumer and a lite pull
  consumer's poll loop (async flush; and the orderly one at 2 000 msg/s with sync
  flush), with Redis Streams' e2e at the same rates beside them when Redis is installed
  (bench/e2e_procs.py);
- stream: ExchangeBatched against the same SDK forced onto plain Exchange, on one broker,
  the ways taking turns: 8 callers' single sends (natural batching, and no accumulator),
  end-to-end latency at 2 000 msg/s through the orderly aio PushConsumer (pull and push
  delivery), and requests per stream message on the client's writers (bench/stream.py);
- floor: a bare grpc.aio server/client pair moving the same bytes (what gRPC alone costs);
- micro: per-message SDK costs measured in-process (build, encode, decode, an orderly
  listener's dispatch);
- remoting: RocketMQ's C++ client (rocketmq-client-cpp 1.2.3, PyPI rocketmq 0.4.4) over
  mockbroker's remoting front: single sends (send_sync, send_orderly) and a PullConsumer
  reading a backlog, next to the gRPC figures of the same shape (bench/remoting.py; skipped,
  with the reason, while the broker has no remoting front or the client cannot install);
- transports: produce (as produce, async flush, 1 in flight) and orderly consume (as
  consume, async listener, batch 32) through the same SDK clients over gRPC and over
  rocketmq:// (RocketMQ remoting via the broker's name server), each on a fresh broker
  serving both, with the ratio rocketmq:// / gRPC (skipped while the broker has no
  remoting front);
- tls: produce (as produce, async flush, 1 in flight) and orderly consume (as consume,
  async listener, batch 32) over gRPC to a broker serving plain text, to one serving TLS
  only (a CA and a certificate made for the run in its temporary directory) and to one
  serving TLS with an ACL (clients signing with a non-admin account), the three brokers up
  side by side and the runs taking turns, with the ratios TLS on / TLS off and TLS + ACL
  on / TLS off;
- dedup: the broker's dedup window (mockbroker/dedup.py) fed 10 million distinct keys at
  its default bound of 1 million, in a process of its own: bytes of RSS per key kept, and
  time per key (bench/dedup.py; --quick: 1 million keys, bound 100 000);
- backlog (only when named in --only; make bench-backlog): the broker's peak RSS with a
  10-million-message backlog, its recovery time after kill -9, and reading it all back.

Servers run as separate processes; the client is this process. Every figure is the median
of --runs runs. Usage:

    python bench/run.py                   # the full run (about 10-11 minutes on 2 cores)
    python bench/run.py --quick           # a smoke run (seconds; writes results/quick.json)
    python bench/run.py --only pull --runs 5 --messages 50000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import dataclasses
import datetime
import functools
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import big_backlog
import console_watch as cons
import consuming as cw
import dedup
import e2e_procs as ep
import flood
import grpc
import receiving as rc
import remoting as rm
import stream as st
import workloads as wl
from figures import (
    CONSUME_KEYS,
    KEYED_KEYS,
    REDIS_PEER,
    Figure,
    PeerFigure,
    Run,
    Timing,
    consume_line,
    consume_ratios,
    fmt,
    keyed_ratios,
    keyed_table,
    peer_produce,
    table,
)
from procs import (
    ROOT,
    ServerProcess,
    broker_process,
    busy_poll_option,
    exchange_port_option,
    floor_process,
    machine_busy_seconds,
)

from mockbroker.config import BrokerConfig
from sdk import (
    AccumulatorConfig,
    ConsumeFromWhere,
    Credentials,
    MessageQueue,
    ProcessingOrder,
    ProducerConfig,
    PushConsumerConfig,
    TLSConfig,
)
from sdk import Producer as BlockingProducer
from sdk import PushConsumer as BlockingPushConsumer
from sdk._transport.broker_client import BrokerClient
from sdk._wire import GRPC_CHANNEL_OPTIONS
from sdk.aio import LitePullConsumer, Producer, PushConsumer

#: The keymode group: listener work per message, listener threads, backlog sizes.
KEYMODE_WORK = 0.005
KEYMODE_THREADS = 128
KEYMODE_MESSAGES = 10_000
KEYMODE_QUICK = 2_000
#: keymode latency: keyed single sends at this rate (queue mode's ceiling is 200 msg/s a
#: queue, 1 600 on 8 queues, so queue mode runs at 62 % of it), seconds per run.
KEYMODE_RATE = 1_000
KEYMODE_LATENCY_SECONDS, KEYMODE_LATENCY_QUICK_SECONDS = 4.0, 1.0
GROUPS = ("produce", "send", "pull", "consume", "keymode", "poll", "receive", "latency", "stream",
          "floor", "micro", "remoting", "transports", "tls", "dedup")  # fmt: skip
#: Groups run only when --only names them (make bench-backlog): they take minutes and GBs.
EXTRA_GROUPS = ("backlog", "flood")
#: The transports group's transports: figure key part, name in titles ("grpc" first).
TRANSPORTS = (("grpc", "gRPC"), ("rocketmq", "rocketmq://"))
#: A broker's (client, admin) accounts when it has an ACL.
AclCredentials = tuple[Credentials, Credentials]
#: The tls group's three brokers: figure key part, name in titles (plain text first).
TLS_MODES = (("plain", "TLS off"), ("tls", "TLS on"), ("tls_acl", "TLS + ACL on"))
#: The tls group's ACL (written at run time): the clients' account may publish and
#: subscribe to any topic and consume in any group, and is checked on each; topics are
#: created by an admin account (CreateTopic needs ADMIN).
BENCH_CLIENT = ("bench-client", "bench-client-secret")
BENCH_ADMIN = ("bench-admin", "bench-admin-secret")
BENCH_ACL = f"""\
accounts:
  - accessKey: {BENCH_CLIENT[0]}
    secretKey: {BENCH_CLIENT[1]}
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: SUB
  - accessKey: {BENCH_ADMIN[0]}
    secretKey: {BENCH_ADMIN[1]}
    admin: true
"""
#: Other processes using this much of a core during a figure get it named in a note.
OTHERS_NOTICEABLE = 0.25
#: latency: wake-ups per run (sequential); the end-to-end send rates (msg/s), seconds per
#: run, and the most sends the paced producer lets overlap.
LONGPOLL_WAKEUPS = 200
LONGPOLL_SUSPEND = 10.0
E2E_RATES = (500, 2000)
E2E_SECONDS = 5.0
#: --quick (a smoke run, which `make test` runs) sends for a quarter of a second per rate:
#: the figures are there, and 3 faces x 2 rates of 1 s (with their warm-ups) were most of
#: --quick's CPU, paced sends and a consumer at 2 000 msg/s.
E2E_QUICK_SECONDS = 0.25
E2E_SENDS_IN_FLIGHT = 64
#: stream: messages per run of the 8 callers' single sends (--quick: CALLERS_QUICK), the
#: end-to-end rate (msg/s) and seconds per run (--quick: E2E_QUICK_SECONDS).
STREAM_CALLERS_MESSAGES = 10_000
STREAM_E2E_RATE = 2000
STREAM_E2E_SECONDS = 3.0
#: The consumer faces the end-to-end figures are taken with ("blocking" is issue 7's;
#: "push" is "aio" with push delivery, issue 40).
E2E_CONSUMERS = ("blocking", "aio", "push")
#: send: messages per run of the one-at-a-time and the concurrent single sends (full and
#: --quick; they are slow), most messages per accumulator run, and sends in flight.
SEND_SEQUENTIAL, SEND_SEQUENTIAL_QUICK = 20_000, 2_000
SEND_CONCURRENT, SEND_CONCURRENT_QUICK = 20_000, 2_000
SEND_ACCUMULATOR, SEND_ACCUMULATOR_QUICK = 100_000, 5_000
SEND_IN_FLIGHT = 64
#: produce: messages per run of the keyed workload's single sends from wl.CALLERS callers.
CALLERS_MESSAGES, CALLERS_QUICK = 20_000, 2_000
SEND_ACCUMULATOR_IN_FLIGHT = 1000
RESULTS = Path(__file__).resolve().parent / "results"
#: The topic of the produce figures (created on each figure's fresh broker).
PRODUCE_TOPIC = "bench-produce"


class Trial(Protocol):
    """Runs over one backlog (consuming.PollTrial, receiving.ReceiveTrial): `prepare` and
    `close` around each timed `run`, which answers how many messages it took."""

    async def prepare(self) -> None: ...
    async def run(self) -> int: ...
    async def close(self) -> None: ...


class Bench:
    """Runs the figures the options ask for, one fresh server process per figure."""

    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.tmp = tmp
        self.figures: list[Figure] = []
        self.facts: dict[str, Any] = {}
        self._serial = 0
        #: Peak RSS (MB) of the broker of each backlog group ("pull", "consume"), read
        #: just before that broker is stopped.
        self.backlog_rss_mb: dict[str, float] = {}
        #: Redis Streams' e2e latency of this run (e2e_procs.redis_latency), if measured.
        self.e2e_redis: dict[str, dict[int, dict[str, float]]] = {}

    # ------------------------------------------------------------------ helpers
    def say(self, text: str) -> None:
        if not self.args.quiet:
            print(text, file=sys.stderr, flush=True)

    def _data_dir(self, name: str) -> Path:
        self._serial += 1
        path = self.tmp / f"{self._serial:02d}-{name}"
        path.mkdir()
        return path

    @contextlib.contextmanager
    def _broker(
        self, name: str, flush_mode: str, extra: tuple[str, ...] = ()
    ) -> Iterator[ServerProcess]:
        """A fresh broker process with its own data directory, removed afterwards.

        `extra`: more broker options.
        """
        profile = None
        if self.args.profile is not None:
            profile = self.args.profile / f"broker-{name}.prof"
        data_dir = self._data_dir(name)
        if self.args.console:
            extra = (*extra, *cons.CONSOLE_OPTIONS)
        if "--exchange-port" not in extra:
            extra = (*extra, *exchange_port_option(self.args))
            self.facts["exchange_port"] = not self.args.no_exchange_port
        extra = (*extra, *busy_poll_option(self.args))
        self.facts["broker_busy_poll_us"] = (
            BrokerConfig().busy_poll_us
            if self.args.broker_busy_poll_us is None
            else self.args.broker_busy_poll_us
        )
        try:
            with broker_process(data_dir, flush_mode, profile, extra) as broker:
                if not self.args.console:
                    yield broker
                    return
                with cons.Watcher(cons.console_of(broker)).watching() as watcher:
                    yield broker
                self.facts["console_pages"] = self.facts.get("console_pages", 0) + watcher.pages
                if watcher.failures:
                    self.facts["console_page_failures"] = (
                        self.facts.get("console_page_failures", 0) + watcher.failures
                    )
        finally:
            shutil.rmtree(data_dir, ignore_errors=True)

    async def _timed(
        self, work: Callable[[], Awaitable[int]], server: ServerProcess | None
    ) -> Timing:
        """Units, seconds and CPU shares of one run of `work`."""
        server_before = server.cpu_seconds() if server is not None else None
        busy_before = machine_busy_seconds()
        cpu_before = time.process_time()
        start = time.perf_counter()
        units = await work()
        seconds = time.perf_counter() - start
        client_cpu = (time.process_time() - cpu_before) / seconds
        busy_after = machine_busy_seconds()
        server_cpu = None
        if server is not None and server_before is not None:
            server_after = server.cpu_seconds()
            if server_after is not None:
                server_cpu = (server_after - server_before) / seconds
        other_cpu = None
        if busy_before is not None and busy_after is not None:
            other = (busy_after - busy_before) / seconds - client_cpu - (server_cpu or 0.0)
            other_cpu = max(0.0, other)
        return Timing(units, seconds, client_cpu, server_cpu, other_cpu)

    async def _measure(
        self,
        figure: Figure,
        work: Callable[[], Awaitable[int]],
        server: ServerProcess | None,
        per: int = 1,
        setup: Callable[[], Awaitable[None]] | None = None,
        teardown: Callable[[], Awaitable[None]] | None = None,
        run_numbers: Sequence[int] | None = None,
    ) -> None:
        """Run `work` --runs times; each run's value is units * per / second.

        `setup` and `teardown`, when given, run before and after each run, untimed.
        `run_numbers`: only these of the --runs runs (0-based; figures measured in turns).
        """
        profiler = cProfile.Profile() if self.args.profile is not None else None
        numbers = range(self.args.runs) if run_numbers is None else run_numbers
        for i in numbers:
            if setup is not None:
                await setup()
            try:
                if profiler is not None:
                    profiler.enable()
                t = await self._timed(work, server)
            finally:
                if profiler is not None:
                    profiler.disable()
                if teardown is not None:
                    await teardown()
            run = t.run(t.units * per / t.seconds)
            figure.runs.append(run)
            self.say(
                f"  {figure.title} run {i + 1}/{self.args.runs}: {fmt(run.value)} {figure.unit} "
                f"({t.units} in {t.seconds:.2f} s, {t.cpu_text()})"
            )
        if profiler is not None:
            runs = "" if run_numbers is None else "-run" + "-".join(str(i + 1) for i in numbers)
            profiler.dump_stats(self.args.profile / f"client-{figure.key}{runs}.prof")

    async def _measure_trials(
        self,
        broker: ServerProcess,
        warm: Trial,
        trials: Sequence[tuple[Figure, Trial]],
        stored: int,
    ) -> None:
        """Run `warm` once, unmeasured, then measure each figure's trial over a backlog,
        the figures' runs taking turns (a change of load falls on all of them).

        Every run must take all `stored` messages of the backlog.
        """
        await warm.prepare()
        try:
            await warm.run()
        finally:
            await warm.close()
        for i in range(self.args.runs):
            for figure, trial in trials:
                await self._measure(figure, trial.run, broker, setup=trial.prepare,
                                    teardown=trial.close, run_numbers=[i])  # fmt: skip
        for figure, _trial in trials:
            if any(r.units != stored for r in figure.runs):
                raise RuntimeError(
                    f"{figure.title}: took {[r.units for r in figure.runs]} of {stored} messages"
                )

    async def _measure_latency(
        self,
        p50: Figure,
        p99: Figure,
        work: Callable[[], Awaitable[tuple[list[float], dict[str, float]]]],
        server: ServerProcess | None,
        sent: Figure | None = None,
        run_numbers: Sequence[int] | None = None,
    ) -> None:
        """Run `work` --runs times; each run's samples (ms) give one p50 and one p99 run.

        `sent`, if given, gets each run's `detail["sent_rate"]` (msg/s) as its value.
        `run_numbers`: only these of the --runs runs (0-based; figures measured in turns).
        """
        profiler = cProfile.Profile() if self.args.profile is not None else None
        got: list[tuple[list[float], dict[str, float]]] = []

        async def one() -> int:
            got.append(await work())
            return len(got[-1][0])

        for i in range(self.args.runs) if run_numbers is None else run_numbers:
            if profiler is not None:
                profiler.enable()
            try:
                t = await self._timed(one, server)
            finally:
                if profiler is not None:
                    profiler.disable()
            samples, detail = got[-1]
            rounded = {k: round(v, 3) for k, v in detail.items()}
            rate = t.units / t.seconds
            for figure, q in ((p50, 50), (p99, 99)):
                figure.runs.append(t.run(cw.percentile(samples, q), rate, rounded))
            if sent is not None:
                sent.runs.append(t.run(detail["sent_rate"], rate))
            self.say(
                f"  {p50.title.removesuffix(' p50')} run {i + 1}/{self.args.runs}: "
                f"p50 {cw.percentile(samples, 50):.3f} ms, p99 {cw.percentile(samples, 99):.3f} ms"
                f", max {max(samples):.3f} ms ({t.units} in {t.seconds:.2f} s, {t.cpu_text()}; "
                + ", ".join(f"{k} {v:.3g}" for k, v in detail.items() if k != "max_ms")
                + ")"
            )
        if profiler is not None:
            runs = "" if run_numbers is None else "-run" + "-".join(str(i + 1) for i in run_numbers)
            profiler.dump_stats(self.args.profile / f"client-{p50.key}{runs}.prof")

    def _add(self, figure: Figure) -> Figure:
        self.figures.append(figure)
        return figure

    # ------------------------------------------------------------------ produce
    async def produce(self) -> None:
        one_queue = wl.make_batches(self.args.messages)
        mixed = wl.make_mixed_batches(self.args.messages)
        for flush_mode in ("async", "sync"):
            # One-queue batches (each batch's keys of one queue), then mixed ones (keys in
            # arrival order: a batch spans every queue, one request since issue 35).
            for in_flight, batches, kind in ((1, one_queue, ""), (4, one_queue, ""),
                                             (1, mixed, "mixed.")):  # fmt: skip
                warmup = batches[: max(wl.QUEUES, min(40, len(batches) // 10))]
                key = f"produce.{flush_mode}.{kind}inflight{in_flight}"
                title = f"produce, {flush_mode} flush, {in_flight} in flight"
                figure = self._add(
                    Figure(
                        key,
                        title + (", mixed keys" if kind else ""),
                        "msg/s",
                        {
                            "api": "sdk.aio.Producer.send_batch",
                            "flush_mode": flush_mode,
                            "batches_in_flight": in_flight,
                            "batch_messages": wl.BATCH,
                            "batch_spans": "every queue" if kind else "one queue",
                            "body_bytes": wl.BODY_BYTES,
                            "keys": wl.KEYS,
                            "queues": wl.QUEUES,
                            "messages_per_run": sum(len(b.keys) for b in batches),
                        },
                    )
                )
                self.say(f"{figure.title}: starting a broker")
                with self._broker(key, flush_mode) as broker:
                    await self._produce_figure(figure, broker, batches, warmup, in_flight)
            await self._callers_figure(flush_mode)
            await self._callers_figure(flush_mode, threads=True)

    async def _callers_figure(self, flush_mode: str, *, threads: bool = False) -> None:
        """Single sends from wl.CALLERS concurrent callers, keys in arrival order, on a
        producer with natural batching (the keyed workload's second half, issue 35):
        asyncio tasks on an sdk.aio.Producer, or (`threads`) threads on a blocking
        sdk.Producer."""
        count = min(self.args.messages, CALLERS_QUICK if self.args.quick else CALLERS_MESSAGES)
        acc = AccumulatorConfig(linger=0)
        if threads:
            key = f"produce.{flush_mode}.mixed.threads{wl.CALLERS}"
            title = f"send(), {flush_mode} flush, {wl.CALLERS} threads, blocking, mixed keys"
            api = "sdk.Producer.send (blocking) from threads, one message per call"
        else:
            key = f"produce.{flush_mode}.mixed.callers{wl.CALLERS}"
            title = f"send(), {flush_mode} flush, {wl.CALLERS} callers, mixed keys"
            api = "sdk.aio.Producer.send from asyncio tasks, one message per call"
        figure = self._add(
            Figure(
                key,
                title,
                "msg/s",
                {
                    "api": f"{api}, each caller's next send when its previous returned",
                    "flush_mode": flush_mode,
                    "callers": wl.CALLERS,
                    "accumulator": {
                        "linger_seconds": acc.linger,
                        "max_requests_in_flight": acc.max_requests_in_flight,
                        "batch_max_messages": acc.batch_max_messages,
                    },
                    "body_bytes": wl.BODY_BYTES,
                    "keys": wl.KEYS,
                    "queues": wl.QUEUES,
                    "messages_per_run": count,
                },
            )
        )
        singles = wl.make_singles(count)
        warmup = wl.make_singles(max(wl.QUEUES * wl.CALLERS, min(2000, count // 10)))
        self.say(f"{figure.title}: starting a broker")
        with self._broker(key, flush_mode) as broker:
            admin = BrokerClient(broker.address)
            try:
                await admin.create_topic(PRODUCE_TOPIC, wl.QUEUES)
            finally:
                await admin.close()
            if threads:
                blocking = BlockingProducer(broker.address, config=ProducerConfig(accumulator=acc))
                await asyncio.to_thread(blocking.start)
                try:
                    sends = functools.partial(wl.send_from_threads, blocking, PRODUCE_TOPIC)
                    await asyncio.to_thread(sends, warmup)  # connect, warm up
                    await self._measure(
                        figure, functools.partial(asyncio.to_thread, sends, singles), broker
                    )
                finally:
                    await asyncio.to_thread(blocking.shutdown)
            else:
                producer = Producer(broker.address, config=ProducerConfig(accumulator=acc))
                await producer.start()
                try:
                    await wl.send_from_callers(producer, PRODUCE_TOPIC, warmup)  # warm up
                    await self._measure(
                        figure,
                        functools.partial(wl.send_from_callers, producer, PRODUCE_TOPIC, singles),
                        broker,
                    )
                finally:
                    await producer.shutdown()
        if any(r.units != count for r in figure.runs):
            raise RuntimeError(f"{figure.title}: sent {[r.units for r in figure.runs]}")

    async def _produce_figure(
        self,
        figure: Figure,
        broker: ServerProcess,
        batches: list[wl.Batch],
        warmup: list[wl.Batch],
        in_flight: int,
        endpoint: str | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        """`endpoint`: what the producer connects to (default the broker's gRPC address;
        the topic is created over gRPC either way); `tls`: how to reach a broker serving
        TLS (None: plain text)."""
        async with self._warm_producer(broker, warmup, in_flight, endpoint, tls) as producer:
            await self._measure(
                figure, lambda: wl.produce(producer, PRODUCE_TOPIC, batches, in_flight), broker
            )

    @contextlib.asynccontextmanager
    async def _warm_producer(
        self,
        broker: ServerProcess,
        warmup: list[wl.Batch],
        in_flight: int,
        endpoint: str | None = None,
        tls: TLSConfig | None = None,
        acl: AclCredentials | None = None,
    ) -> AsyncIterator[Producer]:
        """A started producer on `endpoint` (default the broker's gRPC address), warmed up
        with `warmup` on PRODUCE_TOPIC, created over gRPC; shut down afterwards. `acl`: the
        (client, admin) accounts of a broker with an ACL."""
        topic = PRODUCE_TOPIC
        admin = BrokerClient(broker.address, tls, acl[1] if acl else None)
        try:
            await admin.create_topic(topic, wl.QUEUES)
        finally:
            await admin.close()
        producer = Producer(
            endpoint or broker.address, tls=tls, credentials=acl[0] if acl else None
        )
        await producer.start()
        try:
            queues = await producer.fetch_publish_message_queues(topic)
            if len(queues) != wl.QUEUES:
                raise RuntimeError(f"{topic} has {len(queues)} queues, not {wl.QUEUES}")
            await wl.produce(producer, topic, warmup, in_flight)  # connect, route, warm up
            yield producer
        finally:
            await producer.shutdown()

    # ------------------------------------------------------------------ send
    async def send(self) -> None:
        """Single-message sends (issue 4); compare with "produce, async flush, 1 in flight"."""
        quick = self.args.quick
        sequential = SEND_SEQUENTIAL_QUICK if quick else SEND_SEQUENTIAL
        concurrent = SEND_CONCURRENT_QUICK if quick else SEND_CONCURRENT
        accumulated = min(self.args.messages, SEND_ACCUMULATOR_QUICK if quick else SEND_ACCUMULATOR)
        cases = [
            ("send.sequential", "send: await send(), 1 at a time", 1, False, sequential),
            (f"send.tasks{SEND_IN_FLIGHT}", f"send: send() tasks, {SEND_IN_FLIGHT} in flight",
             SEND_IN_FLIGHT, False, concurrent),
            (f"send.accumulator.tasks{SEND_IN_FLIGHT}",
             f"send: accumulator, send() tasks, {SEND_IN_FLIGHT} in flight",
             SEND_IN_FLIGHT, True, accumulated),
            (f"send.accumulator.tasks{SEND_ACCUMULATOR_IN_FLIGHT}",
             f"send: accumulator, send() tasks, {SEND_ACCUMULATOR_IN_FLIGHT:,} in flight",
             SEND_ACCUMULATOR_IN_FLIGHT, True, accumulated),
        ]  # fmt: skip
        for key, title, in_flight, accumulator, count in cases:
            acc = AccumulatorConfig()
            config = ProducerConfig(accumulator=acc) if accumulator else None
            figure = self._add(
                Figure(
                    key,
                    title,
                    "msg/s",
                    {
                        "api": "sdk.aio.Producer.send, one message per call",
                        "flush_mode": "async",
                        "sends_in_flight": in_flight,
                        "task_per_send": in_flight > 1,
                        "accumulator": (
                            {
                                "batch_max_messages": acc.batch_max_messages,
                                "batch_max_bytes": acc.batch_max_bytes,
                                "linger_seconds": acc.linger,
                            }
                            if accumulator
                            else None
                        ),
                        "body_bytes": wl.BODY_BYTES,
                        "keys": wl.KEYS,
                        "queues": wl.QUEUES,
                        "messages_per_run": count,
                        "compare_with": "produce.async.inflight1 (send_batch of 100)",
                    },
                )
            )
            singles = wl.make_singles(count)
            warmup = wl.make_singles(max(wl.QUEUES * 10, min(2000, count // 10)))
            self.say(f"{figure.title}: starting a broker")
            with self._broker(key, "async") as broker:
                topic = "bench-send"
                admin = BrokerClient(broker.address)
                try:
                    await admin.create_topic(topic, wl.QUEUES)
                finally:
                    await admin.close()
                producer = Producer(broker.address, config=config)
                await producer.start()
                try:
                    await wl.send_singles(producer, topic, warmup, in_flight)  # connect, warm up
                    await self._measure(
                        figure,
                        functools.partial(wl.send_singles, producer, topic, singles, in_flight),
                        broker,
                    )
                finally:
                    await producer.shutdown()
            if any(r.units != count for r in figure.runs):
                raise RuntimeError(f"{figure.title}: sent {[r.units for r in figure.runs]}")

    # ------------------------------------------------------------------ pull
    async def pull(self) -> None:
        topic = "bench-pull"
        backlog = self.args.messages
        params = {
            "api": "BrokerClient.pull (decoded MessageExt)",
            "backlog_messages": backlog,
            "queues": wl.QUEUES,
            "max_messages": wl.PULL_MAX_MESSAGES,
            "max_bytes": wl.PULL_MAX_BYTES,
            "body_bytes": wl.BODY_BYTES,
        }
        sequential = self._add(
            Figure(
                "pull.sequential",
                "pull, 1 queue at a time, 1 in flight",
                "msg/s",
                {**params, "pulls_in_flight": 1},
            )
        )
        prefetch = self._add(
            Figure(
                "pull.prefetch",
                f"pull, {wl.QUEUES} queues at once, next prefetched",
                "msg/s",
                {**params, "pulls_in_flight": wl.QUEUES},
            )
        )
        self.say("pull: starting a broker")
        with self._broker("pull", "async") as broker:
            started = time.perf_counter()
            stored = await wl.fill_backlog(broker.address, topic, backlog)
            self.facts["pull_backlog_fill_seconds"] = round(time.perf_counter() - started, 2)
            self.say(
                f"  backlog of {stored} messages stored in {time.perf_counter() - started:.1f} s"
            )
            queues = wl.queues_of(topic)
            raw = await wl.raw_pull(broker.address, queues[0])
            self.facts["pull_response_bytes"] = raw.ByteSize()
            self.facts["pull_response_messages"] = raw.record_count
            self.facts["pull_records"] = raw.records
            client = BrokerClient(broker.address)
            try:
                await wl.pull_sequential(client, queues[:1])  # connect, warm up
                await self._measure(sequential, lambda: wl.pull_sequential(client, queues), broker)
                await self._measure(prefetch, lambda: wl.pull_prefetch(client, queues), broker)
            finally:
                await client.close()
            self._note_rss("pull", broker)
        for figure in (sequential, prefetch):
            if any(r.units != stored for r in figure.runs):
                raise RuntimeError(f"{figure.title}: read {figure.runs} of {stored} messages")

    # ------------------------------------------------------------------ consume
    async def consume(self) -> None:
        topic = "bench-consume"
        backlog = self.args.messages
        params = {
            "api": "sdk.aio.PushConsumer",
            "backlog_messages": backlog,
            "queues": wl.QUEUES,
            "keys": wl.KEYS,
            "body_bytes": wl.BODY_BYTES,
            "consume_from_where": "FIRST_OFFSET",
            "consumers": 1,
        }
        cases = [
            ("orderly.async.batch1", "consume orderly, async listener, batch 1",
             "orderly-async", 1, "pull"),
            ("orderly.async.batch32", "consume orderly, async listener, batch 32",
             "orderly-async", 32, "pull"),
            ("orderly.threads.batch1", "consume orderly, thread-pool listener, batch 1",
             "orderly-sync", 1, "pull"),
            ("orderly.threads.batch32", "consume orderly, thread-pool listener, batch 32",
             "orderly-sync", 32, "pull"),
            ("concurrent.async.batch32", "consume concurrently, async listener, batch 32",
             "concurrent-async", 32, "pull"),
        ]  # fmt: skip
        # each with push delivery too (issue 40), its runs taking turns with the pull one's
        cases += [
            (f"{key}.push", f"{title}, push delivery", listener, batch, "push")
            for key, title, listener, batch, _ in cases
        ]
        figures = [
            self._add(
                Figure(
                    f"consume.{key}",
                    title,
                    "msg/s",
                    {
                        **params,
                        "listener": {
                            "orderly-async": "MessageListenerOrderly, async def, no-op",
                            "orderly-sync": "MessageListenerOrderly, plain def on the "
                            "consumer's thread pool, no-op",
                            "concurrent-async": "MessageListenerConcurrently, async def, no-op",
                        }[listener],
                        "consume_message_batch_max_size": batch,
                        "delivery": delivery,
                        "runs_taken": "in turns, pull and push delivery alternating",
                    },
                )
            )
            for key, title, listener, batch, delivery in cases
        ]
        self.say("consume: starting a broker")
        with self._broker("consume", "async") as broker:
            stored = await self._consume_backlog("consume", broker, topic, broker.address)
            pairs = len(cases) // 2
            for i in range(self.args.runs):
                for p in range(pairs):
                    # pull then push, push then pull: a change of load falls on both
                    pair = (p, p + pairs) if (i + p) % 2 == 0 else (p + pairs, p)
                    for n in pair:
                        _key, _title, listener, batch, delivery = cases[n]
                        await self._consume_figure(figures[n], broker, broker.address, topic,
                                                   stored, listener, batch, delivery=delivery,
                                                   run_numbers=[i])  # fmt: skip
            self._note_rss("consume", broker)
        ways = zip(cases[:pairs], figures[:pairs], figures[pairs:], strict=True)
        self.facts["consume_push_over_pull"] = {
            key: round(statistics.median(push.values()) / statistics.median(pull.values()), 3)
            for (key, *_), pull, push in ways
            if pull.values() and push.values()
        }

    async def keymode(self) -> None:
        """Orderly listeners that work 5 ms a message, in queue mode and in key mode.

        The keyed workload's backlog (KEYS keys over QUEUES queues) read by one push
        consumer whose listener waits KEYMODE_WORK per message, as for I/O: a plain one
        (time.sleep, on KEYMODE_THREADS threads) and an `async def` one (asyncio.sleep,
        at most KEYMODE_THREADS calls at once). In queue mode a queue's messages are
        called one at a time, so the queues bound the calls at once; in key mode up to
        max_keys_in_flight_per_queue keys of each queue run side by side (issue 20).
        """
        topic = "bench-keymode"
        backlog = min(self.args.messages, KEYMODE_QUICK if self.args.quick else KEYMODE_MESSAGES)
        params = {
            "api": "sdk.aio.PushConsumer",
            "backlog_messages": backlog,
            "queues": wl.QUEUES,
            "keys": wl.KEYS,
            "consume_threads": KEYMODE_THREADS,
            "max_keys_in_flight_per_queue": PushConsumerConfig().max_keys_in_flight_per_queue,
            "consume_message_batch_max_size": 1,
        }
        listeners = {
            "threads": f"MessageListenerOrderly, plain def, time.sleep({KEYMODE_WORK})",
            "async": f"MessageListenerOrderly, async def, asyncio.sleep({KEYMODE_WORK})",
        }
        cases = [(kind, o) for kind in listeners for o in ProcessingOrder]
        figures: dict[tuple[str, ProcessingOrder], Figure] = {}
        for kind, ordering in cases:
            extra = (
                {"compare_with": f"keymode.{kind}.queue"} if ordering is ProcessingOrder.KEY else {}
            )
            figures[(kind, ordering)] = self._add(
                Figure(
                    f"keymode.{kind}.{ordering.value}",
                    f"consume orderly, {KEYMODE_WORK * 1000:g} ms {kind} listener, "
                    f"{ordering.value} mode",
                    "msg/s",
                    {
                        **params,
                        "listener": listeners[kind],
                        "ordering": f"ProcessingOrder.{ordering.name}",
                        **extra,
                    },
                )
            )
        seconds = KEYMODE_LATENCY_QUICK_SECONDS if self.args.quick else KEYMODE_LATENCY_SECONDS
        latency = {o: self._keymode_latency_figures(o, seconds) for o in ProcessingOrder}
        self.say("keymode: starting a broker")
        with self._broker("keymode", "async") as broker:
            # every queue gets its share (fill_backlog's default batch is one queue's 1 000)
            stored = await wl.fill_backlog(
                broker.address, topic, backlog, batch=max(1, backlog // (4 * wl.QUEUES))
            )
            for (kind, ordering), figure in figures.items():
                trial = cw.KeyModeTrial(
                    broker.address, topic, stored, ordering, KEYMODE_WORK, KEYMODE_THREADS,
                    on_loop=kind == "async",
                )  # fmt: skip
                await self._measure(
                    figure, trial.run, broker, setup=trial.prepare, teardown=trial.close
                )
                if any(r.units != stored for r in figure.runs):
                    raise RuntimeError(
                        f"{figure.title}: took {[r.units for r in figure.runs]} of {stored}"
                    )
            for ordering, (p50, p99) in latency.items():
                await self._keymode_latency(broker, ordering, seconds, p50, p99)
        self.facts["keymode_ratios"] = {
            kind: round(
                statistics.median(figures[(kind, ProcessingOrder.KEY)].values())
                / statistics.median(figures[(kind, ProcessingOrder.QUEUE)].values()),
                2,
            )
            for kind in listeners
        }
        p99s = {o: statistics.median(p99.values()) for o, (_p50, p99) in latency.items()}
        if p99s[ProcessingOrder.KEY] > 0:
            self.facts["keymode_p99_ratio"] = round(
                p99s[ProcessingOrder.QUEUE] / p99s[ProcessingOrder.KEY], 2
            )

    def _keymode_latency_figures(
        self, ordering: ProcessingOrder, seconds: float
    ) -> tuple[Figure, Figure]:
        """The p50 and p99 figures of one mode's send-to-call latency (_keymode_latency)."""
        params = {
            "api": "sdk.aio.Producer.send per message -> sdk.aio.PushConsumer, orderly, "
            f"async def listener, asyncio.sleep({KEYMODE_WORK}) after recording",
            "ordering": f"ProcessingOrder.{ordering.name}",
            "rate_msg_per_s": KEYMODE_RATE,
            "seconds_per_run": seconds,
            "queues": wl.QUEUES,
            "keys": wl.KEYS,
            "from": "just before send()",
            "to": "the start of the message's listener call",
        }
        name = f"keymode.latency.{ordering.value}"
        title = f"send to call at {KEYMODE_RATE:,} msg/s, 5 ms listener, {ordering.value} mode"
        return self._percentiles(name, title, params)

    def _percentiles(self, name: str, title: str, params: dict[str, Any]) -> tuple[Figure, Figure]:
        """The p50 and p99 figures (ms per message) of one latency measurement."""
        p50, p99 = (
            self._add(
                Figure(
                    f"{name}.{q}",
                    f"{title} {q}",
                    "ms",
                    {**params, "percentile": int(q[1:])},
                    higher_is_better=False,
                    per="msg",
                )
            )
            for q in ("p50", "p99")
        )
        return p50, p99

    async def _keymode_latency(
        self, broker: ServerProcess, ordering: ProcessingOrder, seconds: float,
        p50: Figure, p99: Figure,
    ) -> None:  # fmt: skip
        """Each message's wait for its call at KEYMODE_RATE keyed sends a second.

        Keys go round robin, so in key mode a message rarely waits behind its own key;
        in queue mode it waits behind every earlier message of its queue.
        """
        topic = f"bench-keymode-latency-{ordering.value}"
        admin = BrokerClient(broker.address)
        producer = Producer(broker.address)
        recorder = cw.WorkingLatencyRecorder(KEYMODE_WORK)
        consumer = PushConsumer(
            f"{topic}-group",
            broker.address,
            ordering=ordering,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            config=PushConsumerConfig(consume_threads=KEYMODE_THREADS),
        )
        try:
            await admin.create_topic(topic, wl.QUEUES)
            await producer.start()
            consumer.subscribe(topic)
            consumer.register_message_listener(recorder)
            await consumer.start()
            await cw.until_held(admin, wl.QUEUES)
            keys = wl.make_keys()

            def send(n: int) -> Awaitable[tuple[list[float], dict[str, float]]]:
                return cw.e2e_latency(
                    producer, recorder, topic, keys, KEYMODE_RATE, n, E2E_SENDS_IN_FLIGHT
                )

            await send(KEYMODE_RATE // 2)  # warm up: half a second
            count = int(KEYMODE_RATE * seconds)
            await self._measure_latency(p50, p99, lambda: send(count), broker)
        finally:
            await consumer.shutdown()
            await producer.shutdown()
            await admin.close()

    async def _consume_backlog(
        self,
        group: str,
        broker: ServerProcess,
        topic: str,
        endpoint: str,
        tls: TLSConfig | None = None,
        acl: AclCredentials | None = None,
    ) -> int:
        """Store the --messages backlog in `topic` (over gRPC), then warm up: a consumer on
        `endpoint` that stops after a tenth of it. Returns the messages stored. `tls`: how
        to reach a broker serving TLS (None: plain text); `acl`: the (client, admin)
        accounts of a broker with an ACL."""
        started = time.perf_counter()
        stored = await wl.fill_backlog(
            broker.address, topic, self.args.messages, tls=tls, credentials=acl[1] if acl else None
        )
        self.facts[f"{group}_backlog_fill_seconds"] = round(time.perf_counter() - started, 2)
        self.say(f"  backlog of {stored} messages stored in {time.perf_counter() - started:.1f} s")
        warm = cw.ConsumeTrial(
            endpoint, topic, max(1, stored // 10), "orderly-async", 32, tls, acl[0] if acl else None
        )
        await warm.prepare()
        try:
            await warm.run()
        finally:
            await warm.close()
        return stored

    async def _consume_figure(
        self,
        figure: Figure,
        broker: ServerProcess,
        endpoint: str,
        topic: str,
        stored: int,
        listener: str,
        batch: int,
        tls: TLSConfig | None = None,
        delivery: str = "pull",
        run_numbers: Sequence[int] | None = None,
    ) -> None:
        """--runs fresh push consumers on `endpoint` (or the runs of `run_numbers`), each
        reading the whole backlog with `delivery`."""
        trial = cw.ConsumeTrial(endpoint, topic, stored, listener, batch, tls, delivery=delivery)
        await self._measure(figure, trial.run, broker, setup=trial.prepare, teardown=trial.close,
                            run_numbers=run_numbers)  # fmt: skip
        if any(r.units != stored for r in figure.runs):
            raise RuntimeError(
                f"{figure.title}: listener saw {[r.units for r in figure.runs]} "
                f"of {stored} messages"
            )

    # ------------------------------------------------------------------ broker memory
    def _note_rss(self, group: str, broker: ServerProcess) -> None:
        """Keep the peak RSS of a backlog group's broker (lifetime: filling the backlog and
        every run reading it)."""
        rss = broker.peak_rss_mb()
        if rss is not None:
            self.backlog_rss_mb[group] = rss
            self.facts[f"{group}_broker_peak_rss_mb"] = round(rss, 1)
            self.say(f"  {group} broker peak RSS {rss:.1f} MB")

    def rss_figure(self) -> None:
        """One figure: the larger peak RSS of the pull and consume brokers (issue 7).

        Each of those brokers stored the whole backlog and served every run reading it, so
        its VmHWM is comparable with the peers' (bench/peers: VmHWM after producing and
        consuming the same backlog). Peak RSS is per process lifetime, so there is one
        value, not one per run.
        """
        if not self.backlog_rss_mb:
            return
        backlog = self.args.messages
        group, rss = max(self.backlog_rss_mb.items(), key=lambda kv: kv[1])
        figure = self._add(
            Figure(
                "broker.rss.backlog",
                "broker peak RSS, " + f"{backlog:,}".replace(",", " ") + "-message backlog",
                "MB",
                {
                    "what": "VmHWM of the broker process (/proc/PID/status), MB = 10^6 bytes",
                    "brokers": sorted(self.backlog_rss_mb),
                    "value_from": group,
                    "backlog_messages": backlog,
                    "body_bytes": wl.BODY_BYTES,
                    "queues": wl.QUEUES,
                },
                higher_is_better=False,
            )
        )
        detail = {f"{g}_mb": round(v, 1) for g, v in self.backlog_rss_mb.items()}
        figure.runs.append(Run(rss, 0.0, backlog, detail=detail))

    # ------------------------------------------------------------------ poll
    async def poll(self) -> None:
        """Lite pull consumers draining a backlog with a plain poll loop (issue 6)."""
        topic = "bench-poll"
        backlog = self.args.messages
        params = {
            "backlog_messages": backlog,
            "queues": wl.QUEUES,
            "keys": wl.KEYS,
            "body_bytes": wl.BODY_BYTES,
            "consume_from_where": "FIRST_OFFSET",
            "auto_commit": True,
            "poll_timeout_seconds": cw.POLL_TIMEOUT_SECONDS,
            "config": "LitePullConsumerConfig defaults",
            "consumers": 1,
        }
        cases = [
            ("poll.aio", "poll loop, sdk.aio.LitePullConsumer", False,
             "sdk.aio.LitePullConsumer, `while batch := await c.poll(timeout)`", "push"),
            ("poll.blocking", "poll loop, blocking sdk.LitePullConsumer", True,
             "sdk.LitePullConsumer, `while batch := c.poll(timeout)` in a thread", "push"),
        ]  # fmt: skip
        # each with pull delivery too (issue 40: push is the default), runs taking turns
        cases += [
            (f"{key}.pull", f"{title}, pull delivery", blocking, api, "pull")
            for key, title, blocking, api, _ in cases
        ]
        # ... and the blocking loop handing each message to the listener of the orderly
        # thread-pool figure at batch size 1: what that figure is read against (issue 40)
        cases.append(
            ("poll.blocking.listener",
             "poll loop, blocking sdk.LitePullConsumer, the orderly figure's listener each",
             True, "sdk.LitePullConsumer, `for m in c.poll(timeout): consume_message([m], "
             "context)` in a thread (consuming.SyncOrderlyCounter)", "push")
        )  # fmt: skip
        figures = [
            self._add(Figure(key, title, "msg/s", {**params, "api": api, "delivery": delivery}))
            for key, title, _blocking, api, delivery in cases
        ]
        self.say("poll: starting a broker")
        with self._broker("poll", "async") as broker:
            started = time.perf_counter()
            stored = await wl.fill_backlog(broker.address, topic, backlog)
            self.facts["poll_backlog_fill_seconds"] = round(time.perf_counter() - started, 2)
            self.say(
                f"  backlog of {stored} messages stored in {time.perf_counter() - started:.1f} s"
            )
            warm = cw.PollTrial(broker.address, topic, max(1, stored // 10), False)
            trials = [
                (
                    figure,
                    cw.PollTrial(
                        broker.address, topic, stored, blocking, delivery, key.endswith("listener")
                    ),
                )
                for figure, (key, _title, blocking, _api, delivery) in zip(
                    figures, cases, strict=True
                )
            ]
            await self._measure_trials(broker, warm, trials, stored)
        ways = zip(cases[:2], figures[:2], figures[2:4], strict=True)
        self.facts["poll_push_over_pull"] = {
            key: round(statistics.median(push.values()) / statistics.median(pull.values()), 3)
            for (key, *_), push, pull in ways
            if pull.values() and push.values()
        }

    # ------------------------------------------------------------------ receive
    async def receive(self) -> None:
        """SimpleConsumer workers receiving and acking a backlog as jobs, next to a poll loop
        on the same backlog (issue 36)."""
        topic = "bench-receive"
        backlog = min(self.args.messages, rc.MESSAGES_QUICK if self.args.quick else rc.MESSAGES)
        params = {
            "backlog_messages": backlog,
            "queues": wl.QUEUES,
            "keys": wl.KEYS,
            "body_bytes": wl.BODY_BYTES,
        }
        receiving = {
            "workers": rc.WORKERS,
            "max_messages": rc.BATCH,
            "invisible_duration_seconds": rc.INVISIBLE_SECONDS,
            "await_duration_seconds": 0,
            "acks": "one ack() per message",
        }
        cases = [
            ("receive.aio", "receive + ack, 8 tasks, sdk.aio.SimpleConsumer", False,
             "sdk.aio.SimpleConsumer shared by 8 tasks, each `receive(16)` then `ack()` each"),
            ("receive.blocking", "receive + ack, 8 threads, blocking sdk.SimpleConsumer", True,
             "sdk.SimpleConsumer shared by 8 threads, each `receive(16)` then `ack()` each"),
        ]  # fmt: skip
        figures = [
            self._add(Figure(key, title, "msg/s", {**params, **receiving, "api": api}))
            for key, title, _blocking, api in cases
        ]
        poll = self._add(
            Figure(
                "receive.poll_aio",
                "poll loop on the receive backlog, sdk.aio.LitePullConsumer",
                "msg/s",
                {**params, "api": "sdk.aio.LitePullConsumer, as the poll group", "consumers": 1},
            )
        )
        self.say("receive: starting a broker")
        with self._broker("receive", "async") as broker:
            stored = await wl.fill_backlog(broker.address, topic, backlog)
            warm = rc.ReceiveTrial(broker.address, topic, max(1, stored // 10), False)
            trials: list[tuple[Figure, Trial]] = [
                (figure, rc.ReceiveTrial(broker.address, topic, stored, blocking))
                for figure, (_key, _title, blocking, _api) in zip(figures, cases, strict=True)
            ]
            trials.append((poll, cw.PollTrial(broker.address, topic, stored, False)))
            await self._measure_trials(broker, warm, trials, stored)

    # ------------------------------------------------------------------ latency
    async def latency(self) -> None:
        quick = self.args.quick
        wakeups = LONGPOLL_WAKEUPS // 4 if quick else LONGPOLL_WAKEUPS
        e2e_seconds = E2E_QUICK_SECONDS if quick else E2E_SECONDS
        lp_params = {
            "api": "BrokerClient.pull(suspend_timeout) woken by sdk.aio.Producer.send",
            "suspend_seconds": LONGPOLL_SUSPEND,
            "wakeups_per_run": wakeups,
            "body_bytes": wl.BODY_BYTES,
            "from": "just before send()",
            "to": "the held pull returned (decoded)",
        }
        lp = [
            self._add(
                Figure(
                    f"latency.longpoll.{name}",
                    f"long-poll wake-up {name}",
                    "ms",
                    {**lp_params, "percentile": q},
                    higher_is_better=False,
                    per="wake-up",
                )
            )
            for name, q in (("p50", 50), ("p99", 99))
        ]
        self.say("latency: starting a broker")
        with self._broker("latency", "async") as broker:
            admin = BrokerClient(broker.address)
            producer = Producer(broker.address)
            try:
                await admin.create_topic("bench-longpoll", wl.QUEUES)
                await producer.start()
                queue = MessageQueue("bench-longpoll", "broker-a", 0)
                key = wl.keys_by_queue(wl.make_keys())[0][0]

                def wake(n: int) -> Awaitable[tuple[list[float], dict[str, float]]]:
                    return cw.longpoll_wakeups(admin, producer, queue, key, n, LONGPOLL_SUSPEND)

                await wake(10)  # connect, warm up
                await self._measure_latency(lp[0], lp[1], lambda: wake(wakeups), broker)
                for face in E2E_CONSUMERS:
                    await self._e2e(face, e2e_seconds, admin, producer, broker)
            finally:
                await producer.shutdown()
                await admin.close()
        await self._e2e_procs()

    async def _e2e(
        self,
        face: str,
        seconds: float,
        admin: BrokerClient,
        producer: Producer,
        broker: ServerProcess,
    ) -> None:
        """End-to-end latency figures at each of E2E_RATES, through one consumer face.

        face "blocking": sdk.PushConsumer with a plain `def` listener (its own loop thread,
        listener on its thread pool), as a blocking service would run it; "aio":
        sdk.aio.PushConsumer with an `async def` listener on the benchmark's own loop;
        "push": "aio" with PushConsumerConfig(delivery="push") (the broker sends each
        queue's batches within credits instead of answering pulls).
        """
        topic = f"bench-e2e-{face}"
        api = {
            "blocking": "sdk.PushConsumer (blocking), orderly, plain def no-op listener",
            "aio": "sdk.aio.PushConsumer, orderly, async def no-op listener",
            "push": "sdk.aio.PushConsumer, orderly, delivery='push', async def no-op listener",
        }[face]
        figures: list[tuple[int, Figure, Figure, Figure]] = []
        for rate in E2E_RATES:
            params = {
                "api": f"sdk.aio.Producer.send per message (default ProducerConfig: "
                f"natural batching) -> {api}",
                "rate_msg_per_s": rate,
                "seconds_per_run": seconds,
                "messages_per_run": int(rate * seconds),
                "max_sends_in_flight": E2E_SENDS_IN_FLIGHT,
                "consume_message_batch_max_size": 1,
                "queues": wl.QUEUES,
                "keys": wl.KEYS,
                "body_bytes": wl.BODY_BYTES,
                "same_process": "producer and consumer share the client process",
            }
            name = f"latency.e2e.{face}.rate{rate}"
            title = f"e2e latency at {rate:,} msg/s, {face} consumer"
            p50, p99 = self._percentiles(name, title, params)
            sent = self._add(
                Figure(
                    f"{name}.sent",
                    f"{title}: rate sent",
                    "msg/s",
                    {**params, "what": "messages sent / time from the first to the last send"},
                )
            )
            figures.append((rate, p50, p99, sent))
        await admin.create_topic(topic, wl.QUEUES)
        recorder = cw.LatencyRecorder()
        listener = recorder if face != "blocking" else cw.BlockingLatencyRecorder(recorder)
        consumer: PushConsumer | BlockingPushConsumer
        if face != "blocking":
            consumer = PushConsumer(
                f"{topic}-group",
                broker.address,
                consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                config=PushConsumerConfig(delivery="push" if face == "push" else "pull"),
            )
        else:
            consumer = BlockingPushConsumer(
                f"{topic}-group", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
            )
        consumer.subscribe(topic)
        consumer.register_message_listener(listener)
        if isinstance(consumer, PushConsumer):
            await consumer.start()
        else:
            await asyncio.to_thread(consumer.start)
        try:
            # every queue's pull (or push subscription) is waiting
            await cw.until_held(admin, wl.QUEUES)
            keys = wl.make_keys()
            for rate, p50, p99, sent in figures:

                def send(n: int, rate: int = rate) -> Awaitable[Any]:
                    return cw.e2e_latency(
                        producer, recorder, topic, keys, rate, n, E2E_SENDS_IN_FLIGHT
                    )

                count = int(rate * seconds)
                await send(min(rate // 2, count))  # warm up: half a second, at most a run
                await self._measure_latency(
                    p50, p99, lambda send=send, count=count: send(count), broker, sent
                )
        finally:
            if isinstance(consumer, PushConsumer):
                await consumer.shutdown()
            else:
                await asyncio.to_thread(consumer.shutdown)

    async def _e2e_procs(self) -> None:
        """End-to-end latency with the paced producer in a process of its own (issue 40):
        each (face, flush mode, rate) of e2e_procs.plan(), one broker per flush mode, then
        Redis Streams' at the same rates when it is installed, and the ratios."""
        seconds = ep.QUICK_SECONDS if self.args.quick else ep.SECONDS
        figures = {
            (face, flush, rate): self._e2e_procs_figures(face, flush, rate, seconds)
            for face, flush, rate in ep.plan()
        }
        for flush in dict.fromkeys(flush for _, flush, _ in figures):
            self.say(f"latency: separate producer process, starting a broker ({flush} flush)")
            with self._broker(f"latency-procs-{flush}", flush) as broker:
                admin = BrokerClient(broker.address)
                try:
                    async with ep.producer_process(broker.address, E2E_SENDS_IN_FLIGHT) as sender:
                        for face in dict.fromkeys(f for f, fl, _ in figures if fl == flush):
                            runs = {
                                r: fs
                                for (f, fl, r), fs in figures.items()
                                if (f, fl) == (face, flush)
                            }
                            await self._e2e_procs_face(
                                face, flush, runs, seconds, admin, sender, broker
                            )
                finally:
                    await admin.close()
        missing = ep.redis_missing()
        if missing is None:
            settings = {ep.REDIS_FSYNC["async"]: ep.RATES, ep.REDIS_FSYNC["sync"]: ep.SYNC_RATES}
            self.say("latency: Redis Streams' e2e at the same rates")
            try:
                self.e2e_redis = await asyncio.to_thread(
                    ep.redis_latency, settings, seconds, self.args.runs, self.say
                )
            except Exception as exc:  # the peer's failure is a note, not ordermq's failure
                missing = f"failed: {type(exc).__name__}: {exc}"
        self.facts["e2e_procs_redis"] = {
            fsync: {str(rate): v for rate, v in by_rate.items()}
            for fsync, by_rate in self.e2e_redis.items()
        }
        if missing is not None:
            self.facts["e2e_procs_redis_skipped"] = missing
        self.facts["e2e_procs"] = ep.ratios(ep.medians(self.figures), self.e2e_redis)

    def _e2e_procs_figures(
        self, face: str, flush: str, rate: int, seconds: float
    ) -> tuple[Figure, Figure, Figure]:
        """The p50, p99 and rate-sent figures of one separate-process e2e measurement."""
        params = {
            "api": f"sdk.aio.Producer.send per message (default ProducerConfig: natural "
            f"batching) in bench/paced_producer.py -> {ep.API[face]}",
            "separate_processes": True,
            "processes": "the paced producer runs in a process of its own; this process "
            "only consumes",
            "flush_mode": flush,
            "rate_msg_per_s": rate,
            "seconds_per_run": seconds,
            "messages_per_run": int(rate * seconds),
            "max_sends_in_flight": E2E_SENDS_IN_FLIGHT,
            "queues": wl.QUEUES,
            "keys": wl.KEYS,
            "body_bytes": wl.BODY_BYTES,
            "clock": "time.perf_counter_ns (CLOCK_MONOTONIC, shared by the processes)",
        }
        name = ep.figure_name(face, flush, rate)
        title = f"e2e latency at {rate:,} msg/s, {face} consumer, {flush} flush, separate processes"
        p50, p99 = self._percentiles(name, title, params)
        what = "messages sent / time from the first to the last send (the producer's process)"
        sent = self._add(
            Figure(f"{name}.sent", f"{title}: rate sent", "msg/s", {**params, "what": what})
        )
        return p50, p99, sent

    async def _e2e_procs_face(
        self,
        face: str,
        flush: str,
        runs: dict[int, tuple[Figure, Figure, Figure]],
        seconds: float,
        admin: BrokerClient,
        sender: ep.ProducerProcess,
        broker: ServerProcess,
    ) -> None:
        """One consumer face (e2e_procs.FACES) at each rate of `runs`, fed by `sender`."""
        topic = f"bench-e2e-procs-{face}-{flush}"
        group = f"{topic}-group"
        await admin.create_topic(topic, wl.QUEUES)
        recorder = cw.LatencyRecorder()
        consumer: PushConsumer | LitePullConsumer
        poller: asyncio.Task[None] | None = None
        if face == "litepull":
            consumer = LitePullConsumer(
                group, broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
            )
            consumer.subscribe(topic)
            await consumer.start()
            poller = asyncio.create_task(ep.poll_into(consumer, recorder))
        else:
            consumer = PushConsumer(
                group,
                broker.address,
                consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                config=PushConsumerConfig(delivery="push"),
            )
            consumer.subscribe(topic)
            listener = recorder if face == "push" else ep.ConcurrentLatencyRecorder(recorder)
            consumer.register_message_listener(listener)
            await consumer.start()
        try:
            await cw.until_held(admin, wl.QUEUES)
            for rate, (p50, p99, sent) in runs.items():

                def send(n: int, rate: int = rate) -> Awaitable[Any]:
                    return ep.e2e_latency(sender, recorder, topic, rate, n)

                count = int(rate * seconds)
                await send(min(rate // 2, count))  # warm up: half a second, at most a run
                await self._measure_latency(
                    p50, p99, lambda send=send, count=count: send(count), broker, sent
                )
        finally:
            if poller is not None:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await poller
            await consumer.shutdown()

    # ------------------------------------------------------------------ stream
    async def stream(self) -> None:
        """ExchangeBatched against plain Exchange on one broker (issues 35 and 40).

        The 8 callers' single sends (as produce's, async flush; and again on producers
        without an accumulator) on a producer per way, the ways taking turns run by run;
        then end-to-end latency at STREAM_E2E_RATE through the orderly aio PushConsumer,
        pull and push delivery, each way in turn (its own producer, consumer and topic).
        What the writers wrote is counted (bench/stream.py).
        """
        quick = self.args.quick
        count = min(self.args.messages, CALLERS_QUICK if quick else STREAM_CALLERS_MESSAGES)
        seconds = E2E_QUICK_SECONDS if quick else STREAM_E2E_SECONDS
        natural = AccumulatorConfig(linger=0)
        # The natural batching producer's accumulator already makes one request of what
        # the callers send meanwhile; without one, each send is a request of its own.
        workloads = (
            (f"callers{wl.CALLERS}", natural, "natural batching"),
            (f"callers{wl.CALLERS}.unbatched", None, "no accumulator"),
        )
        callers: dict[tuple[str, str], Figure] = {}
        for workload, acc, how in workloads:
            for mode, name in st.MODES:
                callers[(workload, mode)] = self._add(
                    Figure(
                        f"stream.{mode}.{workload}",
                        f"stream: send(), {wl.CALLERS} callers, {how}, {name}",
                        "msg/s",
                        {
                            "api": "sdk.aio.Producer.send, one message per call, each "
                            "caller's next send when its previous returned",
                            "stream": name,
                            "flush_mode": "async",
                            "callers": wl.CALLERS,
                            "accumulator": None
                            if acc is None
                            else {
                                "linger_seconds": acc.linger,
                                "max_requests_in_flight": acc.max_requests_in_flight,
                            },
                            "body_bytes": wl.BODY_BYTES,
                            "keys": wl.KEYS,
                            "queues": wl.QUEUES,
                            "messages_per_run": count,
                            "compare_with": f"stream.plain.{workload}",
                        },
                    )
                )
        per_message: dict[str, dict[str, float | None]] = {}
        singles = wl.make_singles(count)
        warmup = wl.make_singles(max(wl.QUEUES * wl.CALLERS, min(2000, count // 10)))
        self.say("stream: starting a broker")
        with (
            # ExchangeBatched against Exchange: both on gRPC, so the port is off
            self._broker("stream", "async", ("--exchange-port", "off")) as broker,
            st.counting() as written,
            st.forcing(),
        ):
            admin = BrokerClient(broker.address)
            producers: dict[tuple[str, str], Producer] = {}
            try:
                await admin.create_topic(PRODUCE_TOPIC, wl.QUEUES)
                for workload, acc, _how in workloads:
                    for mode, _name in st.MODES:
                        with _way(mode):
                            producer = producers[(workload, mode)] = Producer(
                                broker.address, config=ProducerConfig(accumulator=acc)
                            )
                            await producer.start()
                            await wl.send_from_callers(producer, PRODUCE_TOPIC, warmup)
                for workload, _acc, _how in workloads:
                    runs: dict[str, list[float | None]] = {mode: [] for mode, _name in st.MODES}
                    for i in range(self.args.runs):
                        for mode, _name in st.MODES:  # in turns: drift hits both ways
                            figure = callers[(workload, mode)]
                            written.reset()
                            with _way(mode):
                                await self._measure(
                                    figure,
                                    functools.partial(
                                        wl.send_from_callers,
                                        producers[(workload, mode)],
                                        PRODUCE_TOPIC,
                                        singles,
                                    ),
                                    broker,
                                    run_numbers=[i],
                                )
                            written.check(mode, figure.title)
                            runs[mode].append(written.per_message(mode))
                    per_message[workload] = _median_of(runs)
                for face in ("aio", "push"):
                    per_message[f"e2e.{face}"] = await self._stream_e2e(
                        broker, admin, face, seconds, written
                    )
            finally:
                for producer in producers.values():
                    await producer.shutdown()
                await admin.close()
        self.facts["stream_ratios"] = st.ratios(self.figures)
        self.facts["stream_requests_per_message"] = per_message

    async def _stream_e2e(
        self, broker: ServerProcess, admin: BrokerClient, face: str, seconds: float,
        written: st.WriterCount,
    ) -> dict[str, float | None]:  # fmt: skip
        """Both ways' end-to-end latency figures through one aio consumer face, each way on
        a producer, consumer and topic of its own, all up at once and the ways taking turns
        run by run. Returns each way's median requests per stream message."""
        ways: dict[str, tuple[Figure, Figure, Callable[[int], Awaitable[Any]]]] = {}
        runs: dict[str, list[float | None]] = {mode: [] for mode, _name in st.MODES}
        async with contextlib.AsyncExitStack() as stack:
            for mode, name in st.MODES:
                p50, p99 = self._percentiles(
                    f"stream.{mode}.e2e.{face}.rate{STREAM_E2E_RATE}",
                    f"stream: e2e latency at {STREAM_E2E_RATE:,} msg/s, {face} consumer, {name}",
                    {
                        "api": "sdk.aio.Producer.send per message (natural batching) -> "
                        "sdk.aio.PushConsumer, orderly, async def no-op listener, "
                        f"delivery={'push' if face == 'push' else 'pull'}",
                        "stream": name,
                        "rate_msg_per_s": STREAM_E2E_RATE,
                        "seconds_per_run": seconds,
                        "max_sends_in_flight": E2E_SENDS_IN_FLIGHT,
                        "queues": wl.QUEUES,
                        "keys": wl.KEYS,
                        "body_bytes": wl.BODY_BYTES,
                        "compare_with": f"stream.plain.e2e.{face}.rate{STREAM_E2E_RATE}",
                    },
                )
                with _way(mode):  # the consumer's tasks, and the clients they make, too
                    send = await self._stream_e2e_clients(
                        broker, admin, mode, face, stack, written, p50.title, runs[mode]
                    )
                ways[mode] = (p50, p99, send)
            await cw.until_held(admin, len(st.MODES) * wl.QUEUES)  # every pull (or push) waits
            count = int(STREAM_E2E_RATE * seconds)
            for mode, (_p50, _p99, send) in ways.items():
                with _way(mode):
                    await send(min(STREAM_E2E_RATE // 2, count))  # warm up
                runs[mode].clear()
            for i in range(self.args.runs):
                for mode, (p50, p99, send) in ways.items():  # in turns: drift hits both ways
                    with _way(mode):
                        await self._measure_latency(
                            p50, p99, lambda send=send: send(count), broker, run_numbers=[i]
                        )
        return _median_of(runs)

    async def _stream_e2e_clients(
        self, broker: ServerProcess, admin: BrokerClient, mode: str, face: str,
        stack: contextlib.AsyncExitStack, written: st.WriterCount, what: str,
        per_message: list[float | None],
    ) -> Callable[[int], Awaitable[tuple[list[float], dict[str, float]]]]:  # fmt: skip
        """A started producer and consumer of a topic of their own (shut down by `stack`);
        a function sending n messages at STREAM_E2E_RATE and awaiting the consumer's
        samples, which counts what the writers wrote into `per_message`."""
        topic = f"bench-stream-{face}-{mode}"
        await admin.create_topic(topic, wl.QUEUES)
        recorder = cw.LatencyRecorder()
        producer = Producer(broker.address)
        await producer.start()
        stack.push_async_callback(producer.shutdown)
        consumer = PushConsumer(
            f"{topic}-group",
            broker.address,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            config=PushConsumerConfig(delivery="push" if face == "push" else "pull"),
        )
        consumer.subscribe(topic)
        consumer.register_message_listener(recorder)
        await consumer.start()
        stack.push_async_callback(consumer.shutdown)
        keys = wl.make_keys()

        async def send(n: int) -> tuple[list[float], dict[str, float]]:
            written.reset()
            got = await cw.e2e_latency(
                producer, recorder, topic, keys, STREAM_E2E_RATE, n, E2E_SENDS_IN_FLIGHT
            )
            written.check(mode, what)
            per_message.append(written.per_message(mode))
            return got

        return send

    # ------------------------------------------------------------------ floor
    async def floor(self) -> None:
        send_request = wl.send_payload()
        self.facts["send_request_bytes"] = len(send_request)
        pull_bytes = self.facts.get("pull_response_bytes") or wl.pull_response_bytes()
        pull_messages = self.facts.get("pull_response_messages") or wl.PULL_MAX_MESSAGES
        send_calls = max(1, self.args.messages // wl.BATCH)
        # Pull-shaped calls are fewer and longer: 5 per 1 000-message backlog slice, so
        # that a run lasts long enough to time (one backlog read is only ~200 calls).
        pull_calls = max(1, 5 * self.args.messages // pull_messages)
        shapes = [
            ("send", send_request, send_calls, (1, 4), len(send_request), 16, wl.BATCH),
            ("pull", pull_bytes.to_bytes(8, "little"), pull_calls, (1, wl.QUEUES), 8,
             pull_bytes, pull_messages),
        ]  # fmt: skip
        self.say("floor: starting the bare gRPC server")
        with floor_process() as server:
            async with grpc.aio.insecure_channel(
                server.address, options=GRPC_CHANNEL_OPTIONS
            ) as channel:
                for shape, request, calls, in_flights, req_bytes, reply_bytes, msgs in shapes:
                    method = f"/bench.Floor/{shape.capitalize()}"
                    await wl.floor_calls(channel, method, request, 20, 2)  # connect, warm up
                    for in_flight in in_flights:
                        figure = self._add(
                            Figure(
                                f"floor.{shape}.inflight{in_flight}",
                                f"grpc floor, {shape}-shaped, {in_flight} in flight",
                                "payloads/s",
                                {
                                    "api": "grpc.aio unary, raw bytes, no work in the handler",
                                    "request_bytes": req_bytes,
                                    "reply_bytes": reply_bytes,
                                    "messages_per_payload": msgs,
                                    "calls_in_flight": in_flight,
                                    "calls_per_run": calls,
                                },
                            )
                        )
                        await self._measure(
                            figure,
                            functools.partial(
                                wl.floor_calls, channel, method, request, calls, in_flight
                            ),
                            server,
                        )

    # ------------------------------------------------------------------ micro
    async def micro(self) -> None:
        n = max(10_000, self.args.messages // 2)
        records = self.facts.get("pull_records")
        count = self.facts.get("pull_response_messages") or 0
        cases: list[tuple[str, str, Callable[[], float]]] = [
            (
                "micro.message_build",
                "sdk: Message() per message",
                lambda: wl.micro_message_build(n),
            ),
            ("micro.encode", "sdk: encode_message per message", lambda: wl.micro_encode(n)),
            (
                "micro.orderly_dispatch",
                "sdk: orderly dispatch per call (plain def, batch 1, no-op listener)",
                lambda: cw.micro_orderly_dispatch(n),
            ),
            (
                "micro.orderly_dispatch_async",
                "sdk: orderly dispatch per call (async def, batch 1, no-op listener)",
                lambda: cw.micro_orderly_dispatch(n, "async"),
            ),
        ]
        if records:
            cases.append(
                (
                    "micro.decode",
                    "sdk: decode_records per message",
                    lambda: wl.micro_decode(records, count, n),
                )
            )
        else:
            self.say("micro: no pulled records to decode (run the pull group for that figure)")
        for key, title, fn in cases:
            figure = self._add(
                Figure(key, title, "us/msg", {"messages": n, "in_process": True}, False)
            )
            fn()  # warm up
            for _ in range(self.args.runs):
                figure.runs.append(Run(fn(), 0.0, n))
            self.say(f"  {title}: {', '.join(fmt(v) for v in figure.values())} us")

    # ------------------------------------------------------------------ remoting
    async def remoting(self) -> None:
        """RocketMQ's C++ client over the remoting front (bench/remoting.py)."""
        if reason := rm.unavailable():
            self.say(f"remoting: skipped: {reason}")
            self.facts["remoting_skipped"] = reason
            return
        client = rm.cpp_client()
        self.facts["remoting_client"] = dict(client.detail)
        home = self.tmp / "cpp-home"  # the C++ client's logs
        rounds = max(1, (SEND_SEQUENTIAL_QUICK if self.args.quick else SEND_SEQUENTIAL) // wl.KEYS)
        common = {
            "client": "rocketmq-client-cpp 1.2.3 (PyPI rocketmq 0.4.4), a process of its own",
            "flush_mode": "async",
            "body_bytes": wl.BODY_BYTES,
            "queues": wl.QUEUES,
        }
        sends = [
            ("sync", "remoting send: C++ send_sync, 1 at a time", "SEND_MESSAGE, queues in turn"),
            ("orderly", "remoting send: C++ send_orderly, 1 at a time",
             "SEND_MESSAGE, the queue picked by sharding key"),
        ]  # fmt: skip
        for mode, title, api in sends:
            figure = self._add(
                Figure(
                    f"remoting.send.{mode}",
                    title,
                    "msg/s",
                    {
                        **common,
                        "api": api,
                        "keys": wl.KEYS,
                        "messages_per_run": rounds * wl.KEYS,
                        "compare_with": "send.sequential",
                    },
                )
            )
            args = rm.produce_args(rm.TOPIC, mode, wl.KEYS, rounds, wl.BODY_BYTES)
            warmup = rm.produce_args(rm.TOPIC, mode, wl.KEYS, 1, wl.BODY_BYTES)
            await self._remoting_figure(figure, client, home, args, "sent", warmup=warmup)
        backlog = self.args.messages
        figure = self._add(
            Figure(
                "remoting.pull",
                f"remoting pull: C++ PullConsumer, 1 queue at a time, {rm.PULL_MAX_NUM} a pull",
                "msg/s",
                {
                    **common,
                    "api": "PULL_MESSAGE without suspend, decode included",
                    "backlog_messages": backlog,
                    "max_messages": rm.PULL_MAX_NUM,
                    "backlog_sent_with": "the ordermq SDK over gRPC",
                    "compare_with": "pull.sequential",
                },
            )
        )
        args = rm.pull_args(rm.TOPIC)
        await self._remoting_figure(figure, client, home, args, "messages", backlog=backlog)
        if any(r.units != backlog for r in figure.runs):
            raise RuntimeError(f"{figure.title}: read {[r.units for r in figure.runs]}")

    async def _remoting_figure(
        self,
        figure: Figure,
        client: rm.Client,
        home: Path,
        args: list[str],
        counted: str,
        *,
        warmup: list[str] | None = None,
        backlog: int = 0,
    ) -> None:
        """A fresh broker with the remoting front; the driver run with `args`, --runs times.

        The driver times itself: the rate and the client's CPU are its own figures; the
        broker's CPU seconds over the whole driver run are set against the driver's time.
        """
        self.say(f"{figure.title}: starting a broker")
        with self._broker(figure.key, "async", rm.BROKER_OPTIONS) as broker:
            namesrv = rm.namesrv_of(broker)
            if backlog:
                stored = await wl.fill_backlog(broker.address, rm.TOPIC, backlog)
                self.say(f"  backlog of {stored} messages stored over gRPC")
            else:
                admin = BrokerClient(broker.address)
                try:
                    await admin.create_topic(rm.TOPIC, wl.QUEUES)
                finally:
                    await admin.close()
            if warmup:  # connect, route, warm the server up
                await rm.drive(client, home, namesrv, warmup)
            done: dict[str, Any] = {}  # the last run's "done" event

            async def one() -> int:
                done.update(await rm.drive(client, home, namesrv, args))
                return int(done[counted])

            for i in range(self.args.runs):
                t = await self._timed(one, broker)
                seconds = float(done["seconds"])
                driver_cpu = float(done["cpu_seconds"])
                server = None if t.server_cpu is None else t.server_cpu * t.seconds / seconds
                other = None
                if t.other_cpu is not None:  # the driver was one of the "other" processes
                    other = max(0.0, t.other_cpu - driver_cpu / t.seconds)
                run = Run(t.units / seconds, seconds, t.units, driver_cpu / seconds, server,
                          None, None, other)  # fmt: skip
                figure.runs.append(run)
                if done.get("failures"):  # sent again (--resend), inside the timed run
                    key = f"{figure.key}_failed_sends"
                    self.facts[key] = self.facts.get(key, 0) + int(done["failures"])
                self.say(
                    f"  {figure.title} run {i + 1}/{self.args.runs}: {fmt(run.value)} "
                    f"{figure.unit} ({t.units} in {seconds:.2f} s; driver CPU "
                    f"{driver_cpu / seconds:.0%}, broker CPU "
                    f"{'-' if server is None else f'{server:.0%}'})"
                )

    # ------------------------------------------------------------------ transports
    async def transports(self) -> None:
        """Produce and orderly consume over gRPC and over rocketmq:// (issue 33).

        The same workloads as "produce, async flush, 1 in flight" and "consume orderly,
        async listener, batch 32", through the same SDK clients, once with the broker's gRPC
        address and once with "rocketmq://<its name server>"; every broker has both fronts.
        """
        if reason := rm.remoting_support():
            self.say(f"transports: skipped: {reason}")
            self.facts["transports_skipped"] = reason
            return
        batches = wl.make_batches(self.args.messages)
        mixed = wl.make_mixed_batches(self.args.messages)
        common = {"flush_mode": "async", "keys": wl.KEYS, "queues": wl.QUEUES,
                  "body_bytes": wl.BODY_BYTES, "broker_fronts": "gRPC and remoting"}  # fmt: skip
        for transport, name in TRANSPORTS:
            # One-queue batches, then mixed ones (keys in arrival order, every queue in each
            # batch): one request over gRPC, one SEND_BATCH_MESSAGE per queue over remoting.
            produces = {
                kind: self._add(
                    Figure(
                        f"transports.{transport}.produce{kind}",
                        f"over {name}: produce, async flush, 1 in flight"
                        + (", mixed keys" if kind else ""),
                        "msg/s",
                        {
                            **common,
                            "transport": name,
                            "api": "sdk.aio.Producer.send_batch",
                            "batches_in_flight": 1,
                            "batch_messages": wl.BATCH,
                            "batch_spans": "every queue" if kind else "one queue",
                            "messages_per_run": len(kind_batches) * wl.BATCH,
                            "compare_with": f"transports.grpc.produce{kind}",
                        },
                    )
                )
                for kind, kind_batches in (("", batches), ("_mixed", mixed))
            }
            consume = self._add(
                Figure(
                    f"transports.{transport}.consume",
                    f"over {name}: consume orderly, async listener, batch 32",
                    "msg/s",
                    {
                        **common,
                        "transport": name,
                        "api": "sdk.aio.PushConsumer",
                        "listener": "MessageListenerOrderly, async def, no-op",
                        "consume_message_batch_max_size": 32,
                        "backlog_messages": self.args.messages,
                        "backlog_sent_with": "the ordermq SDK over gRPC",
                        "consume_from_where": "FIRST_OFFSET",
                        "consumers": 1,
                        "compare_with": "transports.grpc.consume",
                    },
                )
            )
            sent = {produces[""].key: batches, produces["_mixed"].key: mixed}
            for figure in (*produces.values(), consume):
                self.say(f"{figure.title}: starting a broker")
                with self._broker(figure.key, "async", rm.BROKER_OPTIONS) as broker:
                    namesrv = rm.namesrv_of(broker)
                    endpoint = broker.address if transport == "grpc" else rm.endpoint(namesrv)
                    if figure.key in sent:
                        these = sent[figure.key]
                        warmup = these[: max(wl.QUEUES, min(40, len(these) // 10))]
                        await self._produce_figure(figure, broker, these, warmup, 1, endpoint)
                    else:
                        topic = "bench-consume"
                        group = f"transports_{transport}"
                        stored = await self._consume_backlog(group, broker, topic, endpoint)
                        await self._consume_figure(
                            figure, broker, endpoint, topic, stored, "orderly-async", 32
                        )
        self.facts["transports_ratios"] = transport_ratios(self.figures)
        self.facts["transports_mixed_over_one_queue"] = mixed_batch_costs(self.figures)

    # ------------------------------------------------------------------ tls
    async def tls(self) -> None:
        """Produce and orderly consume with TLS off, on, and on with an ACL (issues 34, 37).

        The same workloads as "produce, async flush, 1 in flight" and "consume orderly,
        async listener, batch 32", through the same SDK clients over gRPC, to a broker
        serving plain text, to one serving TLS only (--tls-cert/--tls-key, with a CA and a
        certificate for 127.0.0.1 made for this run in its temporary directory; the
        clients trust that CA) and to one serving TLS with an ACL (--acl-file, BENCH_ACL
        written for this run; the clients sign every call with a non-admin account, so
        each is checked for its signature and permissions). Each workload gets a fresh
        set of brokers, one of each kind, up side by side, and the figures' runs take turns
        (_turns), so that a change of the machine's load falls on all and their ratios to
        plain text stay fair.
        """
        certs, reason = bench_certs(self.tmp / "tls-certs")
        if certs is None:
            self.say(f"tls: skipped: {reason}")
            self.facts["tls_skipped"] = reason
            return
        batches = wl.make_batches(self.args.messages)
        warmup = batches[: max(wl.QUEUES, min(40, len(batches) // 10))]
        common = {
            "flush_mode": "async",
            "keys": wl.KEYS,
            "queues": wl.QUEUES,
            "body_bytes": wl.BODY_BYTES,
            "transport": "gRPC",
            "runs_taken": "in turns with the other modes', brokers side by side",
        }
        certificate = "made by trustme: ECDSA P-256, for localhost and 127.0.0.1"
        tls_params: dict[str, dict[str, Any]] = {
            "plain": {"tls": False, "acl": False},
            "tls": {"tls": True, "certificate": certificate, "client_certificates": False,
                    "acl": False},
            "tls_acl": {"tls": True, "certificate": certificate, "client_certificates": False,
                        "acl": True, "account": "non-admin, defaultTopicPerm PUB|SUB, "
                        "defaultGroupPerm SUB; every call signed (HMAC-SHA256)"},
        }  # fmt: skip
        figures: dict[tuple[str, str], Figure] = {}
        for workload in ("produce", "consume"):
            for mode, name in TLS_MODES:
                if workload == "produce":
                    figure = Figure(
                        f"tls.{mode}.produce",
                        f"{name}: produce, async flush, 1 in flight",
                        "msg/s",
                        {
                            **common,
                            **tls_params[mode],
                            "api": "sdk.aio.Producer.send_batch",
                            "batches_in_flight": 1,
                            "batch_messages": wl.BATCH,
                            "messages_per_run": len(batches) * wl.BATCH,
                            "compare_with": "tls.plain.produce",
                        },
                    )
                else:
                    figure = Figure(
                        f"tls.{mode}.consume",
                        f"{name}: consume orderly, async listener, batch 32",
                        "msg/s",
                        {
                            **common,
                            **tls_params[mode],
                            "api": "sdk.aio.PushConsumer",
                            "listener": "MessageListenerOrderly, async def, no-op",
                            "consume_message_batch_max_size": 32,
                            "backlog_messages": self.args.messages,
                            "consume_from_where": "FIRST_OFFSET",
                            "consumers": 1,
                            "compare_with": "tls.plain.consume",
                        },
                    )
                figures[workload, mode] = self._add(figure)
        acl_file = self.tmp / "bench_acl.yml"
        acl_file.write_text(BENCH_ACL)
        tls_config = TLSConfig(ca_file=certs.ca)
        tls = {"plain": None, "tls": tls_config, "tls_acl": tls_config}
        tls_options = ("--tls-cert", str(certs.cert), "--tls-key", str(certs.key))
        options = {
            "plain": (),
            "tls": tls_options,
            "tls_acl": (*tls_options, "--acl-file", str(acl_file)),
        }
        acl: dict[str, AclCredentials | None] = {
            "plain": None,
            "tls": None,
            "tls_acl": (Credentials(*BENCH_CLIENT), Credentials(*BENCH_ADMIN)),
        }
        for workload in ("produce", "consume"):
            self.say(f"tls {workload}: starting a plain-text, a TLS and a TLS + ACL broker")
            with contextlib.ExitStack() as stack:
                brokers = {
                    mode: stack.enter_context(
                        self._broker(f"tls.{mode}.{workload}", "async", options[mode])
                    )
                    for mode, _ in TLS_MODES
                }
                if workload == "produce":
                    async with contextlib.AsyncExitStack() as clients:
                        producers = {
                            mode: await clients.enter_async_context(
                                self._warm_producer(
                                    brokers[mode], warmup, 1, None, tls[mode], acl[mode]
                                )
                            )
                            for mode, _ in TLS_MODES
                        }
                        for i, mode in self._turns():
                            await self._measure(
                                figures["produce", mode],
                                functools.partial(
                                    wl.produce, producers[mode], PRODUCE_TOPIC, batches, 1
                                ),
                                brokers[mode],
                                run_numbers=[i],
                            )
                else:
                    topic = "bench-consume"
                    trials = {}
                    for mode, _ in TLS_MODES:
                        broker = brokers[mode]
                        stored = await self._consume_backlog(
                            f"tls_{mode}", broker, topic, broker.address, tls[mode], acl[mode]
                        )
                        client = acl[mode]
                        trials[mode] = cw.ConsumeTrial(
                            broker.address, topic, stored, "orderly-async", 32, tls[mode],
                            client[0] if client else None,
                        )  # fmt: skip
                    for i, mode in self._turns():
                        trial = trials[mode]
                        await self._measure(
                            figures["consume", mode], trial.run, brokers[mode],
                            setup=trial.prepare, teardown=trial.close, run_numbers=[i],
                        )  # fmt: skip
                    for mode, _ in TLS_MODES:
                        figure, expected = figures["consume", mode], trials[mode].expected
                        if any(r.units != expected for r in figure.runs):
                            raise RuntimeError(
                                f"{figure.title}: listener saw {[r.units for r in figure.runs]} "
                                f"of {expected} messages"
                            )
        self.facts["tls_ratios"] = tls_ratios(self.figures)
        self.facts["tls_acl_ratios"] = tls_ratios(self.figures, "tls_acl")

    def _turns(self) -> Iterator[tuple[int, str]]:
        """(run number, mode) in the order the tls group measures them: the modes take
        turns, each run's in the other order from the previous one's (plain, TLS, TLS+ACL,
        TLS+ACL, TLS, plain, plain...), so a change of load falls on all."""
        modes = [mode for mode, _ in TLS_MODES]
        for i in range(self.args.runs):
            for mode in modes if i % 2 == 0 else modes[::-1]:
                yield i, mode

    # ------------------------------------------------------------------ backlog
    async def backlog(self) -> None:
        size = self.args.backlog_messages
        if size is None:
            size = big_backlog.QUICK_MESSAGES if self.args.quick else big_backlog.MESSAGES
        pause = self.args.backlog_pause
        if pause is None:
            pause = big_backlog.PAUSE_SECONDS
        self.facts.update(await big_backlog.measure(size, self.tmp, self._add, self.say, pause))

    # ------------------------------------------------------------------ dedup
    async def dedup(self) -> None:
        """The broker's dedup window fed millions of distinct keys: memory per key (issue 42)."""
        self.facts.update(await dedup.measure(self.args, self._add, self.say))

    # ------------------------------------------------------------------ flood
    async def flood(self) -> None:
        """Normal clients' latency alone and next to one flooding client (issue 21)."""
        self.facts.update(await flood.measure(self.args, self.tmp, self._add, self.say))

    # ------------------------------------------------------------------ all
    async def run(self) -> None:
        backlog_groups = [g for g in self.args.only if g in ("pull", "consume")]
        for group in self.args.only:
            started = time.perf_counter()
            await getattr(self, group)()
            self.facts[f"{group}_seconds"] = round(time.perf_counter() - started, 1)
            if backlog_groups and group == backlog_groups[-1]:
                self.rss_figure()


# ---------------------------------------------------------------------- output
def _way(mode: str) -> contextlib.AbstractContextManager[None]:
    """The context of a stream-group way's clients: plain Exchange for "plain"."""
    return st.plain_exchange() if mode == "plain" else contextlib.nullcontext()


def _median_of(runs: dict[str, list[float | None]]) -> dict[str, float | None]:
    """Per mode, the median of its runs' values (None where none was measured)."""
    out: dict[str, float | None] = {}
    for mode, values in runs.items():
        known = [v for v in values if v is not None]
        out[mode] = round(statistics.median(known), 2) if known else None
    return out


def send_comparison(figures: list[Figure]) -> str:
    """A line setting the single-send figures against send_batch of 100 (if both ran)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    batch = medians.get("produce.async.inflight1")
    singles = [(f.title.removeprefix("send: "), medians[f.key]) for f in figures
               if f.key.startswith("send.") and f.key in medians]  # fmt: skip
    if not batch or not singles:
        return ""
    parts = ", ".join(f"{title} {fmt(v)} ({v / batch:.0%})" for title, v in singles)
    return (
        f"send vs send_batch: send_batch of {wl.BATCH}, 1 in flight (produce, async flush, "
        f"1 in flight) {fmt(batch)} msg/s; single sends: {parts}"
    )


def transport_ratios(figures: list[Figure]) -> dict[str, float]:
    """rocketmq:// over gRPC, per workload of the transports group (medians; those measured)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    out = {}
    for workload in ("produce", "produce_mixed", "consume"):
        grpc_, remoting = (medians.get(f"transports.{t}.{workload}") for t, _ in TRANSPORTS)
        if grpc_ and remoting:
            out[workload] = round(remoting / grpc_, 3)
    return out


def mixed_batch_costs(figures: list[Figure]) -> dict[str, float]:
    """Per transport, a mixed-key batch's rate over a one-queue batch's (medians): what a
    batch over every queue costs where it is one request (gRPC) and where it is one
    SEND_BATCH_MESSAGE per queue (rocketmq://)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    out = {}
    for transport, _ in TRANSPORTS:
        one_queue = medians.get(f"transports.{transport}.produce")
        mixed = medians.get(f"transports.{transport}.produce_mixed")
        if one_queue and mixed:
            out[transport] = round(mixed / one_queue, 3)
    return out


def transport_comparison(figures: list[Figure]) -> str:
    """A line setting the rocketmq:// figures against the gRPC ones (if both ran)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    ratios = transport_ratios(figures)
    parts = [
        f"{what} {fmt(medians[f'transports.rocketmq.{workload}'])} vs "
        f"{fmt(medians[f'transports.grpc.{workload}'])} msg/s ({ratios[workload]:.2f}x)"
        for workload, what in (
            ("produce", "produce (send_batch of 100, 1 in flight)"),
            ("produce_mixed", "produce, mixed keys"),
            ("consume", "orderly consume (async listener, batch 32)"),
        )
        if workload in ratios
    ]
    costs = mixed_batch_costs(figures)
    if costs:
        names = dict(TRANSPORTS)
        parts.append(
            "mixed keys over one queue: "
            + ", ".join(f"{names[t]} {ratio:.2f}x" for t, ratio in costs.items())
        )
    return f"rocketmq:// vs gRPC: {'; '.join(parts)}" if parts else ""


def tls_ratios(figures: list[Figure], mode: str = "tls") -> dict[str, float]:
    """`mode` (tls: TLS on; tls_acl: TLS and ACL on) over plain text, per workload of the
    tls group (medians; those measured)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    out = {}
    for workload in ("produce", "consume"):
        plain, other = (medians.get(f"tls.{m}.{workload}") for m in ("plain", mode))
        if plain and other:
            out[workload] = round(other / plain, 3)
    return out


def tls_comparison(figures: list[Figure]) -> str:
    """Lines setting the TLS and TLS + ACL figures against the plain-text ones (those run)."""
    medians = {f.key: statistics.median(f.values()) for f in figures if f.values()}
    lines = []
    for mode, name in TLS_MODES[1:]:
        ratios = tls_ratios(figures, mode)
        parts = [
            f"{what} {fmt(medians[f'tls.{mode}.{workload}'])} vs "
            f"{fmt(medians[f'tls.plain.{workload}'])} msg/s ({ratios[workload]:.2f}x)"
            for workload, what in (
                ("produce", "produce (send_batch of 100, 1 in flight)"),
                ("consume", "orderly consume (async listener, batch 32)"),
            )
            if workload in ratios
        ]
        if parts:
            lines.append(f"{name} vs TLS off: {'; '.join(parts)}")
    return "\n".join(lines)


def bench_certs(directory: Path) -> tuple[Any, str | None]:
    """A CA and a broker certificate for 127.0.0.1 made now in `directory` (trustme, as the
    TLS tests make theirs: tests/tls_certs.py), or None and why not."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        from tests.tls_certs import issue
    except ImportError as exc:  # trustme is a development dependency
        return None, f"cannot make certificates: {exc} (pip install -e '.[dev]')"
    return issue(directory, "bench"), None


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    cpu_model = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import google.protobuf

    return {
        "nproc": affinity or os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "loadavg": _loadavg(),
        "grpcio": grpc.__version__,
        "protobuf": google.protobuf.__version__,
    }


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def git_revision() -> dict[str, Any]:
    """The commit measured, and whether the work tree had changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "sdk", "mockbroker", "proto"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": head or None, "dirty": bool(dirty)}


def redis_reference(
    args: argparse.Namespace, tmp: Path, say: Callable[[str], None]
) -> PeerFigure | None:
    """Redis Streams' figures to read the keyed and consume figures against: pipelined
    batches, 8 concurrent callers and a group read (bench/peers' `produce`,
    `produce_callers` and `consume`).

    Measured now, with bench/peers (`--only redis-everysec`, same --messages and --runs,
    nothing installed), when redis-server and the `redis` client are both here; else read
    from the last `make bench-peers` (bench/results/peers.json, or peers-quick.json);
    None when neither is there.
    """
    if shutil.which("redis-server") and importlib.util.find_spec("redis") is not None:
        out = tmp / "peers-redis.json"
        argv = [sys.executable, str(ROOT / "bench" / "peers" / "run.py"), "--only", REDIS_PEER,
                "--no-latency", "--no-compare", "--no-install", "--messages",
                str(args.messages), "--runs", str(args.runs), "--out", str(out)]  # fmt: skip
        say(f"redis: measuring {REDIS_PEER} with bench/peers/run.py")
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        measured = peer_produce(out)
        if measured is not None:
            return dataclasses.replace(measured, source="this run (bench/peers/run.py)")
        say(f"redis: not measured ({done.returncode}): {done.stderr.strip()[-300:]}")
    for name in ("peers-quick.json", "peers.json") if args.quick else ("peers.json",):
        found = peer_produce(RESULTS / name)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Measure ordermq's throughput and latency (see bench/README.md)."
    )
    p.add_argument("--runs", type=int, default=None, help="runs per figure (default 3)")
    p.add_argument(
        "--messages",
        type=int,
        default=None,
        help="messages per produce run, and size of the pull, consume and poll backlogs "
        "(default 200000)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 20000 messages, 1 run, shorter latency runs, fewer single sends, "
        "results/quick.json",
    )
    p.add_argument(
        "--only",
        default=",".join(GROUPS),
        help=f"comma-separated groups to run, of {', '.join(GROUPS + EXTRA_GROUPS)} "
        f"(default all but {', '.join(EXTRA_GROUPS)})",
    )
    p.add_argument(
        "--backlog-messages",
        type=int,
        default=None,
        help="size of the backlog group's backlog (default 10000000; --quick: 1000000)",
    )
    p.add_argument(
        "--backlog-pause",
        type=float,
        default=None,
        help="seconds between the backlog group's old nine tenths and the rest (default 30; "
        "the retention horizon goes in its middle, so the deleting broker has half of it)",
    )
    p.add_argument("--output", type=Path, default=None, help="JSON file to write")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="write cProfile stats of the client and the broker to this directory "
        "(slows everything down; figures are then not comparable)",
    )
    p.add_argument("--quiet", action="store_true", help="print only the table")
    p.add_argument(
        "--broker-busy-poll-us",
        type=int,
        default=None,
        help="start every broker with this --busy-poll-us (0: it sleeps whenever its loop "
        "waits; default: the broker's own default), to compare with a run without",
    )
    p.add_argument(
        "--no-exchange-port",
        action="store_true",
        help="start every broker without its Exchange port (--exchange-port off): the "
        "clients' sends, pulls and subscriptions go over gRPC's ExchangeBatched instead of "
        "framed TCP (compare with a run without)",
    )
    p.add_argument(
        "--console",
        action="store_true",
        help="serve every broker's console and fetch its pages every second meanwhile "
        "(compare with a run without: bench/console_watch.py)",
    )
    a = p.parse_args(argv)
    a.runs = a.runs if a.runs is not None else (1 if a.quick else 3)
    a.messages = a.messages if a.messages is not None else (20_000 if a.quick else 200_000)
    if a.output is None:
        a.output = RESULTS / ("quick.json" if a.quick else "latest.json")
    groups = [g.strip() for g in a.only.split(",") if g.strip()]
    unknown = set(groups) - set(GROUPS + EXTRA_GROUPS)
    if unknown or not groups:
        p.error(f"--only takes groups of {', '.join(GROUPS + EXTRA_GROUPS)}; got {a.only!r}")
    # pull before floor: the floor uses its sizes
    a.only = [g for g in GROUPS + EXTRA_GROUPS if g in groups]
    if a.backlog_pause is not None and a.backlog_pause < 2:
        p.error("--backlog-pause must be >= 2 (the deleting broker has half of it)")
    if a.runs < 1 or a.messages < wl.BATCH * wl.QUEUES:
        p.error(f"--runs must be >= 1 and --messages >= {wl.BATCH * wl.QUEUES}")
    if a.profile is not None:
        a.profile.mkdir(parents=True, exist_ok=True)
        a.profile = a.profile.resolve()
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    stamp = datetime.datetime.now(datetime.UTC)
    load_before = _loadavg()
    with tempfile.TemporaryDirectory(prefix="ordermq-bench-") as tmp:
        bench = Bench(args, Path(tmp))
        failure: BaseException | None = None
        try:
            asyncio.run(bench.run())
        except Exception as exc:  # report what was measured, then fail
            failure = exc
        redis = None
        if any(f.key in KEYED_KEYS or f.key in CONSUME_KEYS for f in bench.figures):
            redis = redis_reference(args, Path(tmp), bench.say)
    elapsed = time.perf_counter() - started
    bench.facts.pop("pull_records", None)
    keyed = keyed_ratios(bench.figures, redis)
    if keyed:
        bench.facts["keyed_ratios"] = keyed
        bench.facts["keyed_redis"] = (
            {
                "peer": redis.name,
                "produce": redis.value,
                "produce_callers": redis.callers,
                "consume": redis.consume,
                "source": redis.source,
            }
            if redis
            else None
        )
    consumed = consume_ratios(bench.figures, redis)
    if consumed:
        bench.facts["consume_vs_redis"] = consumed
    host = machine()
    host["loadavg_before"], host["loadavg_after"] = load_before, host.pop("loadavg")
    report: dict[str, Any] = {
        "schema": 1,
        "timestamp": stamp.isoformat(timespec="seconds"),
        "elapsed_seconds": round(elapsed, 1),
        "machine": host,
        "revision": git_revision(),
        "options": {
            "runs": args.runs,
            "messages": args.messages,
            "quick": args.quick,
            "groups": args.only,
            "profiled": args.profile is not None,
            "console": args.console,
        },
        "facts": bench.facts,
        "figures": [f.summary() for f in bench.figures],
    }
    if failure is not None:
        report["error"] = f"{type(failure).__name__}: {failure}"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    m = report["machine"]
    print(
        f"ordermq bench  {report['timestamp']}  {m['nproc']} cores  Python {m['python']}  "
        f"grpcio {m['grpcio']}  runs {args.runs}  messages {args.messages:,}"
    )
    first = keyed_table(bench.figures, redis)
    if first:
        print(first)
        print()
    consume = consume_line(bench.figures, redis)
    if consume:
        print(consume)
        print()
    print(table([f for f in bench.figures if f.key not in KEYED_KEYS]))
    print(
        f"(medians of {args.runs} run(s); CPU: share of one core and CPU time per unit; "
        f"others: CPU share of every other process on the machine meanwhile; "
        f"{elapsed:.0f} s; written to {_shown(args.output)})"
    )
    if load_before is not None and load_before[0] >= 0.5:
        print(
            f"note: load average was {load_before[0]:.2f} before the run: other work on this "
            f"machine skews the figures"
        )
    busy = [
        f["title"]
        for f in report["figures"]
        if (f.get("other_cpu_median") or 0.0) >= OTHERS_NOTICEABLE
    ]
    if busy:
        print(
            f"note: other processes used {OTHERS_NOTICEABLE:.0%} of a core or more during "
            f"{len(busy)} figure(s) (column others): {', '.join(busy)}"
        )
    if "remoting_skipped" in bench.facts:
        print(f"note: the remoting figures were skipped: {bench.facts['remoting_skipped']}")
    if "transports_skipped" in bench.facts:
        print(f"note: the transports figures were skipped: {bench.facts['transports_skipped']}")
    if "tls_skipped" in bench.facts:
        print(f"note: the tls figures were skipped: {bench.facts['tls_skipped']}")
    comparisons = (
        send_comparison(bench.figures),
        transport_comparison(bench.figures),
        tls_comparison(bench.figures),
        st.comparison(bench.figures, bench.facts.get("stream_requests_per_message", {})),
    )
    for comparison in comparisons:
        if comparison:
            print(comparison)
    e2e = ep.comparison(
        bench.facts.get("e2e_procs", {}),
        bench.e2e_redis,
        bench.facts.get("e2e_procs_redis_skipped"),
    )
    if e2e:
        print(e2e)
    floods = flood.summary(bench.figures)
    if floods:
        print(floods)
    if failure is not None:
        print(f"bench failed: {report['error']}", file=sys.stderr)
        raise failure
    return 0


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
