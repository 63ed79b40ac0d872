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
        yield from retention_metrics(s)


def retention_metrics(s: BrokerState) -> Iterator[Metric]:
    """Disk use, whether sends are refused, what retention kept and deleted."""
    store = s.store
    disk = store.disk
    yield GaugeMetricFamily(
        "ordermq_disk_used_ratio",
        "Share of the data directory's disk in use, 0..1",
        value=disk.ratio if disk is not None else 0.0,
    )
    yield GaugeMetricFamily(
        "ordermq_sends_refused",
        "1 while the disk is over the refuse ratio and sends get DISK_FULL",
        value=int(store.refusing_sends),
    )
    yield GaugeMetricFamily(
        "ordermq_retention_oldest_timestamp_seconds",
        "When the oldest record retention kept was stored (0: none)",
        value=store.oldest_timestamp_ms() / 1000,
    )
    yield CounterMetricFamily(
        "ordermq_retention_deleted_messages",
        "Messages deleted by retention since start",
        value=store.retention_stats.messages_deleted,
    )
    oldest = GaugeMetricFamily(
        "ordermq_queue_min_offset", "Oldest offset still stored", labels=["topic", "queue"]
    )
    for topic in store.topics.all():
        for qid in range(topic.queue_count):
            oldest.add_metric([topic.name, str(qid)], store.queue(topic, qid).min_offset)
    yield oldest
    skipped = CounterMetricFamily(
        "ordermq_consumer_retention_skipped",
        "Messages retention deleted before the group committed past them",
        labels=["group", "topic", "queue"],
    )
    for group, topic_name, qid in sorted(s.offsets.committed()):
        count = s.offsets.skipped(group, topic_name, qid)
        if count:
            skipped.add_metric([group, topic_name, str(qid)], count)
    yield skipped


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
