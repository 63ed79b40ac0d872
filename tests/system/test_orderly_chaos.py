"""Orderly consumption under chaos: consumer processes join, die and freeze mid-stream.

A broker process with a short lock lease (4 s) and client timeout (6 s); a producer in this
process sends rounds of one message per key (500 keys over 8 queues, body "key:seq") at a
steady pace, at least 40 rounds (20 000 messages). Consumer processes
(tests/system/orderly_worker.py) each log every message they process, fsynced before the
listener answers SUCCESS. While the messages flow:

1. three workers start;
2. a fourth joins (the queues are re-spread over four);
3. one is killed with SIGKILL (its queues move once the broker expires it);
4. another is frozen with SIGSTOP until its queues have moved to the others, which cannot
   happen before its lease ran out, and is then resumed with SIGCONT (it rejoins);
5. once every message sent is in the union of the logs, the live workers get SIGTERM.

The scenario runs once per module; two tests check its merged history (the logs in the
real-time order of their lines: all processes share one monotonic clock):

- the issue's acceptance (`verify`): every key in order (never n+1 before n; duplicates
  only as re-delivered suffixes), nothing lost, nothing invented, each message from its
  key's queue and one offset, no two listener calls on a queue at the same time;
  duplicates (lines minus distinct messages) are counted and printed (`pytest -s`);
- planned hand-overs (`verify_handovers`): a queue released on purpose is taken up
  exactly where its last owner stopped.

At most one listener call per queue of the frozen worker is special: the call it had in
flight, or had already handed to its thread pool, when it was stopped. That call completes
after SIGCONT, whatever happened meanwhile (the lease is checked before a call, not during
it, as in RocketMQ); it is "frozen" below.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sdk import Message, Producer, shard_index
from tests.support import ROOT, BrokerProcess, wait_until
from tests.system.orderly_worker import CONFIG, TOPIC

pytestmark = pytest.mark.system

WORKER = ROOT / "tests" / "system" / "orderly_worker.py"
QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(500)]
#: One round is one message per key; 40 rounds are the 20 000 messages the test needs.
MIN_ROUNDS = 40
#: Producer pace: a round every half second (1 000 messages/s), slow enough for the
#: workers to keep up, so every chaos step meets messages still arriving.
ROUND_INTERVAL = 0.5

BROKER_LEASE = 4.0
CLIENT_TIMEOUT = 6.0
#: How often mockbroker looks for clients that went silent (server._EXPIRY_SWEEP_SECONDS).
EXPIRY_SWEEP = 1.0
#: Leeway for a loaded two-core machine on top of the protocol's own delays.
SLACK = 10.0
#: Queues of a killed or frozen worker move once the broker expired it (CLIENT_TIMEOUT after
#: its last heartbeat, seen by a sweep); the others then rebalance on the membership change
#: (or at their periodic rebalance), lock the queues and work off the backlog.
TAKEOVER_TIMEOUT = (
    CONFIG.heartbeat_interval + CLIENT_TIMEOUT + EXPIRY_SWEEP + 2 * CONFIG.rebalance_interval
) + SLACK
#: A resumed worker heartbeats and rejoins; the others release its queues at their
#: rebalance, and it locks them at its next renewal or rebalance.
REJOIN_TIMEOUT = (
    CONFIG.heartbeat_interval + 2 * CONFIG.rebalance_interval + 2 * CONFIG.lock_renew_interval
) + SLACK
START_TIMEOUT = 60.0  # a Python process importing grpc, on a busy machine
DRAIN_TIMEOUT = 60.0


# ---------------------------------------------------------------------------- the history
@dataclass(frozen=True)
class Entry:
    """One processed message: one line of a worker's log."""

    worker: str
    key: str
    seq: int
    queue: int
    offset: int
    start: int  # monotonic ns when the listener call began
    end: int  # monotonic ns when the line was written

    def __str__(self) -> str:
        return (
            f"{self.worker} {self.key}#{self.seq} (queue {self.queue} offset {self.offset}, "
            f"{self.start}..{self.end})"
        )


@dataclass(frozen=True)
class Revoke:
    """A worker's revoke hook ran: it released `queue` on purpose (and then unlocked it)."""

    worker: str
    queue: int
    at: int  # monotonic ns


