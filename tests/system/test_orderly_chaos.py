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

The history, the checks and the processes are in tests/system/orderly_history.py, shared
with test_broker_restart_chaos.py.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sdk import shard_index
from tests.chaos_report import ChaosRecorder
from tests.support import wait_until
from tests.system import orderly_history
from tests.system.orderly_history import (
    BROKER_LEASE,
    REJOIN_TIMEOUT,
    TAKEOVER_TIMEOUT,
    Entry,
    History,
    PacedProducer,
    Revoke,
    Scene,
    orderly_broker,
    start_worker,
    verify,
    verify_handovers,
)

pytestmark = [pytest.mark.system, pytest.mark.chaos]

QUEUES = 8
KEYS = [f"k{i:03d}" for i in range(500)]
#: One round is one message per key; 40 rounds are the 20 000 messages the test needs.
MIN_ROUNDS = 40
#: Producer pace: a round every half second (1 000 messages/s), slow enough for the
#: workers to keep up, so every chaos step meets messages still arriving.
ROUND_INTERVAL = 0.5

DRAIN_TIMEOUT = 60.0


# ---------------------------------------------------------------------------- frozen calls
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
    assert {shard_index(k, QUEUES) for k in KEYS} == set(range(QUEUES)), "keys cover queues"
    broker = orderly_broker(directory / "broker", QUEUES)
    history = History(KEYS)
    scene = Scene(directory, broker, history)
    workers, mark, until, sent = scene.workers, scene.mark, scene.until, scene.sent

    try:
        broker.start()
        scene.producer = producer = PacedProducer(broker.address, KEYS, ROUND_INTERVAL)
        producer.start()
        until(lambda: sent() >= 1, 30, "the first round (it creates the topic)")
        scene.spawn_all(dict.fromkeys(("w1", "w2", "w3"), ()))
        until(lambda: history.lines() >= 1500, 60, "1 500 messages processed")

        # A fourth worker joins: the queues are spread over four.
        scene.spawn("w4")
        until(lambda: history.started_after("w4", 0), TAKEOVER_TIMEOUT, "w4 to get queues")
        joined = mark("w4 consuming")

        # kill -9 a worker that holds queues after the re-spread.
        until(lambda: history.started_after("w1", joined), REJOIN_TIMEOUT, "w1 consuming")
        workers["w1"].proc.send_signal(signal.SIGKILL)
        workers["w1"].proc.wait()
        scene.gone.add("w1")
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

        # Enough messages (the chaos is over: the rest need no pace), then everything consumed.
        producer.hurry(MIN_ROUNDS)
        until(lambda: sent() >= MIN_ROUNDS, MIN_ROUNDS * ROUND_INTERVAL + 60, "all rounds")
        rounds = producer.halt()
        mark(f"producer done: {rounds} rounds")
        total = rounds * len(KEYS)
        until(lambda: len(history.distinct) >= total, DRAIN_TIMEOUT, f"all {total} processed")
        mark("all processed")

        scene.stop_workers(["w2", "w3", "w4"])
        mark("workers stopped")
        history.refresh()
    finally:
        scene.clean_up()

    entries = history.entries()
    revokes = [r for w in workers.values() for r in w.revokes()]
    frozen = frozen_calls(entries, revokes, "w2", stopped, resumed)
    lines = [f"orderly chaos: {total} messages sent in {rounds} rounds; logs in {directory}"]
    lines += scene.timeline()
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
def test_every_key_in_order_nothing_lost_duplicates_counted(
    chaos: ChaosRun, chaos_report: ChaosRecorder
) -> None:
    report = verify(chaos.entries, chaos.rounds, chaos.frozen, KEYS, QUEUES)
    report.record(chaos_report, "consumers join, die (-9), freeze", chaos.rounds, "")
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
        return verify(entries, rounds, {}, ["a"], QUEUES).errors

    clean = [e("w1", 0, 0, 1), e("w1", 1, 2, 3), e("w1", 2, 4, 5)]
    assert errors(clean) == []
    crash = [*clean, e("w2", 1, 10, 11), e("w2", 2, 12, 13), e("w2", 3, 14, 15)]
    report = verify(crash, 4, {}, ["a"], QUEUES)
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


def test_a_worker_that_never_gets_ready_is_killed_and_reaped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    silent = tmp_path / "silent_worker.py"
    silent.write_text("import signal\nsignal.pause()\n")  # never prints its ready line
    monkeypatch.setattr(orderly_history, "WORKER", silent)
    monkeypatch.setattr(orderly_history, "START_TIMEOUT", 0.5)
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recording(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(popen(*args, **kwargs))  # type: ignore[call-overload]
        return started[-1]

    monkeypatch.setattr(subprocess, "Popen", recording)
    with pytest.raises(AssertionError, match="w1 to start"):
        start_worker("w1", "127.0.0.1:1", tmp_path)
    [proc] = started
    assert proc.returncode is not None  # killed and waited for, not left running
