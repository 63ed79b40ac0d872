"""Client metrics in a prometheus-client registry that the application exposes.

Off until enabled::

    from prometheus_client import REGISTRY, start_http_server
    import sdk.metrics
    sdk.metrics.enable(REGISTRY)
    start_http_server(9100)

Series: ordermq_client_send_seconds{topic} (per send request), ordermq_client_consume_seconds
{group,topic} (per listener call), ordermq_client_rebalances_total{group},
ordermq_client_messages_retried_total{group,via} (messages a listener failed that will be
consumed again: via="broker" through the group's retry topic, via="local" in place, as
orderly consumers retry), ordermq_client_messages_dead_lettered_total{group} (moved to the
group's dead-letter topic), and ordermq_client_cached_messages{group,topic,queue} (pulled,
not yet consumed) and ordermq_client_retention_skipped_total{group,topic} (messages the
broker's retention deleted before the consumer reached them).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric
    from prometheus_client.registry import Collector

    from sdk.consumer.process_queue import ProcessQueue
    from sdk.message import MessageQueue

# prometheus_client is imported by enable() only: every program using the SDK imports this
# module, and most never enable metrics (25-50 ms a process here, after the rest of the SDK).

_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _HasQueues(Protocol):
    group: str
    _queues: dict[MessageQueue, ProcessQueue]


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Histogram

        self.registry = registry
        self.send = Histogram(
            "ordermq_client_send_seconds", "Send request latency", ["topic"],
            registry=registry, buckets=_BUCKETS,
        )  # fmt: skip
        self.consume = Histogram(
            "ordermq_client_consume_seconds", "Listener call latency", ["group", "topic"],
            registry=registry, buckets=_BUCKETS,
        )  # fmt: skip
        self.rebalances = Counter(
            "ordermq_client_rebalances", "Rebalances that moved queues", ["group"],
            registry=registry,
        )  # fmt: skip
        self.retention_skipped = Counter(
            "ordermq_client_retention_skipped",
            "Messages deleted by the broker's retention before the consumer reached them",
            ["group", "topic"],
            registry=registry,
        )
        self.retried = Counter(
            "ordermq_client_messages_retried",
            "Failed messages to be consumed again, through the retry topic or in place",
            ["group", "via"], registry=registry,
        )  # fmt: skip
        self.dead_lettered = Counter(
            "ordermq_client_messages_dead_lettered",
            "Failed messages moved to the group's dead-letter topic", ["group"],
            registry=registry,
        )  # fmt: skip
        self.collector = _cache_collector()
        registry.register(self.collector)


def _cache_collector() -> Collector:
    """The collector of ordermq_client_cached_messages (a class of its own each time)."""
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector

    class _CacheCollector(Collector):
        def collect(self) -> Iterator[Metric]:
            family = GaugeMetricFamily(
                "ordermq_client_cached_messages",
                "Messages pulled and not yet consumed",
                labels=["group", "topic", "queue"],
            )
            for consumer in list(_consumers):
                for _attempt in range(3):  # the consumer's loop may change the table meanwhile
                    try:
                        items = list(consumer._queues.items())
                        break
                    except RuntimeError:
                        continue
                else:
                    continue
                for queue, pq in items:
                    family.add_metric([consumer.group, queue.topic, str(queue.queue_id)], pq.count)
            yield family

    return _CacheCollector()


_active: _Metrics | None = None
_consumers: weakref.WeakSet[_HasQueues] = weakref.WeakSet()


def enable(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """Start recording into `registry` (a new one if None); returns it."""
    from prometheus_client import CollectorRegistry

    global _active
    disable()
    _active = _Metrics(registry if registry is not None else CollectorRegistry())
    return _active.registry


def disable() -> None:
    """Stop recording and unregister the series."""
    global _active
    if _active is not None:
        for collector in (
            _active.send, _active.consume, _active.rebalances, _active.retried,
            _active.dead_lettered, _active.retention_skipped, _active.collector,
        ):  # fmt: skip
            _active.registry.unregister(collector)
    _active = None


def enabled() -> bool:
    """True while metrics are recorded (between enable() and disable())."""
    return _active is not None


def observe_send(topic: str, seconds: float) -> None:
    """A send request to `topic` took `seconds`."""
    if _active is not None:
        _active.send.labels(topic).observe(seconds)


def observe_consume(group: str, topic: str, seconds: float) -> None:
    """A listener call took `seconds`."""
    if _active is not None:
        _active.consume.labels(group, topic).observe(seconds)


def rebalanced(group: str) -> None:
    """A rebalance of `group` moved queues."""
    if _active is not None:
        _active.rebalances.labels(group).inc()


def retention_skipped(group: str, topic: str, count: int) -> None:
    """`group` moved past `count` messages of `topic` that retention had deleted."""
    if _active is not None:
        _active.retention_skipped.labels(group, topic).inc(count)


def retried(group: str, messages: int, *, local: bool) -> None:
    """`messages` failed messages of `group` will be consumed again.

    `local`: in place (an orderly retry, or a send-back the broker did not take); else
    through the group's retry topic.
    """
    if _active is not None and messages:
        _active.retried.labels(group, "local" if local else "broker").inc(messages)


def dead_lettered(group: str) -> None:
    """A failed message of `group` was moved to its dead-letter topic."""
    if _active is not None:
        _active.dead_lettered.labels(group).inc()


def track(consumer: _HasQueues) -> None:
    """Report `consumer`'s cached messages (held weakly)."""
    _consumers.add(consumer)