class History:
    """The workers' logs, read incrementally as they grow."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[Path, int, bytes]] = {}
        self.by_worker: dict[str, list[Entry]] = {}
        self.top: dict[str, int] = {}  # key -> highest seq processed
        self.distinct: set[tuple[str, int]] = set()
        self.last_start: dict[str, int] = {}  # worker -> latest listener call start

    def add(self, worker: str, path: Path) -> None:
        self._files[worker] = (path, 0, b"")
        self.by_worker[worker] = []

    def refresh(self) -> None:
        for worker, (path, pos, partial) in self._files.items():
            if not path.exists():
                continue
            with path.open("rb") as f:
                f.seek(pos)
                data = f.read()
            if not data:
                continue
            *lines, rest = (partial + data).split(b"\n")
            self._files[worker] = (path, pos + len(data), rest)
            for line in lines:
                self._take(worker, line.decode())

    def _take(self, worker: str, line: str) -> None:
        name, key, seq, queue, offset, start, end = line.split()
        assert name == worker, f"{worker}'s log has a line of {name}: {line!r}"
        e = Entry(worker, key, int(seq), int(queue), int(offset), int(start), int(end))
        self.by_worker[worker].append(e)
        self.top[key] = max(self.top.get(key, -1), e.seq)
        self.distinct.add((key, e.seq))
        self.last_start[worker] = max(self.last_start.get(worker, 0), e.start)

    def entries(self) -> list[Entry]:
        return [e for lines in self.by_worker.values() for e in lines]

    def lines(self) -> int:
        return sum(len(lines) for lines in self.by_worker.values())

    def frontier(self) -> int:
        """The seq every key has reached (-1 while some key has none)."""
        return min(self.top.get(k, -1) for k in KEYS)

    def started_after(self, worker: str, ns: int) -> bool:
        """True once `worker` began a listener call after `ns`."""
        return self.last_start.get(worker, 0) > ns


def frozen_calls(
    entries: list[Entry], revokes: list[Revoke], paused: str, stopped: int, resumed: int
) -> dict[Entry, Entry]:
    """The listener calls the paused worker had in flight or dispatched when it stopped.

    Per queue, that is its first call to end after SIGSTOP, unless that call began after
    another worker, which held the queue while it was paused, released it after SIGCONT
    (then it is an ordinary call on a queue taken back). A dispatched call may begin only
    after SIGCONT; each is mapped to a copy that begins no later than the stop.
    """
    first: dict[int, Entry] = {}
    for e in sorted(entries, key=lambda e: e.end):
        if e.worker == paused and e.end > stopped:
            first.setdefault(e.queue, e)
    return {
        e: dataclasses.replace(e, start=min(e.start, stopped))
        for e in first.values()
        if not any(
            r.worker != paused and r.queue == e.queue and resumed < r.at < e.start for r in revokes
        )
    }


# ---------------------------------------------------------------------------- the checks
@dataclass
class Report:
    lines: int
    distinct: int
    lines_by_worker: dict[str, int]
    duplicates_by_worker: dict[str, int] = field(default_factory=dict)
    rewinds: int = 0  # times a worker went back to a seq at or below one it had processed
    deepest: tuple[int, str] = (0, "")  # the longest re-delivery: seqs behind, and where
    errors: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        return self.lines - self.distinct

    def summary(self) -> str:
        return (
            f"{self.lines} lines, {self.distinct} distinct messages, "
            f"{self.duplicates} duplicates (by worker: {self.duplicates_by_worker}); "
            f"lines by worker: {self.lines_by_worker}; {self.rewinds} rewinds; "
            f"deepest re-delivery {self.deepest[0]} seqs behind ({self.deepest[1]})"
        )


def verify(
    entries: list[Entry], rounds: int, frozen: dict[Entry, Entry], keys: list[str] = KEYS
) -> Report:
    """Order, completeness, re-delivery only as suffixes, placement, exclusivity.

    - nothing lost: every (key, seq) sent was processed at least once, nothing else was;
    - order: for every key, no seq n+1 is processed before n ever was (each processed seq is
      at most the highest seen so far + 1);
    - suffixes: per worker and key, each next seq is the previous + 1, or a rewind to an
      earlier one (a re-delivery from a committed offset), or a jump over seqs another
      worker processed after this one began its previous message (it held the key then);
    - placement: each key comes from its own queue, each (key, seq) from one offset, and
      offsets grow with seq;
    - exclusivity: no two listener calls on one queue overlap in time, in one process or
      across processes, apart from the frozen calls.
    """
    entries = [frozen.get(e, e) for e in entries]  # frozen calls: dispatched by the stop
    timeline = sorted(entries, key=lambda e: (e.end, e.worker))
    report = Report(
        lines=len(entries),
        distinct=len({(e.key, e.seq) for e in entries}),
        lines_by_worker=dict(sorted(Counter(e.worker for e in entries).items())),
    )
    errors = report.errors

    sent = {(k, s) for k in keys for s in range(rounds)}
    seen = {(e.key, e.seq) for e in entries}
    if missing := sorted(sent - seen):
        errors.append(f"{len(missing)} messages never processed, e.g. {missing[:10]}")
    if unknown := sorted(seen - sent):
        errors.append(f"{len(unknown)} processed messages were never sent: {unknown[:10]}")

    top: dict[str, int] = {}
    dups: Counter[str] = Counter()
    for e in timeline:
        best = top.get(e.key, -1)
        if e.seq > best + 1:
            errors.append(
                f"{e.key}: {e} processed before seq {best + 1} ever was; "
                f"history of the key: {key_history(timeline, e)}"
            )
        elif e.seq <= best:
            dups[e.worker] += 1
            report.deepest = max(report.deepest, (best - e.seq, str(e)))
        top[e.key] = max(best, e.seq)
    report.duplicates_by_worker = dict(sorted(dups.items()))

    processed: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    for e in entries:
        processed[(e.key, e.seq)].append(e)
    for worker, lines in sorted(by_worker(entries).items()):
        last: dict[str, Entry] = {}
        for e in lines:
            prev = last.get(e.key)
            last[e.key] = e
            if prev is None or e.seq == prev.seq + 1:
                continue
            if e.seq <= prev.seq:
                report.rewinds += 1
                continue
            others = processed[(e.key, prev.seq + 1)]
            if not any(o.worker != worker and o.start > prev.start for o in others):
                errors.append(
                    f"{e.key}: {worker} skipped from seq {prev.seq} to {e.seq} although no "
                    f"other worker processed {prev.seq + 1} in between; "
                    f"history of the key: {key_history(timeline, e)}"
                )

    offset_of: dict[tuple[str, int], int] = {}
    for e in entries:
        if e.queue != shard_index(e.key, QUEUES):
            errors.append(f"{e} came from queue {e.queue}, not {shard_index(e.key, QUEUES)}")
        if offset_of.setdefault((e.key, e.seq), e.offset) != e.offset:
            errors.append(f"{e}: the same message was also read at {offset_of[(e.key, e.seq)]}")
    per_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (key, seq), offset in offset_of.items():
        per_key[key].append((seq, offset))
    for key, pairs in sorted(per_key.items()):
        offsets = [o for _, o in sorted(pairs)]
        if offsets != sorted(set(offsets)):
            errors.append(f"{key}: offsets do not grow with seq: {sorted(pairs)[:20]}")

    frozen_now = set(frozen.values())
    for queue, calls in sorted(by_queue(entries).items()):
        latest: Entry | None = None
        for e in sorted(calls, key=lambda e: e.start):
            if e in frozen_now:
                continue
            if latest is not None and e.start < latest.end:
                errors.append(f"queue {queue}: {e} began before {latest} ended")
            if latest is None or e.end > latest.end:
                latest = e
    return report


def verify_handovers(
    entries: list[Entry], revokes: list[Revoke], frozen: dict[Entry, Entry]
) -> list[str]:
    """A queue released on purpose is taken up exactly where its last owner stopped.

    A worker that releases a queue (rebalance or shutdown) waits for its listener call,
    persists the next offset and only then unlocks; so after a revoke, when the releasing
    worker made the last call on the queue, the next call on it (by anyone) must be at
    that call's offset + 1: a planned hand-over re-delivers nothing and skips nothing.
    """
    calls = by_queue([e for e in entries if e not in frozen])
    errors = []
    for r in sorted(revokes, key=lambda r: r.at):
        before = [e for e in calls.get(r.queue, []) if e.end < r.at]
        after = [e for e in calls.get(r.queue, []) if e.start > r.at]
        if not before or not after:
            continue
        last = max(before, key=lambda e: e.end)
        following = min(after, key=lambda e: e.start)
        gap = following.offset - (last.offset + 1)
        if last.worker == r.worker and gap:
            what = f"{-gap} offsets re-delivered" if gap < 0 else f"{gap} offsets skipped"
            errors.append(
                f"queue {r.queue}: {r.worker} released it at {r.at} after processing offset "
                f"{last.offset} ({last}); the next call was at offset {following.offset} "
                f"({following}): {what}"
            )
    return errors


def by_worker(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Each worker's entries in the order it wrote them."""
    out: dict[str, list[Entry]] = defaultdict(list)
    for e in sorted(entries, key=lambda e: e.end):
        out[e.worker].append(e)
    return out


