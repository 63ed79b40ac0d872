"""Power cuts: what the broker promises survives losing everything that was not fsynced.

kill -9 (tests/system/test_crash_recovery.py) keeps the page cache, so it cannot tell a
write that reached the disk from one that did not. Here the broker runs traced by
tools/powerloss (tests/system/powerloss.py) and each kill is a power cut: the data directory
is rebuilt as a disk would hold it, only what was fsynced (mode "synced"), or that plus a
random prefix of the later writes of each file ("prefix") or each page as of a random
moment ("reorder"); a name survives only if its directory was fsynced after it. The rounds
cycle through the three modes; each next broker starts on what the cut left, traced again
(so that a later cut can land in its recovery), and a last, untraced broker reads it all.
Every broker, each time, must recover without logging an error.

1. Sync flush, producing: keyed messages are sent in order per key while the power goes
   at a random moment (some rounds: right after recovery, with nothing sent). Every
   acknowledged message must be there exactly once, at the offset its send reported, each
   key in send order, offsets dense, nothing invented (test_crash_recovery.verify).
2. Sync flush, orderly consumption: an orderly consumer commits offsets while the producing
   goes on, through every cut (the broker comes back on the same port). At each cut, every
   committed offset is at most what survived of its queue; in the end every delivery was of
   the message stored at its offset now (nothing served before it was durable), and each
   queue was delivered from offset 0 to its end without a gap.
3. Async flush: acknowledged messages may be lost, and the test measures how many and how
   long before the cut they were acknowledged (`pytest -s` prints it). What survives must
   still be a prefix of each queue: a lost message only at or after the surviving end.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mockbroker.offsets import ConsumerOffsets
from mockbroker.store.checkpoint import read_checkpoint
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    ProducerConfig,
    PushConsumer,
)
from sdk.errors import OrderMQError
from tests.chaos_report import ChaosRecorder, scaled
from tests.support import BrokerProcess, wait_until
from tests.system.orderly_history import BROKER_LEASE, CLIENT_TIMEOUT
from tests.system.orderly_worker import CONFIG
from tests.system.powerloss import PowerGrid, bad_log_lines
from tests.system.test_crash_recovery import (
    MIN_ACKS_PER_ROUND,
    QUEUES,
    SEED,
    TOPIC,
    Attempt,
    Ledger,
    QueueContent,
    read_topic,
    run_producer,
    token_of,
    verify,
)
from tools.powerloss.model import MODES

pytestmark = [pytest.mark.system, pytest.mark.chaos]

SYNC_ROUNDS = scaled(6, 30)
ORDERLY_ROUNDS = scaled(3, 20)
ASYNC_ROUNDS = scaled(6, 30)
#: Sync rounds that cut the power right after recovery, before anything is sent.
QUIET_EVERY = 4
GROUP = "powerloss"
#: Deliveries a round of the orderly test waits for before the countdown to its cut.
MIN_DELIVERIES_PER_ROUND = 20
#: The orderly test's fsyncs take this long, as on a slow disk: a delivery or a commit
#: that wrongly ran ahead of an fsync then has time to happen before a cut.
SLOW_DISK_MS = 3.0

StartBroker = Callable[..., BrokerProcess]


def check_clean(broker: BrokerProcess) -> None:
    bad = bad_log_lines(broker.stderr())
    assert not bad, "the broker logged errors:\n" + "\n".join(bad[:20])


def produce_then_cut(
    grid: PowerGrid,
    broker: BrokerProcess,
    ledger: Ledger,
    rng: random.Random,
    round_no: int,
    also: Callable[[], bool] = lambda: True,
) -> float:
    """Send until the power goes, at a random moment after the first acknowledgements (and
    once `also` holds); the time.monotonic() when the broker was dead."""
    ledger.acked_this_round = ledger.failed_this_round = 0
    stop = threading.Event()
    join = run_producer(broker.address, ledger, rng.randrange(1 << 30), round_no, stop)
    try:
        wait_until(
            lambda: ledger.acked_this_round >= MIN_ACKS_PER_ROUND and also(),
            timeout=60,
            what="the round's first acknowledgements (and deliveries)",
        )
        # The chaos, not a synchronisation: the power goes somewhere in the sending.
        time.sleep(rng.uniform(0.1, 0.5))
        grid.cut(broker, MODES[round_no % len(MODES)], rng)
    finally:
        stop.set()
        crash = join()
    assert crash is None, f"the producer crashed: {crash!r}"
    return grid.cut_at


def context(round_no: int, broker: BrokerProcess) -> Callable[[BaseException], AssertionError]:
    """Wraps a failure with the seed, the round, its mode and the broker's last log lines."""

    def wrap(exc: BaseException) -> AssertionError:
        mode = MODES[(round_no - 1) % len(MODES)] if round_no else "-"
        return AssertionError(
            f"seed={SEED} round={round_no} (after a {mode} cut): {exc!r}\n"
            + broker.stderr()[-3000:]
        )

    return wrap


