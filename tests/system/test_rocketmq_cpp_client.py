"""RocketMQ's own C++ client against mockbroker's name server and remoting port (issue 23).

The client is PyPI `rocketmq` 0.4.4 (a ctypes wrapper around rocketmq-client-cpp 1.2.3's
librocketmq.so), installed into ~/.cache/ordermq/interop by tests/interop/provision.py and run by
tests/interop/cpp_driver.py in processes of its own; the tests skip with the reason when it
cannot be installed (no network, not Linux x86-64) or when this mockbroker has no remoting
front. The broker is `python -m mockbroker --remoting-port P --namesrv-port N` in a process.

- orderly: a producer sends 100 keys x 40 rounds with send_orderly (each key on the queue
  ordermq's shard_index gives it); two orderly PushConsumer processes of one group share
  the queues; one is stopped half-way (SIGTERM; kill -9 in the second test) and the other
  takes its queues over from the committed offsets; every message is consumed, each key in
  order (orderly_history.verify); after both stopped cleanly, the group's committed
  offsets (read over gRPC) are the queues' ends, and a restarted consumer takes up exactly
  the messages sent meanwhile;
- one truth: what the C++ producer sends is read over gRPC by the ordermq SDK, and what the
  SDK sends is consumed by a C++ (concurrent) PushConsumer, keys, tags and queues intact;
- pull: a C++ PullConsumer reads every message of every queue, at the offsets and with the
  message ids the producer was given.

Without a server, the drivers still run here: bad arguments, no name server at all, and a
name server that accepts connections and never answers all end them with a clear error in
bounded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sdk import LitePullConsumer, Message, Producer, shard_index
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from tests.chaos_report import ChaosRecorder, scaled
from tests.component.scraping import scrape
from tests.interop.harness import (
    Driver,
    Event,
    GrpcView,
    RemotingBroker,
    brokers,
    drivers,
    port_of,
    remoting_support,
    wait_across,
)
from tests.interop.provision import Client, require
from tests.remoting_client import RemotingClient
from tests.support import ROOT, free_port, wait_until
from tests.system.orderly_history import Entry, verify

pytestmark = [pytest.mark.system, pytest.mark.interop]

QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(100)]
#: Messages per key (4 000 in all; make chaos: 40 000); the kill -9 variant sends fewer.
#: The checks are per message and per queue handed over, whatever the count: 4 000 keep
#: every queue busy past the half-way stop and cost the C++ processes and the history's
#: verification less than half of 10 000.
ROUNDS = scaled(40, 400)
KILL_ROUNDS = scaled(30, 200)
#: Rounds sent while no consumer runs, before the restart.
EXTRA_ROUNDS = 5
#: The lock lease the kill -9 variant gives the broker: a killed consumer's queues are free
#: once it expires (RocketMQ's 60 s would make the test slow); the C++ client renews its
#: locks every 20 s, so a live consumer keeps them.
KILL_LEASE = 30.0
#: Generous bounds for a loaded two-core machine; the tests wait on conditions. Consuming
#: includes, in the kill -9 variant, the take-over after KILL_LEASE.
PRODUCE_TIMEOUT = scaled(120, 600)
CONSUME_TIMEOUT = scaled(180, 900)


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cpp() -> Client:
    return require("cpp")


@pytest.fixture
def run(cpp: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    """`run(name, *args)` starts cpp_driver.py; whatever still runs is killed at the end."""
    with drivers(cpp, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., RemotingBroker]]:
    """`broker(*args)` starts a remoting broker (skips when this build has none)."""
    with brokers(tmp_path) as start:
        yield start


# ---------------------------------------------------------------------------- helpers
def placement(tmp_path: Path, keys: list[str]) -> Path:
    """A --key-queues file placing each key where ordermq's shard_index does."""
    path = tmp_path / "key-queues.json"
    path.write_text(json.dumps({k: shard_index(k, QUEUES) for k in keys}))
    return path


def produce_args(b: RemotingBroker, topic: str, *args: str) -> list[str]:
    return ["produce", "--namesrv", b.namesrv, "--topic", topic, "--group", "interop-producer",
            "--deadline", str(PRODUCE_TIMEOUT), *args]  # fmt: skip


def push_args(b: RemotingBroker, topic: str, group: str, *args: str) -> list[str]:
    return ["push", "--namesrv", b.namesrv, "--topic", topic, "--group", group, *args]


