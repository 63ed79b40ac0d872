"""sdk.Career and sdk.aio.Career against an EmbeddedBroker, on a FakeClock shared by all.

One holder among three candidates at every step; a clean hand-over on shutdown (the
next candidate is inaugurated at its next attempt, with a higher epoch); a forced one
when the holder stops renewing: it stops executing once its own lease view ran out,
before the broker's lease is over, and another candidate is inaugurated only after that;
a deposed holder's late write is refused by its stale epoch (FencedLog); the asyncio
twin; bad arguments.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sdk.aio
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Career
from sdk.errors import BrokerUnavailableError, InvalidArgumentError
from sdk.testing import FakeClock
from tests.support import wait_until

RENEW = 5.0
LEASE = 30.0  # the candidates' own view; the broker's lease is 60 s


class StaleEpochWrite(Exception):
    """A write whose epoch is lower than the highest the log has seen."""


class FencedLog:
    """An append-only log that refuses writes with an epoch below the highest seen."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, str]] = []
        self.highest = 0
        self._lock = threading.Lock()

    def append(self, epoch: int, what: str) -> None:
        with self._lock:
            if epoch < self.highest:
                raise StaleEpochWrite(f"epoch {epoch} < {self.highest}: {what}")
            self.highest = epoch
            self.entries.append((epoch, what))


class Candidate:
    """The callbacks of one candidate; every event goes to the shared event list."""

    def __init__(self, name: str, events: list[tuple[str, str, int]], log: FencedLog) -> None:
        self.name = name
        self.events = events
        self.log = log

    def inaugurate(self, epoch: int) -> None:
        self.events.append(("inaugurate", self.name, epoch))

    def execute(self, epoch: int) -> None:
        self.log.append(epoch, f"{self.name} executes")

    def hand_over(self, epoch: int) -> None:
        self.events.append(("hand_over", self.name, epoch))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path / "b", port=0, lock_lease_seconds=60.0)
    with EmbeddedBroker(config, clock=clock) as b:
        yield b


def career(broker: EmbeddedBroker, clock: FakeClock, c: Candidate, **kw: Any) -> Career:
    options: dict[str, Any] = {
        "lease_seconds": LEASE,
        "renew_interval_seconds": RENEW,
        "execute_interval_seconds": 1.0,
        "clock": clock,
    } | kw
    return Career("report", broker.address, c.inaugurate, c.execute, c.hand_over, **options)


def three_started(
    broker: EmbeddedBroker, clock: FakeClock
) -> tuple[list[tuple[str, str, int]], FencedLog, list[Candidate], list[Career]]:
    """Three candidates of one career, started: their events, log, candidates, careers."""
    events: list[tuple[str, str, int]] = []
    log = FencedLog()
    candidates = [Candidate(f"c{i}", events, log) for i in range(3)]
    careers = [career(broker, clock, c) for c in candidates]
    for c in careers:
        c.start()
    return events, log, candidates, careers


def holders(careers: list[Career]) -> list[Career]:
    return [c for c in careers if c.epoch is not None]


def step(clock: FakeClock, careers: list[Career], seconds: float) -> None:
    """Advance the clock; let the candidates act; never two holders."""
    clock.advance(seconds)
    time.sleep(0.15)
    assert len(holders(careers)) <= 1


def advance_until(
    clock: FakeClock, careers: list[Career], condition: Callable[[], bool], max_steps: int
) -> int:
    """Step RENEW seconds at a time until `condition` holds; the steps it took.

    A candidate slow to go back to sleep (a loaded machine) misses one step, not the test.
    """
    for steps in range(1, max_steps + 1):
        step(clock, careers, RENEW)
        if condition():
            return steps
    raise AssertionError(f"not within {max_steps} steps of {RENEW} s")


def check_terms(events: list[tuple[str, str, int]]) -> list[int]:
    """The epochs inaugurated, checked: each term handed over before the next one began."""
    epochs: list[int] = []
    open_term: tuple[str, int] | None = None
    for kind, who, epoch in events:
        if kind == "inaugurate":
            assert open_term is None, f"{who} inaugurated during {open_term}"
            assert not epochs or epoch > epochs[-1], "the epoch only grows"
            epochs.append(epoch)
            open_term = (who, epoch)
        else:
            assert open_term == (who, epoch), (kind, who, epoch, open_term)
            open_term = None
    return epochs


