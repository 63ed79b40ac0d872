"""The /metrics page written on the event loop a slice at a time (mockbroker/exposition.py)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import CollectorRegistry

from mockbroker.exposition import SAMPLES_PER_SLICE, Encoder, Families, written

LAG_SERIES = 2 * SAMPLES_PER_SLICE + 7


def families() -> list[Metric]:
    """A page's kinds of family: one cut into three slices, an empty one, a histogram."""
    ready = GaugeMetricFamily("ordermq_ready", "1 when ready", value=1)
    lag = GaugeMetricFamily("ordermq_consumer_lag", 'messages "not yet" read\nper queue',
                            labels=["group", "topic", "queue"])  # fmt: skip
    for n in range(LAG_SERIES):
        lag.add_metric([f"g{n % 7}", 'topic "a"\\b', str(n)], n * 0.5)
    retries = CounterMetricFamily("ordermq_retries", "retries", labels=["group"])
    seconds = HistogramMetricFamily("ordermq_flush_seconds", "fsync time", labels=["mode"])
    seconds.add_metric(["sync"], [("0.001", 3.0), ("0.01", 5.0), ("+Inf", 6.0)], 0.02)
    sent = CounterMetricFamily("ordermq_sent", "sent", value=12)
    return [ready, lag, retries, seconds, sent]


def written_with_turns(encoder: Encoder, names: frozenset[str] | None = None) -> tuple[bytes, int]:
    async def main() -> tuple[bytes, int]:
        page = asyncio.ensure_future(written(families(), encoder, names))
        turns = 0
        while not page.done():
            await asyncio.sleep(0)
            turns += 1
        return await page, turns

    return asyncio.run(main())


@pytest.mark.parametrize("encoder", [generate_latest, openmetrics.generate_latest])
def test_the_page_is_what_prometheus_client_writes_in_one_go(encoder: Encoder) -> None:
    """In the text format and in OpenMetrics: a family cut into slices has its header
    lines once, and an OpenMetrics page ends with one # EOF."""
    page, turns = written_with_turns(encoder)
    assert page == encoder(Families(families()))
    assert turns >= LAG_SERIES // SAMPLES_PER_SLICE  # the loop had its turns meanwhile


def test_names_keep_only_their_samples_as_prometheus_client_does() -> None:
    names = frozenset({"ordermq_consumer_lag", "ordermq_sent_total"})
    page, _ = written_with_turns(generate_latest, names)
    registry = CollectorRegistry(auto_describe=True)  # it learns the names it filters
    registry.register(Families(families()))
    assert page == generate_latest(registry.restricted_registry(names))
    assert b"ordermq_ready" not in page and b"ordermq_retries" not in page