def by_queue(entries: list[Entry]) -> dict[int, list[Entry]]:
    out: dict[int, list[Entry]] = defaultdict(list)
    for e in entries:
        out[e.queue].append(e)
    return out


def key_history(timeline: list[Entry], around: Entry, width: int = 8) -> str:
    """The key's processing history (worker:seq) near `around`, for failure messages."""
    mine = [e for e in timeline if e.key == around.key]
    i = mine.index(around)
    part = mine[max(0, i - width) : i + width]
    return " ".join(f"{e.worker}:{e.seq}" + ("<--" if e == around else "") for e in part)


# ---------------------------------------------------------------------------- processes
class PacedProducer(threading.Thread):
    """Sends round after round (seq = round number, one message per key) until halted."""

    def __init__(self, address: str) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self._address = address
        self._halt = threading.Event()
        self.rounds = 0  # rounds fully acknowledged
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self._address) as producer:
                while not self._halt.is_set():
                    seq = self.rounds
                    producer.send_batch(
                        [Message(TOPIC, f"{k}:{seq}".encode(), sharding_key=k) for k in KEYS]
                    )
                    self.rounds = seq + 1
                    self._halt.wait(ROUND_INTERVAL)  # the pace, not a wait for a condition
        except BaseException as exc:
            self.error = exc

    def halt(self) -> int:
        """Stop after the round in flight; the number of rounds sent."""
        self._halt.set()
        self.join(30)
        assert not self.is_alive(), "the producer did not stop"
        return self.rounds


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    out: Path

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    def state(self) -> str:
        """The process state letter from /proc (R, S, T for stopped, Z, ...)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def revokes(self) -> list[Revoke]:
        found = []
        for line in self.output().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "revoked" and parts[0].isdigit():
                found += [Revoke(self.name, int(q), int(parts[0])) for q in parts[2].split(",")]
        return found


def start_worker(name: str, address: str, directory: Path) -> Worker:
    log, out = directory / f"{name}.log", directory / f"{name}.out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--broker", address, "--log", str(log), "--id", name],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    worker = Worker(name, proc, log, out)

    def ready() -> bool:
        assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{worker.output()}"
        return "ready " in worker.output()

    wait_until(ready, START_TIMEOUT, f"{name} to start")
    return worker


# ---------------------------------------------------------------------------- the scenario
@dataclass
class ChaosRun:
    """What the scenario left behind for the checks."""

    directory: Path
    entries: list[Entry]
    revokes: list[Revoke]
    rounds: int
    frozen: dict[Entry, Entry]
    timeline: str  # the chaos events, for messages


def run_chaos(directory: Path) -> ChaosRun:
    assert CONFIG.lock_lease < BROKER_LEASE < CLIENT_TIMEOUT
    assert {shard_index(k, QUEUES) for k in KEYS} == set(range(QUEUES)), "keys cover queues"
    broker = BrokerProcess(
        directory / "broker",
        "--flush-mode", "async",
        "--default-queues", str(QUEUES),
        "--lock-lease-seconds", str(BROKER_LEASE),
        "--client-timeout-seconds", str(CLIENT_TIMEOUT),
    )  # fmt: skip
    history = History()
    workers: dict[str, Worker] = {}
    gone: set[str] = set()  # workers killed on purpose
    producer: PacedProducer | None = None
    began = time.monotonic_ns()
    events: list[tuple[str, int]] = []

    def mark(what: str) -> int:
        now = time.monotonic_ns()
        events.append((what, now))
        return now

    def spawn(name: str) -> None:
        workers[name] = start_worker(name, broker.address, directory)
        history.add(name, workers[name].log)
        mark(f"{name} ready")

    def sent() -> int:
        assert producer is not None
        if producer.error is not None:
            raise AssertionError(f"the producer failed: {producer.error!r}")
        return producer.rounds

    def until(condition: Callable[[], bool], timeout: float, what: str) -> None:
        """wait_until, also failing fast if the producer or a worker died."""

        def check() -> bool:
            sent()
            for w in workers.values():
                if w.name not in gone and w.proc.poll() is not None:
                    raise AssertionError(f"{w.name} exited ({w.proc.returncode}):\n{w.output()}")
            history.refresh()
            return condition()

        try:
            wait_until(check, timeout, what)
        except AssertionError as exc:
            state = (
                f"frontier {history.frontier()}, rounds sent {sent()}, lines {history.lines()}, "
                f"distinct {len(history.distinct)}, logs in {directory}"
            )
            raise AssertionError(f"{exc} ({state})") from None

    try:
        broker.start()
        producer = PacedProducer(broker.address)
        producer.start()
        until(lambda: sent() >= 1, 30, "the first round (it creates the topic)")
        for name in ("w1", "w2", "w3"):
            spawn(name)
        until(lambda: history.lines() >= 1500, 60, "1 500 messages processed")

        # A fourth worker joins: the queues are spread over four.
        spawn("w4")
        until(lambda: history.started_after("w4", 0), TAKEOVER_TIMEOUT, "w4 to get queues")
        joined = mark("w4 consuming")

        # kill -9 a worker that holds queues after the re-spread.
        until(lambda: history.started_after("w1", joined), REJOIN_TIMEOUT, "w1 consuming")
        workers["w1"].proc.send_signal(signal.SIGKILL)
        workers["w1"].proc.wait()
        gone.add("w1")
        mark("w1 killed")
        # Every key reaching a round sent after the kill proves w1's queues moved.
        target = sent() + 1
        until(lambda: history.frontier() >= target, TAKEOVER_TIMEOUT, "w1's queues to move")
        moved = mark("w1's queues taken over")

        # Freeze a worker that holds queues until they moved to the others. They cannot
        # move before the broker lease ran out, nor before the broker expired the frozen
        # member (CLIENT_TIMEOUT without a heartbeat, > BROKER_LEASE): only then do the
        # others' allocations include its queues. So the pause lasts at least as long as
        # those constants, and no longer than it takes the queues to move.
        until(lambda: history.started_after("w2", moved), REJOIN_TIMEOUT, "w2 consuming")
        w2 = workers["w2"]
        w2.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: w2.state() == "T", 10, "w2 to stop")
        stopped = mark("w2 stopped")
        target = sent() + 1
        until(lambda: history.frontier() >= target, TAKEOVER_TIMEOUT, "w2's queues to move")
        mark("w2's queues taken over")
        paused = (time.monotonic_ns() - stopped) / 1e9
        assert paused > BROKER_LEASE, f"w2's queues moved {paused:.1f}s into its pause"
        w2.proc.send_signal(signal.SIGCONT)
        resumed = mark("w2 resumed")
        until(lambda: history.started_after("w2", resumed), REJOIN_TIMEOUT, "w2 to rejoin")
        mark("w2 consuming again")

        # Enough messages, then everything consumed.
        until(lambda: sent() >= MIN_ROUNDS, MIN_ROUNDS * ROUND_INTERVAL + 60, "all rounds")
        rounds = producer.halt()
        mark(f"producer done: {rounds} rounds")
        total = rounds * len(KEYS)
        until(lambda: len(history.distinct) >= total, DRAIN_TIMEOUT, f"all {total} processed")
        mark("all processed")

        for name in ("w2", "w3", "w4"):
            workers[name].proc.send_signal(signal.SIGTERM)
        for name in ("w2", "w3", "w4"):
            code = workers[name].proc.wait(30)
            assert code == 0, f"{name} exited with {code}:\n{workers[name].output()}"
        mark("workers stopped")
        history.refresh()
    finally:
        if producer is not None and producer.is_alive():
            producer.halt()
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
                w.proc.wait()
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill9()

    entries = history.entries()
    revokes = [r for w in workers.values() for r in w.revokes()]
    frozen = frozen_calls(entries, revokes, "w2", stopped, resumed)
    lines = [f"orderly chaos: {total} messages sent in {rounds} rounds; logs in {directory}"]
    lines += [f"  {(ns - began) / 1e9:6.2f}s {what}" for what, ns in events]
    lines += [f"  frozen call: {e}" for e in sorted(frozen, key=lambda e: e.end)]
    return ChaosRun(
        directory=directory,
        entries=entries,
        revokes=revokes,
        rounds=rounds,
        frozen=frozen,
        timeline="\n".join(lines),
    )


@pytest.fixture(scope="module")
def chaos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosRun]:
    """The scenario, run once for the tests of this module."""
    yield run_chaos(tmp_path_factory.mktemp("orderly-chaos"))


# ---------------------------------------------------------------------------- the tests
def test_every_key_in_order_nothing_lost_duplicates_counted(chaos: ChaosRun) -> None:
    report = verify(chaos.entries, chaos.rounds, chaos.frozen)
    text = f"{report.summary()}\n{chaos.timeline}"
    print(text)
    assert not report.errors, f"{len(report.errors)} violations:\n" + (
        "\n".join(report.errors[:30]) + "\n" + text
    )
    idle = [f"w{i}" for i in range(1, 5) if not report.lines_by_worker.get(f"w{i}")]
    assert not idle, f"workers that processed nothing: {idle}\n{text}"


def test_a_planned_handover_redelivers_nothing(chaos: ChaosRun) -> None:
    errors = verify_handovers(chaos.entries, chaos.revokes, chaos.frozen)
    assert not errors, f"{len(errors)} hand-overs re-delivered or skipped messages:\n" + (
        "\n".join(errors[:30]) + "\n" + chaos.timeline
    )


def test_the_checks_catch_disorder_loss_skips_overlaps_and_rewound_handovers() -> None:
    q = shard_index("a", QUEUES)

    def e(worker: str, seq: int, start: int, end: int) -> Entry:
        return Entry(worker, "a", seq, q, seq, start, end)

    def errors(entries: list[Entry], rounds: int = 3) -> list[str]:
        return verify(entries, rounds, {}, keys=["a"]).errors

    clean = [e("w1", 0, 0, 1), e("w1", 1, 2, 3), e("w1", 2, 4, 5)]
    assert errors(clean) == []
    crash = [*clean, e("w2", 1, 10, 11), e("w2", 2, 12, 13), e("w2", 3, 14, 15)]
    report = verify(crash, 4, {}, keys=["a"])
    assert (report.errors, report.duplicates) == ([], 2)
    disorder = errors([e("w1", 0, 0, 1), e("w1", 2, 2, 3), e("w1", 1, 4, 5)])
    assert any("processed before seq 1 ever was" in m for m in disorder), disorder
    [lost] = errors(clean[:2])
    assert "1 messages never processed" in lost
    [skip] = errors([*clean, e("w2", 0, 10, 11), e("w2", 2, 12, 13)])
    assert "w2 skipped from seq 0 to 2" in skip
    [overlap] = errors([e("w1", 0, 0, 10), e("w2", 1, 5, 15), e("w2", 2, 16, 17)])
    assert "began before" in overlap
    [handover] = verify_handovers([*clean, e("w2", 1, 10, 11)], [Revoke("w1", q, 6)], {})
    assert "2 offsets re-delivered" in handover
    [gap] = verify_handovers([*clean, e("w2", 4, 10, 11)], [Revoke("w1", q, 6)], {})
    assert "1 offsets skipped" in gap
    assert verify_handovers([*clean, e("w2", 3, 10, 11)], [Revoke("w1", q, 6)], {}) == []
