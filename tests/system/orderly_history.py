"""What the orderly system tests share: worker processes, their merged history, the checks.

The worker processes (tests/system/orderly_worker.py) log one fsynced line per processed
message; `History` reads the logs as they grow, `verify` checks the merged history for the
issue's promises (order, completeness, exclusivity) and counts duplicates, and
`verify_handovers` checks planned hand-overs. `PacedProducer` sends rounds of one message
per key; `Scene` holds the processes of one run and waits on conditions, failing fast when
a process died. Used by test_orderly_chaos.py (consumers join, die and freeze) and
test_broker_restart_chaos.py (the broker is killed with -9 and restarted).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sdk import Message, OrderMQError, PartialBatchError, Producer, ProducerConfig, shard_index
from tests.chaos_report import ChaosRecorder
from tests.support import ROOT, BrokerProcess, wait_until
from tests.system.orderly_worker import CONFIG, TOPIC

WORKER = ROOT / "tests" / "system" / "orderly_worker.py"
START_TIMEOUT = 60.0  # a Python process importing grpc, on a busy machine
#: The broker's lease and client timeout that go with orderly_worker.CONFIG: its client
#: lease (3 s) is shorter than the broker's, which is shorter than the client timeout.
BROKER_LEASE = 4.0
CLIENT_TIMEOUT = 6.0
#: How often mockbroker looks for clients that went silent (server._EXPIRY_SWEEP_SECONDS).
EXPIRY_SWEEP = 1.0
#: Leeway for a loaded two-core machine on top of the protocol's own delays.
SLACK = 10.0
#: A killed, frozen or cut-off worker's queues move once the broker expired it
#: (CLIENT_TIMEOUT of silence, seen by a sweep); the others then rebalance on the
#: membership change (or at their periodic round), lock the queues and go on.
TAKEOVER_TIMEOUT = (
    CONFIG.heartbeat_interval + CLIENT_TIMEOUT + EXPIRY_SWEEP + 2 * CONFIG.rebalance_interval
) + SLACK
#: A new (or returning) worker heartbeats; the others release queues at their rebalance,
#: and it locks them at its next renewal or rebalance.
REJOIN_TIMEOUT = (
    CONFIG.heartbeat_interval + 2 * CONFIG.rebalance_interval + 2 * CONFIG.lock_renew_interval
) + SLACK


def orderly_broker(data_dir: Path, queues: int, *args: str) -> BrokerProcess:
    """A broker (not started yet) with the short lease the orderly workers expect.

    `args`: more command-line arguments of the broker.
    """
    assert CONFIG.lock_lease < BROKER_LEASE < CLIENT_TIMEOUT
    return BrokerProcess(
        data_dir,
        "--flush-mode", "async",
        "--default-queues", str(queues),
        "--lock-lease-seconds", str(BROKER_LEASE),
        "--client-timeout-seconds", str(CLIENT_TIMEOUT),
        *args,
    )  # fmt: skip


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

    def __init__(self, keys: list[str]) -> None:
        self._keys = keys
        self._files: dict[str, tuple[Path, int, bytes]] = {}
        self.by_worker: dict[str, list[Entry]] = {}
        self.top: dict[str, int] = {}  # key -> highest seq processed
        self.distinct: set[tuple[str, int]] = set()
        self.last_start: dict[str, int] = {}  # worker -> latest listener call start
        self.queue_start: dict[int, int] = {}  # queue -> latest listener call start

    def add(self, worker: str, path: Path) -> None:
        """Follow `worker`'s log at `path` (it may not exist yet)."""
        self._files[worker] = (path, 0, b"")
        self.by_worker[worker] = []

    def refresh(self) -> None:
        """Read the lines written since the last refresh."""
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
        self.queue_start[e.queue] = max(self.queue_start.get(e.queue, 0), e.start)

    def entries(self) -> list[Entry]:
        """Every line read so far."""
        return [e for lines in self.by_worker.values() for e in lines]

    def lines(self) -> int:
        """How many lines were read so far."""
        return sum(len(lines) for lines in self.by_worker.values())

    def frontier(self) -> int:
        """The seq every key has reached (-1 while some key has none)."""
        return min(self.top.get(k, -1) for k in self._keys)

    def started_after(self, worker: str, ns: int) -> bool:
        """True once `worker` began a listener call after `ns`."""
        return self.last_start.get(worker, 0) > ns

    def queues_idle_since(self, ns: int, queues: int) -> list[int]:
        """The queues on which no listener call began after `ns`."""
        return [q for q in range(queues) if self.queue_start.get(q, 0) <= ns]


