"""Prometheus metrics of a broker, read from its state at scrape time.

Served with the health checks by mockbroker.http_status on `--metrics-port` (off by
default). The hot paths only count: a per-batch, per-topic counter in the store, and a
counter update and a histogram observation per request (mockbroker/request_stats.py).
Series of a group appear while the group exists (BrokerState.existing_groups) and go
with it.

The snapshot runs on the broker's event loop, and a broker of many groups has tens of
thousands of per-queue series (a few microseconds each): the families over groups,
offsets and queues give the loop back every SERIES_PER_SLICE series (PAUSE), so that a
scrape delays requests by a slice, not by the whole snapshot. Each series reads the state
as it is at its turn.
"""

from __future__ import annotations

import asyncio
import math
import os
import platform
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from mockbroker.busy_poll import BusyPollSelector, PollingEventLoop
from mockbroker.histogram import Histogram
from sdk._version import __version__

if TYPE_CHECKING:
    from mockbroker.fronts.exchange_port import ExchangePort
    from mockbroker.fronts.remoting.front import RemotingFront
    from mockbroker.server import Broker
    from mockbroker.state import BrokerState

#: Series a snapshot adds between two turns of the loop it gives back.
SERIES_PER_SLICE = 1000


class _Pause:
    """Yielded between two slices of the snapshot: the loop serves others meanwhile."""


PAUSE = _Pause()


class BrokerCollector:
    """Turns the broker's counters and tables into metric families, on its event loop.

    The loop owns the state: the `/metrics` page (exposition.py) asks it from the HTTP
    server's threads.
    """

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    async def families(self) -> list[Metric]:
        """Every family: build and disk figures, and the snapshot."""
        return [build_info(), *disk_space(self._broker.config.data_dir), *await self._snapshot()]

    async def _snapshot(self) -> list[Metric]:
        ready = self._broker.readiness() is None
        families: list[Metric] = [
            GaugeMetricFamily(
                "ordermq_ready",
                "1 when the broker is ready (recovered, the store accepts writes), else 0",
                value=int(ready),
            )
        ]
        lag = self._broker.loop_lag
        families.append(
            _histogram(
                "ordermq_event_loop_lag_seconds",
                f"How late the broker's event loop woke a timer due (sampled every "
                f"{lag.interval * 1000:g} ms): its stalls, which delay every client",
                {},
                lag.seconds,
            )
        )
        loop = asyncio.get_running_loop()
        if isinstance(loop, PollingEventLoop):  # the standalone broker's (busy_poll.py)
            families += busy_poll_families(loop.busy_poll)
        if self._broker.state is not None:
            for family in _state_families(self._broker.state):
                if not isinstance(family, _Pause):
                    families.append(family)
                    continue
                await asyncio.sleep(0)
                if self._broker.stopping:
                    break  # the store closes meanwhile: the scrape ends with what it has
        if self._broker.remoting is not None:
            families += _remoting_families(self._broker.remoting)
        if self._broker.exchange_port is not None:
            families += _exchange_port_families(self._broker.exchange_port)
        return families


def busy_poll_families(selector: BusyPollSelector) -> list[Metric]:
    """How long the broker's loop polls before it sleeps, and how often that paid."""
    spins = CounterMetricFamily(
        "ordermq_busy_poll_spins_total",
        "Polls of the broker's event loop before it sleeps: hit (a request came within the "
        "spin, so no wake-up) or missed (none came: the loop slept, and polls again once "
        "requests come densely)",
        labels=["outcome"],
    )
    spins.add_metric(["hit"], selector.spins_hit)
    spins.add_metric(["missed"], selector.spins_missed)
    return [
        GaugeMetricFamily(
            "ordermq_busy_poll_spin_seconds",
            "How long the broker's event loop polls before it sleeps (--busy-poll-us; 0: "
            "it does not, as with fewer than 2 cores)",
            value=selector.spin_seconds,
        ),
        spins,
    ]


