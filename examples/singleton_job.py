"""A singleton job in three processes: sdk.Career, its hand-overs and its fencing epochs.

What it shows: seed 000's leader career (inaugurate, execute, hand over) on ordermq.
Three candidate processes run the career "nightly-report"; one at a time holds it and
executes the job, which appends to a shared append-only log. Each term carries the
broker's fencing epoch, and the log refuses a write whose epoch is lower than the
highest it has seen. Then, in turn:

- the holder is paused (SIGSTOP) past its lease: another candidate is inaugurated
  within the broker's lease, with a higher epoch; once resumed (SIGCONT) the former
  holder's late writes are refused by its stale epoch, and it becomes a candidate again;
- the holder is killed (kill -9): another is inaugurated within the broker's lease;
- the holder is stopped (SIGTERM): it hands over cleanly, releasing the career, and
  another is inaugurated at its next attempt.

The log then shows one holder at a time and epochs that only grow.

Run it:  python examples/singleton_job.py
(It starts its own broker, with a 3 s lock lease, and takes about 20 seconds.)
Exit status 0, and "result: OK", when every check held.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BROKER_LEASE = 3.0  # the broker's lock lease, short for the example (60 s by default)
LEASE = 2.0  # the candidates' own view of it: shorter
RENEW = 0.3


class FencedLog:
    """An append-only file of "epoch who what" lines, shared by processes.

    append() refuses (returns False) a write whose epoch is lower than the highest
    written: the application's side of fencing.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, epoch: int, who: str, what: str) -> bool:
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            highest = max((int(line.split()[0]) for line in f if line.strip()), default=0)
            if epoch < highest:
                return False
            f.write(f"{epoch} {who} {what}\n")
            f.flush()
            return True

    def lines(self) -> list[tuple[int, str, str]]:
        if not self.path.exists():
            return []
        with open(self.path) as f:
            fcntl.flock(f, fcntl.LOCK_SH)
            rows = [line.rstrip("\n").split(" ", 2) for line in f if line.strip()]
        return [(int(epoch), who, what) for epoch, who, what in rows]


def candidate(name: str, address: str, log_path: Path) -> None:
    """One candidate process: runs the career until SIGTERM."""
    from sdk import Career, wait_for_shutdown_signal

    log = FencedLog(log_path)

    def note(epoch: int, what: str) -> None:
        if not log.append(epoch, name, what):
            print(f"{name}: {what} at epoch {epoch} refused: stale epoch", flush=True)

    career = Career(
        "nightly-report",
        address,
        lambda epoch: note(epoch, "inaugurate"),
        lambda epoch: note(epoch, "execute"),
        lambda epoch: note(epoch, "hand_over"),
        lease_seconds=LEASE,
        renew_interval_seconds=RENEW,
        execute_interval_seconds=0.1,
    )
    with career:
        print(f"{name}: candidate", flush=True)
        wait_for_shutdown_signal()