# ---------------------------------------------------------------------------- the checks
@dataclass
class Report:
    """What `verify` found: counts for the summary, and the violations."""

    lines: int
    distinct: int
    lines_by_worker: dict[str, int]
    lost: int = 0  # messages sent (acknowledged) and never processed
    order_violations: int = 0  # a key's seq processed before the one before it ever was
    copies: int = 0  # messages stored more than once (a send retried after its answer was lost)
    duplicates_by_worker: dict[str, int] = field(default_factory=dict)
    rewinds: int = 0  # times a worker went back to a seq at or below one it had processed
    deepest: tuple[int, str] = (0, "")  # the longest re-delivery: seqs behind, and where
    errors: list[str] = field(default_factory=list)

    @property
    def duplicates(self) -> int:
        """Lines beyond the first of each message: re-deliveries (and stored copies)."""
        return self.lines - self.distinct

    def summary(self) -> str:
        """One paragraph of counts, printed by the tests (`pytest -s`)."""
        return (
            f"{self.lines} lines, {self.distinct} distinct messages, "
            f"{self.duplicates} duplicates (by worker: {self.duplicates_by_worker}); "
            f"{self.copies} extra copies stored by retried sends; "
            f"lines by worker: {self.lines_by_worker}; {self.rewinds} rewinds; "
            f"deepest re-delivery {self.deepest[0]} seqs behind ({self.deepest[1]})"
        )

    def record(self, chaos_report: ChaosRecorder, fault: str, rounds: int, note: str) -> None:
        """This run's row of the fault suite's summary table."""
        chaos_report.record(
            fault=fault,
            rounds=rounds,
            acked=self.distinct + self.lost,
            lost=self.lost,
            order_violations=self.order_violations,
            duplicates=self.duplicates,
            note=note,
        )


