"""Orderly consumption through network faults between the clients and the broker.

A broker process with a short lock lease (4 s) and client timeout (6 s); consumer processes
(tests/system/orderly_worker.py: client lease 3 s, renewal every 1 s) and a producer in this
process (rounds of one message per key, 160 keys over 8 queues). Every client reaches the
broker through its own fault proxy (tests/faultproxy.py, named by gRPC's `grpc_proxy`
variable), so a fault can hit every link or one client only:

(a) delay and jitter (and a bandwidth limit) on every link, while a worker joins and
    another leaves: order holds, nothing is lost, planned hand-overs re-deliver nothing;
(b) connections reset at random while they carry requests or answers (every link 20 ms
    slow, so that they do), the producer's too: order holds, nothing acknowledged is lost,
    and once the resets stop every queue is consumed again (none stuck);
(c) one consumer cut off from the broker (the way back first, then both ways) while it
    holds queues, for longer than every lease: it stops calling its listener within its
    own lease (3 s), the broker expires it (client timeout, 6 s of silence) and the
    others take its queues, no two consumers call a listener on one queue at the same
    time, and after the heal it rejoins and gets queues again; nothing stuck, nothing lost;
(d) the producer cut off for longer than its send deadline, its connections lost on the
    way: its sends fail with a clear, retriable error and are sent again after the heal (a
    spooling producer's sends return at once and are delivered after it); nothing
    acknowledged is lost, order holds.

(f) SimpleConsumer workers (tests/system/job_worker.py) receiving and acking jobs while
    connections are reset at random as in (b): every job is finished, none is lost, an
    acked job is never delivered again, and each re-delivery is explained by a cut: the
    ack of the delivery before it failed, or the receive that took it did (its answer
    never arrived). Once the resets stop, every job settles.

The histories of (a) to (e) are checked as in test_orderly_chaos.py (`verify`): every key
in order (never n+1 before n), nothing acknowledged lost, nothing invented, no two
listener calls on a queue at the same time; duplicates and extra stored copies are
counted. Each test records its row of the fault suite's table. A proxy cannot reorder or
drop packets (TCP is a byte stream); where the kernel has netem, (e) runs (a) again with
packet delay, loss and reordering on the loopback of a private network namespace, and is
skipped otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    Producer,
    ProducerConfig,
    SendStatus,
    shard_index,
)
from sdk._transport.broker_client import BrokerClient
from sdk.errors import RequestTimeoutError
from tests.chaos_report import REPORT_PATH_ENV, ChaosRecorder, scaled
from tests.faultproxy import NO_PROXY_VARIABLES, FaultProxy, LinkFaults, proxy_environment
from tests.support import ROOT, wait_until
from tests.system import job_worker
from tests.system.orderly_history import (
    BROKER_LEASE,
    REJOIN_TIMEOUT,
    SLACK,
    TAKEOVER_TIMEOUT,
    Entry,
    History,
    PacedProducer,
    Report,
    Scene,
    orderly_broker,
    verify,
    verify_handovers,
)
from tests.system.orderly_worker import CONFIG
from tests.system.test_job_queue_chaos import BATCH, PATIENCE, Events, StartBroker, Worker, produce

pytestmark = [pytest.mark.system, pytest.mark.chaos]

QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(160)]
ROUND_INTERVAL = 0.5
#: Rounds each test sends at least (one message per key each).
MIN_ROUNDS = scaled(16, 240)
#: Rounds sent while a fault lasts, where its length is counted in rounds.
FAULT_ROUNDS = scaled(16, 240)
DRAIN_TIMEOUT = 60.0
#: How long the producer retries a round that failed.
RETRY_FOR = 60.0

#: (a): 30 +- 20 ms each way, and 2 MB/s each way, on every link.
SLOW_LINK = LinkFaults(delay=0.03, jitter=0.02, rate=2_000_000)
#: (b): a connection reset every 0.2 to 1 s, somewhere, while it carries something: each
#: link delays by 20 ms, so that requests and answers are on their way for a while.
RESET_PACE = (0.2, 1.0)
RESET_LINK = LinkFaults(delay=0.02)
#: (c): the way back is cut first, for longer than a renewal period, so that a renewal
#: reaches the broker and its answer is held until the heal.
ONE_WAY = CONFIG.lock_renew_interval * 1.5
#: (c): a listener call that passed its lease check just before the lease ended starts a
#: moment later (a thread hop on a busy machine).
CALL_START_SLACK = 0.5
#: (c): rounds sent before the workers start, and the cut-off worker's work per message:
#: it is still behind on its queues, with hundreds of messages buffered (several seconds
#: of work), when it is cut off.
BACKLOG_ROUNDS = 12
SLOW_DELAY_MS = 25
#: (c): how many times it is cut off and healed.
PARTITIONS = scaled(1, 6)
#: (d): the producer's send deadline, and how long it is cut off (longer than the deadline).
SEND_TIMEOUT = 2.0
PRODUCER_OUTAGE = float(scaled(5, 30))
SPOOLED = 200
SPOOL_KEYS = 7

#: (e): the qdisc put on the namespace's loopback (ORDERMQ_NETEM_QDISC to change it).
QDISC = os.environ.get(
    "ORDERMQ_NETEM_QDISC", "netem delay 10ms 5ms loss 0.5% reorder 5% 50%"
).split()
#: Set (to the qdisc) inside the namespace, for the inner run of (a).
INNER_NETEM = os.environ.get("ORDERMQ_NETEM", "")


# ---------------------------------------------------------------------------- the network
@dataclass
class Net:
    """One run's broker, producer and workers, each client behind its own fault proxy."""

    scene: Scene
    history: History
    monkeypatch: pytest.MonkeyPatch
    proxies: dict[str, FaultProxy] = field(default_factory=dict)

    def proxy(self, name: str) -> FaultProxy:
        """The proxy of client `name` (made and started on first use)."""
        if name not in self.proxies:
            proxy = self.proxies[name] = FaultProxy(seed=len(self.proxies), name=f"proxy-{name}")
            proxy.start()
        return self.proxies[name]

    def start_producer(
        self, *, backlog: int = 0, config: ProducerConfig | None = None
    ) -> PacedProducer:
        """The paced producer (a thread of this process) behind proxy "producer"."""
        proxy = self.proxy("producer")
        # gRPC reads the variable when a channel is made: the producer's, in its thread.
        self.monkeypatch.setenv("grpc_proxy", proxy.url)
        for name in NO_PROXY_VARIABLES:
            self.monkeypatch.delenv(name, raising=False)
        producer = PacedProducer(
            self.scene.broker.address, KEYS, ROUND_INTERVAL,
            backlog=backlog, retry_for=RETRY_FOR, config=config,
        )  # fmt: skip
        self.scene.producer = producer
        producer.start()
        self.scene.until(lambda: self.scene.sent() >= 1, 30, "the first round (the topic)")
        return producer

    def spawn(self, name: str, *args: str) -> None:
        """Start worker `name` behind its own proxy."""
        self.scene.spawn(name, *args, env=proxy_environment(self.proxy(name)))

    def finish(self, workers: list[str]) -> int:
        """Halt the producer, wait until everything sent is processed, stop `workers`."""
        scene, history = self.scene, self.history
        assert scene.producer is not None
        scene.until(
            lambda: scene.sent() >= MIN_ROUNDS, MIN_ROUNDS * ROUND_INTERVAL + 60, "all rounds"
        )
        rounds = scene.producer.halt()
        scene.mark(f"producer done: {rounds} rounds, {scene.producer.failed_sends} failed sends")
        total = rounds * len(KEYS)
        scene.until(lambda: len(history.distinct) >= total, DRAIN_TIMEOUT, f"all {total} processed")
        scene.mark("all processed")
        scene.stop_workers(workers)
        scene.mark("workers stopped")
        history.refresh()
        return rounds

    def check_traffic_went_through_the_proxies(self) -> None:
        """Every client's connections went through its proxy, to the broker."""
        for name, proxy in self.proxies.items():
            stats = proxy.stats()
            assert stats.connections >= 1, f"{name} never connected through its proxy"
            assert stats.bytes_down > 0, f"{name}'s proxy carried no answer"
            assert stats.targets == {self.scene.broker.address}, stats.targets

    def timeline(self) -> str:
        return "\n".join(self.scene.timeline())


