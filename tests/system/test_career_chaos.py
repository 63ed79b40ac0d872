"""The singleton career under chaos: three candidate processes, kill -9 and SIGSTOP.

Issue 42's acceptance for sdk.Career. A broker process with a 3 s lock lease; three
candidate processes (tests/system/career_worker.py, client lease 2 s, renewal every
0.3 s) run the career "chaos-report" and log every write attempt to an append-only,
epoch-fenced store. Then:

1. the holder is killed with SIGKILL: a new holder is inaugurated within the broker's
   lease (plus one renewal interval and some slack);
2. the new holder is frozen with SIGSTOP in the middle of an on_execute: another holder
   is inaugurated within the lease; resumed with SIGCONT, the frozen process finishes
   its on_execute with a write at its stale epoch, which the store refuses;
3. every candidate gets SIGTERM: the holder hands over cleanly, each exits 0.

Checked from the attempts log (one clock for every process): the epochs of the terms
only grow; every write during another holder's term came from the frozen process after
SIGCONT, and was refused; each epoch was written by one process only.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT, written_lines
from tests.system.conftest import StartBroker

pytestmark = [pytest.mark.system, pytest.mark.chaos]

BROKER_LEASE = 3.0
RENEW = 0.3
#: A new holder within the broker's lease, one renewal interval, and slack for a loaded
#: machine (the holder's last renewal came before the fault, so this is an upper bound).
REPLACED_WITHIN = BROKER_LEASE + RENEW + 1.5


@dataclass(frozen=True)
class Attempt:
    ok: bool
    epoch: int
    worker: str
    what: str
    ns: int


def attempts(store: Path) -> list[Attempt]:
    path = store.with_name(store.name + ".attempts")
    rows = [line.split() for line in written_lines(path) if line.strip()]
    return [Attempt(v == "ok", int(e), w, what, int(ns)) for v, e, w, what, ns in rows]


def wait_for(store: Path, what: str, timeout: float, **match: object) -> Attempt:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for a in attempts(store):
            if a.what == what and all(getattr(a, k) == v for k, v in match.items()):
                return a
        time.sleep(0.02)
    raise AssertionError(f"no {what} {match} within {timeout} s: {attempts(store)[-5:]}")


def new_term(store: Path, after: int, timeout: float) -> Attempt:
    """The first inauguration with an epoch above `after`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [a for a in attempts(store) if a.what == "inaugurate" and a.ok and a.epoch > after]
        if found:
            return found[0]
        time.sleep(0.02)
    raise AssertionError(f"no holder after epoch {after} within {timeout} s")


def candidate(name: str, address: str, store: Path) -> subprocess.Popen[str]:
    worker = ROOT / "tests" / "system" / "career_worker.py"
    cmd = [sys.executable, str(worker), "--broker", address, "--store", str(store), "--id", name]
    return subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_one_holder_at_a_time_through_kill_9_and_sigstop(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = start_broker(tmp_path / "data", "--lock-lease-seconds", str(BROKER_LEASE))
    store = tmp_path / "store"
    workers = {name: candidate(name, broker.address, store) for name in ("A", "B", "C")}
    try:
        first = new_term(store, 0, timeout=30)
        wait_for(store, "execute-end", 10, epoch=first.epoch)

        killed_at = time.monotonic_ns()
        workers[first.worker].kill()
        workers[first.worker].wait()
        second = new_term(store, first.epoch, REPLACED_WITHIN)
        assert (second.ns - killed_at) / 1e9 <= REPLACED_WITHIN
        assert second.worker != first.worker

        # Freeze the new holder in the middle of an on_execute (it sleeps 0.4 s in it).
        start = wait_for(store, "execute-start", 10, epoch=second.epoch)
        stopped_at = time.monotonic_ns()
        workers[second.worker].send_signal(signal.SIGSTOP)
        stopped_during_execute = not any(
            a.epoch == second.epoch and a.what == "execute-end" and a.ns > start.ns
            for a in attempts(store)
        )
        third = new_term(store, second.epoch, REPLACED_WITHIN)
        assert (third.ns - stopped_at) / 1e9 <= REPLACED_WITHIN
        wait_for(store, "execute-end", 10, epoch=third.epoch)
        resumed_at = time.monotonic_ns()
        workers[second.worker].send_signal(signal.SIGCONT)
        if stopped_during_execute:
            late = wait_for(store, "execute-end", 10, epoch=second.epoch, ok=False)
            assert late.worker == second.worker and late.ns > resumed_at
        wait_for(store, "hand_over", 10, epoch=second.epoch, ok=False)  # deposed, refused
    finally:
        for proc in workers.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
        outcomes = {name: proc.communicate(timeout=60) for name, proc in workers.items()}
    for name, proc in workers.items():
        if name != first.worker:
            assert proc.returncode == 0, outcomes[name]
    log = attempts(store)
    # The last holder handed over cleanly on SIGTERM.
    assert any(a.what == "hand_over" and a.ok and a.epoch == third.epoch for a in log)

    terms = [a for a in log if a.what == "inaugurate" and a.ok]
    epochs = [a.epoch for a in terms]
    assert epochs == sorted(set(epochs)), "the epoch only grows, one inauguration per term"
    writers: dict[int, set[str]] = {}
    for a in log:
        writers.setdefault(a.epoch, set()).add(a.worker)
    assert all(len(w) == 1 for w in writers.values()), writers
    # One holder at a time: a write during a later term came only from the frozen process,
    # after it was resumed, and it was refused.
    for a in log:
        later = [t for t in terms if t.epoch > a.epoch and t.ns < a.ns]
        if later:
            assert not a.ok, a
            assert a.worker == second.worker and a.ns > resumed_at, a
    refused = [a for a in log if not a.ok]
    assert refused and all(a.worker == second.worker for a in refused), refused
