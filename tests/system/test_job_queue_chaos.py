"""A job queue under chaos: worker processes killed with -9 and SIGSTOPped holding jobs.

Issue 36's scenario, on a real broker process and real worker processes
(tests/system/job_worker.py, sdk.SimpleConsumer): JOBS jobs, four workers receiving with a
time to run of a few seconds. One worker is killed with -9 while it holds jobs; another
is SIGSTOPped while it holds jobs, stays stopped until the others have received its jobs
again (its time to run passed), then continues with SIGCONT and finishes them late (its
acks are refused). From the workers' logs: every job was finished at least once, none
was lost, and the only jobs received (or finished) more than once are the jobs the two
held when they were signalled, each received exactly twice.

The workers stall at a fixed point (after STALL_AFTER jobs, holding the rest of a batch)
so that the signals land while they certainly hold jobs, however busy the machine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sdk import Message, Producer
from tests.chaos_report import ChaosRecorder, scaled
from tests.support import ROOT, BrokerProcess, wait_until, written_lines

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]

WORKER = Path(__file__).with_name("job_worker.py")
#: The jobs: each victim must finish STALL_AFTER before it stalls, and a worker's share is
#: about a quarter (over three times that); `make chaos` sends 10 000.
JOBS = scaled(4_000, 10_000)
#: The workers' time to run: a few seconds, far more than a batch takes to process.
INVISIBLE_SECONDS = 5
BATCH = 8
#: Jobs the two chaos victims finish before they stall holding the rest of a batch.
STALL_AFTER = 300
#: Generous: the machine may be busy; every wait ends as soon as its condition holds.
PATIENCE = 120.0


@dataclass
class Events:
    """One worker's log, parsed: jobs in the order of each kind of line (job_worker.py)."""

    got: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    late: list[str] = field(default_factory=list)
    stall: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)  # the errors of receives that raised
    lines: list[list[str]] = field(default_factory=list)  # every line, split into words

    def holding(self) -> set[str]:
        """Jobs received and not acked."""
        return set(self.got) - set(self.acked)

    def answered(self) -> set[str]:
        """Jobs whose ack was answered: accepted or refused."""
        return set(self.acked) | set(self.late)


def read_log(path: Path) -> Events:
    events = Events()
    for line in written_lines(path):
        kind, job, *_ = words = line.split()
        getattr(events, kind).append(job)
        events.lines.append(words)
    return events


class Worker:
    """A job_worker.py process and its log."""

    def __init__(
        self,
        name: str,
        directory: Path,
        address: str,
        *args: str,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log = directory / f"{name}.log"
        self.out = directory / f"{name}.out"
        with self.out.open("wb") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), "--broker", address, "--log", str(self.log),
                 "--invisible", str(INVISIBLE_SECONDS), "--batch", str(BATCH), *args],
                cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip

    def events(self) -> Events:
        return read_log(self.log)

    def state(self) -> str:
        """The process state letter from /proc (T once stopped)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0]

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()


def produce(address: str, count: int = JOBS) -> list[str]:
    """Send `count` jobs to topic "jobs"; their names (the bodies)."""
    jobs = [f"job-{i:05d}" for i in range(count)]
    with Producer(address) as producer:
        for start in range(0, count, 250):  # each batch goes to one queue, in turn
            producer.send_batch([Message("jobs", j.encode()) for j in jobs[start : start + 250]])
    return jobs


def test_killed_and_stopped_workers_jobs_are_redelivered_and_no_others(
    start_broker: StartBroker, tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    started = time.monotonic()
    broker: BrokerProcess = start_broker(tmp_path / "broker")
    jobs = produce(broker.address)
    release = tmp_path / "release"
    stall = ("--stall-after", str(STALL_AFTER), "--release", str(release))
    workers = {
        "killed": Worker("killed", tmp_path, broker.address, *stall),
        "stopped": Worker("stopped", tmp_path, broker.address, *stall),
        "w3": Worker("w3", tmp_path, broker.address),
        "w4": Worker("w4", tmp_path, broker.address),
    }
    killed, stopped = workers["killed"], workers["stopped"]

    def finished() -> set[str]:
        return {j for w in workers.values() for j in w.events().done}

    try:
        wait_until(lambda: bool(killed.events().stall), PATIENCE, "the killed worker to stall")
        killed.proc.send_signal(signal.SIGKILL)
        killed.proc.wait()
        wait_until(lambda: bool(stopped.events().stall), PATIENCE, "the stopped worker to stall")
        stopped.proc.send_signal(signal.SIGSTOP)
        wait_until(lambda: stopped.state() == "T", 10, "the worker to stop")
        held_by_killed = killed.events().holding()
        held_by_stopped = stopped.events().holding()
        assert held_by_killed and held_by_stopped, "the signals must land while jobs are held"

        def received_by_others(held: set[str], victim: Worker) -> bool:
            others = {j for w in workers.values() if w is not victim for j in w.events().got}
            return held <= others

        # Past its jobs' time to run: the others received them again. Only then continue.
        wait_until(lambda: received_by_others(held_by_stopped, stopped), PATIENCE,
                   "the stopped worker's jobs to be delivered again")  # fmt: skip
        release.touch()
        stopped.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: finished() >= set(jobs), PATIENCE, f"all {JOBS} jobs finished")
        # Its log says "done" before each ack: wait for the acks' outcomes, or the worker
        # may be ended with the last ack still unanswered (and its "late" line unwritten).
        wait_until(lambda: held_by_stopped <= stopped.events().answered(), PATIENCE,
                   "the resumed worker's acks of the jobs it held to be answered")  # fmt: skip
    finally:
        for w in workers.values():
            w.end()

    events = {name: w.events() for name, w in workers.items()}
    received = Counter(j for e in events.values() for j in e.got)
    finishes = Counter(j for e in events.values() for j in e.done)
    held = held_by_killed | held_by_stopped
    assert set(finishes) == set(jobs), "every job finished at least once, and nothing else"
    again = {j for j, n in received.items() if n > 1}
    assert again == held, "jobs delivered again: exactly those the two victims held"
    assert all(received[j] == 2 for j in held), "each held job delivered again once"
    assert {j for j, n in finishes.items() if n > 1} <= held
    late = set(events["stopped"].late)
    assert late == held_by_stopped, "the resumed worker's acks of its held jobs were refused"
    assert not any(e.late for name, e in events.items() if name != "stopped")
    chaos_report.record(
        fault="job queue: a worker kill -9, another SIGSTOPped past its time to run",
        rounds=1, acked=JOBS, lost=len(set(jobs) - set(finishes)), order_violations=0,
        duplicates=sum(n - 1 for n in finishes.values()),
        note=f"{len(held_by_killed)} + {len(held_by_stopped)} held jobs delivered again; "
        f"{time.monotonic() - started:.0f} s",
    )  # fmt: skip
