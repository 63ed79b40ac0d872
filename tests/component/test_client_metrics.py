"""Client metrics, recorded into the application's registry after enable()."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

import sdk.metrics
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk.testing import FakeClock
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


class FailOnce(MessageListenerConcurrently):
    def __init__(self) -> None:
        self.done: list[bytes] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        if any(m.body == b"flaky" and m.reconsume_times == 0 for m in msgs):
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        self.done += [m.body for m in msgs]
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def test_a_concurrent_retry_through_the_broker_is_counted(
    tmp_path: Path, registry: CollectorRegistry
) -> None:
    # The broker's clock stands still: the retry stays scheduled, never redelivered.
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=FakeClock()) as broker:
        with Producer(broker.address) as producer:
            producer.send_batch([Message("orders", b"fine"), Message("orders", b"flaky")])
        listener = FailOnce()
        consumer = PushConsumer("billing", broker.address,
                                consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        consumer.subscribe("orders")
        consumer.register_message_listener(listener)
        with consumer:
            wait_until(lambda: registry.get_sample_value(
                "ordermq_client_messages_retried_total", {"group": "billing", "via": "broker"}
            ) == 1, 20, "the retry counted")  # fmt: skip
            wait_until(lambda: listener.done == [b"fine"], 20)
    assert registry.get_sample_value(
        "ordermq_client_messages_dead_lettered_total", {"group": "billing"}
    ) in (None, 0)


def test_orderly_retries_in_place_and_the_dead_letter_are_counted(
    broker: EmbeddedBroker, registry: CollectorRegistry
) -> None:
    with Producer(broker.address) as producer:
        producer.send_batch(
            [Message("orders", b, sharding_key="same") for b in (b"ok-1", b"poison", b"ok-2")]
        )
    seen: list[bytes] = []

    class Poisoned(MessageListenerOrderly):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            seen.extend(m.body for m in msgs)
            if any(m.body == b"poison" for m in msgs):
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            return ConsumeOrderlyStatus.SUCCESS

    config = PushConsumerConfig(suspend_current_queue_time=0.01, max_reconsume_times=2)
    consumer = PushConsumer("billing", broker.address, config=config,
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("orders")
    consumer.register_message_listener(Poisoned())
    with consumer:
        wait_until(lambda: b"ok-2" in seen, 20)
    assert seen == [b"ok-1", b"poison", b"poison", b"poison", b"ok-2"]  # a try, two retries
    assert value(registry, "ordermq_client_messages_retried_total",
                 group="billing", via="local") == 2  # fmt: skip
    assert value(registry, "ordermq_client_messages_dead_lettered_total", group="billing") == 1