class Run:
    """The three candidate processes, and what the log says of them."""

    def __init__(self, address: str, log: FencedLog) -> None:
        self.log = log
        self.procs = {
            name: subprocess.Popen(
                [sys.executable, __file__, "--candidate", name, address, str(log.path)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for name in ("A", "B", "C")
        }

    def holder(self) -> tuple[int, str] | None:
        """The (epoch, name) of the last inauguration, unless it handed over since."""
        last = None
        for epoch, who, what in self.log.lines():
            if what == "inaugurate":
                last = (epoch, who)
            elif what == "hand_over" and last == (epoch, who):
                last = None
        return last

    def next_holder(self, after: int, within: float) -> tuple[int, str, float]:
        start = time.monotonic()
        while time.monotonic() - start < within:
            found = self.holder()
            if found is not None and found[0] > after:
                return found[0], found[1], time.monotonic() - start
            time.sleep(0.05)
        raise SystemExit(f"no new holder within {within} s: {self.log.lines()[-5:]}")

    def executions(self, epoch: int, count: int = 3) -> None:
        """Wait until the holder of `epoch` executed `count` times."""
        deadline = time.monotonic() + 10
        while sum(e == epoch and w == "execute" for e, _, w in self.log.lines()) < count:
            if time.monotonic() > deadline:
                raise SystemExit(f"epoch {epoch} does not execute")
            time.sleep(0.05)


def check_log(rows: list[tuple[int, str, str]]) -> list[str]:
    """What is wrong with the log: one holder per epoch, epochs only grow."""
    problems = []
    owner: dict[int, str] = {}
    previous = 0
    for epoch, who, _ in rows:
        if epoch < previous:
            problems.append(f"epoch {epoch} written after {previous}")
        previous = max(previous, epoch)
        if owner.setdefault(epoch, who) != who:
            problems.append(f"epoch {epoch} written by {owner[epoch]} and {who}")
    return problems


def main() -> int:
    from mockbroker import BrokerConfig, EmbeddedBroker

    failures: list[str] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(
            BrokerConfig(data_dir=Path(tmp) / "data", port=0, lock_lease_seconds=BROKER_LEASE)
        ) as broker,
    ):
        log = FencedLog(Path(tmp) / "report.log")
        run = Run(broker.address, log)
        try:
            epoch, first, _ = run.next_holder(0, within=30)
            others = " and ".join(sorted(set(run.procs) - {first}))
            print(f"{first} holds the career (epoch {epoch}); {others} wait")
            run.executions(epoch)

            run.procs[first].send_signal(signal.SIGSTOP)
            paused = epoch
            epoch, second, took = run.next_holder(paused, within=BROKER_LEASE + 3)
            print(f"{first} paused (SIGSTOP): {second} inaugurated with a higher epoch")
            if took > BROKER_LEASE + 1:
                failures.append(f"the paused holder was replaced after {took:.1f} s")
            run.executions(epoch)
            if log.append(paused, first, "late write"):
                failures.append("a write at the paused holder's epoch was accepted")
            run.procs[first].send_signal(signal.SIGCONT)
            print(f"{first} resumed (SIGCONT): its late writes are refused (stale epoch)")

            run.procs[second].kill()  # kill -9
            run.procs[second].wait()
            killed = epoch
            epoch, third, took = run.next_holder(killed, within=BROKER_LEASE + 3)
            print(f"{second} killed (kill -9): {third} inaugurated within the broker's lease")
            if took > BROKER_LEASE + 1:
                failures.append(f"the killed holder was replaced after {took:.1f} s")
            run.executions(epoch)

            run.procs[third].send_signal(signal.SIGTERM)  # clean: hand over, unlock
            run.procs[third].wait(timeout=30)
            handed = epoch
            epoch, fourth, took = run.next_holder(handed, within=5)
            print(f"{third} stopped (SIGTERM): handed over; {fourth} inaugurated")
            if took > 1 + RENEW:
                failures.append(f"the clean hand-over took {took:.1f} s")
            if (handed, third, "hand_over") not in log.lines():
                failures.append(f"{third} did not hand over")
            run.executions(epoch)
        finally:
            for proc in run.procs.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
            outputs = {name: proc.communicate(timeout=30)[0] for name, proc in run.procs.items()}
        rows = log.lines()
    failures += check_log(rows)
    if "refused: stale epoch" not in outputs[first]:
        # It may have been deposed before it wrote again; the late write above was refused.
        print(f"({first} did not try to write after it was resumed)")
    else:
        print(f"{first}: " + outputs[first].splitlines()[-1].split(": ", 1)[1])
    epochs = list(dict.fromkeys(e for e, _, _ in rows))
    grow = epochs == sorted(epochs)
    print(f"log: {len(rows)} lines, terms {len(epochs)}, epochs only grow: {grow}")
    for failure in failures:
        print("FAILED:", failure)
    print("result:", "FAILED" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidate", nargs=3, metavar=("NAME", "ADDRESS", "LOG"))
    args = parser.parse_args()
    if args.candidate:
        name, address, path = args.candidate
        candidate(name, address, Path(path))
        sys.exit(0)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
