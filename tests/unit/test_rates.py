"""The broker's message-rate meter."""

from __future__ import annotations

from mockbroker.state import RateMeter


def test_rate_meter_averages_over_its_window() -> None:
    meter = RateMeter(window_seconds=60)
    assert meter.rates() == (0.0, 0.0)
    for second in range(0, 121):
        meter.sample(float(second), stored=second * 100, served=second * 50)
    assert meter.rates() == (100.0, 50.0)
