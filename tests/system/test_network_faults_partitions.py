"""Orderly consumption while one client is cut off from the broker.

The network (tests/system/network_faults_support.py): a broker process with a short lock
lease (4 s) and client timeout (6 s), consumer processes (client lease 3 s, renewal every
1 s) and a producer in this process, each client behind its own fault proxy.

(c) one consumer cut off from the broker (the way back first, then both ways) while it
    holds queues, for longer than every lease: it stops calling its listener within its
    own lease (3 s), the broker expires it (client timeout, 6 s of silence) and the
    others take its queues, no two consumers call a listener on one queue at the same
    time, and after the heal it rejoins and gets queues again; nothing stuck, nothing lost;
(d) the producer cut off for longer than its send deadline, its connections lost on the
    way: its sends fail with a clear, retriable error and are sent again after the heal (a
    spooling producer's sends return at once and are delivered after it); nothing
    acknowledged is lost, order holds.

The histories are checked as in test_orderly_chaos.py (`verify`), and each test records
its row of the fault suite's table.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    Producer,
    ProducerConfig,
    SendStatus,
)
from sdk.errors import RequestTimeoutError
from tests.chaos_report import ChaosRecorder, scaled
from tests.system.network_faults_support import (
    KEYS,
    QUEUES,
    Net,
    check,
    network,
)
from tests.system.orderly_history import (
    BROKER_LEASE,
    REJOIN_TIMEOUT,
    SLACK,
    TAKEOVER_TIMEOUT,
    Entry,
    History,
    verify,
)
from tests.system.orderly_worker import CONFIG

pytestmark = [pytest.mark.system, pytest.mark.chaos]


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
#: (c): the queues w1 holds are those only it began listener calls on this recently (it
#: calls each of its queues every SLOW_DELAY_MS or so).
HOLDING_WINDOW_NS = 2_000_000_000
#: (c): how many times it is cut off and healed.
PARTITIONS = scaled(1, 6)
#: (d): the producer's send deadline, and how long it is cut off (longer than the deadline).
SEND_TIMEOUT = 2.0
PRODUCER_OUTAGE = float(scaled(5, 30))
SPOOLED = 200
SPOOL_KEYS = 7


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

    def holding() -> set[int]:
        # Over a sliding window, not since a fixed time: calls another worker began on a
        # queue before a rebalance gave it to w1 (the first worker up takes every queue
        # until the others join) would otherwise keep that queue out for good.
        return recent_queues(history, "w1", time.monotonic_ns() - HOLDING_WINDOW_NS)

    scene.until(lambda: len(holding()) >= 2, REJOIN_TIMEOUT, "w1 consuming its queues")
    held = frozenset(holding())
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
        net.spawn_all({"w1": ("--delay-ms", str(SLOW_DELAY_MS)), "w2": (), "w3": ()})
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
        net.spawn("w1", "w2")
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