def verify(
    entries: list[Entry],
    rounds: int,
    frozen: dict[Entry, Entry],
    keys: list[str],
    queues: int,
    *,
    resends: bool = False,
    exclusive: str = "queue",
) -> Report:
    """Order, completeness, re-delivery only as suffixes, placement, exclusivity.

    - nothing lost: every (key, seq) sent was processed at least once, nothing else was;
    - order: for every key, no seq n+1 is processed before n ever was (each processed seq is
      at most the highest seen so far + 1);
    - suffixes: per worker and key, each next seq is the previous + 1, or a rewind to an
      earlier one (a re-delivery from a committed offset), or a jump over seqs another
      worker processed after this one began its previous message (it held the key then);
    - placement: each key comes from its own queue, each (key, seq) from one offset, and
      offsets grow with seq. With `resends` (the producer retried sends whose answer was
      lost, so the broker may have stored a message twice) a (key, seq) may come from
      several offsets, all of them above those of seq - 1 and below those of seq + 1;
    - exclusivity: no two listener calls on one queue (`exclusive="key"`: of one key, as
      key mode promises) overlap in time, in one process or across processes, apart from
      the frozen calls.
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
        report.lost = len(missing)
        errors.append(f"{len(missing)} messages never processed, e.g. {missing[:10]}")
    if unknown := sorted(seen - sent):
        errors.append(f"{len(unknown)} processed messages were never sent: {unknown[:10]}")

    top: dict[str, int] = {}
    dups: Counter[str] = Counter()
    for e in timeline:
        best = top.get(e.key, -1)
        if e.seq > best + 1:
            report.order_violations += 1
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
            if e.seq == prev.seq and e.offset > prev.offset and resends:
                continue  # the next stored copy of the message
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

    errors += check_placement(entries, queues, resends, report)

    frozen_now = set(frozen.values())
    groups: dict[object, list[Entry]] = defaultdict(list)
    for e in entries:
        groups[e.queue if exclusive == "queue" else e.key].append(e)
    for group, calls in sorted(groups.items(), key=lambda item: str(item[0])):
        latest: Entry | None = None
        for e in sorted(calls, key=lambda e: e.start):
            if e in frozen_now:
                continue
            if latest is not None and e.start < latest.end:
                errors.append(f"{exclusive} {group}: {e} began before {latest} ended")
            if latest is None or e.end > latest.end:
                latest = e
    return report


def check_placement(entries: list[Entry], queues: int, resends: bool, report: Report) -> list[str]:
    """Each key from its queue; per key, one message per offset and offsets growing with seq.

    Counts the stored copies into `report.copies`; without `resends` a copy is an error.
    """
    errors = []
    offsets: dict[tuple[str, int], set[int]] = defaultdict(set)
    for e in entries:
        if e.queue != shard_index(e.key, queues):
            errors.append(f"{e} came from queue {e.queue}, not {shard_index(e.key, queues)}")
        offsets[(e.key, e.seq)].add(e.offset)
    per_key: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for (key, seq), found in sorted(offsets.items()):
        report.copies += len(found) - 1
        if len(found) > 1 and not resends:
            errors.append(f"{key}#{seq}: the same message was read at offsets {sorted(found)}")
        per_key[key].update((offset, seq) for offset in found)
    for key, pairs in sorted(per_key.items()):
        by_offset = sorted(pairs)
        seqs = [seq for _, seq in by_offset]
        shared = len({offset for offset, _ in by_offset}) < len(by_offset)
        if shared or seqs != sorted(seqs):
            errors.append(f"{key}: offsets do not grow with seq: {by_offset[:20]}")
    return errors


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
    """The entries of each queue."""
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
    """Sends round after round (seq = round number, one message per key) until halted.

    The first `backlog` rounds go out at once, the others one per `interval` (or at once
    again up to a number of rounds given to `hurry`, once the faults are over). A send waits
    up to its deadline for an unreachable broker (`config`: the producer's settings).
    Without `retry_for` a failed send ends the thread (`error`). With it, the messages of a
    round that were not acknowledged (the broker was down too long, or died while
    answering, or the network lost the answer) are sent again until they are, for up to
    `retry_for` seconds, before the next round: so every round counted in `rounds` is
    acknowledged as a whole, and a key's messages are stored in seq order (a retried one
    possibly twice, when the broker stored it but its answer was lost). `failures` keeps
    what the failed sends raised.
    """

    def __init__(
        self,
        address: str,
        keys: list[str],
        interval: float,
        *,
        backlog: int = 0,
        retry_for: float = 0.0,
        config: ProducerConfig | None = None,
    ) -> None:
        super().__init__(name="orderly-producer", daemon=True)
        self._address = address
        self._keys = keys
        self._interval = interval
        self._backlog = backlog
        self._retry_for = retry_for
        self._config = config
        self._halt = threading.Event()
        self._wake = threading.Event()  # set by halt and hurry: the pause ends at once
        self._hurry_to = 0
        self._producer: Producer | None = None
        self.rounds = 0  # rounds fully acknowledged
        self.sends = 0  # send_batch calls begun
        self.sending = False  # one is under way
        self.sending_since = 0.0  # when the send under way began (monotonic)
        self.failed_sends = 0  # send_batch calls that failed (and were retried)
        self.failures: list[OrderMQError] = []  # what they raised
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Producer(self._address, config=self._config) as producer:
                self._producer = producer
                while not self._halt.is_set():
                    seq = self.rounds
                    self._send_round(producer, seq)
                    self.rounds = seq + 1
                    if self.rounds >= max(self._backlog, self._hurry_to):
                        self._wake.wait(self._interval)  # the pace, not a wait for a condition
                        self._wake.clear()
        except BaseException as exc:
            self.error = exc

    def _send_round(self, producer: Producer, seq: int) -> None:
        messages = [Message(TOPIC, f"{k}:{seq}".encode(), sharding_key=k) for k in self._keys]
        deadline = time.monotonic() + self._retry_for
        while True:
            self.sends += 1
            self.sending, self.sending_since = True, time.monotonic()
            try:
                producer.send_batch(messages)
                return
            except OrderMQError as exc:
                if time.monotonic() > deadline:
                    raise
                self.failed_sends += 1
                self.failures.append(exc)
                if isinstance(exc, PartialBatchError):
                    messages = [m for m, r in zip(messages, exc.results, strict=True) if r is None]
                time.sleep(0.1)  # a retry's back-off while the broker restarts
            finally:
                self.sending = False

    def describe(self) -> str:
        """Its state for a test's failure message: sends, failures, and where it is now."""
        state = f"producer: {self.sends} sends begun, {self.failed_sends} failed"
        if self.failures:
            state += f" (the last: {self.failures[-1]!r})"
        if not self.sending:
            return f"{state}, none under way"
        return (
            f"{state}, one under way for {time.monotonic() - self.sending_since:.1f}s; "
            f"its client's tasks:\n{self._tasks()}"
        )

    def _tasks(self) -> str:
        """Where the tasks on the producer's loop are: what a send that hangs waits on."""
        thread = self._producer._loop if self._producer is not None else None
        if thread is None:
            return "(no client)"
        lines = []
        # Read from this thread while the loop runs: good enough for a failure message.
        for task in list(asyncio.all_tasks(thread._loop))[:8]:
            awaiting: Any = task.get_coro()
            where = []
            while awaiting is not None and len(where) < 12:  # down the chain of awaits
                frame = getattr(awaiting, "cr_frame", None) or getattr(awaiting, "gi_frame", None)
                if frame is not None:
                    name = frame.f_code.co_filename.rpartition("/")[2]
                    where.append(f"{frame.f_code.co_name} ({name}:{frame.f_lineno})")
                awaiting = getattr(awaiting, "cr_await", None) or getattr(
                    awaiting, "gi_yieldfrom", None
                )
            lines.append(f"  {task.get_name()}: {' -> '.join(where) or 'done'}")
        return "\n".join(lines) or "(none)"

    def hurry(self, rounds: int) -> None:
        """Send the rounds up to `rounds` without pausing, then go on at the pace.

        For the rounds a test needs in all once its faults are over: the pace only makes
        each fault meet messages still arriving, so the rest need not wait for it.
        """
        self._hurry_to = rounds
        self._wake.set()

    def halt(self) -> int:
        """Stop after the round in flight; the number of rounds sent."""
        self._halt.set()
        self._wake.set()
        self.join(30 + self._retry_for)
        assert not self.is_alive(), "the producer did not stop"
        return self.rounds


