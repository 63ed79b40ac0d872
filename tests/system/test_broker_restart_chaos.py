"""Orderly consumption through broker crashes: kill -9 three times, and a rolling restart.

The scenario runs three times: with the workers in queue mode (RocketMQ's), in key mode
(ProcessingOrder.KEY: keys of a queue side by side, each in order), where exclusivity
is checked per key instead of per queue, and in queue mode with push delivery
(`--delivery push`: the broker sends each held queue's batches within credits; a
subscription the crash cut is opened again, at the lock epoch the worker holds then).

A broker process with a short lock lease (4 s) and client timeout (6 s); a producer in this
process first sends a backlog (40 rounds of one message per key, 160 keys over 8 queues,
body "key:seq"), then a round a second. Three consumer processes
(tests/system/orderly_worker.py) work 10 ms per message, so the backlog keeps every queue
busy for tens of seconds. While it lasts:

1. the broker is killed with SIGKILL and restarted on the same port and data directory,
   three times, once every worker consumes; each outage lasts until a send met it, the
   second one also longer than every lease (the workers stop consuming; the locks the
   broker kept on disk are all that keeps their queues theirs). After each restart every
   queue must be consumed again, and the logs grow, before the next step;
2. between the first and the second crash, one worker is replaced (rolling restart):
   SIGTERM, it exits after handing its queues over, and a new one starts;
3. once every acknowledged message is in the union of the logs, the workers get SIGTERM.

A send waits for a broker that is down (up to its deadline); one that fails anyway is
retried by the producer until acknowledged, each round before the next, so every message
of the counted rounds was acknowledged. A retried send may have been stored twice (the
broker stored it and died before answering); such copies are counted apart. The history
is checked as in test_orderly_chaos.py: every key in order (never n+1 before n), nothing
acknowledged lost, nothing invented, no two listener calls on a queue at the same time
(also across broker restarts), duplicates counted and printed (`pytest -s`); and a planned
hand-over re-delivers nothing, for hand-overs whose offset commit met a running broker.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sdk import shard_index
from tests.chaos_report import ChaosRecorder
from tests.component.scraping import scrape
from tests.support import wait_until
from tests.system.orderly_history import (
    BROKER_LEASE,
    CLIENT_TIMEOUT,
    EXPIRY_SWEEP,
    REJOIN_TIMEOUT,
    SLACK,
    Entry,
    History,
    PacedProducer,
    Revoke,
    Scene,
    orderly_broker,
    verify,
    verify_handovers,
)
from tests.system.orderly_worker import CONFIG

pytestmark = [pytest.mark.system, pytest.mark.chaos]

QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(160)]
#: Rounds sent before the workers start: 6 400 messages, 800 per queue, at 10 ms each.
BACKLOG_ROUNDS = 40
#: Then a round a second (160 messages/s): every queue keeps receiving messages.
ROUND_INTERVAL = 1.0
DELAY_MS = 10
#: Lines the logs must grow by after a restart before the next step.
PROGRESS = 400
#: The second outage outlasts every lease: the workers' (3 s) and the broker's (4 s).
LONG_OUTAGE = BROKER_LEASE + CONFIG.lock_renew_interval
#: How long the producer retries a round that failed (a send itself waits 10 s at most).
RETRY_FOR = 60.0
#: The clients' longest reconnect back-off (sdk/_wire.py GRPC_CLIENT_CHANNEL_OPTIONS).
RECONNECT_BACKOFF = 2.0
#: After a restart, each owner reconnects and renews its lock (kept on disk) or retakes it
#: at a rebalance; at worst a queue moves once the broker expired its silent owner.
RESUME_TIMEOUT = (
    RECONNECT_BACKOFF
    + CONFIG.heartbeat_interval
    + CLIENT_TIMEOUT
    + EXPIRY_SWEEP
    + 2 * CONFIG.rebalance_interval
) + SLACK
DRAIN_TIMEOUT = 60.0


@dataclass
class RestartRun:
    """What the scenario left behind for the checks."""

    entries: list[Entry]
    revokes: list[Revoke]
    rounds: int
    outages: list[tuple[int, int]]  # monotonic ns: broker killed, broker serving again
    failed_sends: int
    timeline: str
    ordering: str  # the workers' ProcessingOrder: "queue" or "key"
    delivery: str  # the workers' PushConsumerConfig.delivery: "pull" or "push"
    port: bool  # the broker had its Exchange port on (the clients' streams went there)
    #: Requests the broker counted since its last restart, by method (Pull, Subscribe...).
    requests: dict[str, float]


def run_restarts(
    directory: Path, ordering: str, delivery: str = "pull", port: bool = False
) -> RestartRun:
    """The scenario of the module docstring, with its logs and broker data in `directory`;
    the workers keep `ordering` ("queue" or "key": ProcessingOrder's values) and get their
    messages by `delivery` ("pull" or "push"); with `port` the broker serves its Exchange
    port, which its routes name, so the clients' sends and subscriptions go there."""
    assert {shard_index(k, QUEUES) for k in KEYS} == set(range(QUEUES)), "keys cover queues"
    port_args = ("--exchange-port", "0" if port else "off")
    broker = orderly_broker(directory / "broker", QUEUES, "--metrics-port", "0", *port_args)
    history = History(KEYS)
    scene = Scene(directory, broker, history)
    mark, until, sent = scene.mark, scene.until, scene.sent
    delay = ("--delay-ms", str(DELAY_MS), "--ordering", ordering, "--delivery", delivery)
    outages: list[tuple[int, int]] = []

    def backlog() -> int:
        return sent() * len(KEYS) - len(history.distinct)

    def every_queue_consumed_since(ns: int, what: str, timeout: float) -> None:
        until(lambda: not history.queues_idle_since(ns, QUEUES), timeout, what)

    def crash(n: int, down: float = 0.0) -> int:
        """kill -9 the broker; restart it once a send met the outage (and `down` s passed);
        wait until every queue is consumed again and the logs grew by PROGRESS lines."""
        killed = mark(f"broker killed ({n}), backlog {backlog()} messages")
        broker.kill9()
        sends = producer.sends
        wait_until(
            lambda: sent() >= 0 and (producer.sending or producer.sends > sends),
            ROUND_INTERVAL + SLACK,
            "a send to meet the killed broker",
        )
        wait_until(lambda: time.monotonic_ns() - killed >= down * 1e9, down + 1, "the outage")
        broker.restart()
        serving = mark("broker serving again")
        outages.append((killed, serving))
        history.refresh()
        grown = history.lines() + PROGRESS
        until(
            lambda: history.lines() >= grown and not history.queues_idle_since(serving, QUEUES),
            RESUME_TIMEOUT,
            f"every queue to be consumed after restart {n}",
        )
        mark("every queue consumed again")
        return serving

    def replace_w1(since: int) -> None:
        """Rolling restart: w1 (busy since `since`) hands its queues over; w4 takes its place."""
        until(lambda: history.started_after("w1", since), REJOIN_TIMEOUT, "w1 busy")
        scene.stop_workers(["w1"])
        left = mark("w1 stopped")
        scene.spawn("w4", *delay)
        until(lambda: history.started_after("w4", left), REJOIN_TIMEOUT, "w4 busy")
        every_queue_consumed_since(left, "every queue consumed after w1 left", REJOIN_TIMEOUT)
        mark("w4 consuming, every queue consumed")

    try:
        broker.start()
        scene.producer = producer = PacedProducer(
            broker.address, KEYS, ROUND_INTERVAL, backlog=BACKLOG_ROUNDS, retry_for=RETRY_FOR
        )
        producer.start()
        until(lambda: sent() >= BACKLOG_ROUNDS, 60, f"the backlog of {BACKLOG_ROUNDS} rounds")
        mark(f"backlog sent: {backlog()} messages")
        scene.spawn_all(dict.fromkeys(("w1", "w2", "w3"), delay))
        until(
            lambda: all(history.started_after(w, 0) for w in ("w1", "w2", "w3")),
            REJOIN_TIMEOUT,
            "every worker to be consuming",
        )
        every_queue_consumed_since(0, "every queue to be consumed", REJOIN_TIMEOUT)

        replace_w1(since=crash(1))
        crash(2, down=LONG_OUTAGE)
        crash(3)

        rounds = producer.halt()
        total = rounds * len(KEYS)
        mark(f"producer done: {rounds} rounds, {producer.failed_sends} failed sends retried")
        until(lambda: len(history.distinct) >= total, DRAIN_TIMEOUT, f"all {total} processed")
        mark("all processed")
        scene.stop_workers(["w2", "w3", "w4"])
        mark("workers stopped")
        history.refresh()
        metrics_port = int(broker.fronts["metrics"].rsplit(":", 1)[1])
        if delivery == "push":  # a subscription counts once the broker saw it end
            wait_until(
                lambda: requests_by_method(metrics_port).get("Subscribe", 0) >= QUEUES,
                SLACK,
                "the broker to count the workers' subscriptions as ended",
            )
        requests = requests_by_method(metrics_port)
        if port:
            accepted = scrape(metrics_port)[
                ("ordermq_exchange_port_connections_accepted_total", ())
            ]
            requests["exchange port connections"] = accepted
    finally:
        scene.clean_up()

    lines = [
        f"broker restarts, {ordering} mode, {delivery}{' on the Exchange port' * port}: "
        f"{total} messages sent in {rounds} rounds; "
        f"logs in {directory}"
    ]
    return RestartRun(
        entries=history.entries(),
        revokes=[r for w in scene.workers.values() for r in w.revokes()],
        rounds=rounds,
        outages=outages,
        failed_sends=producer.failed_sends,
        timeline="\n".join(lines + scene.timeline()),
        ordering=ordering,
        delivery=delivery,
        port=port,
        requests=requests,
    )


def requests_by_method(metrics_port: int) -> dict[str, float]:
    """ordermq_rpc_requests_total summed over codes, by method (subscriptions count once
    each ends: after the workers stopped, every one)."""
    counts: dict[str, float] = {}
    for (name, labels), value in scrape(metrics_port).items():
        if name == "ordermq_rpc_requests_total":
            method = dict(labels)["method"]
            counts[method] = counts.get(method, 0) + value
    return counts


@pytest.fixture(
    scope="module",
    params=[("queue", "pull", False), ("key", "pull", False), ("queue", "push", False),
            ("queue", "push", True)],
    ids=["queue", "key", "queue-push", "queue-push-port"],
)  # fmt: skip
def run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestartRun]:
    """The scenario, run once per processing order (and with push delivery) for the tests
    of this module."""
    ordering, delivery, port = request.param
    began = time.monotonic()
    result = run_restarts(tmp_path_factory.mktemp("broker-restarts"), ordering, delivery, port)
    took = time.monotonic() - began
    print(f"\nbroker restart chaos ({ordering} mode, {delivery}, port {port}) took {took:.1f}s")
    yield result


