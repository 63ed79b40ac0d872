"""The lite pull consumer with push delivery (LitePullConsumerConfig.delivery, "push" by
default) against an in-process broker: the broker sends each held queue's batches within
the credit the consumer grants as poll() frees room; pause, seek and the thresholds keep
their meaning; without push at the broker the consumer pulls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    MessageExt,
    Producer,
)
from sdk.errors import InvalidArgumentError
from tests.component.test_push_delivery import pulls, subscriptions
from tests.component.transports import BrokerOver, broker_over
from tests.support import wait_until


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerOver]:
    """A broker with two queues per topic, reached over gRPC."""
    with broker_over("grpc", tmp_path / "broker", default_queues=2) as b:
        yield b


def fill(address: str, n: int, start: int = 0) -> None:
    with Producer(address) as p:
        msgs = [Message("orders", f"{i:05d}".encode(), sharding_key=f"k{i % 4}")
                for i in range(start, start + n)]  # fmt: skip
        for i in range(0, n, 500):
            p.send_batch(msgs[i : i + 500])


def new(broker: BrokerOver, **config: object) -> LitePullConsumer:
    c = LitePullConsumer(
        "batch",
        broker.address,
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        config=LitePullConsumerConfig(**config),  # type: ignore[arg-type]
    )
    c.subscribe("orders")
    return c


def drain(c: LitePullConsumer, n: int, timeout: float = 20) -> list[MessageExt]:
    out: list[MessageExt] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += c.poll(timeout=0.2)
    return out


def in_queue_order(got: list[MessageExt]) -> bool:
    per_queue: dict[int, list[int]] = {}
    for m in got:
        per_queue.setdefault(m.queue.queue_id, []).append(m.queue_offset)
    return all(offsets == list(range(len(offsets))) for offsets in per_queue.values())


def test_poll_gets_every_message_once_in_queue_order_through_push(broker: BrokerOver) -> None:
    fill(broker.address, 1000)
    c = new(broker)
    with c:
        got = drain(c, 1000)
        assert len(subscriptions(broker.embedded)) == 2  # one per queue
        fill(broker.address, 500, start=1000)  # arrives on the open subscriptions
        got += drain(c, 500)
        assert c.poll(timeout=0.05) == []
    assert len(got) == 1500 and len({m.msg_id for m in got}) == 1500
    assert in_queue_order(got)
    assert pulls(broker.embedded) == 0


def test_the_aio_consumer_gets_every_message_through_push(broker: BrokerOver) -> None:
    fill(broker.address, 600)

    async def main() -> list[MessageExt]:
        c = sdk.aio.LitePullConsumer(
            "batch", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
        )
        c.subscribe("orders")
        got: list[MessageExt] = []
        async with c:
            deadline = time.monotonic() + 20
            while len(got) < 600 and time.monotonic() < deadline:
                got += await c.poll(timeout=0.2)
            assert len(subscriptions(broker.embedded)) == 2
        return got

    got = asyncio.run(main())
    assert len(got) == 600 and in_queue_order(got)
    assert pulls(broker.embedded) == 0


def test_a_queue_that_is_not_polled_holds_no_more_than_its_credit(broker: BrokerOver) -> None:
    """Nobody polls: each queue's cache fills to its share of pull_threshold_for_all and
    the broker sends no more (memory bounded), then poll() gets them all in order."""
    fill(broker.address, 2000)
    c = new(broker, pull_threshold_for_all=200, pull_threshold_for_queue=150)
    with c:
        core = c._core
        wait_until(lambda: sum(pq.count for pq in core._queues.values()) >= 200, 10)
        time.sleep(0.3)  # the broker would send more now, had it credit
        counts = [pq.count for pq in core._queues.values()]
        assert counts == [100, 100], counts  # min(150, 200 // 2) each
        got = drain(c, 2000)
    assert len(got) == 2000 and in_queue_order(got)


def test_a_queue_a_rebalance_takes_away_full_leaves_the_total_cached(broker: BrokerOver) -> None:
    """Flow control reads one count kept over the queues as they change: the cache of a
    queue given up must leave it, or the queue kept would not pull its new share."""
    fill(broker.address, 2000)
    # Pulls of 128: each of two queues stops at 256 (its share, 150, passed), 512 in all;
    # the queue kept may hold 300 alone, and pulls once more if the total is 256.
    limits = {"pull_threshold_for_all": 300, "pull_threshold_for_queue": 1000, "delivery": "pull"}
    a = new(broker, rebalance_interval=1, **limits)
    with a:
        core = a._core
        wait_until(lambda: [pq.count for pq in core._queues.values()] == [256, 256], 10)
        with new(broker, rebalance_interval=1, **limits):
            wait_until(lambda: len(core._queues) == 1, 20)
            [kept] = core._queues.values()
            wait_until(lambda: kept.count == 384, 10)
            assert core._cached.count == 384


def test_a_paused_queue_is_not_polled_and_resumes_where_it_stood(broker: BrokerOver) -> None:
    fill(broker.address, 400)
    c = new(broker)
    with c:
        wait_until(lambda: len(subscriptions(broker.embedded)) == 2, 10)
        queues = sorted(c.assignment(), key=lambda q: q.queue_id)
        c.pause([queues[0]])
        got = drain(c, 400, timeout=2)
        assert {m.queue.queue_id for m in got} == {1}
        c.resume([queues[0]])
        got += drain(c, 400 - len(got))
    assert len(got) == 400 and in_queue_order(got)


def test_seek_with_push_restarts_the_queue_at_the_offset(broker: BrokerOver) -> None:
    fill(broker.address, 400)
    c = new(broker)
    with c:
        first = drain(c, 400)
        queue = first[0].queue
        c.seek(queue, 10)
        again = drain(c, 1)
        assert again and again[0].queue == queue and again[0].queue_offset == 10


def test_delivery_pull_pulls(broker: BrokerOver) -> None:
    fill(broker.address, 300)
    c = new(broker, delivery="pull")
    with c:
        got = drain(c, 300)
        assert subscriptions(broker.embedded) == []
    assert len(got) == 300 and pulls(broker.embedded) > 0


def test_a_delivery_that_is_neither_push_nor_pull_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="delivery must be 'pull' or 'push'"):
        LitePullConsumerConfig(delivery="stream")


def test_over_rocketmq_the_lite_pull_consumer_pulls(tmp_path: Path) -> None:
    with broker_over("rocketmq", tmp_path / "broker", default_queues=2) as b:
        fill(b.address, 300)
        c = new(b)
        with c:
            got = drain(c, 300)
        assert len(got) == 300 and in_queue_order(got)


def test_after_a_broker_restart_poll_goes_on_from_where_it_was(tmp_path: Path) -> None:
    """The broker stops while the consumer holds subscriptions; started again on the same
    port, the consumer subscribes again from each queue's next offset: every message once,
    in queue order, and through push again."""
    data = tmp_path / "broker"
    with EmbeddedBroker(BrokerConfig(data_dir=data, default_queues=2)) as first:
        address = first.address
        port = int(address.rsplit(":", 1)[1])
        fill(address, 400)
        c = LitePullConsumer("batch", address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
        c.subscribe("orders")
        c.start()
        try:
            got = drain(c, 400)
        except BaseException:
            c.shutdown()
            raise
    try:
        with EmbeddedBroker(BrokerConfig(data_dir=data, default_queues=2, port=port)) as second:
            fill(second.address, 400, start=400)
            got += drain(c, 400, timeout=30)
            assert len(subscriptions(second)) == 2
            assert pulls(second) == 0
    finally:
        c.shutdown()
    assert len(got) == 800 and len({m.msg_id for m in got}) == 800
    assert in_queue_order(got)