def entries(drivers: list[Driver]) -> list[Entry]:
    """The listener calls of the consumer drivers, as orderly_history entries."""
    return [
        Entry(d.name, e["key"], e["seq"], e["queue"], e["offset"], e["start"], e["end"])
        for d in drivers
        for e in d.of("message")
        if e["key"] is not None
    ]


def distinct(drivers: list[Driver]) -> int:
    return len({(e["key"], e["seq"]) for d in drivers for e in d.of("message")})


@dataclass
class Stop:
    """What the first consumer held when it was stopped, and where the survivor went on."""

    #: The queues whose latest listener call before the stop was the stopped consumer's.
    queues: list[int]
    #: Queue id -> offset of the stopped consumer's last listener call on it.
    last: dict[int, int]
    #: Queue id -> the survivor's first offset on it after that call (None: it never began).
    taken_at: dict[int, int | None]
    #: The group's committed offsets right after the stop, as the broker answers a consumer
    #: of the group (QUERY_CONSUMER_OFFSET); a killed consumer's are read once the broker
    #: has read all it sent, and while its locks still keep the survivor off its queues.
    committed: dict[int, int | None]


def handed_over(
    stopped: Driver, survivor: Driver, before_ns: int, committed: dict[int, int | None]
) -> Stop:
    """Which queues `stopped` held at `before_ns`, and where `survivor` took them up."""
    latest: dict[int, tuple[int, str]] = {}
    for d in (stopped, survivor):
        for e in d.of("message"):
            if e["start"] < before_ns and e["start"] > latest.get(e["queue"], (0, ""))[0]:
                latest[e["queue"]] = (e["start"], d.name)
    queues = sorted(q for q, (_, name) in latest.items() if name == stopped.name)
    last_call = {}
    for e in stopped.of("message"):
        if e["queue"] in queues and e["end"] > last_call.get(e["queue"], {"end": 0})["end"]:
            last_call[e["queue"]] = e
    taken_at: dict[int, int | None] = {}
    for q in queues:
        after = [
            e
            for e in survivor.of("message")
            if e["queue"] == q and e["start"] > last_call[q]["end"]
        ]
        taken_at[q] = min(after, key=lambda e: e["start"])["offset"] if after else None
    return Stop(queues, {q: last_call[q]["offset"] for q in queues}, taken_at, committed)


def resume_point(committed: int | None) -> int:
    """Where a consumer of the group begins a queue: its committed offset, else 0.

    0 as RocketMQ's broker answers a group with no offset while the queue still holds its
    first message (reference section 10).
    """
    return 0 if committed is None else committed


def queried_offsets(b: RemotingBroker, group: str, topic: str) -> dict[int, int | None]:
    """Queue id -> where the broker tells a consumer of `group` to begin (None: not found).

    Over remoting, as the C++ consumers ask it: QUERY_CONSUMER_OFFSET answers once every
    commit of the queue the broker accepted is saved (gRPC answers what is saved now).
    """

    async def work() -> dict[int, int | None]:
        client = await RemotingClient.connect(f"127.0.0.1:{b.remoting_port}")
        try:
            found: dict[int, int | None] = {}
            for q in range(QUEUES):
                fields = {"consumerGroup": group, "topic": topic, "queueId": str(q)}
                command = RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=fields)
                answer = await client.request(command, 60)
                if answer.code == ResponseCode.QUERY_NOT_FOUND:
                    found[q] = None
                    continue
                assert answer.code == ResponseCode.SUCCESS and answer.ext_fields, answer.remark
                found[q] = int(answer.ext_fields["offset"])
            return found
        finally:
            await client.close()

    return asyncio.run(work())


def disconnected_members(metrics_port: int, group: str) -> float:
    """The group's members whose connection closed, in their disconnect grace (metrics)."""
    return scrape(metrics_port).get(("ordermq_group_members_disconnected", (("group", group),)), 0)


def first_offsets(driver: Driver) -> dict[int, int]:
    """Queue id -> the offset of `driver`'s first listener call on it."""
    first: dict[int, int] = {}
    for e in sorted(driver.of("message"), key=lambda e: e["start"]):
        first.setdefault(e["queue"], e["offset"])
    return first