@dataclass
class Worker:
    """A running orderly_worker.py: its process, log of processed messages, and output."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    out: Path

    def output(self) -> str:
        """What the process printed so far (ready line, hooks, warnings)."""
        return self.out.read_text(errors="replace")

    def state(self) -> str:
        """The process state letter from /proc (R, S, T for stopped, Z, ...)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def revokes(self) -> list[Revoke]:
        """The queues its revoke hook reported."""
        found = []
        for line in self.output().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] == "revoked" and parts[0].isdigit():
                found += [Revoke(self.name, int(q), int(parts[0])) for q in parts[2].split(",")]
        return found


def start_worker(
    name: str, address: str, directory: Path, *args: str, env: dict[str, str] | None = None
) -> Worker:
    """Start orderly_worker.py (extra `args`, such as --delay-ms) and wait for its ready line.

    `env`: its environment (default: this process's).
    """
    log, out = directory / f"{name}.log", directory / f"{name}.out"
    base = os.environ if env is None else env
    env = {
        **base,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")])),
        "PYTHONUNBUFFERED": "1",
    }
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), "--broker", address, "--log", str(log), "--id", name,
             *args],
            cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
    worker = Worker(name, proc, log, out)

    def ready() -> bool:
        assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{worker.output()}"
        return "ready " in worker.output()

    try:
        wait_until(ready, START_TIMEOUT, f"{name} to start")
    except BaseException:
        proc.kill()  # not left running (and holding its queues) after the test failed
        proc.wait()
        raise
    return worker


