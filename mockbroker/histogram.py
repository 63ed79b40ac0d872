"""Durations counted into buckets, cheaply enough for the send path.

The broker's event loop owns every Histogram (observations and scrapes both run on it),
so there are no locks: an observation is one bisect and two additions.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator

#: Bucket bounds (seconds) fit for fsyncs and sends: a tenth of a millisecond (a page
#: cache write, an fsync on a battery-backed controller) to ten seconds (a stalled disk).
DURATION_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class Histogram:
    """Counts of observations at or below each bound, plus their count and sum."""

    __slots__ = ("_counts", "bounds", "sum")

    def __init__(self, bounds: tuple[float, ...] = DURATION_BUCKETS) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must be strictly increasing: {bounds}")
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)  # the last one: above every bound
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Count one observation."""
        self._counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        """How many observations were made."""
        return sum(self._counts)

    def cumulative(self) -> Iterator[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, infinity last."""
        total = 0
        for bound, n in zip((*self.bounds, math.inf), self._counts, strict=True):
            total += n
            yield bound, total
