"""One candidate process of the career chaos test (tests/system/test_career_chaos.py).

    python tests/system/career_worker.py --broker HOST:PORT --store FILE --id A

Runs the career "chaos-report" (sdk.Career) until SIGTERM, then shuts it down (a clean
hand-over when it holds it) and exits 0. Every callback writes to FILE, an append-only
store shared by the candidates that refuses a write whose epoch is lower than the
highest it has seen (the application's side of fencing). Each attempt, accepted or
refused, is one line of FILE + ".attempts":

    <ok|refused> <epoch> <worker id> <what> <monotonic ns>

and each accepted one a line of FILE: `<epoch> <worker id> <what>`. on_execute writes
"execute-start", sleeps 0.4 s, then writes "execute-end", without checking whether it
still holds the career: a process paused in between writes late, with its stale epoch.
time.monotonic_ns() is one clock for every process of the machine.
"""

from __future__ import annotations

import argparse
import fcntl
import time
from pathlib import Path

from sdk import Career, wait_for_shutdown_signal

LEASE = 2.0  # the broker of the test has a 3 s lock lease
RENEW = 0.3


class Store:
    """The fenced append-only store, shared by processes through flock."""

    def __init__(self, path: Path, worker: str) -> None:
        self.path = path
        self.attempts = path.with_name(path.name + ".attempts")
        self.worker = worker

    def write(self, epoch: int, what: str) -> bool:
        with open(self.path, "a+") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.seek(0)
            highest = max((int(line.split()[0]) for line in f if line.strip()), default=0)
            ok = epoch >= highest
            if ok:
                f.write(f"{epoch} {self.worker} {what}\n")
                f.flush()
            with open(self.attempts, "a") as a:
                verdict = "ok" if ok else "refused"
                a.write(f"{verdict} {epoch} {self.worker} {what} {time.monotonic_ns()}\n")
            return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--id", required=True)
    args = parser.parse_args()
    store = Store(args.store, args.id)

    def execute(epoch: int) -> None:
        store.write(epoch, "execute-start")
        time.sleep(0.4)
        store.write(epoch, "execute-end")

    career = Career(
        "chaos-report",
        args.broker,
        lambda epoch: store.write(epoch, "inaugurate"),
        execute,
        lambda epoch: store.write(epoch, "hand_over"),
        lease_seconds=LEASE,
        renew_interval_seconds=RENEW,
        execute_interval_seconds=0,
    )
    with career:
        print(f"ready {career.client_id}", flush=True)
        wait_for_shutdown_signal()


if __name__ == "__main__":
    main()