class Scene:
    """The processes of one run: a broker, a producer, workers; waits that fail fast."""

    def __init__(self, directory: Path, broker: BrokerProcess, history: History) -> None:
        self.directory = directory
        self.broker = broker
        self.history = history
        self.workers: dict[str, Worker] = {}
        self.gone: set[str] = set()  # workers stopped or killed on purpose
        self.producer: PacedProducer | None = None
        self.began = time.monotonic_ns()
        self.events: list[tuple[str, int]] = []

    def mark(self, what: str) -> int:
        """Note a chaos event for the timeline; its monotonic ns."""
        now = time.monotonic_ns()
        self.events.append((what, now))
        return now

    def spawn(self, name: str, *args: str, env: dict[str, str] | None = None) -> None:
        """Start a worker (`env`: its environment) and follow its log."""
        self.spawn_all({name: args}, None if env is None else lambda _: env)

    def spawn_all(
        self,
        workers: Mapping[str, Sequence[str]],
        env: Callable[[str], dict[str, str]] | None = None,
    ) -> None:
        """Start workers together (name: its extra arguments; `env(name)`: its environment).

        Each start is a Python process importing grpc: they overlap instead of queueing.
        Returns once every one is ready; the workers that started are followed (and ended by
        clean_up) even when another did not.
        """
        envs = {name: None if env is None else env(name) for name in workers}
        with ThreadPoolExecutor(len(workers)) as pool:
            starts = {
                name: pool.submit(
                    start_worker,
                    name,
                    self.broker.address,
                    self.directory,
                    *args,
                    env=envs[name],
                )
                for name, args in workers.items()
            }
        failed = [f.exception() for f in starts.values() if f.exception() is not None]
        for name, start in starts.items():
            if start.exception() is None:
                self.workers[name] = start.result()
                self.history.add(name, self.workers[name].log)
                self.mark(f"{name} ready")
        if failed:
            raise failed[0]

    def sent(self) -> int:
        """Rounds the producer had acknowledged; fails if it gave up."""
        assert self.producer is not None
        if self.producer.error is not None:
            raise AssertionError(f"the producer failed: {self.producer.error!r}")
        return self.producer.rounds

    def until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """wait_until, also failing fast if the broker, the producer or a worker died."""

        def check() -> bool:
            self.sent()
            assert self.broker.proc is not None
            if self.broker.proc.poll() is not None:
                raise AssertionError(
                    f"the broker exited ({self.broker.proc.returncode}):\n{self.broker.stderr()}"
                )
            for w in self.workers.values():
                if w.name not in self.gone and w.proc.poll() is not None:
                    raise AssertionError(f"{w.name} exited ({w.proc.returncode}):\n{w.output()}")
            self.history.refresh()
            return condition()

        try:
            wait_until(check, timeout, what)
        except AssertionError as exc:
            h = self.history
            state = (
                f"frontier {h.frontier()}, rounds sent {self.sent()}, lines {h.lines()}, "
                f"distinct {len(h.distinct)}, logs in {self.directory}"
            )
            if self.producer is not None:
                state += f"; {self.producer.describe()}"
            raise AssertionError(f"{exc} ({state})") from None

    def stop_workers(self, names: list[str]) -> None:
        """SIGTERM the workers, and expect each to shut down cleanly (exit 0)."""
        for name in names:
            self.workers[name].proc.terminate()
        for name in names:
            code = self.workers[name].proc.wait(30)
            assert code == 0, f"{name} exited with {code}:\n{self.workers[name].output()}"
            self.gone.add(name)

    def clean_up(self) -> None:
        """Whatever still runs is ended: producer, workers (even stopped ones), broker."""
        if self.producer is not None and self.producer.is_alive():
            self.producer.halt()
        for w in self.workers.values():
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGCONT)
                w.proc.kill()
                w.proc.wait()
        if self.broker.proc is not None and self.broker.proc.poll() is None:
            self.broker.kill9()

    def timeline(self) -> list[str]:
        """The chaos events, in seconds since the scene began."""
        return [f"  {(ns - self.began) / 1e9:6.2f}s {what}" for what, ns in self.events]