def test_one_holder_among_three_and_a_clean_hand_over_on_shutdown(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    events, log, candidates, careers = three_started(broker, clock)
    try:
        wait_until(lambda: len(holders(careers)) == 1, what="a holder")
        first = holders(careers)[0]
        for _ in range(8):  # 40 s: renewals keep the one holder
            step(clock, careers, RENEW)
            assert holders(careers) == [first]
        first_epoch = first.epoch
        assert first_epoch is not None and first.terms == [first_epoch]
        wait_until(lambda: len(log.entries) >= 3, what="the holder's executions")

        first.shutdown()  # clean: hand-over, then unlock
        # Another candidate may already hold it: an attempt of the last step that a busy
        # machine held back until after the unlock. check_terms (below) checks the order.
        handed = ("hand_over", candidates[careers.index(first)].name, first_epoch)
        assert handed in events
        assert all(kind == "inaugurate" for kind, _, _ in events[events.index(handed) + 1 :])
        rest = [c for c in careers if c is not first]
        # The next attempt of the others wins: long before the broker's lease (60 s) ends.
        advance_until(clock, rest, lambda: len(holders(rest)) == 1, max_steps=3)
        second = holders(rest)[0]
        assert second.epoch is not None and second.epoch > first_epoch
        wait_until(lambda: log.highest == second.epoch, what="the second holder's writes")
        with pytest.raises(StaleEpochWrite):
            log.append(first_epoch, "the former holder's late write")
    finally:
        for c in careers:
            c.shutdown()
    assert len(check_terms(events)) == 2
    assert [e for e, _ in log.entries] == sorted(e for e, _ in log.entries)


def test_a_holder_that_stops_renewing_stops_before_the_broker_gives_the_career_away(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    events, log, candidates, careers = three_started(broker, clock)
    try:
        wait_until(lambda: len(holders(careers)) == 1, what="a holder")
        holder = holders(careers)[0]
        old = holder.epoch
        assert old is not None
        wait_until(lambda: log.entries != [], what="a write")

        async def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise BrokerUnavailableError("paused (test)")

        # As a paused or cut-off process: its renewals and heartbeats no longer arrive.
        transport = holder._core._transport
        transport.lock_batch = unreachable  # type: ignore[method-assign]
        transport.heartbeat = unreachable  # type: ignore[method-assign]
        transport.unlock_batch = unreachable  # type: ignore[method-assign]
        others = [c for c in careers if c is not holder]
        name = candidates[careers.index(holder)].name

        def handed_over() -> bool:
            assert holders(others) == []  # the broker's lease lives on
            return ("hand_over", name, old) in events

        # The holder's own lease view (30 s) runs out: it stops, while the broker's lives.
        before = advance_until(clock, careers, handed_over, max_steps=9)
        assert holder.epoch is None and LEASE <= before * RENEW < 60
        # Past the broker's 60 s, counted from the last renewal (at the fault or before),
        # another candidate takes the career.
        after = advance_until(clock, careers, lambda: holders(others) != [], max_steps=12)
        assert (before + after) * RENEW >= 60
        wait_until(lambda: len(holders(others)) == 1, what="a new holder")
        new = holders(others)[0].epoch
        assert new is not None and new > old
        wait_until(lambda: log.highest == new, what="the new holder's writes")
        with pytest.raises(StaleEpochWrite):  # the deposed holder wakes up and writes
            log.append(old, "the deposed holder's late write")
    finally:
        for c in careers:
            c.shutdown()
    check_terms(events)


def test_the_asyncio_career_cancels_a_deposed_execution_and_hands_over(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    events: list[tuple[str, str, int]] = []

    def candidate(name: str) -> sdk.aio.Career:
        async def inaugurate(epoch: int) -> None:
            events.append(("inaugurate", name, epoch))

        async def execute(epoch: int) -> None:
            await asyncio.Event().wait()  # a long job: only a cancellation ends it

        async def hand_over(epoch: int) -> None:
            events.append(("hand_over", name, epoch))

        return sdk.aio.Career(
            "sweeper", broker.address, inaugurate, execute, hand_over,
            lease_seconds=LEASE, renew_interval_seconds=RENEW, clock=clock,
        )  # fmt: skip

    async def main() -> None:
        a, b = candidate("a"), candidate("b")
        await a.start()
        for _ in range(200):
            if a.epoch is not None:
                break
            await asyncio.sleep(0.01)
        assert a.epoch is not None
        await b.start()
        await asyncio.sleep(0.1)
        assert b.epoch is None
        # a's renewals stop arriving; its execution is cancelled at its lease's end
        transport = a._core._transport

        async def unreachable(*args: Any, **kwargs: Any) -> Any:
            raise BrokerUnavailableError("paused (test)")

        transport.lock_batch = unreachable  # type: ignore[method-assign]
        for _ in range(30):  # past the broker's lease (60 s)
            await asyncio.to_thread(clock.advance, RENEW)
            await asyncio.sleep(0.1)
            if b.epoch is not None:
                break
        assert a.epoch is None and b.epoch is not None and b.epoch > a.terms[0]
        await b.shutdown()  # clean: b's hand-over, while its lock is still renewed
        await a.shutdown()

    asyncio.run(main())
    assert [kind for kind, _, _ in events] == ["inaugurate", "hand_over"] * 2
    check_terms(events)


def test_a_failed_inauguration_ends_the_term_and_another_candidate_takes_it(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    events: list[tuple[str, str, int]] = []
    log = FencedLog()
    failing, healthy = Candidate("failing", events, log), Candidate("healthy", events, log)

    def refuse(epoch: int) -> None:
        raise RuntimeError("the job's database is down")

    failing.inaugurate = refuse  # type: ignore[method-assign]
    first = career(broker, clock, failing)
    second = career(broker, clock, healthy)
    with first:
        wait_until(lambda: first.terms != [], what="the first inauguration")
        state = broker.broker.state
        assert state is not None
        wait_until(lambda: not state.locks.locks("CAREER_report"), what="the lock's release")
        with second:
            # The lock is free: the healthy candidate's first attempt takes it.
            wait_until(lambda: second.epoch is not None, what="the healthy candidate's term")
            step(clock, [first, second], RENEW)  # the failing one tries again, in vain
            assert second.epoch is not None and second.epoch > first.terms[0]
            assert first.terms == first.terms[:1]
            wait_until(lambda: log.entries != [], what="the healthy candidate's job")
    assert events[0][:2] == ("inaugurate", "healthy")
    assert all(who.startswith("healthy") for _, who in log.entries)


@pytest.mark.parametrize(
    "name, options",
    [
        ("", {}),
        ("has space", {}),
        ("x" * 200, {}),
        ("ok", {"lease_seconds": 0}),
        ("ok", {"renew_interval_seconds": 0}),
        ("ok", {"lease_seconds": 5, "renew_interval_seconds": 5}),
        ("ok", {"execute_interval_seconds": -1}),
        ("ok", {"lease_seconds": float("nan")}),
        ("ok", {"renew_interval_seconds": "5"}),
        ("ok", {"topic": "rmq_sys_x"}),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_sent(name: str, options: Any) -> None:
    with pytest.raises(InvalidArgumentError):
        Career(name, "127.0.0.1:1", print, print, print, **options)
    with pytest.raises(InvalidArgumentError):
        sdk.aio.Career(name, "127.0.0.1:1", _noop, _noop, _noop, **options)


def test_callbacks_must_be_callable() -> None:
    with pytest.raises(InvalidArgumentError):
        Career("ok", "127.0.0.1:1", print, None, print)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError):
        sdk.aio.Career("ok", "127.0.0.1:1", _noop, _noop, 3)  # type: ignore[arg-type]


async def _noop(epoch: int) -> None:
    pass