# ---------------------------------------------------------------------------- no server
def test_the_drivers_refuse_bad_arguments(cpp: Client) -> None:
    cases = [
        (["produce", "--namesrv", "localhost", "--topic", "t", "--group", "g"], "HOST:PORT"),
        (["produce", "--namesrv", "127.0.0.1:1;localhost", "--topic", "t", "--group", "g"],
         "HOST:PORT[;HOST:PORT...]"),
        (["produce", "--namesrv", "127.0.0.1:1", "--topic", "t", "--group", "g", "--keys", "0"],
         "--keys must be at least 1"),
        (["pull", "--namesrv", "127.0.0.1:1", "--topic", "t"], "--group"),
        (["push", "--namesrv", "127.0.0.1:1", "--topic", "t", "--group", "g", "--log-level",
          "LOUD"], "--log-level"),
        (["subscribe"], "invalid choice"),
    ]  # fmt: skip
    for args, expected in cases:
        proc = subprocess.run(cpp.command(*args), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (args, proc.stderr)
        assert proc.stdout == ""


def test_without_a_name_server_each_driver_ends_at_once_with_a_clear_error(
    run: Callable[..., Driver],
) -> None:
    namesrv = f"127.0.0.1:{free_port()}"  # nothing listens there
    common = ["--namesrv", namesrv, "--topic", "nowhere", "--group", "g", "--deadline", "60"]
    started = {
        # --route-timeout 0: the client's own failure of a send without a route
        "produce": run("producer", "produce", *common, "--route-timeout", "0"),
        "push": run("push", "push", *common, "--orderly", "--route-timeout", "2"),
        "pull": run("pull", "pull", *common, "--route-timeout", "2"),
    }
    # With --resend a failed send is sent again (each failure printed) until the deadline.
    resender = run("resender", "produce", *common[:-1], "3", "--resend", "--resend-backoff",
                   "0.2", "--route-timeout", "0")  # fmt: skip
    for driver in started.values():
        assert driver.finish(60) == 2, driver.describe()
    assert resender.finish(60) == 3, resender.describe()
    failed = resender.of("send_failed")
    assert len(failed) >= 2 and not resender.of("sent"), resender.describe()
    assert {(e["key"], e["seq"]) for e in failed} == {("k000", 0)}, failed
    assert "No route info of this topic" in failed[0]["message"]
    assert "No route info of this topic" in started["produce"].of("error")[0]["message"]
    assert started["produce"].of("started"), "the producer starts without a name server"
    for name in ("push", "pull"):
        error = started[name].of("error")[0]["message"]
        assert f"no route for topic nowhere from the name server at {namesrv} within 2 s" in error
        assert not started[name].of("started")


class LateForwarder:
    """A port that refuses connections until `open()`, then forwards each to `target`."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))  # bound, not listening: connections refused
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []

    def open(self) -> None:
        self._listener.listen(16)
        self._spawn(self._accept)

    def close(self) -> None:
        self._listener.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self._listener.accept()
                server = socket.create_connection(self._target)
                self._spawn(self._pipe, client, server)
                self._spawn(self._pipe, server, client)

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_a_producer_whose_first_route_request_fails_sends_once_a_route_comes(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker]
) -> None:
    # The C++ client's first route request can fail at once (seen on a loaded machine with
    # the name server up): the driver's producer sends its first message again while it
    # fails for want of a route, up to --route-timeout, as its consumers wait for a route.
    b = broker()
    topic = "late-route"
    GrpcView(b.address).create_topic(topic, QUEUES)
    late = LateForwarder(b.namesrv)
    try:
        producer = run("producer", "produce", "--namesrv", late.address, "--topic", topic,
                       "--group", "late-producer", "--keys", "3", "--rounds", "2",
                       "--route-timeout", "60", "--deadline", "90")  # fmt: skip
        waited = producer.wait_event("route_wait")
        assert "No route info of this topic" in waited["message"], waited
        late.open()
        assert producer.finish(PRODUCE_TIMEOUT) == 0, producer.describe()
    finally:
        late.close()
    assert len(producer.of("sent")) == 6, producer.describe()


def test_a_silent_name_server_ends_the_drivers_within_their_bounds(
    run: Callable[..., Driver],
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        namesrv = f"127.0.0.1:{silent.getsockname()[1]}"
        common = ["--namesrv", namesrv, "--topic", "t", "--group", "g"]
        began = time.monotonic()
        producer = run("producer", "produce", *common, "--deadline", "3")
        pull = run("pull", "pull", *common, "--route-timeout", "1", "--deadline", "60")
        assert producer.finish(60) == 3, producer.describe()  # a send alone would take 60 s
        assert "--deadline of 3 s" in producer.of("error")[0]["message"]
        assert pull.finish(60) == 2, pull.describe()  # one route request: the client's 5 s
        assert "no route for topic t" in pull.of("error")[0]["message"]
        assert time.monotonic() - began < 45


# ---------------------------------------------------------------------------- orderly
def orderly_scene(
    run: Callable[..., Driver],
    b: RemotingBroker,
    tmp_path: Path,
    topic: str,
    rounds: int,
    stop: Callable[[Driver], None],
    read: Callable[[], None] = lambda: None,
) -> tuple[Driver, Driver, Stop]:
    """Two orderly consumers, a producer, and `stop` applied to the first half-way.

    The group's committed offsets are read once `stop` returned; `read` is called right
    after. Returns once every message was consumed: both consumer drivers and the hand-over.
    """
    group = f"{topic}-group"
    grpc = GrpcView(b.address)
    grpc.create_topic(topic, QUEUES)
    c1 = run("c1", *push_args(b, topic, group, "--orderly"))
    c2 = run("c2", *push_args(b, topic, group, "--orderly"))
    c1.wait_event("started")
    c2.wait_event("started")
    producer = run("producer", *produce_args(b, topic, "--key-queues",
                   str(placement(tmp_path, KEYS)), "--rounds", str(rounds),
                   "--report", "summary"))  # fmt: skip
    total = len(KEYS) * rounds
    wait_across(
        [c1, c2],
        lambda: distinct([c1, c2]) >= total // 2 and bool(c1.of("message") and c2.of("message")),
        CONSUME_TIMEOUT,
        "half the messages consumed, some by each consumer",
        finishing=[producer],  # on a loaded machine it may send everything before that
    )
    before = time.monotonic_ns()
    stop(c1)
    committed = queried_offsets(b, group, topic)
    read()
    assert producer.finish(PRODUCE_TIMEOUT) == 0, producer.describe()
    wait_across(
        [c2], lambda: distinct([c1, c2]) >= total, CONSUME_TIMEOUT, "every message consumed"
    )
    return c1, c2, handed_over(c1, c2, before, committed)


@pytest.mark.chaos
def test_orderly_consumers_keep_each_keys_order_through_a_stop_and_a_restart(
    run: Callable[..., Driver],
    broker: Callable[..., RemotingBroker],
    tmp_path: Path,
    chaos_report: ChaosRecorder,
) -> None:
    b = broker("--default-queues", str(QUEUES))
    topic, group = "cpp-orderly", "cpp-orderly-group"

    def sigterm(c: Driver) -> None:
        assert c.terminate() == 0, c.describe()
        assert c.of("stopped"), c.describe()

    c1, c2, stop = orderly_scene(run, b, tmp_path, topic, ROUNDS, sigterm)
    # A planned stop persists its offsets and unlocks its queues; the survivor begins each
    # right after the stopped consumer's last message: nothing re-delivered, nothing skipped.
    errors = [
        f"queue {q}: c1 stopped after offset {stop.last[q]}, c2 went on at {stop.taken_at[q]}"
        for q in stop.queues
        if stop.taken_at[q] != stop.last[q] + 1
    ]
    # Both stopped cleanly: the group's offsets, read over gRPC, are the queues' ends.
    assert c2.terminate() == 0, c2.describe()
    grpc = GrpcView(b.address)
    committed, ends = grpc.committed(group, topic), grpc.max_offsets(topic)
    assert committed == ends, f"committed {committed}, queue ends {ends}"

    # Sent while nobody consumes; a restarted consumer takes up exactly those.
    extra = run("producer2", *produce_args(b, topic, "--key-queues",
                str(placement(tmp_path, KEYS)), "--first-seq", str(ROUNDS),
                "--rounds", str(EXTRA_ROUNDS), "--report", "summary"))  # fmt: skip
    assert extra.finish(PRODUCE_TIMEOUT) == 0, extra.describe()
    c3 = run("c1-restarted", *push_args(b, topic, group, "--orderly"))
    everything = len(KEYS) * (ROUNDS + EXTRA_ROUNDS)
    wait_across([c3], lambda: distinct([c1, c2, c3]) >= everything, CONSUME_TIMEOUT,
                "the messages sent while no consumer ran")  # fmt: skip
    assert c3.terminate() == 0, c3.describe()
    errors += [
        f"queue {q}: the restarted consumer began at {offset}, committed was {committed[q]}"
        for q, offset in first_offsets(c3).items()
        if offset != committed[q]
    ]
    if len(c3.of("message")) != len(KEYS) * EXTRA_ROUNDS:
        errors.append(f"the restart processed {len(c3.of('message'))} messages, not "
                      f"{len(KEYS) * EXTRA_ROUNDS}")  # fmt: skip

    report = verify(entries([c1, c2, c3]), ROUNDS + EXTRA_ROUNDS, {}, KEYS, QUEUES)
    report.record(chaos_report, "C++ orderly consumer stopped (SIGTERM), then restarted",
                  ROUNDS + EXTRA_ROUNDS, f"{len(stop.queues)} queues handed over; "
                  f"lines by consumer {report.lines_by_worker}")  # fmt: skip
    print(report.summary())
    assert not report.errors + errors, "\n".join((report.errors + errors)[:20])


@pytest.mark.chaos
def test_a_killed_orderly_consumers_queues_resume_from_the_committed_offsets(
    run: Callable[..., Driver],
    broker: Callable[..., RemotingBroker],
    tmp_path: Path,
    chaos_report: ChaosRecorder,
) -> None:
    group = "cpp-killed-group"
    b = broker(
        "--default-queues", str(QUEUES),
        "--lock-lease-seconds", str(KILL_LEASE),
        "--disconnect-grace-seconds", "2",
        "--metrics-port", "0",
    )  # fmt: skip
    metrics = port_of(b.process.fronts["metrics"])

    def kill9(c: Driver) -> None:
        # Reaped is not enough: what c1 wrote to its socket before it died (an offset
        # commit, oneway) may not be read yet. The broker counts c1 disconnected once it has
        # read everything c1 sent; a query read after that answers every commit of c1's.
        c.kill9()
        wait_until(lambda: disconnected_members(metrics, group) == 1, 60,
                   "the broker seeing c1's connection close")  # fmt: skip

    def still_in_grace() -> None:
        # c1 still a member: its locks still held, no commit of c2's on its queues yet.
        assert disconnected_members(metrics, group) == 1, "c1 left before the offsets were read"

    c1, c2, stop = orderly_scene(run, b, tmp_path, "cpp-killed", KILL_ROUNDS, kill9, still_in_grace)
    # Re-delivery (at most what c1 processed since its last offset persist, every 5 s)
    # starts exactly at what was committed when it died, and never past its last message.
    errors = [
        f"queue {q}: c1 died after offset {stop.last[q]} with {stop.committed[q]} committed; "
        f"c2 went on at {stop.taken_at[q]}"
        for q in stop.queues
        if stop.taken_at[q] != resume_point(stop.committed[q])
        or resume_point(stop.committed[q]) > stop.last[q] + 1
    ]
    assert c2.terminate() == 0, c2.describe()
    report = verify(entries([c1, c2]), KILL_ROUNDS, {}, KEYS, QUEUES)
    redelivered = sum(stop.last[q] + 1 - resume_point(stop.committed[q]) for q in stop.queues)
    report.record(chaos_report, "C++ orderly consumer killed (-9)", KILL_ROUNDS,
                  f"{len(stop.queues)} queues taken over after the {KILL_LEASE:g} s lock "
                  f"lease; {redelivered} re-delivered from the committed offsets")  # fmt: skip
    print(report.summary())
    assert not report.errors + errors, "\n".join((report.errors + errors)[:20])


# ---------------------------------------------------------------------------- one truth
def test_what_the_cpp_client_sends_the_sdk_reads_and_the_other_way_round(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker], tmp_path: Path
) -> None:
    b = broker()
    topic, keys = "cpp-one-truth", KEYS[:10]
    GrpcView(b.address).create_topic(topic, QUEUES)
    placed = str(placement(tmp_path, keys))
    producer = run(
        "producer",
        *produce_args(b, topic, "--key-queues", placed, "--rounds", "2", "--tags", "FromCpp"),
    )
    assert producer.finish(PRODUCE_TIMEOUT) == 0, producer.describe()
    sent = {(e["key"], e["seq"]): e for e in producer.of("sent")}
    assert len(sent) == 2 * len(keys)

    got = []
    with LitePullConsumer("sdk-reader", b.address, auto_commit=False) as reader:
        queues = reader.fetch_message_queues(topic)
        reader.assign(queues)
        for q in queues:
            reader.seek_to_begin(q)
        wait_until(lambda: bool(got.extend(reader.poll(0.5))) or len(got) >= len(sent), 60,
                   "the SDK reading what the C++ client sent")  # fmt: skip
    assert len(got) == len(sent)
    for m in got:
        key, seq = m.body.decode().split(":")
        assert (m.topic, m.tags, m.keys) == (topic, "FromCpp", (key,)), m
        assert m.queue.queue_id == shard_index(key, QUEUES), m
        assert m.queue_offset == sent[(key, int(seq))]["offset"], m

    with Producer(b.address) as sdk_producer:
        for key in keys:
            sdk_producer.send(Message(topic, f"{key}:2".encode(), tags="FromSdk", keys=key,
                                      sharding_key=key))  # fmt: skip
    # A new group: the broker answers QUERY_CONSUMER_OFFSET with 0 while the queue still
    # holds its first message (the Java broker's rule), so the consumer reads from the start.
    consumer = run("cpp-consumer", *push_args(b, topic, "cpp-one-truth-group"))
    wait_across([consumer], lambda: distinct([consumer]) >= 3 * len(keys), CONSUME_TIMEOUT,
                "the C++ consumer reading both producers' messages")  # fmt: skip
    from_sdk = [e for e in consumer.of("message") if e["tags"] == "FromSdk"]
    assert sorted(e["key"] for e in from_sdk) == sorted(keys)
    for e in from_sdk:
        assert (e["topic"], e["keys"], e["seq"]) == (topic, e["key"], 2), e
        assert e["queue"] == shard_index(e["key"], QUEUES), e
    assert consumer.terminate() == 0, consumer.describe()


# ---------------------------------------------------------------------------- pull
def test_the_pull_consumer_reads_every_message_where_the_producer_was_told(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker]
) -> None:
    b = broker()
    topic = "cpp-pull"
    grpc = GrpcView(b.address)
    grpc.create_topic(topic, QUEUES)
    producer = run("producer", *produce_args(b, topic, "--mode", "sync", "--keys", "50",
                   "--rounds", "40"))  # fmt: skip
    assert producer.finish(PRODUCE_TIMEOUT) == 0, producer.describe()
    sent = {(e["key"], e["seq"]): e for e in producer.of("sent")}
    assert len(sent) == 2000

    puller = run("puller", "pull", "--namesrv", b.namesrv, "--topic", topic,
                 "--group", "cpp-pull-group", "--deadline", str(CONSUME_TIMEOUT))  # fmt: skip
    assert puller.finish(CONSUME_TIMEOUT) == 0, puller.describe()
    pulled: list[Event] = puller.of("message")
    assert sorted((e["key"], e["seq"]) for e in pulled) == sorted(sent)
    for e in pulled:
        told = sent[(e["key"], e["seq"])]
        assert (e["msg_id"], e["offset"]) == (told["msg_id"], told["offset"]), (e, told)
    ends = grpc.max_offsets(topic)
    done = {e["queue"]: e for e in puller.of("queue_done")}
    assert sorted(done) == sorted(ends)
    for q, end in ends.items():
        offsets = [e["offset"] for e in pulled if e["queue"] == q]
        assert offsets == list(range(end)), f"queue {q}: {offsets[:10]}... of {end}"
        assert (done[q]["next_offset"], done[q]["max_offset"]) == (end, end), done[q]


# ---------------------------------------------------------------------------- bench
def test_the_bench_remoting_group_measures_sends_and_pulls(cpp: Client, tmp_path: Path) -> None:
    out = tmp_path / "remoting.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--only", "remoting", "--quick",
         "--messages", "4000", "--quiet", "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    if reason := report["facts"].get("remoting_skipped"):
        assert reason == remoting_support()  # the client is there: only the front may lack
        pytest.skip(reason)
    figures = {f["key"]: f for f in report["figures"]}
    assert sorted(figures) == ["remoting.pull", "remoting.send.orderly", "remoting.send.sync"]
    assert all(f["median"] > 0 for f in figures.values()), figures
    assert figures["remoting.pull"]["runs"][0]["units"] == 4000
    assert figures["remoting.send.sync"]["runs"][0]["units"] == 2000
