"""bench/flood.py: the broker's loop stalls of a phase, from two scrapes of its loop-lag
histogram (ordermq_event_loop_lag_seconds, cumulative buckets)."""

from __future__ import annotations

import math
import sys

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import flood

BOUNDS = (0.001, 0.005, 0.01, 0.025, math.inf)


def histogram(*counts: float) -> dict[float, float]:
    return dict(zip(BOUNDS, counts, strict=True))


def test_the_stalls_of_a_phase_are_what_grew_past_the_stall_bound_between_scrapes() -> None:
    before = histogram(100, 110, 111, 111, 111)  # a stall of 5-10 ms before the phase
    after = histogram(300, 310, 318, 320, 320)
    assert flood._stalls(before, after) == (9, 25.0)  # 7 within 10 ms, 2 within 25 ms


def test_a_phase_without_stalls_says_so_and_names_the_bound_its_wake_ups_were_within() -> None:
    before = histogram(10, 10, 10, 10, 10)
    assert flood._stalls(before, histogram(60, 70, 70, 70, 70)) == (0, 5.0)
    assert flood._stalls(before, before) == (0, 0.0)  # no wake-up observed


def test_a_wake_up_later_than_every_bound_is_within_infinity() -> None:
    assert flood._stalls(histogram(0, 0, 0, 0, 0), histogram(5, 5, 5, 5, 6)) == (1, math.inf)
