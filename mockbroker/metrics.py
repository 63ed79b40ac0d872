"""Prometheus metrics of a broker, read from its state at scrape time.

Served on `--metrics-port` (off by default). Nothing is counted on the per-message path
but a per-batch, per-topic counter in the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from mockbroker.state import BrokerState


class BrokerCollector(Collector):
    """Turns the broker's counters and tables into metric families."""

    def __init__(self, state: BrokerState, loop: asyncio.AbstractEventLoop) -> None:
        self._state = state
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        """One snapshot of every series, taken on the broker's loop.

        The loop owns the state; scrapes arrive on the HTTP server's threads.
        """
        future = asyncio.run_coroutine_threadsafe(self._snapshot(), self._loop)
        yield from future.result(timeout=10)

    async def _snapshot(self) -> list[Metric]:
        return list(self._collect())

    def _collect(self) -> Iterator[Metric]:
        s = self._state
        store = s.store
        stored = CounterMetricFamily(
            "ordermq_messages_in", "Messages stored, by topic", labels=["topic"]
        )
        for topic, n in sorted(store.stats.stored_by_topic.items()):
            stored.add_metric([topic], n)
        yield stored
        served = CounterMetricFamily(
            "ordermq_messages_out", "Messages served to pulls, by topic", labels=["topic"]
        )
        for topic, n in sorted(store.stats.served_by_topic.items()):
            served.add_metric([topic], n)
        yield served
        yield GaugeMetricFamily("ordermq_held_pulls", "Pulls held waiting", value=s.holder.held)
        yield GaugeMetricFamily(
            "ordermq_scheduled_messages", "Delayed messages waiting", value=s.scheduler.pending
        )
        yield GaugeMetricFamily(
            "ordermq_store_bytes", "Bytes in the commit log", value=store.commitlog.total_bytes()
        )
        yield CounterMetricFamily(
            "ordermq_corrupt_records",
            "Stored records found corrupt",
            value=store.stats.corrupt_records_detected,
        )
        flusher = store.flusher
        if flusher is not None:
            flush = SummaryMetricFamily("ordermq_flush_seconds", "Time spent in fsync")
            flush.add_metric([], count_value=flusher.flushes, sum_value=flusher.flush_seconds)
            yield flush
        if s.sliced is not None:
            fair = s.sliced.scheduler
            yield CounterMetricFamily(
                "ordermq_fair_slices",
                "Slices of store work run (fair scheduling)",
                value=fair.slices,
            )
            yield CounterMetricFamily(
                "ordermq_fair_slices_waited",
                "Slices of store work that waited for their turn behind other clients' work",
                value=fair.waited,
            )
        yield CounterMetricFamily(
            "ordermq_client_limit_refusals",
            "Unary sends refused: their client had client_max_in_flight_bytes in flight",
            value=s.limits.refused,
        )
        locks = GaugeMetricFamily("ordermq_locks_held", "Live queue locks", labels=["group"])
        lag = GaugeMetricFamily(
            "ordermq_consumer_lag",
            "Messages not yet committed, by group and queue",
            labels=["group", "topic", "queue"],
        )
        members = GaugeMetricFamily("ordermq_group_members", "Group members", labels=["group"])
        for group in sorted(set(s.groups.groups()) | s.offsets.groups()):
            live = sum(1 for v in s.locks.locks(group).values() if v.live)
            locks.add_metric([group], live)
            members.add_metric([group], len(s.groups.members(group)))
        for group, topic_name, qid in sorted(s.offsets.committed()):
            found = store.topics.find(topic_name)
            committed = s.offsets.get(group, topic_name, qid)
            if found is None or committed is None or qid >= found.queue_count:
                continue
            max_offset = store.queue(found, qid).max_offset
            lag.add_metric([group, topic_name, str(qid)], max_offset - committed)
        yield locks
        yield members
        yield lag


class MetricsServer:
    """The /metrics HTTP endpoint of one broker."""

    def __init__(self, state: BrokerState, host: str, port: int) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(state, asyncio.get_running_loop()))
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_port)

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()
