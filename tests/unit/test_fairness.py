"""FairScheduler: turns at the store, on a fake timer (no timing assertions).

Each slice of "store work" here advances the fake timer by what it would cost, so the
scheduler sees a flood's cost without anything taking real time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable

import pytest

from mockbroker.fairness import ACTIVE_SECONDS, FairScheduler

#: What one slice of the flooder's work costs on the fake timer (four times the budget).
SLICE = 0.002
BUDGET = 0.0005


class FakeTimer:
    """A monotonic timer that moves only when the test's "work" moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Bench:
    """A scheduler, its fake timer and the order in which slices ran."""

    def __init__(self, budget: float = BUDGET) -> None:
        self.timer = FakeTimer()
        self.scheduler = FairScheduler(turn_seconds=budget, timer=self.timer)
        self.ran: list[tuple[Hashable, int]] = []

    async def work(self, client: Hashable, n: int, cost: float = SLICE) -> None:
        async with self.scheduler.turn(client):
            self.ran.append((client, n))
            self.timer.now += cost

    def start(self, client: Hashable, count: int, cost: float = SLICE) -> list[asyncio.Task[None]]:
        return [asyncio.create_task(self.work(client, n, cost)) for n in range(count)]


def test_a_normal_request_waits_for_at_most_one_slice_of_a_flooder_with_100_queued() -> None:
    async def main() -> list[tuple[Hashable, int]]:
        b = Bench()
        flood = b.start("flooder", 100)
        await asyncio.sleep(0)  # all 100 asked: one ran at once, 99 wait
        assert b.ran == [("flooder", 0)] and b.scheduler.waiting == 99
        normal = asyncio.create_task(b.work("normal", 0, cost=0.0001))
        await asyncio.gather(*flood, normal)
        return b.ran

    ran = asyncio.run(main())
    # Served first come, first served it would be the 101st; it waited for the flooder's
    # slice that held the turn, then it was its turn.
    assert ran.index(("normal", 0)) <= 2
    assert [n for c, n in ran if c == "flooder"] == list(range(100)), "a client keeps its order"


def test_waiting_clients_take_turns_a_slice_each() -> None:
    async def main() -> list[tuple[Hashable, int]]:
        b = Bench()
        tasks = b.start("a", 4) + b.start("b", 4) + b.start("c", 4)
        await asyncio.gather(*tasks)
        return b.ran

    ran = asyncio.run(main())
    clients = [c for c, _ in ran]
    assert clients[1:] == ["a", "b", "c"] * 3 + ["b", "c"]  # a's first ran before any waited
    for client in "abc":
        assert [n for c, n in ran if c == client] == [0, 1, 2, 3]


def test_an_uncontended_slice_does_not_wait() -> None:
    async def main() -> tuple[bool, int]:
        b = Bench()
        went_round = False

        def mark() -> None:
            nonlocal went_round
            went_round = True

        asyncio.get_running_loop().call_soon(mark)
        for n in range(3):  # cheap slices, under the budget together
            await b.work("only", n, cost=BUDGET / 4)
        return went_round, b.scheduler.waited

    went_round, waited = asyncio.run(main())
    assert not went_round, "the slices ran without letting the loop go round"
    assert waited == 0


def test_past_the_budget_the_loop_goes_round_before_the_next_slice() -> None:
    async def main() -> list[str]:
        b = Bench()
        events: list[str] = []
        await b.work("only", 0)  # spends four budgets
        asyncio.get_running_loop().call_soon(events.append, "loop went round")
        await b.work("only", 1)
        events.append("second slice done")
        return events

    assert asyncio.run(main()) == ["loop went round", "second slice done"]


def test_a_cancelled_waiting_slice_leaves_its_place() -> None:
    async def main() -> tuple[list[tuple[Hashable, int]], int]:
        b = Bench()
        first = b.start("a", 1)
        waiting = b.start("b", 1) + b.start("c", 1)
        await asyncio.sleep(0)  # a ran (four budgets); b and c wait for the loop to go round
        assert b.scheduler.waiting == 2
        waiting[0].cancel()
        await asyncio.gather(*first, waiting[1])
        with pytest.raises(asyncio.CancelledError):
            await waiting[0]
        return b.ran, b.scheduler.waiting

    ran, waiting = asyncio.run(main())
    assert ran == [("a", 0), ("c", 0)]
    assert waiting == 0


def test_a_granted_slice_cancelled_before_it_ran_passes_the_turn_on() -> None:
    async def main() -> list[tuple[Hashable, int]]:
        b = Bench()
        first = b.start("a", 1)
        waiting = b.start("b", 1) + b.start("c", 1)
        await asyncio.sleep(0)  # a ran (four budgets); b and c wait for the loop to go round
        await asyncio.sleep(0)  # the loop went round: b was granted, and has not run yet
        assert b.scheduler.waiting == 1 and b.ran == [("a", 0)]
        waiting[0].cancel()
        await asyncio.gather(*first, waiting[1])
        with pytest.raises(asyncio.CancelledError):
            await waiting[0]
        return b.ran

    assert asyncio.run(main()) == [("a", 0), ("c", 0)]


def test_a_failing_slice_gives_the_turn_back() -> None:
    async def main() -> list[tuple[Hashable, int]]:
        b = Bench()

        async def failing() -> None:
            async with b.scheduler.turn("a"):
                b.timer.now += SLICE
                raise RuntimeError("the store refused")

        bad = asyncio.create_task(failing())
        others = b.start("b", 2)
        with pytest.raises(RuntimeError):
            await bad
        await asyncio.gather(*others)
        return b.ran

    assert asyncio.run(main()) == [("b", 0), ("b", 1)]


def test_others_are_active_for_a_second_after_their_last_turn() -> None:
    async def main() -> list[bool]:
        b = Bench()
        s = b.scheduler
        seen = [s.others_active("a")]  # nobody took a turn yet
        await b.work("a", 0, cost=0.0)
        seen += [s.others_active("a"), s.others_active("b")]
        await b.work("b", 0, cost=0.0)
        seen += [s.others_active("a")]
        b.timer.now += ACTIVE_SECONDS + 0.001
        seen += [s.others_active("a"), s.others_active("c")]
        return seen

    assert asyncio.run(main()) == [False, False, True, True, False, False]