def test_every_acknowledged_message_in_order_through_broker_crashes(
    run: RestartRun, chaos_report: ChaosRecorder
) -> None:
    report = verify(run.entries, run.rounds, {}, KEYS, QUEUES, resends=True, exclusive=run.ordering)
    note = f"{len(run.outages)} restarts, {report.copies} copies from retried sends"
    what = "broker kill -9 and restart" + (", key mode" if run.ordering == "key" else "")
    what += ", push delivery" if run.delivery == "push" else ""
    what += " on the Exchange port" if run.port else ""
    report.record(chaos_report, what, run.rounds, note)
    text = (
        f"{report.summary()}; {run.failed_sends} failed sends retried; requests since the "
        f"last restart: {run.requests}\n{run.timeline}"
    )
    print(text)
    assert not report.errors, f"{len(report.errors)} violations:\n" + (
        "\n".join(report.errors[:30]) + "\n" + text
    )
    idle = [f"w{i}" for i in range(1, 5) if not report.lines_by_worker.get(f"w{i}")]
    assert not idle, f"workers that processed nothing: {idle}\n{text}"
    if run.delivery == "push":  # since the last restart the workers consumed through push
        assert run.requests.get("Subscribe", 0) >= QUEUES, run.requests
        assert run.requests.get("Pull", 0) == 0, run.requests
    if run.port:  # since the last restart: the producer's and the workers' streams
        assert run.requests.get("exchange port connections", 0) >= 4, run.requests