@contextlib.contextmanager
def network(directory: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Net]:
    """A broker started; clients are added by the test; everything ends on the way out."""
    assert {shard_index(k, QUEUES) for k in KEYS} == set(range(QUEUES)), "keys cover queues"
    broker = orderly_broker(directory / "broker", QUEUES)
    history = History(KEYS)
    net = Net(Scene(directory, broker, history), history, monkeypatch)
    try:
        broker.start()
        yield net
    finally:
        net.scene.clean_up()
        for proxy in net.proxies.values():
            proxy.stop()


def check(report: Report, net: Net, extra: str = "") -> None:
    text = f"{report.summary()}{extra}\n{net.timeline()}"
    print(text)
    assert not report.errors, f"{len(report.errors)} violations:\n" + (
        "\n".join(report.errors[:30]) + "\n" + text
    )


# ---------------------------------------------------------------------------- (a) delay
def test_delay_jitter_and_a_bandwidth_limit_on_every_link(
    tmp_path: Path, chaos_report: ChaosRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = LinkFaults() if INNER_NETEM else SLOW_LINK
    with network(tmp_path, monkeypatch) as net:
        scene, history = net.scene, net.history
        for name in ("producer", "w1", "w2", "w3"):
            net.proxy(name).set(faults)
        net.start_producer()
        net.spawn("w1")
        net.spawn("w2")
        scene.until(lambda: history.frontier() >= 2, REJOIN_TIMEOUT, "w1 and w2 consuming")
        joined = scene.mark("w3 joins")
        net.spawn("w3")
        scene.until(lambda: history.started_after("w3", joined), REJOIN_TIMEOUT, "w3 consuming")
        scene.stop_workers(["w1"])  # a planned hand-over, every message of it delayed
        left = scene.mark("w1 left")
        scene.until(
            lambda: not history.queues_idle_since(left, QUEUES),
            REJOIN_TIMEOUT,
            "every queue consumed after w1 left",
        )
        rounds = net.finish(["w2", "w3"])
        net.check_traffic_went_through_the_proxies()
    entries = history.entries()
    revokes = [r for w in scene.workers.values() for r in w.revokes()]
    report = verify(entries, rounds, {}, KEYS, QUEUES)
    fault = f"packet level: {' '.join(QDISC)}" if INNER_NETEM else "delay 30±20 ms, 2 MB/s"
    report.record(chaos_report, fault, rounds, "a worker joins, one leaves")
    check(report, net)
    errors = verify_handovers(entries, revokes, {})
    assert not errors, "\n".join(errors[:30]) + "\n" + net.timeline()


# ---------------------------------------------------------------------------- (b) resets
class Resetter(threading.Thread):
    """Every RESET_PACE seconds, resets a busy connection of a proxy picked at random."""

    def __init__(self, proxies: list[FaultProxy], seed: int) -> None:
        super().__init__(name="resetter", daemon=True)
        self._proxies = proxies
        self._rng = random.Random(seed)
        self._halt = threading.Event()
        self.resets = 0

    def run(self) -> None:
        while not self._halt.wait(self._rng.uniform(*RESET_PACE)):  # the pace of the faults
            proxy = self._rng.choice(self._proxies)
            # The next moment it carries something (a proxy's link is rarely idle for long).
            while not self._halt.is_set() and not proxy.reset(count=1, busy=True):
                self._halt.wait(0.002)
            self.resets += 1

    def halt(self) -> int:
        self._halt.set()
        self.join(10)
        return self.resets


def test_connections_reset_at_random(
    tmp_path: Path, chaos_report: ChaosRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    with network(tmp_path, monkeypatch) as net:
        scene, history = net.scene, net.history
        for name in ("producer", "w1", "w2", "w3"):
            net.proxy(name).set(RESET_LINK)
        producer = net.start_producer()
        for name in ("w1", "w2", "w3"):
            net.spawn(name)
        scene.until(lambda: history.frontier() >= 1, REJOIN_TIMEOUT, "the workers consuming")
        resetter = Resetter(list(net.proxies.values()), seed=21)
        resetter.start()
        scene.mark("resets begin")
        target = scene.sent() + FAULT_ROUNDS
        scene.until(lambda: scene.sent() >= target, FAULT_ROUNDS * ROUND_INTERVAL + 60, "rounds")
        resets = resetter.halt()
        calm = scene.mark(f"resets end: {resets} connections reset")
        # No queue stays stuck: each is consumed again after the last reset.
        scene.until(
            lambda: not history.queues_idle_since(calm, QUEUES),
            REJOIN_TIMEOUT,
            "every queue consumed after the resets",
        )
        scene.mark("every queue consumed again")
        rounds = net.finish(["w1", "w2", "w3"])
        net.check_traffic_went_through_the_proxies()
    report = verify(history.entries(), rounds, {}, KEYS, QUEUES, resends=True)
    note = f"{resets} resets, {report.copies} copies from retried sends"
    report.record(chaos_report, "connection resets", rounds, note)
    check(report, net, f"; {producer.failed_sends} failed sends retried")
    assert resets >= FAULT_ROUNDS // 4, f"only {resets} resets"


# ---------------------------------------------------------------------------- (c) partition
def recent_queues(history: History, worker: str, since: int) -> set[int]:
    """The queues only `worker` began listener calls on after `since` (monotonic ns)."""
    calls = [e for lines in history.by_worker.values() for e in lines if e.start > since]
    others = {e.queue for e in calls if e.worker != worker}
    return {e.queue for e in calls if e.worker == worker} - others


def reprocessed(entries: list[Entry], worker: str, after: int) -> list[Entry]:
    """`worker`'s calls after `after` on a message some worker had processed already."""
    top: dict[str, int] = {}
    found = []
    for e in sorted(entries, key=lambda e: (e.end, e.worker)):
        if e.worker == worker and e.start > after and e.seq <= top.get(e.key, -1):
            found.append(e)
        top[e.key] = max(top.get(e.key, -1), e.seq)
    return found


def first_call_by_others(entries: list[Entry], worker: str, queue: int, after: int) -> int:
    """When another worker first began a call on `queue` after `after`; 0 if none did."""
    return min((e.start for e in entries if e.queue == queue and e.worker != worker
                and e.start > after), default=0)  # fmt: skip


@dataclass(frozen=True)
class Cut:
    """One partition of w1: the queues it held, when it was cut off, when it healed."""

    held: frozenset[int]
    cut: int  # monotonic ns
    healed: int

    def moves(self, entries: list[Entry]) -> dict[int, float]:
        """Per queue held: seconds from the cut until another worker called on it."""
        return {q: (first_call_by_others(entries, "w1", q, self.cut) - self.cut) / 1e9
                for q in self.held}  # fmt: skip

    def calls_cut_off(self, entries: list[Entry]) -> list[Entry]:
        """w1's calls that began while it was cut off."""
        return [e for e in entries if e.worker == "w1" and self.cut < e.start < self.healed]


def cut_off_and_heal(net: Net) -> Cut:
    """Cut w1 off while it consumes queues (the way back first); heal once they moved."""
    scene, history, proxy = net.scene, net.history, net.proxy("w1")
    warm = time.monotonic_ns()
    scene.until(
        lambda: len(recent_queues(history, "w1", warm)) >= 2,
        REJOIN_TIMEOUT,
        "w1 consuming its queues",
    )
    held = frozenset(recent_queues(history, "w1", warm))
    proxy.partition("down")
    cut = scene.mark(f"w1 cut off (answers first), holding queues {sorted(held)}")
    time.sleep(ONE_WAY)  # the fault's shape: requests still arrive, answers do not
    proxy.partition("both")
    scene.mark("w1 cut off both ways")
    scene.until(
        lambda: all(first_call_by_others(history.entries(), "w1", q, cut) for q in held),
        TAKEOVER_TIMEOUT,
        "w1's queues to move to the others",
    )
    scene.mark("w1's queues taken over")
    target = scene.sent() + 1  # and every key goes on past the take-over
    scene.until(lambda: history.frontier() >= target, TAKEOVER_TIMEOUT, "progress")
    proxy.heal()
    healed = scene.mark("w1's link healed")
    scene.until(lambda: history.started_after("w1", healed), REJOIN_TIMEOUT, "w1 to rejoin")
    scene.mark("w1 consuming again")
    scene.until(
        lambda: not history.queues_idle_since(healed, QUEUES),
        REJOIN_TIMEOUT,
        "every queue consumed after the heal",
    )
    return Cut(held, cut, healed)


def test_a_consumer_cut_off_from_the_broker_while_it_holds_queues(
    tmp_path: Path, chaos_report: ChaosRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    with network(tmp_path, monkeypatch) as net:
        scene, history = net.scene, net.history
        net.start_producer(backlog=BACKLOG_ROUNDS)
        net.spawn("w1", "--delay-ms", str(SLOW_DELAY_MS))
        net.spawn("w2")
        net.spawn("w3")
        scene.until(lambda: history.frontier() >= 2, REJOIN_TIMEOUT, "the workers consuming")
        cuts = [cut_off_and_heal(net) for _ in range(PARTITIONS)]
        rounds = net.finish(["w1", "w2", "w3"])
        net.check_traffic_went_through_the_proxies()
    entries = history.entries()
    report = verify(entries, rounds, {}, KEYS, QUEUES)
    moves = [m for c in cuts for m in c.moves(entries).values()]
    last = max(((e.start - c.cut) / 1e9 for c in cuts for e in c.calls_cut_off(entries)),
               default=0.0)  # fmt: skip
    note = (
        f"{len(cuts)} cuts; w1's last call {last:.1f}s into a cut; its queues moved after "
        f"{min(moves):.1f}-{max(moves):.1f}s"
    )
    report.record(chaos_report, "one consumer partitioned", rounds, note)
    check(report, net, f"; {note}")
    for c in cuts:
        # It stops within its own lease: its view of the lease began before the cut.
        limit = c.cut + (CONFIG.lock_lease + CALL_START_SLACK) * 1e9
        late = [str(e) for e in c.calls_cut_off(entries) if e.start > limit]
        assert not late, f"w1 called its listener past its lease: {late[:5]}"
        # Nobody took a queue before the broker's lease ran out (the client timeout is longer).
        early = {q: s for q, s in c.moves(entries).items() if s < BROKER_LEASE}
        assert not early, f"queues moved before the broker lease ended: {early}"
    # Back, it goes on from where the queues' owners committed, not from where it was.
    stale = reprocessed(entries, "w1", cuts[0].healed)
    assert not stale, f"w1 re-processed {len(stale)} messages after a heal: {stale[0]}"


# ---------------------------------------------------------------------------- (d) producer
def test_a_producer_cut_off_from_the_broker(
    tmp_path: Path,
    chaos_report: ChaosRecorder,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One attempt per send: a retry's route refresh waits too (5 s) before the next one.
    config = ProducerConfig(send_timeout=SEND_TIMEOUT, retry_times=0)
    with network(tmp_path, monkeypatch) as net:
        scene, history = net.scene, net.history
        producer = net.start_producer(config=config)
        net.spawn("w1")
        net.spawn("w2")
        scene.until(lambda: history.frontier() >= 2, REJOIN_TIMEOUT, "the workers consuming")
        # A spooling producer too, through the same proxy (this process's grpc_proxy).
        spool = Producer(
            scene.broker.address,
            config=dataclasses.replace(config, spool_dir=tmp_path / "spool"),
        )
        spool.start()
        for k in range(SPOOL_KEYS):  # the topic, the channel, and each key's seq 0
            spool.send(spooled_message(k))
        spool.flush(timeout=30)
        failed = producer.failed_sends
        proxy = net.proxy("producer")
        proxy.partition()
        cut = scene.mark("the producer cut off")
        statuses = {spool.send(spooled_message(SPOOL_KEYS + i)).status for i in range(SPOOLED)}
        scene.until(
            lambda: producer.failed_sends > failed and "delivery failed" in caplog.text,
            SEND_TIMEOUT + SLACK,
            "a send and a spool delivery to fail",
        )
        # The partition outlasts the connections (TCP gives up, a NAT forgets them): what
        # was sent into it is lost, not delivered late.
        lost = proxy.reset()
        scene.mark(f"{lost} connections lost in the partition")
        time.sleep(max(0.0, PRODUCER_OUTAGE - (time.monotonic_ns() - cut) / 1e9))  # the outage
        proxy.heal()
        healed = scene.mark(f"healed; {producer.failed_sends - failed} sends had failed")
        spool.flush(timeout=60)
        scene.mark("the spool delivered")
        spool.shutdown()
        rounds = net.finish(["w1", "w2"])
        net.check_traffic_went_through_the_proxies()
        spooled = read_topic(scene.broker.address, "spooled")
    failures = producer.failures[failed:]
    assert failures and all(f.retriable for f in failures), failures
    timeouts = [f for f in failures if isinstance(f, RequestTimeoutError)]
    assert timeouts, f"no send failed by its deadline: {failures}"
    assert f"no answer within {SEND_TIMEOUT:g}s" in str(timeouts[0]), str(timeouts[0])
    assert statuses == {SendStatus.SPOOLED}, "a spooled send waited for the broker"
    check_spooled(spooled)
    report = verify(history.entries(), rounds, {}, KEYS, QUEUES, resends=True)
    note = (
        f"cut {(healed - cut) / 1e9:.0f}s: {len(failures)} sends failed (retried), "
        f"{report.copies} copies; {SPOOLED} spooled sends delivered after the heal"
    )
    report.record(chaos_report, "producer partitioned", rounds, note)
    check(report, net, f"; {note}")


def spooled_message(i: int) -> Message:
    """The i-th message of the spooling producer: SPOOL_KEYS keys, body "key:seq"."""
    key = f"k{i % SPOOL_KEYS}"
    return Message("spooled", f"{key}:{i // SPOOL_KEYS}".encode(), sharding_key=key)


def check_spooled(spooled: dict[str, list[bytes]]) -> None:
    """Every spooled message stored, each key's in the order sent (a copy only in place)."""
    for k in range(SPOOL_KEYS):
        key = f"k{k}"
        seqs = [int(body.split(b":")[1]) for body in spooled.get(key, [])]
        sent = len(range(k, SPOOL_KEYS + SPOOLED, SPOOL_KEYS))
        assert seqs == sorted(seqs), f"{key}'s spooled messages out of order: {seqs}"
        assert set(seqs) == set(range(sent)), f"{key}: {sorted(set(range(sent)) - set(seqs))}"


def read_topic(address: str, topic: str) -> dict[str, list[bytes]]:
    """Every message of `topic`, bodies per sharding key in queue order."""
    out: dict[str, list[bytes]] = {}
    consumer = LitePullConsumer(
        "net-check", address, auto_commit=False, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    with consumer:
        consumer.assign(consumer.fetch_message_queues(topic))
        while batch := consumer.poll(timeout=2.0):
            for m in batch:
                out.setdefault(m.sharding_key or "", []).append(m.body)
    return out


# ---------------------------------------------------------------------------- (e) netem
def netem_unavailable() -> str | None:
    """Why packet-level faults cannot run here (None when they can)."""
    if INNER_NETEM:
        return "this is the run inside the namespace"
    missing = [tool for tool in ("unshare", "ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"packet-level faults need {', '.join(missing)}"
    probe = subprocess.run(
        ["unshare", "-n", "sh", "-c", "ip link set lo up && exec tc qdisc add dev lo root \"$@\"",
         "sh", *QDISC],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if probe.returncode:
        why = (probe.stderr or probe.stdout).strip().splitlines()
        return (
            f"packet-level faults need netem in a network namespace; "
            f"`unshare -n tc qdisc add dev lo root {' '.join(QDISC)}` failed: "
            f"{why[-1] if why else probe.returncode}"
        )
    return None


def test_packet_delay_loss_and_reordering_under_netem(
    tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    reason = netem_unavailable()
    if reason:
        pytest.skip(reason)
    report = tmp_path / "rows.json"
    inner = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"{Path(__file__).relative_to(ROOT)}::test_delay_jitter_and_a_bandwidth_limit_on_every_link",
    ]  # fmt: skip
    env = {**os.environ, "ORDERMQ_NETEM": " ".join(QDISC), REPORT_PATH_ENV: str(report)}
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c",
         'ip link set lo up && tc qdisc add dev lo root $ORDERMQ_NETEM && exec "$@"', "sh",
         *inner],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    print(done.stdout[-5000:])
    for row in json.loads(report.read_text()) if report.exists() else []:
        chaos_report.record(
            fault=row["fault"], rounds=row["rounds"], acked=row["acked"], lost=row["lost"],
            order_violations=row["order_violations"], duplicates=row["duplicates"],
            note=f"{row['note']}; in a network namespace",
        )  # fmt: skip
    assert done.returncode == 0, f"the run under netem failed:\n{done.stdout}\n{done.stderr}"


# ---------------------------------------------------------------------------- (f) job queue
#: (f): the jobs (a few seconds of work for the workers), and the workers.
JOBS = scaled(400, 4000)
JOB_WORKERS = 3


@dataclass
class Deliveries:
    """Every delivery the workers' logs show, by (job, delivery attempt)."""

    got: Counter[tuple[str, int]] = field(default_factory=Counter)
    acks: dict[tuple[str, int], str] = field(default_factory=dict)  # "acked" or "late"
    finished: Counter[str] = field(default_factory=Counter)
    failed_receives: int = 0

    @classmethod
    def of(cls, logs: list[Events]) -> Deliveries:
        d = cls()
        for events in logs:
            d.failed_receives += len(events.failed)
            for kind, *words in events.lines:
                if kind == "got":
                    d.got[(words[0], int(words[1]))] += 1
                elif kind in ("acked", "late"):
                    d.acks[(words[0], int(words[1]))] = kind
                elif kind == "done":
                    d.finished[words[0]] += 1
        return d

    def last(self) -> dict[str, int]:
        """Each job's last delivery attempt a worker got."""
        top: dict[str, int] = {}
        for job, attempt in self.got:
            top[job] = max(top.get(job, 0), attempt)
        return top

    def earlier(self) -> list[tuple[str, int]]:
        """The deliveries a later one of the same job followed (the re-delivered ones)."""
        return [(job, a) for job, top in self.last().items() for a in range(1, top)]


def settled(address: str) -> bool:
    """True once the job workers' committed offsets reach the end of every queue of "jobs"."""

    async def progress() -> dict[str, Any]:
        client = BrokerClient(address)
        try:
            return await client.admin("ConsumerProgress", group=job_worker.GROUP,
                                      topic=job_worker.TOPIC)  # fmt: skip
        finally:
            await client.close()

    queues = asyncio.run(progress())["queues"]
    return bool(queues) and all(q["consumer_offset"] >= 0 and q["lag"] == 0 for q in queues)


def test_simple_consumers_receive_and_ack_through_connections_reset_at_random(
    start_broker: StartBroker, tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    broker = start_broker(tmp_path / "broker")
    jobs = produce(broker.address, JOBS)
    proxies: list[FaultProxy] = []
    workers: list[Worker] = []
    try:
        for i in range(JOB_WORKERS):
            proxy = FaultProxy(seed=i, name=f"proxy-w{i}")
            proxy.start()
            proxies.append(proxy)
            proxy.set(RESET_LINK)
            env = proxy_environment(proxy)
            workers.append(Worker(f"w{i}", tmp_path, broker.address, env=env))
        resetter = Resetter(proxies, seed=36)
        resetter.start()
        try:
            wait_until(
                lambda: Deliveries.of([w.events() for w in workers]).finished.keys() >= set(jobs),
                PATIENCE,
                f"all {JOBS} jobs finished",
            )
        finally:
            resets = resetter.halt()
        # Then every job settles: those whose acks were cut before they settled come back
        # and are finished again, so the logs show every re-delivery.
        wait_until(lambda: settled(broker.address), PATIENCE, "every job settled")
        for proxy in proxies:
            assert proxy.stats().targets == {broker.address}, "a worker went around its proxy"
    finally:
        for w in workers:
            w.end()
        for proxy in proxies:
            proxy.stop()

    d = Deliveries.of([w.events() for w in workers])
    assert set(d.finished) == set(jobs), "every job finished at least once, and nothing else"
    assert all(n == 1 for n in d.got.values()), "no delivery attempt of a job handed out twice"
    top = d.last()
    came_back = [(j, a) for (j, a), kind in d.acks.items() if kind == "acked" and a < top[j]]
    assert not came_back, f"acked jobs delivered again: {came_back[:10]}"
    # Each re-delivered job's earlier delivery was cut: its ack failed (a "late" line), or
    # the receive that took it did, and no worker got it at all.
    cut_acks = [k for k in d.earlier() if d.acks.get(k) == "late"]
    cut_receives = [k for k in d.earlier() if k not in d.got]
    unexplained = sorted(set(d.earlier()) - set(cut_acks) - set(cut_receives))
    assert not unexplained, f"re-delivered with no cut to explain it: {unexplained[:10]}"
    assert len(cut_receives) <= d.failed_receives * BATCH, (
        f"{len(cut_receives)} deliveries no worker got, but only {d.failed_receives} "
        f"receives failed (of at most {BATCH} jobs each)"
    )
    late = sum(kind == "late" for kind in d.acks.values())
    assert d.failed_receives + late > 0, f"the {resets} resets cut no receive and no ack"
    note = (
        f"{resets} resets: {d.failed_receives} receives and {late} acks cut; "
        f"{len(cut_acks)} + {len(cut_receives)} jobs delivered again after a cut ack / receive"
    )
    print(note)
    chaos_report.record(
        fault="job queue: connection resets", rounds=1, acked=JOBS,
        lost=len(set(jobs) - set(d.finished)), order_violations=0,
        duplicates=sum(n - 1 for n in d.finished.values()), note=note,
    )  # fmt: skip
