"""Send-back to retry and dead-letter topics, delayed delivery and cancel, on a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageQueue, Producer
from sdk._transport.broker_client import BrokerClient
from sdk.errors import InvalidArgumentError, InvalidOffsetError, MessageNotFoundError
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run
from tests.component.pulling import read_queue
from tests.support import wait_until


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock) as b:
        yield b


def bodies(broker: EmbeddedBroker, queue: MessageQueue) -> list[bytes]:
    return [m.body for m in read_queue(broker.address, queue)]


def test_failed_message_is_retried_later_then_dead_lettered(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    with Producer(broker.address, clock=clock) as producer:
        sent = producer.send(Message("orders", b"poison", keys="k1", sharding_key="o-1"))
    retry_q, dlq_q = mq("%RETRY%g", 0), mq("%DLQ%g", 0)

    async def body(c: BrokerClient) -> None:
        await join(c, "client-1")
        first = await c.send_back("g", sent.queue, sent.queue_offset, max_reconsume_times=2)
        assert (first.dead_letter, first.topic, first.reconsume_times) == (False, "%RETRY%g", 1)

    run(broker.address, body)
    assert bodies(broker, retry_q) == [], "level 3 delays the retry by 10 s"
    clock.advance(9.9)
    assert bodies(broker, retry_q) == []
    clock.advance(0.2)
    wait_until(lambda: bodies(broker, retry_q) == [b"poison"])
    [retried] = read_queue(broker.address, retry_q)
    assert retried.reconsume_times == 1 and retried.msg_id == sent.msg_id
    assert retried.properties == {
        "ORIGIN_TOPIC": "orders",
        "ORIGIN_QUEUE_ID": str(sent.queue.queue_id),
        "ORIGIN_QUEUE_OFFSET": "0",
    }
    assert (retried.keys, retried.sharding_key) == (("k1",), "o-1")

    # A member heartbeats on a connection that stays open, or leaves its group once the
    # connection closed and the broker's disconnect grace (30 s) passed: join again.
    async def again(c: BrokerClient) -> None:
        await join(c, "client-1")
        second = await c.send_back("g", retry_q, 0, max_reconsume_times=2)
        assert (second.dead_letter, second.reconsume_times) == (False, 2)

    run(broker.address, again)
    clock.advance(30.1)  # level 4: 30 s
    wait_until(lambda: len(bodies(broker, retry_q)) == 2)

    async def last(c: BrokerClient) -> None:
        await join(c, "client-1")
        third = await c.send_back("g", retry_q, 1, max_reconsume_times=2)
        assert (third.dead_letter, third.topic, third.reconsume_times) == (True, "%DLQ%g", 2)

    run(broker.address, last)
    [dead] = read_queue(broker.address, dlq_q)
    assert (dead.body, dead.msg_id, dead.properties["ORIGIN_TOPIC"]) == (
        b"poison", sent.msg_id, "orders",
    )  # fmt: skip


def test_an_orderly_consumer_dead_letters_on_its_own_count(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as producer:
        sent = producer.send(Message("orders", b"stuck", sharding_key="o-1"))

    async def body(c: BrokerClient) -> None:
        await join(c, "client-1")
        await c.lock_batch("g", "client-1", [sent.queue])
        back = await c.send_back(
            "g", sent.queue, sent.queue_offset, max_reconsume_times=5, reconsume_times=5
        )
        assert back.dead_letter
        with pytest.raises(InvalidOffsetError):
            await c.send_back("g", sent.queue, 99)
        with pytest.raises(InvalidArgumentError):
            await c.send_back("g", sent.queue, 0, delay_level=19)

    run(broker.address, body)
    assert bodies(broker, mq("%DLQ%g", 0)) == [b"stuck"]


def test_delayed_messages_arrive_when_due_on_their_keys_queue(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    start = clock.now()
    with Producer(broker.address, clock=clock) as producer:
        later = producer.send(Message("orders", b"at +30s", sharding_key="o-7", delay_seconds=30))
        sooner = producer.send(
            Message(
                "orders",
                b"at +10s",
                sharding_key="o-7",
                deliver_at=datetime.fromtimestamp(start + 10, UTC),
            )
        )
        now = producer.send(Message("orders", b"now", sharding_key="o-7"))
    assert later.queue_offset == sooner.queue_offset == -1
    assert later.queue == sooner.queue == now.queue
    queue = now.queue
    assert bodies(broker, queue) == [b"now"]
    clock.advance(9.99)
    assert bodies(broker, queue) == [b"now"], "not a moment early"
    clock.advance(20.02)
    wait_until(lambda: bodies(broker, queue) == [b"now", b"at +10s", b"at +30s"])
    got = read_queue(broker.address, queue)
    assert [m.msg_id for m in got[1:]] == [sooner.msg_id, later.msg_id]
    assert all(m.store_timestamp >= int((start + 10) * 1000) for m in got[1:])


def test_a_delivered_delayed_message_is_found_by_its_keys(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    with Producer(broker.address, clock=clock) as producer:
        sent = producer.send(
            Message("orders", b"later", keys=["order-9", "refund-3"], sharding_key="o-9",
                    delay_seconds=5)
        )  # fmt: skip
    clock.advance(5.1)
    queue = sent.queue
    wait_until(lambda: bodies(broker, queue) == [b"later"])
    [delivered] = read_queue(broker.address, queue)

    async def found(c: BrokerClient) -> dict[str, set[tuple[str, int, int]]]:
        return {
            key: {(m.msg_id, m.queue_offset, m.store_timestamp)
                  for m in await c.query_messages_by_key("orders", key)}
            for key in ("order-9", "refund-3")
        }  # fmt: skip

    # Like a lookup by id, a lookup by key finds every stored copy: the scheduled one
    # (found while it waits) and the one delivered to the queue.
    copy = (sent.msg_id, delivered.queue_offset, delivered.store_timestamp)
    assert all(copy in copies for copies in run(broker.address, found).values())


def test_delay_levels_follow_rocketmq(broker: EmbeddedBroker, clock: FakeClock) -> None:
    from sdk._wire import encode_frame

    async def body(c: BrokerClient) -> None:
        await c.create_topic("levels", 1)
        frames = b"".join(
            encode_frame(msg_id=bytes([i]) * 16, born_timestamp_ms=1, body=b"L%d" % lvl,
                         delay_level=lvl)
            for i, lvl in enumerate([2, 1, 5])  # 5 s, 1 s, 1 min
        )  # fmt: skip
        appended = await c.send("levels", 0, frames)
        assert appended.scheduled and appended.count == 3

    run(broker.address, body)
    queue = mq("levels", 0)
    clock.advance(1.01)
    wait_until(lambda: bodies(broker, queue) == [b"L1"])
    clock.advance(4)
    wait_until(lambda: bodies(broker, queue) == [b"L1", b"L2"])
    clock.advance(55)
    wait_until(lambda: bodies(broker, queue) == [b"L1", b"L2", b"L5"])


def test_cancel_before_and_after_due(broker: EmbeddedBroker, clock: FakeClock) -> None:
    with Producer(broker.address, clock=clock) as producer:
        cancelled = producer.send(Message("orders", b"never", sharding_key="k", delay_seconds=5))
        delivered = producer.send(Message("orders", b"once", sharding_key="k", delay_seconds=5))
        assert producer.cancel(cancelled.msg_id) is True
        assert producer.cancel(cancelled.msg_id) is True, "cancelling twice is harmless"
        clock.advance(5.1)
        wait_until(lambda: bodies(broker, delivered.queue) == [b"once"])
        assert producer.cancel(delivered.msg_id) is False
        with pytest.raises(MessageNotFoundError):
            producer.cancel("00" * 16)
        with pytest.raises(InvalidArgumentError, match="hexadecimal"):
            producer.cancel("not-an-id")
    clock.advance(3600)
    assert bodies(broker, delivered.queue) == [b"once"]


def test_scheduled_messages_survive_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    config = BrokerConfig(data_dir=tmp_path)
    with EmbeddedBroker(config, clock=clock) as b, Producer(b.address, clock=clock) as p:
        r1 = p.send(Message("orders", b"one", sharding_key="k", delay_seconds=10))
        r2 = p.send(Message("orders", b"two", sharding_key="k", delay_seconds=20))
        p.cancel(r2.msg_id)
    with EmbeddedBroker(config, clock=clock) as b:
        state = b.broker.state
        assert state is not None and state.scheduler.pending == 1
        assert bodies(b, r1.queue) == []
        clock.advance(30)
        wait_until(lambda: bodies(b, r1.queue) == [b"one"])
