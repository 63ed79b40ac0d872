"""A hostile remoting peer next to the broker-restart chaos (issue 31's acceptance).

A broker process serving gRPC and RocketMQ remoting (`--remoting-port`, at most 64
connections per host), with the short lease of the orderly tests. A producer in this
process sends a backlog (60 rounds of one message per key, 48 keys over 8 queues), then a
round a second; two orderly worker processes (tests/system/orderly_worker.py, group
"chaos") work 20 ms per message. Meanwhile a hostile peer (tests/system/hostile_peer.py)
speaks remoting to the same broker:

1. it asks for pulls of a 4 MiB message and never reads the answers (the broker holds
   bytes the peer does not take, seen in /proc/net/tcp), and keeps that connection open;
2. it sends HEART_BEAT and LOCK_BATCH_MQ with a 1 MiB client id, for a group nobody
   joined and for the workers' group: each is refused by the lock rule's client id check;
3. it floods heartbeats naming 400 new groups, 50 per heartbeat, on one connection: each
   group gets a durable %RETRY% topic, so the first five are served and the rest refused
   whole by the per-client topic limit (`client_max_topics`, 256);
4. it joins the workers' group by heartbeat and, once every other queue is consumed by
   the worker it is allocated to, pulls those queues with the commit-offset bit set to
   their end offset, round after round: the commit rule drops each (another client holds
   the queue), so no worker's successor starts past messages nobody processed;
5. it opens 80 connections from 127.0.0.2 and asks one thing on each: 64 are answered, the
   rest closed on accept; it keeps those 64 open.

While the commit attack runs the broker is killed with SIGKILL; it stays down longer than
every lease (the workers' queues are then retaken, their offsets read from the broker, and
queue 3 changes hands as the peer is gone) and is restarted on its port and data
directory. Once every queue is consumed again the peer does 1, 2, 3 and 5 again against
the new broker. A probe asks the broker's gRPC port for the group's members every 0.5 s
(10 s deadline) throughout, outside the outage. At the end the producer stops, the
workers drain the backlog and stop, and the broker gets SIGTERM with the peer's stuck
connection and its 64 others still open. Checked: per-key order and every acknowledged
message processed (tests/system/orderly_history.py `verify`), each probe answered, each
hostile request refused or capped as the rules say, no committed offset past what the
queue's holder processed (asked just before the kill), and the broker exiting 0 within
its stop grace and its bound on a peer that reads nothing.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from mockbroker import BrokerConfig
from sdk import Message, MessageQueue, Producer, shard_index
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk.consumer.allocate import AllocateMessageQueueAveragely
from tests.interop.harness import port_of
from tests.support import wait_until
from tests.system.hostile_peer import CommitAttack, FloodResult, HostilePeer
from tests.system.orderly_history import (
    BROKER_LEASE,
    REJOIN_TIMEOUT,
    SLACK,
    Entry,
    History,
    PacedProducer,
    Scene,
    orderly_broker,
    verify,
)
from tests.system.orderly_worker import CONFIG, GROUP, TOPIC

pytestmark = [pytest.mark.system]

QUEUES = 8
KEYS = [f"k{i:02d}" for i in range(48)]
BACKLOG_ROUNDS = 60
ROUND_INTERVAL = 1.0
DELAY_MS = 20
WORKERS = ("w1", "w2")
#: Lines the logs must grow by after the restart before the peer starts again.
PROGRESS = 200
#: The outage outlasts every lease: the workers' (3 s) and the broker's (4 s).
LONG_OUTAGE = BROKER_LEASE + CONFIG.lock_renew_interval
RETRY_FOR = 60.0
RESUME_TIMEOUT = 30.0 + SLACK
DRAIN_TIMEOUT = 60.0

MAX_PER_HOST = 64
FLOOD_CONNECTIONS = 80
FLOOD_FROM = "127.0.0.2"
FLOOD_GROUPS = 400
GROUPS_PER_HEARTBEAT = 50
#: The broker's default per-client topic limit (BrokerConfig.client_max_topics).
CLIENT_MAX_TOPICS = BrokerConfig().client_max_topics
#: Sorts after every worker's client id (host@pid@hex): allocated the last queues.
HOSTILE_ID = "~hostile@1"
NOBODY = "nobody-joined"
STUCK_GROUP = "hostile-stuck"
BULK_TOPIC = "hostile-bulk"
#: Pulls with the commit bit answered per queue before the broker is killed.
COMMITS_BEFORE_KILL = 20

PROBE_INTERVAL = 0.5
PROBE_DEADLINE = 10.0
#: The broker's stop grace (mockbroker/server.py stop(grace_seconds=5.0), one for every
#: front), the remoting server's last flush at a stop (STOP_FLUSH_SECONDS, 1 s), a margin.
STOP_LIMIT = 10.0


@dataclass
class ProbeCall:
    """One probe request: when it was sent, when it ended, what failed (None: answered)."""

    start: int
    end: int
    error: str | None


class Probe(threading.Thread):
    """Asks the broker's gRPC port for the workers' group every PROBE_INTERVAL seconds."""

    def __init__(self, address: str) -> None:
        super().__init__(name="broker-probe", daemon=True)
        self._address = address
        self._halt = threading.Event()
        self.calls: list[ProbeCall] = []

    def run(self) -> None:
        while not self._halt.is_set():
            start = time.monotonic_ns()
            error = None
            with grpc.insecure_channel(self._address) as channel:
                stub = pb_grpc.MessagingServiceStub(channel)
                try:
                    stub.GetConsumerList(pb.GetConsumerListRequest(group=GROUP),
                                         timeout=PROBE_DEADLINE)  # fmt: skip
                except grpc.RpcError as exc:
                    error = f"{exc.code()}: {exc.details()}"
            self.calls.append(ProbeCall(start, time.monotonic_ns(), error))
            self._halt.wait(PROBE_INTERVAL)  # the pace, not a wait for a condition

    def halt(self) -> None:
        """Stop after the call in flight."""
        self._halt.set()
        self.join(PROBE_DEADLINE + 5)


@dataclass
class HostileRun:
    """What the scenario left behind for the checks."""

    entries: list[Entry]
    rounds: int
    outages: list[tuple[int, int]]
    probes: list[ProbeCall]
    stuck_bytes: list[int] = field(default_factory=list)
    huge_answers: list[RemotingCommand] = field(default_factory=list)
    flood_codes: list[int] = field(default_factory=list)
    floods: list[FloodResult] = field(default_factory=list)
    attack: CommitAttack | None = None
    #: Queues whose committed offset was past the next one to process: (committed, processed).
    past_processed: dict[int, tuple[int, int]] = field(default_factory=dict)
    stopped_in: float | None = None  # seconds from SIGTERM to exit; None: it did not exit
    exit_code: int | None = None
    timeline: str = ""

    def probes_outside_outages(self) -> list[ProbeCall]:
        """The probe calls made while the broker was meant to be serving."""
        return [
            c
            for c in self.probes
            if not any(c.start <= serving and c.end >= killed for killed, serving in self.outages)
        ]


def allocation(members: list[str]) -> dict[str, list[int]]:
    """The queues each member takes, as the workers' strategy allocates them."""
    queues = [MessageQueue(TOPIC, "broker-a", q) for q in range(QUEUES)]
    strategy = AllocateMessageQueueAveragely()
    return {
        m: [mq.queue_id for mq in strategy.allocate(GROUP, m, queues, members)] for m in members
    }


