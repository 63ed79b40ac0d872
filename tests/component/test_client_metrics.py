"""Client metrics, recorded into the application's registry after enable()."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

import sdk.metrics
from mockbroker import EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
from tests.support import wait_until


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    try:
        yield sdk.metrics.enable(CollectorRegistry())
    finally:
        sdk.metrics.disable()


class Count(MessageListenerOrderly):
    def __init__(self) -> None:
        self.n = 0

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.n += len(msgs)
        return ConsumeOrderlyStatus.SUCCESS


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    assert found is not None, f"{name} {labels} missing"
    return found


def test_send_consume_rebalance_and_cache_series(
    broker: EmbeddedBroker, registry: CollectorRegistry
) -> None:
    with Producer(broker.address) as producer:
        producer.send_batch([Message("orders", b"x", sharding_key="k") for _ in range(20)])
        producer.send(Message("orders", b"y", sharding_key="k"))
    listener = Count()
    consumer = PushConsumer("billing", broker.address,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(listener)
    with consumer:
        wait_until(lambda: listener.n == 21)
        cached = [
            s for m in registry.collect() if m.name == "ordermq_client_cached_messages"
            for s in m.samples
        ]  # fmt: skip
        assert len(cached) == 8 and all(s.labels["group"] == "billing" for s in cached)
    assert value(registry, "ordermq_client_send_seconds_count", topic="orders") == 2
    assert value(registry, "ordermq_client_consume_seconds_count", group="billing",
                 topic="orders") == 21  # fmt: skip
    assert value(registry, "ordermq_client_rebalances_total", group="billing") >= 1


def test_nothing_is_recorded_when_disabled(broker: EmbeddedBroker) -> None:
    registry = sdk.metrics.enable(CollectorRegistry())
    sdk.metrics.disable()
    with Producer(broker.address) as producer:
        producer.send(Message("orders", b"x"))
    assert (
        registry.get_sample_value("ordermq_client_send_seconds_count", {"topic": "orders"}) is None
    )