def build_info() -> Metric:
    """ordermq_build_info{version, python} 1."""
    info = GaugeMetricFamily(
        "ordermq_build_info",
        "Always 1; the labels name the ordermq version and the Python version",
        labels=["version", "python"],
    )
    info.add_metric([__version__, platform.python_version()], 1)
    return info


def disk_space(data_dir: Path) -> Iterator[Metric]:
    """Free and total bytes of the filesystem holding `data_dir` (none before it exists)."""
    try:
        fs = os.statvfs(data_dir)
    except OSError:
        return
    yield GaugeMetricFamily(
        "ordermq_disk_free_bytes",
        "Bytes the broker may still write on the filesystem of its data directory",
        value=fs.f_bavail * fs.f_frsize,
    )
    yield GaugeMetricFamily(
        "ordermq_disk_size_bytes",
        "Size of the filesystem of the broker's data directory",
        value=fs.f_blocks * fs.f_frsize,
    )


def _histogram(
    name: str, documentation: str, labels: dict[str, str], histogram: Histogram
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, documentation, labels=list(labels))
    buckets = [(_le(bound), n) for bound, n in histogram.cumulative()]
    family.add_metric(list(labels.values()), buckets, sum_value=histogram.sum)
    return family


def _le(bound: float) -> str:
    """A bucket bound as Prometheus clients write it: 0.005, 1.0, +Inf."""
    return "+Inf" if math.isinf(bound) else repr(bound)


def _counter(
    name: str, documentation: str, labels: list[str], counts: Iterable[tuple[tuple[str, ...], int]]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, n in sorted(counts):
        family.add_metric(list(key), n)
    return family


def _state_families(s: BrokerState) -> Iterator[Metric | _Pause]:
    store = s.store
    stats = store.stats
    yield _counter(
        "ordermq_messages_in", "Messages stored, by topic", ["topic"],
        [((t,), n) for t, n in stats.stored_by_topic.items()],
    )  # fmt: skip
    yield _counter(
        "ordermq_messages_out", "Messages served to pulls, by topic", ["topic"],
        [((t,), n) for t, n in stats.served_by_topic.items()],
    )  # fmt: skip
    yield GaugeMetricFamily("ordermq_held_pulls", "Pulls held waiting", value=s.holder.held)
    yield GaugeMetricFamily(
        "ordermq_scheduled_messages", "Delayed messages waiting", value=s.scheduler.pending
    )
    transactions = s.transactions
    yield GaugeMetricFamily(
        "ordermq_transactions_pending", "Half messages waiting for their commit or rollback",
        value=transactions.pending,
    )  # fmt: skip
    yield _counter(
        "ordermq_transactions_ended", "Transactions ended since start, by outcome "
        "(committed, rolled back, dropped after the most check-backs)", ["outcome"],
        [((name.replace(" ", "_"),), n) for name, n in transactions.outcomes.items()],
    )  # fmt: skip
    yield CounterMetricFamily(
        "ordermq_transaction_checks", "Check-backs sent to producers since start",
        value=transactions.checks_sent,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "ordermq_store_bytes", "Bytes in the commit log", value=store.commitlog.total_bytes()
    )
    yield CounterMetricFamily(
        "ordermq_corrupt_records",
        "Stored records found corrupt",
        value=stats.corrupt_records_detected,
    )
    window = s.dedup.window if s.dedup is not None else None
    yield CounterMetricFamily(
        "ordermq_dedup_duplicates",
        "Messages answered as duplicates of one stored earlier, not stored again",
        value=window.duplicates if window is not None else 0,
    )
    yield GaugeMetricFamily(
        "ordermq_dedup_keys", "Keys in the dedup window", value=len(window or ())
    )
    if store.flusher is not None:
        yield _histogram(
            "ordermq_flush_seconds", "Duration of each flush (fsyncs and checkpoint write)",
            {}, store.flusher.flush_seconds,
        )  # fmt: skip
    yield from _fairness_families(s)
    yield from _request_families(s)
    yield from _group_families(s)
    yield from retention_metrics(s)


def _remoting_families(front: RemotingFront) -> Iterator[Metric]:
    ports = (("broker", front.broker), ("namesrv", front.namesrv))
    servers = [(name, server) for name, server in ports if server is not None]
    open_now = GaugeMetricFamily(
        "ordermq_remoting_connections", "Open remoting connections, by port", labels=["port"]
    )
    refused = CounterMetricFamily(
        "ordermq_remoting_connections_refused",
        "Remoting connections closed on accept: past remoting_max_connections, or "
        "remoting_max_connections_per_host from one address",
        labels=["port"],
    )
    for name, server in servers:
        open_now.add_metric([name], len(server.connections))
        refused.add_metric([name], server.refused_connections)
    yield open_now
    yield refused


def _exchange_port_families(port: ExchangePort) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "ordermq_exchange_port_connections", "Open connections to the Exchange port",
        value=port.connections,
    )  # fmt: skip
    yield CounterMetricFamily(
        "ordermq_exchange_port_connections_accepted",
        "Connections to the Exchange port whose preamble was taken (each an Exchange stream)",
        value=port.accepted_connections,
    )
    yield CounterMetricFamily(
        "ordermq_exchange_port_connections_refused",
        "Exchange port connections closed on accept, past the connection limits",
        value=port.refused_connections,
    )