def client_id(output: str) -> str:
    """A worker's client id, from its ready line."""
    return next(line.split()[1] for line in output.splitlines() if line.startswith("ready "))


def run_hostile(directory: Path) -> HostileRun:
    """The scenario of the module docstring, with its logs and broker data in `directory`."""
    assert {shard_index(k, QUEUES) for k in KEYS} == set(range(QUEUES)), "keys cover queues"
    broker = orderly_broker(
        directory / "broker", QUEUES,
        "--remoting-port", "0",
        "--remoting-max-connections-per-host", str(MAX_PER_HOST),
    )  # fmt: skip
    history = History(KEYS)
    scene = Scene(directory, broker, history)
    mark, until, sent = scene.mark, scene.until, scene.sent
    delay = ("--delay-ms", str(DELAY_MS))
    outages: list[tuple[int, int]] = []
    peer: HostilePeer | None = None
    probe: Probe | None = None
    result = HostileRun(entries=[], rounds=0, outages=outages, probes=[])

    def nuisance(life: int) -> None:
        """Steps 1, 2, 3 and 5 of the module docstring; what they leave open stays open."""
        assert peer is not None, "the broker has started"
        result.stuck_bytes.append(peer.stop_reading(STUCK_GROUP, BULK_TOPIC))
        mark(f"peer stopped reading, broker holds {result.stuck_bytes[-1]} bytes for it")
        result.floods.append(peer.connection_flood(FLOOD_CONNECTIONS, FLOOD_FROM))
        mark(f"connection flood: {result.floods[-1]}")
        result.huge_answers += peer.huge_client_id([NOBODY, GROUP])
        mark("1 MiB client ids sent")
        result.flood_codes += peer.heartbeat_flood(
            f"flood{life}", FLOOD_GROUPS, GROUPS_PER_HEARTBEAT
        )
        mark(f"{FLOOD_GROUPS} new groups named by heartbeats")

    def worker_consumed(worker: str, queue: int, since: int) -> bool:
        return any(e.queue == queue and e.start > since for e in history.by_worker[worker])

    try:
        broker.start()  # the remoting port accepts once announced; restarts keep it
        peer = HostilePeer("127.0.0.1", port_of(broker.fronts["remoting"]), TOPIC)
        with Producer(broker.address) as producer:
            producer.send(Message(BULK_TOPIC, b"x" * (4 << 20), sharding_key="bulk"))
        probe = Probe(broker.address)
        probe.start()
        scene.producer = paced = PacedProducer(
            broker.address, KEYS, ROUND_INTERVAL, backlog=BACKLOG_ROUNDS, retry_for=RETRY_FOR
        )
        paced.start()
        until(lambda: sent() >= BACKLOG_ROUNDS, 60, f"the backlog of {BACKLOG_ROUNDS} rounds")
        mark("backlog sent")
        scene.spawn_all(dict.fromkeys(WORKERS, delay))
        until(lambda: not history.queues_idle_since(0, QUEUES), REJOIN_TIMEOUT, "every queue busy")
        mark("every queue consumed")

        nuisance(1)

        ids = {client_id(scene.workers[w].output()): w for w in WORKERS}
        allocated = allocation([*ids, HOSTILE_ID])
        joined = mark("peer joins the workers' group")
        peer.join(GROUP, HOSTILE_ID)
        held = {q: ids[m] for m, qs in allocated.items() if m != HOSTILE_ID for q in qs}
        until(
            lambda: all(worker_consumed(w, q, joined) for q, w in held.items()),
            REJOIN_TIMEOUT,
            f"each queue to be consumed by its worker after the peer joined: {held}",
        )
        mark(f"the workers hold queues {sorted(held)}; the peer commits ahead on them")
        result.attack = attack = peer.commit_ahead(GROUP, HOSTILE_ID, sorted(held))
        until(
            lambda: min(attack.answered.values()) >= COMMITS_BEFORE_KILL,
            30,
            f"{COMMITS_BEFORE_KILL} pulls with a commit bit per queue",
        )

        # A worker commits an offset after its log has the line of the message before it.
        committed = peer.committed(GROUP, sorted(held))
        history.refresh()
        processed = {q: max(e.offset for e in history.entries() if e.queue == q) for q in held}
        result.past_processed = {
            q: (offset, processed[q])
            for q, offset in committed.items()
            if offset > processed[q] + 1
        }
        mark(f"committed {committed}, processed up to {processed}")
        killed = mark("broker killed during the commit attack")
        broker.kill9()
        peer.stop_commits()
        peer.forget_connections()
        wait_until(
            lambda: time.monotonic_ns() - killed >= LONG_OUTAGE * 1e9,
            LONG_OUTAGE + 1,
            "the outage",
        )
        broker.restart()
        back = mark("broker serving again")
        outages.append((killed, back))
        history.refresh()
        grown = history.lines() + PROGRESS
        until(
            lambda: history.lines() >= grown and not history.queues_idle_since(back, QUEUES),
            RESUME_TIMEOUT,
            "every queue to be consumed after the restart",
        )
        mark("every queue consumed again")

        nuisance(2)

        result.rounds = rounds = paced.halt()
        total = rounds * len(KEYS)
        mark(f"producer done: {rounds} rounds, {paced.failed_sends} failed sends retried")
        until(lambda: len(history.distinct) >= total, DRAIN_TIMEOUT, f"all {total} processed")
        mark("all processed")
        scene.stop_workers(list(WORKERS))
        mark("workers stopped")
        history.refresh()
        probe.halt()

        assert broker.proc is not None
        term = mark("SIGTERM to the broker, the stuck peer and 64 connections still open")
        broker.proc.send_signal(signal.SIGTERM)
        try:
            result.exit_code = broker.proc.wait(STOP_LIMIT)
            result.stopped_in = (time.monotonic_ns() - term) / 1e9
            mark(f"broker exited ({result.exit_code})")
        except subprocess.TimeoutExpired:
            mark(f"broker still running {STOP_LIMIT}s after SIGTERM")
    finally:
        if probe is not None:
            probe.halt()
        if peer is not None:
            peer.close()
        scene.clean_up()

    result.entries = history.entries()
    result.probes = probe.calls if probe is not None else []
    lines = [f"hostile peer: {result.rounds} rounds of {len(KEYS)} keys; logs in {directory}"]
    result.timeline = "\n".join(lines + scene.timeline())
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostileRun]:
    """The scenario, run once for the tests of this module."""
    began = time.monotonic()
    result = run_hostile(tmp_path_factory.mktemp("hostile-peer"))
    print(f"\nhostile peer run took {time.monotonic() - began:.1f}s\n{result.timeline}")
    yield result