def test_a_planned_handover_redelivers_nothing_between_crashes(run: RestartRun) -> None:
    if run.ordering == "key":
        pytest.skip(
            "key mode commits a queue's lowest unfinished offset: a hand-over re-delivers "
            "what other keys finished past it (ProcessingOrder.KEY says so)"
        )
    # A release persists its offset just before the revoke hook runs; a commit sent while
    # the broker was down, or before the client's channel reconnected, fails (the next
    # owner then re-delivers from the last commit, as it may).
    settle = int(RECONNECT_BACKOFF * 1e9)
    committed = [
        r
        for r in run.revokes
        if not any(killed <= r.at <= serving + settle for killed, serving in run.outages)
    ]
    errors = verify_handovers(run.entries, committed, {})
    print(
        f"{len(committed)} of {len(run.revokes)} queue releases checked as planned hand-overs "
        f"(the others persisted their offset during an outage)"
    )
    assert not errors, f"{len(errors)} hand-overs re-delivered or skipped messages:\n" + (
        "\n".join(errors[:30]) + "\n" + run.timeline
    )


def test_the_checks_take_stored_copies_only_in_their_place() -> None:
    q = shard_index("a", QUEUES)

    def e(seq: int, offset: int, start: int) -> Entry:
        return Entry("w1", "a", seq, q, offset, start, start + 1)

    def errors(entries: list[Entry], resends: bool) -> list[str]:
        return verify(entries, 3, {}, ["a"], QUEUES, resends=resends).errors

    copied = [e(0, 0, 0), e(1, 1, 2), e(1, 2, 4), e(2, 3, 6)]
    report = verify(copied, 3, {}, ["a"], QUEUES, resends=True)
    assert (report.errors, report.copies, report.duplicates, report.rewinds) == ([], 1, 1, 0)
    [twice] = errors(copied, resends=False)
    assert "the same message was read at offsets [1, 2]" in twice
    misplaced = [e(0, 0, 0), e(1, 1, 2), e(2, 2, 4), e(1, 3, 6)]
    [out_of_place] = errors(misplaced, resends=True)
    assert "offsets do not grow with seq" in out_of_place
    [shared] = errors([e(0, 0, 0), e(1, 0, 2), e(2, 1, 4)], resends=True)
    assert "offsets do not grow with seq" in shared