def _fairness_families(s: BrokerState) -> Iterator[Metric]:
    if s.sliced is not None:
        fair = s.sliced.scheduler
        yield CounterMetricFamily(
            "ordermq_fair_slices", "Slices of store work run (fair scheduling)", value=fair.slices
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
    yield _counter(
        "ordermq_topic_creations_refused",
        "Requests refused a new topic, by cause: disk_full, max_topics, client_max_topics",
        ["cause"],
        [((cause,), n) for cause, n in s.topic_creation.refused.items()],
    )


def _request_families(s: BrokerState) -> Iterator[Metric]:
    requests = s.requests
    yield _counter(
        "ordermq_rpc_requests",
        "Requests answered, by RPC and gRPC status code (Send and Pull include those on "
        "Exchange streams; a stream counts when it ends)",
        ["method", "code"], requests.by_code.items(),
    )  # fmt: skip
    yield _counter(
        "ordermq_rpc_errors",
        "Requests refused or failed, by RPC, gRPC status code and ordermq reason",
        ["method", "code", "reason"], requests.errors.items(),
    )  # fmt: skip
    yield _histogram(
        "ordermq_send_duration_seconds",
        "Time from a send's arrival to its answer (in sync mode, its fsync included)",
        {"flush_mode": s.config.flush_mode}, requests.send_seconds,
    )  # fmt: skip


def _group_families(s: BrokerState) -> Iterator[Metric | _Pause]:
    groups = sorted(s.existing_groups())
    locks = GaugeMetricFamily("ordermq_locks_held", "Live queue locks", labels=["group"])
    members = GaugeMetricFamily("ordermq_group_members", "Group members", labels=["group"])
    disconnected = GaugeMetricFamily(
        "ordermq_group_members_disconnected",
        "Group members whose connection closed and who are not back, while the disconnect "
        "grace runs (a remoting connection its client closed counts once all it sent was read)",
        labels=["group"],
    )
    for n, group in enumerate(groups, 1):
        if not n % (SERIES_PER_SLICE // 10):  # a group's locks and members: ~10 series
            yield PAUSE
        locks.add_metric([group], sum(1 for v in s.locks.locks(group).values() if v.live))
        in_group = s.groups.members(group)
        members.add_metric([group], len(in_group))
        gone = sum(1 for m in in_group if s.groups.disconnected_since(m) is not None)
        disconnected.add_metric([group], gone)
    yield locks
    yield members
    yield disconnected
    retry = s.retry
    yield _counter(
        "ordermq_messages_retried",
        "Failed messages sent back to the group's retry topic %RETRY%<group>",
        ["group"], [((g,), retry.retried[g]) for g in groups if g in retry.retried],
    )  # fmt: skip
    yield _counter(
        "ordermq_messages_dead_lettered",
        "Failed messages moved to the group's dead-letter topic %DLQ%<group>",
        ["group"], [((g,), retry.dead_lettered[g]) for g in groups if g in retry.dead_lettered],
    )  # fmt: skip
    yield from _lag(s)
    yield from pop_metrics(s, set(groups))


def pop_metrics(s: BrokerState, groups: set[str]) -> Iterator[Metric]:
    """What simple consumers' receives (pop) hold and did, by group and topic.

    A (group, topic) with pop state or a count has every series, zeros included.
    """
    pop = s.pop
    stats = pop.stats
    held = pop.in_flight()
    keys = sorted(
        key
        for key in set(held).union(stats.received, stats.acked, stats.expired, stats.dead_lettered)
        if key[0] in groups
    )
    in_flight = GaugeMetricFamily(
        "ordermq_pop_messages_in_flight",
        "Messages received and not yet acked whose invisible time has not passed",
        labels=["group", "topic"],
    )
    for group, topic in keys:
        in_flight.add_metric([group, topic], held.get((group, topic), 0))
    yield in_flight
    for name, documentation, counts in (
        ("ordermq_pop_messages_received",
         "Messages delivered to receives (each re-delivery counts again)", stats.received),
        ("ordermq_pop_messages_acked", "Received messages acked (settled)", stats.acked),
        ("ordermq_pop_messages_expired",
         "Received messages whose invisible time passed without an ack: visible again, to "
         "be delivered again or dead-lettered", stats.expired),
        ("ordermq_pop_messages_dead_lettered",
         "Received messages moved to %DLQ%<group>: after their last delivery attempt, or "
         "forwarded by the client", stats.dead_lettered),
    ):  # fmt: skip
        yield _counter(
            name, documentation, ["group", "topic"],
            [(key, counts[key]) for key in keys],
        )  # fmt: skip


def _lag(s: BrokerState) -> Iterator[Metric | _Pause]:
    store = s.store
    lag = GaugeMetricFamily(
        "ordermq_consumer_lag",
        "Messages not yet committed, by group and queue",
        labels=["group", "topic", "queue"],
    )
    for n, (group, topic_name, qid) in enumerate(s.offsets.committed(), 1):
        if not n % SERIES_PER_SLICE:
            yield PAUSE
        found = store.topics.find(topic_name)
        committed = s.offsets.get(group, topic_name, qid)
        if found is None or committed is None or qid >= found.queue_count:
            continue
        max_offset = store.queue(found, qid).max_offset
        lag.add_metric([group, topic_name, str(qid)], max_offset - committed)
    yield lag


def retention_metrics(s: BrokerState) -> Iterator[Metric | _Pause]:
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
    yield CounterMetricFamily(
        "ordermq_retention_early_deletions",
        "Commit-log segments deleted before their retention time since start (each logged "
        "as retention.early_deletion with the groups it cost)",
        value=store.retention_stats.segments_deleted_early,
    )
    yield CounterMetricFamily(
        "ordermq_retention_expired_messages",
        "Messages expired by their topic's own retention since start",
        value=store.retention_stats.messages_expired,
    )
    oldest = GaugeMetricFamily(
        "ordermq_queue_min_offset", "Oldest offset still stored", labels=["topic", "queue"]
    )
    since_pause = 0
    for topic in store.topics.all():
        if since_pause >= SERIES_PER_SLICE:
            yield PAUSE
            since_pause = 0
        if store.topics.find(topic.name) is not topic:
            continue  # deleted (or made again) during a pause
        for qid in range(topic.queue_count):
            oldest.add_metric([topic.name, str(qid)], store.queue(topic, qid).min_offset)
        since_pause += topic.queue_count
    yield oldest
    skipped = CounterMetricFamily(
        "ordermq_consumer_retention_skipped",
        "Messages retention deleted before the group committed past them",
        labels=["group", "topic", "queue"],
    )
    for n, (group, topic_name, qid) in enumerate(s.offsets.committed(), 1):
        if not n % SERIES_PER_SLICE:
            yield PAUSE
        count = s.offsets.skipped(group, topic_name, qid)
        if count:
            skipped.add_metric([group, topic_name, str(qid)], count)
    yield skipped