def test_other_clients_keep_per_key_order_and_every_acknowledged_message(run: HostileRun) -> None:
    report = verify(run.entries, run.rounds, {}, KEYS, QUEUES, resends=True)
    text = f"{report.summary()}\n{run.timeline}"
    print(text)
    assert not report.errors, f"{len(report.errors)} violations:\n" + (
        "\n".join(report.errors[:30]) + "\n" + text
    )
    idle = [w for w in WORKERS if not report.lines_by_worker.get(w)]
    assert not idle, f"workers that processed nothing: {idle}\n{text}"


def test_the_broker_answers_throughout(run: HostileRun) -> None:
    calls = run.probes_outside_outages()
    failed = [c for c in calls if c.error is not None]
    worst = max((c.end - c.start) / 1e9 for c in calls)
    print(f"{len(calls)} probes outside the outage, the slowest answered in {worst:.3f}s")
    assert len(calls) >= 10, f"too few probes: {len(calls)}\n{run.timeline}"
    assert not failed, f"{len(failed)} probes not answered: {failed[:5]}\n{run.timeline}"


def test_each_hostile_request_is_refused_or_capped(run: HostileRun) -> None:
    assert len(run.stuck_bytes) == 2 and all(run.stuck_bytes), run.stuck_bytes
    assert run.floods == [FloodResult(MAX_PER_HOST, FLOOD_CONNECTIONS - MAX_PER_HOST)] * 2
    assert len(run.huge_answers) == 8
    for answer in run.huge_answers:
        assert answer.code == ResponseCode.SYSTEM_ERROR, answer
        assert "client_id must be 1-255 characters" in (answer.remark or ""), answer.remark
    served = CLIENT_MAX_TOPICS // GROUPS_PER_HEARTBEAT  # the rest would pass the limit
    refused = FLOOD_GROUPS // GROUPS_PER_HEARTBEAT - served
    per_life = [ResponseCode.SUCCESS] * served + [ResponseCode.SYSTEM_ERROR] * refused
    assert run.flood_codes == per_life * 2
    assert run.attack is not None and run.attack.error is None, run.attack
    assert min(run.attack.answered.values()) >= COMMITS_BEFORE_KILL


def test_a_pull_commits_nothing_past_what_the_queues_holder_processed(run: HostileRun) -> None:
    assert not run.past_processed, (
        f"offsets committed past the holder's progress (committed, processed): "
        f"{run.past_processed}\n{run.timeline}"
    )


def test_the_broker_stops_within_its_grace_on_sigterm(run: HostileRun) -> None:
    assert run.stopped_in is not None, f"no exit {STOP_LIMIT}s after SIGTERM\n{run.timeline}"
    print(f"the broker stopped {run.stopped_in:.2f}s after SIGTERM")
    assert run.exit_code == 0, run.timeline
