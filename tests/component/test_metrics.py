"""The broker's /metrics endpoint, scraped after a known workload."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer
from sdk._transport.broker_client import BrokerClient, GroupInfo
from tests.component.pulling import read_queue


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_key_series_have_the_right_values(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path, metrics_port=0)) as broker:
        port = broker.broker.metrics_port
        assert port
        with Producer(broker.address) as producer:
            results = producer.send_batch(
                [Message("orders", b"x" * 10, sharding_key="k") for _ in range(30)]
            )
            producer.send(Message("audit", b"y"))
        queue = results[0].queue
        assert len(read_queue(broker.address, queue)) == 30

        async def consume(c: BrokerClient) -> None:
            await c.heartbeat("w1", [GroupInfo("billing", "CONSUME_ORDERLY")])
            epoch = (await c.lock_batch("billing", "w1", [queue]))[queue]
            await c.commit_offsets("billing", "w1", [(queue, 12, epoch)])

        async def run() -> None:
            c = BrokerClient(broker.address)
            try:
                await consume(c)
            finally:
                await c.close()

        asyncio.run(run())
        m = scrape(port)
    assert m[("ordermq_messages_in_total", (("topic", "orders"),))] == 30
    assert m[("ordermq_messages_in_total", (("topic", "audit"),))] == 1
    assert m[("ordermq_messages_out_total", (("topic", "orders"),))] == 30
    assert m[("ordermq_locks_held", (("group", "billing"),))] == 1
    assert m[("ordermq_group_members", (("group", "billing"),))] == 1
    lag_key = (("group", "billing"), ("queue", str(queue.queue_id)), ("topic", "orders"))
    assert m[("ordermq_consumer_lag", lag_key)] == 30 - 12
    assert m[("ordermq_held_pulls", ())] == 0
    assert m[("ordermq_store_bytes", ())] > 31 * 10
    # Two sends and a pull, at least, took their turns.
    assert m[("ordermq_fair_slices_total", ())] >= 3
    assert 0 <= m[("ordermq_fair_slices_waited_total", ())] <= m[("ordermq_fair_slices_total", ())]
    assert m[("ordermq_client_limit_refusals_total", ())] == 0
    assert ("ordermq_flush_seconds_count", ()) in m


def test_metrics_are_off_unless_asked_for(broker: EmbeddedBroker) -> None:
    assert broker.broker.metrics_port is None