# ---------------------------------------------------------------------- 1. sync, producing
def test_acknowledged_messages_survive_power_cuts_under_sync_flush(
    tmp_path: Path, start_broker: StartBroker, chaos_report: ChaosRecorder
) -> None:
    grid = PowerGrid(tmp_path)
    rng = random.Random(SEED)
    ledger = Ledger()
    args = ("--flush-mode", "sync", "--default-queues", str(QUEUES))
    for round_no in range(SYNC_ROUNDS + 1):
        last = round_no == SYNC_ROUNDS
        broker = start_broker(grid.data, *args, env=None if last else grid.arm())
        try:
            queues, recovered = read_topic(broker.address)
            assert recovered == (round_no > 0), "a power cut must be (and only be) recovered"
            verify(queues, ledger)
            check_clean(broker)
            if last:
                break
            if round_no % QUIET_EVERY == QUIET_EVERY - 1:
                grid.cut(broker, MODES[round_no % len(MODES)], rng)
            else:
                produce_then_cut(grid, broker, ledger, rng, round_no)
        except (AssertionError, OrderMQError) as exc:
            raise context(round_no, broker)(exc) from exc
    assert broker.terminate() == 0, broker.stderr()
    acked = len(ledger.acked)
    assert acked >= (SYNC_ROUNDS - SYNC_ROUNDS // QUIET_EVERY) * MIN_ACKS_PER_ROUND
    chaos_report.record(
        fault="power cut, sync flush",
        rounds=SYNC_ROUNDS,
        acked=acked,
        lost=0,
        order_violations=0,
        duplicates=0,
        note="every acknowledged message at its offset after each cut",
    )


def test_a_new_topics_queues_survive_a_power_cut_after_a_checkpoint(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    # A checkpoint says every index entry below it is durable, so recovery replays only the
    # commit log after it: the index files must then exist, with their names synced.
    grid = PowerGrid(tmp_path)
    args = ("--flush-mode", "sync", "--default-queues", str(QUEUES))
    broker = start_broker(grid.data, *args, env=grid.arm())
    with Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer:
        sent = [producer.send(Message(TOPIC, f"m{i}".encode(), keys=f"m{i}")) for i in range(8)]
    checkpoint = grid.data / "checkpoint"
    wait_until(lambda: read_checkpoint(checkpoint).position > 0, 10, "a checkpoint")
    grid.cut(broker, "synced", random.Random(0))
    broker = start_broker(grid.data, *args)
    queues, recovered = read_topic(broker.address)
    assert recovered
    stored = {(q, m.queue_offset): m.body for q, c in queues.items() for m in c.messages}
    for i, result in enumerate(sent):
        assert stored.get((result.queue.queue_id, result.queue_offset)) == f"m{i}".encode()
    check_clean(broker)


def test_messages_acknowledged_after_a_roll_survive_a_power_cut(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    # A roll renames the spare segment (made in a thread) and leaves the directory's sync
    # to the next flush: a send into the new segment is answered only once that ran.
    grid = PowerGrid(tmp_path)
    args = ("--flush-mode", "sync", "--default-queues", str(QUEUES), "--segment-bytes", "1048576")
    broker = start_broker(grid.data, *args, env=grid.arm())
    body = bytes(100 * 1024)
    with Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer:
        sent = [producer.send(Message(TOPIC, body + b"%d" % i, keys=f"m{i}")) for i in range(40)]
    grid.cut(broker, "synced", random.Random(0))
    segments = [p for p in (grid.data / "commitlog").iterdir() if p.name.isdigit()]
    assert len(segments) >= 4, "the sends should have rolled the commit log three times"
    broker = start_broker(grid.data, *args)
    queues, recovered = read_topic(broker.address)
    assert recovered
    stored = {(q, m.queue_offset): m.body for q, c in queues.items() for m in c.messages}
    for i, result in enumerate(sent):
        assert stored.get((result.queue.queue_id, result.queue_offset)) == body + b"%d" % i
    check_clean(broker)


# ---------------------------------------------------------------------- 2. sync, consuming
class Deliveries(MessageListenerOrderly):
    """Records every message it is handed: (queue id, queue offset, token)."""

    def __init__(self) -> None:
        self.log: list[tuple[int, int, str]] = []
        self._lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self._lock:
            self.log += [(m.queue.queue_id, m.queue_offset, token_of(m.body)) for m in msgs]
        return ConsumeOrderlyStatus.SUCCESS

    def count(self) -> int:
        return len(self.log)


def committed_offsets(data: Path) -> dict[int, int]:
    """The group's committed offsets in a data directory, as the broker loads them."""
    offsets = ConsumerOffsets(data / "offsets.json")
    offsets.load()
    found = {q: offsets.get(GROUP, TOPIC, q) for q in range(QUEUES)}
    return {q: o for q, o in found.items() if o is not None}


def check_committed(committed: dict[int, int], queues: dict[int, QueueContent]) -> None:
    for q, offset in committed.items():
        survived = queues[q].max_offset if q in queues else 0
        assert offset <= survived, f"queue {q}: offset {offset} committed, {survived} survived"


def check_deliveries(log: list[tuple[int, int, str]], queues: dict[int, QueueContent]) -> int:
    """Every delivery was of what is stored at its offset, each queue from 0 to its end
    without a gap; returns the number of re-deliveries."""
    stored = {(q, m.queue_offset): token_of(m.body) for q, c in queues.items() for m in c.messages}
    highest: dict[int, int] = {}
    for q, offset, token in log:
        now = stored.get((q, offset))
        assert now == token, f"queue {q} offset {offset}: {token} was delivered, {now} is stored"
        top = highest.get(q, -1)
        assert offset <= top + 1, f"queue {q}: offset {offset} delivered after {top}: a gap"
        highest[q] = max(top, offset)
    delivered = {(q, offset) for q, offset, _ in log}
    missing = sorted(set(stored) - delivered)
    assert not missing, f"stored but never delivered: {missing[:10]}"
    return len(log) - len(delivered)


def test_committed_offsets_never_pass_what_a_power_cut_kept(
    tmp_path: Path, start_broker: StartBroker, chaos_report: ChaosRecorder
) -> None:
    grid = PowerGrid(tmp_path, sync_delay_ms=SLOW_DISK_MS)
    rng = random.Random(SEED + 1)
    ledger = Ledger()
    args = ("--flush-mode", "sync", "--default-queues", str(QUEUES),
            "--lock-lease-seconds", str(BROKER_LEASE),
            "--client-timeout-seconds", str(CLIENT_TIMEOUT))  # fmt: skip
    broker = start_broker(grid.data, *args, env=grid.arm())
    listener = Deliveries()
    consumer = PushConsumer(
        GROUP, broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET, config=CONFIG
    )
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    consumer.start()
    committed: dict[int, int] = {}
    checked = 0
    try:
        for round_no in range(ORDERLY_ROUNDS + 1):
            last = round_no == ORDERLY_ROUNDS
            if round_no:
                broker.env = {} if last else grid.arm()
                broker.restart()
            try:
                queues, _ = read_topic(broker.address)
                verify(queues, ledger)
                check_committed(committed, queues)
                checked += len(committed)
                check_clean(broker)
                if last:
                    break
                target = listener.count() + MIN_DELIVERIES_PER_ROUND
                # Some commit is on disk before the cut, however slow the machine: else a
                # round can cut before the first persist and leave nothing to check.
                produce_then_cut(
                    grid, broker, ledger, rng, round_no,
                    also=lambda t=target: listener.count() >= t
                    and bool(committed_offsets(grid.data)),
                )  # fmt: skip
                committed = committed_offsets(grid.data)
            except (AssertionError, OrderMQError) as exc:
                raise context(round_no, broker)(exc) from exc
        stored = sum(len(c.messages) for c in queues.values())
        wait_until(
            lambda: len({(q, o) for q, o, _ in listener.log}) >= stored,
            timeout=60,
            what=f"the consumer to have been handed all {stored} stored messages",
        )
    finally:
        consumer.shutdown()
    redelivered = check_deliveries(listener.log, queues)
    assert checked >= 1, "no cut found a committed offset to check"
    assert broker.terminate() == 0, broker.stderr()
    print(f"\norderly power cuts: {len(listener.log)} deliveries, {redelivered} again")
    chaos_report.record(
        fault="power cut, orderly consumer (sync)",
        rounds=ORDERLY_ROUNDS,
        acked=len(ledger.acked),
        lost=0,
        order_violations=0,
        duplicates=redelivered,
        note=f"{checked} committed offsets checked against what survived",
    )


# ---------------------------------------------------------------------- 3. async
def forget_lost(queues: dict[int, QueueContent], ledger: Ledger) -> list[Attempt]:
    """The acknowledged messages a cut lost, from now on counted as unacknowledged; each
    must have been at or after the surviving end of its queue."""
    stored = {token_of(m.body) for c in queues.values() for m in c.messages}
    lost = [a for a in ledger.acked if a.token not in stored]
    for a in lost:
        assert a.result is not None
        q, offset = a.result.queue.queue_id, a.result.queue_offset
        survived = queues[q].max_offset if q in queues else 0
        assert offset >= survived, f"{a.token} at {q}/{offset} lost, {survived} survived"
        a.result = None
    return lost


def test_async_flush_loses_only_a_tail_and_its_window_is_measured(
    tmp_path: Path, start_broker: StartBroker, chaos_report: ChaosRecorder
) -> None:
    grid = PowerGrid(tmp_path)
    rng = random.Random(SEED + 2)
    ledger = Ledger()
    args = ("--flush-mode", "async", "--default-queues", str(QUEUES))
    lost_per_cut: list[int] = []
    window_ms: list[float] = []  # how long before the cut the oldest lost one was acked
    cut_at = 0.0
    for round_no in range(ASYNC_ROUNDS + 1):
        last = round_no == ASYNC_ROUNDS
        broker = start_broker(grid.data, *args, env=None if last else grid.arm())
        try:
            queues, recovered = read_topic(broker.address)
            assert recovered == (round_no > 0), "a power cut must be (and only be) recovered"
            if round_no:
                lost = forget_lost(queues, ledger)
                lost_per_cut.append(len(lost))
                oldest = min((a.acked_at for a in lost), default=cut_at)
                window_ms.append((cut_at - oldest) * 1000)
            verify(queues, ledger)
            check_clean(broker)
            if last:
                break
            cut_at = produce_then_cut(grid, broker, ledger, rng, round_no)
        except (AssertionError, OrderMQError) as exc:
            raise context(round_no, broker)(exc) from exc
    assert broker.terminate() == 0, broker.stderr()
    lost_total = sum(lost_per_cut)
    acked = len(ledger.acked) + lost_total
    assert acked >= ASYNC_ROUNDS * MIN_ACKS_PER_ROUND
    summary = (
        f"lost per cut {sorted(lost_per_cut)} (median {statistics.median(lost_per_cut):g}); "
        f"acked up to ms before the cut {sorted(round(w) for w in window_ms)} "
        f"(median {statistics.median(window_ms):.0f}, max {max(window_ms):.0f})"
    )
    print(f"\nasync power cuts, {acked} acknowledged: {summary}")
    chaos_report.record(
        fault="power cut, async flush",
        rounds=ASYNC_ROUNDS,
        acked=acked,
        lost=lost_total,
        order_violations=0,
        duplicates=0,
        note=f"measured, not a failure; loss window median "
        f"{statistics.median(window_ms):.0f} ms, max {max(window_ms):.0f} ms",
    )
