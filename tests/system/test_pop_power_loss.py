"""Power cuts over the pop journal: no acknowledged ack is ever undone.

A worker receives jobs (each invisible for a short time) and acknowledges most of them, the
rest it drops, while the power goes at a random moment (tests/system/powerloss.py: only what
was fsynced survives, or by mode some of the rest). The next broker starts on what the cut
left. The pop journal is synced before any receive, ack or change is answered, in both flush
modes (mockbroker/pop/journal.py), so:

1. Sync flush: every ack the worker saw answered is in force after every cut: its job is
   never delivered again, and the group's committed offset never goes back; every job
   received and not acknowledged comes back; in the end every job sent is acknowledged
   once, and the group's committed offset reaches each queue's end.
2. Async flush: a send is answered before its fsync and a receive may hand out a job not
   yet on disk, so a cut may lose the tail of a queue, jobs acknowledged there included (the
   producer's answer was no promise either). Every ack of a job that survived stays in
   force; the jobs sent after the cut, stored at the offsets of lost ones, are delivered
   (the group's pop state and committed offset do not skip them).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import encode_frame, iter_records
from tests.chaos_report import ChaosRecorder, scaled
from tests.support import BrokerProcess, wait_until
from tests.system.powerloss import PowerGrid
from tests.system.test_crash_recovery import SEED, QueueContent, read_topic
from tests.system.test_power_loss import check_clean, committed_offsets, context
from tools.powerloss.model import MODES

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]
TOPIC, GROUP = "chaos", "powerloss"  # the names test_power_loss.committed_offsets reads
QUEUES = 4
ROUNDS = scaled(6, 30)
JOBS_PER_ROUND = 80
#: Acks a round waits for before the random countdown to its cut.
MIN_ACKS_PER_ROUND = 20
#: Short, so that dropped jobs come back within the test.
INVISIBLE_MS = 1500
#: Share of received jobs the worker acknowledges; it drops the others.
ACK_SHARE = 0.75
#: Each fsync takes this much longer, as on a slow disk: an ack answered ahead of its
#: journal record's fsync then has time to be answered before a cut.
SLOW_DISK_MS = 3.0
#: Generous: the machine may be busy; every wait ends as soon as its condition holds.
PATIENCE = 90.0


def stub(address: str) -> tuple[grpc.Channel, pb_grpc.MessagingServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.MessagingServiceStub(channel)


def receive(m: pb_grpc.MessagingServiceStub, wait_ms: int) -> list[tuple[bytes, pb.Lease]]:
    answer = m.Receive(
        pb.ReceiveRequest(group=GROUP, topic=TOPIC, max_messages=16,
                          invisible_duration_ms=INVISIBLE_MS, wait_ms=wait_ms),
        timeout=PATIENCE,
    )  # fmt: skip
    records = list(iter_records(answer.records))
    return [(r.body, lease) for r, lease in zip(records, answer.leases, strict=True)]


def ack(m: pb_grpc.MessagingServiceStub, lease: pb.Lease) -> None:
    m.Ack(pb.AckRequest(group=GROUP, receipt_handle=lease.receipt_handle), timeout=PATIENCE)


@dataclass
class Jobs:
    """What the producer and the worker saw answered, across every broker run."""

    sent: dict[bytes, tuple[int, int]] = field(default_factory=dict)  # body -> (queue, offset)
    acked: set[bytes] = field(default_factory=set)  # acks answered OK
    asked: set[bytes] = field(default_factory=set)  # acks sent, answered or not (a cut)
    received: set[bytes] = field(default_factory=set)
    again: list[str] = field(default_factory=list)  # acked jobs delivered again
    redelivered: int = 0  # received again after being dropped (or a cut)
    acks_this_round: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def got(self, body: bytes, lease: pb.Lease) -> None:
        with self.lock:
            if body in self.acked:
                self.again.append(f"{body!r} (attempt {lease.delivery_attempt}) was acked")
            if body in self.received:
                self.redelivered += 1
            self.received.add(body)

    def settled(self, body: bytes) -> None:
        with self.lock:
            self.acked.add(body)
            self.acks_this_round += 1


def send_jobs(address: str, jobs: Jobs, round_no: int, count: int = JOBS_PER_ROUND) -> None:
    channel, m = stub(address)
    with channel:
        for i in range(count):
            body = b"job-%d-%d" % (round_no, i)
            frame = encode_frame(msg_id=body.ljust(16, b"."), born_timestamp_ms=1, body=body)
            answer = m.Send(pb.SendRequest(topic=TOPIC, queue_id=i % QUEUES, frames=frame),
                            timeout=PATIENCE)  # fmt: skip
            jobs.sent[body] = (i % QUEUES, answer.first_queue_offset)


def work(address: str, jobs: Jobs, seed: int, stop: threading.Event) -> Callable[[], None]:
    """Receive and ack (or drop) jobs in a thread until `stop` or the broker dies."""
    rng = random.Random(seed)
    failures: list[BaseException] = []

    def run() -> None:
        channel, m = stub(address)
        with channel:
            try:
                while not stop.is_set():
                    for body, lease in receive(m, wait_ms=200):
                        jobs.got(body, lease)
                        if rng.random() < ACK_SHARE:
                            jobs.asked.add(body)
                            ack(m, lease)
                            jobs.settled(body)
            except grpc.RpcError as exc:
                if not stop.is_set() and exc.code() != grpc.StatusCode.UNAVAILABLE:
                    failures.append(exc)
            except BaseException as exc:  # reported by join()
                failures.append(exc)

    thread = threading.Thread(target=run, name="pop-worker", daemon=True)
    thread.start()

    def join() -> None:
        thread.join(PATIENCE)
        assert not thread.is_alive(), "the worker is stuck"
        assert not failures, f"the worker failed: {failures[0]!r}"

    return join


def drain(address: str, jobs: Jobs, expected: set[bytes]) -> None:
    """Receive and ack until none comes within an invisible time: then every job of
    `expected` was acked, or had an ack sent that a cut left unanswered (which may or may
    not have settled it, as it may be on disk or not)."""
    channel, m = stub(address)
    with channel:
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            got = receive(m, wait_ms=2 * INVISIBLE_MS)
            if not got and expected <= jobs.asked:
                break
            for body, lease in got:
                jobs.got(body, lease)
                jobs.asked.add(body)
                ack(m, lease)
                jobs.settled(body)
        missing = sorted(expected - jobs.asked)
        assert not missing, f"{len(missing)} job(s) never came back: {missing[:10]}"


def query_committed(address: str) -> list[int]:
    channel, m = stub(address)
    with channel:
        return [
            m.QueryConsumerOffset(
                pb.QueryConsumerOffsetRequest(group=GROUP, topic=TOPIC, queue_id=q),
                timeout=PATIENCE,
            ).offset
            for q in range(QUEUES)
        ]


def create_topic(address: str) -> None:
    channel = grpc.insecure_channel(address)
    with channel:
        admin = pb_grpc.AdminServiceStub(channel)
        admin.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, queue_count=QUEUES),
                          timeout=PATIENCE)  # fmt: skip


def work_then_cut(
    grid: PowerGrid, broker: BrokerProcess, jobs: Jobs, rng: random.Random, round_no: int
) -> None:
    jobs.acks_this_round = 0
    stop = threading.Event()
    join = work(broker.address, jobs, rng.randrange(1 << 30), stop)
    try:
        wait_until(lambda: jobs.acks_this_round >= MIN_ACKS_PER_ROUND, PATIENCE,
                   "the round's first acks")  # fmt: skip
        # The chaos, not a synchronisation: the power goes somewhere in the receiving.
        time.sleep(rng.uniform(0.1, 0.5))
        grid.cut(broker, MODES[round_no % len(MODES)], rng)
    finally:
        stop.set()
        join()


# ---------------------------------------------------------------------- 1. sync
def test_acknowledged_acks_survive_power_cuts_under_sync_flush(
    tmp_path: Path, start_broker: StartBroker, chaos_report: ChaosRecorder
) -> None:
    grid = PowerGrid(tmp_path, sync_delay_ms=SLOW_DISK_MS)
    rng = random.Random(SEED + 3)
    jobs = Jobs()
    args = ("--flush-mode", "sync")
    committed = [0] * QUEUES
    for round_no in range(ROUNDS + 1):
        last = round_no == ROUNDS
        broker = start_broker(grid.data, *args, env=None if last else grid.arm())
        try:
            if round_no == 0:
                create_topic(broker.address)
            now = [committed_offsets(grid.data).get(q, 0) for q in range(QUEUES)]
            assert all(a <= b for a, b in zip(committed, now, strict=True)), (
                f"the group's committed offsets went back from {committed} to {now}"
            )
            committed = now
            assert not jobs.again, f"acked jobs delivered again: {jobs.again[:5]}"
            check_clean(broker)
            if last:
                break
            send_jobs(broker.address, jobs, round_no)
            work_then_cut(grid, broker, jobs, rng, round_no)
            assert not jobs.again, f"acked jobs delivered again: {jobs.again[:5]}"
        except AssertionError as exc:
            raise context(round_no, broker)(exc) from exc
    acked_before_end = len(jobs.acked)
    drain(broker.address, jobs, set(jobs.sent))
    assert not jobs.again, f"acked jobs delivered again: {jobs.again[:5]}"
    ends = [sum(1 for q, _ in jobs.sent.values() if q == queue) for queue in range(QUEUES)]
    wait_until(lambda: query_committed(broker.address) == ends, PATIENCE,
               f"the group's committed offsets to reach {ends}")  # fmt: skip
    check_clean(broker)
    assert broker.terminate() == 0, broker.stderr()
    assert acked_before_end >= ROUNDS * MIN_ACKS_PER_ROUND
    print(f"\npop power cuts: {len(jobs.sent)} jobs, {acked_before_end} acked before the "
          f"last cut, {jobs.redelivered} delivered again after a drop or a cut")  # fmt: skip
    chaos_report.record(
        fault="power cut, pop receive/ack (sync)",
        rounds=ROUNDS,
        acked=acked_before_end,
        lost=0,
        order_violations=0,
        duplicates=0,
        note=f"0 acked acks undone; {jobs.redelivered} dropped jobs came back",
    )


# ---------------------------------------------------------------------- 2. async
def forget_lost(jobs: Jobs, queues: dict[int, QueueContent]) -> int:
    """Drop the jobs a cut lost from the books; each must lie at or past the surviving end
    of its queue. How many were acked."""
    stored = {m.body for c in queues.values() for m in c.messages}
    lost = [body for body in jobs.sent if body not in stored]
    for body in lost:
        q, offset = jobs.sent.pop(body)
        survived = queues[q].max_offset if q in queues else 0
        assert offset >= survived, f"{body!r} at {q}/{offset} lost, {survived} survived"
    acked = sum(1 for body in lost if body in jobs.acked)
    for book in (jobs.acked, jobs.asked, jobs.received):
        book.difference_update(lost)
    return acked


def test_acks_of_jobs_that_survive_hold_under_async_flush(
    tmp_path: Path, start_broker: StartBroker, chaos_report: ChaosRecorder
) -> None:
    grid = PowerGrid(tmp_path, sync_delay_ms=SLOW_DISK_MS)
    rng = random.Random(SEED + 4)
    jobs = Jobs()
    args = ("--flush-mode", "async")
    lost_jobs = lost_acked = 0
    for round_no in range(ROUNDS + 1):
        last = round_no == ROUNDS
        broker = start_broker(grid.data, *args, env=None if last else grid.arm())
        try:
            if round_no == 0:
                create_topic(broker.address)
            before = len(jobs.sent)
            queues, _ = read_topic(broker.address)
            lost_acked += forget_lost(jobs, queues)
            lost_jobs += before - len(jobs.sent)
            assert not jobs.again, f"acked jobs delivered again: {jobs.again[:5]}"
            check_clean(broker)
            if last:
                break
            # Jobs sent now take the offsets of the lost ones: the group must not skip them.
            send_jobs(broker.address, jobs, round_no)
            work_then_cut(grid, broker, jobs, rng, round_no)
            assert not jobs.again, f"acked jobs delivered again: {jobs.again[:5]}"
        except AssertionError as exc:
            raise context(round_no, broker)(exc) from exc
    drain(broker.address, jobs, set(jobs.sent))
    assert not jobs.again, f"acked jobs delivered again: {jobs.again[:5]}"
    ends = [queues[q].max_offset if q in queues else 0 for q in range(QUEUES)]
    wait_until(lambda: query_committed(broker.address) == ends, PATIENCE,
               f"the group's committed offsets to reach {ends}")  # fmt: skip
    check_clean(broker)
    assert broker.terminate() == 0, broker.stderr()
    print(f"\npop power cuts (async): {len(jobs.sent)} jobs kept, {lost_jobs} lost by the "
          f"cuts ({lost_acked} of them acked)")  # fmt: skip
    chaos_report.record(
        fault="power cut, pop receive/ack (async)",
        rounds=ROUNDS,
        acked=len(jobs.acked),
        lost=lost_jobs,
        order_violations=0,
        duplicates=0,
        note=f"0 acks of surviving jobs undone; {lost_acked} acked jobs lost with the tail",
    )
