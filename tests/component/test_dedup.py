"""Broker-side deduplication through the public SDK and ordermq's gRPC front.

A message sent again with the same idempotency key (its IDEMPOTENCY_KEY property, else
its message id) on the same topic within `dedup_window_seconds` is answered with the
first one's place and not stored again, across broker restarts (the window is refilled
from the store); once the window has passed, it is stored again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer, SendResult
from sdk._transport.broker_client import BrokerClient
from sdk._transport.codec import encode_message
from sdk._transport.protocol import Appended
from sdk._wire import pack_frame
from sdk.errors import OrderMQError
from sdk.testing import FakeClock, TestBroker
from tests.component.pulling import read_topic

TOPIC = "orders"
QUEUES = 4


@pytest.fixture
def broker() -> Iterator[TestBroker]:
    with TestBroker(default_queues=QUEUES, dedup_window_seconds=600) as b:
        yield b


def place(result: SendResult) -> tuple[int, int]:
    return result.queue.queue_id, result.queue_offset


def test_a_retry_storm_through_two_restarts_stores_each_message_once(
    broker: TestBroker,
) -> None:
    """The same 1 000 messages sent 5 times, the broker restarted twice: each stored once."""
    messages = [
        Message(TOPIC, f"order {i}".encode(), properties={"IDEMPOTENCY_KEY": f"order-{i}"})
        for i in range(1000)
    ]
    rounds: list[list[tuple[int, int]]] = []
    with Producer(broker.address) as producer:
        for n in range(5):
            if n in (2, 4):
                broker.restart()
            rounds.append([place(producer.send(m)) for m in messages])
    assert all(r == rounds[0] for r in rounds[1:]), "a duplicate is answered with the first place"
    assert len(set(rounds[0])) == 1000
    seen = read_topic(broker.address, TOPIC, QUEUES)
    assert Counter(m.body for m in seen) == Counter(m.body for m in messages)  # each once


def send_twice(address: str, frames: bytes, queues: tuple[int, int]) -> tuple[Appended, Appended]:
    """A request sent, then sent again (a retry after its answer was lost)."""

    async def run() -> tuple[Appended, Appended]:
        client = BrokerClient(address)
        try:
            await client.query_route(TOPIC, create_if_missing=True)
            first = await client.send(TOPIC, queues[0], frames, timeout=10)
            again = await client.send(TOPIC, queues[1], frames, timeout=10)
            return first, again
        finally:
            await client.close()

    return asyncio.run(run())


def frames(*ids: int) -> bytes:
    return b"".join(
        encode_message(Message(TOPIC, b"m%d" % n), n.to_bytes(16, "big"), 0.0) for n in ids
    )


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_a_resent_request_is_answered_with_the_first_place_even_on_another_queue(
    flush_mode: str,
) -> None:
    with TestBroker(default_queues=QUEUES, dedup_window_seconds=600, flush_mode=flush_mode) as b:
        first, again = send_twice(b.address, frames(1, 2, 3), (1, 3))
        assert (first.first_offset, first.count) == (again.first_offset, again.count) == (0, 3)
        assert again.queue_id == 1 and again.durable
        assert len(read_topic(b.address, TOPIC, QUEUES)) == 3


def places(appended: Appended) -> list[tuple[int, int, bool]]:
    return [(m.queue_id, m.offset, m.duplicate) for m in appended.messages]


def test_a_batch_with_new_messages_stores_only_those(broker: TestBroker) -> None:
    """A batch partly repeating an earlier send: its duplicates answered, the rest stored."""
    send_twice(broker.address, frames(1), (0, 0))
    first, again = send_twice(broker.address, frames(3, 1, 2), (0, 2))
    assert places(first) == [(0, 1, False), (0, 0, True), (0, 2, False)]
    assert places(again) == [(0, 1, True), (0, 0, True), (0, 2, True)]
    assert [m.msg_id for m in first.messages] == [n.to_bytes(16, "big") for n in (3, 1, 2)]
    assert first.durable and again.durable
    assert len(read_topic(broker.address, TOPIC, QUEUES)) == 3  # 1, then 3 and 2 once


def test_the_same_message_twice_in_a_batch_is_stored_once(broker: TestBroker) -> None:
    first, again = send_twice(broker.address, frames(5, 6, 5, 7, 6), (1, 1))
    assert places(first) == [
        (1, 0, False), (1, 1, False), (1, 0, True), (1, 2, False), (1, 1, True),
    ]  # fmt: skip
    assert places(again) == [(1, 0, True), (1, 1, True), (1, 0, True), (1, 2, True), (1, 1, True)]
    bodies = [m.body for m in read_topic(broker.address, TOPIC, QUEUES)]
    assert bodies == [b"m5", b"m6", b"m7"]  # the new ones in their order


@pytest.mark.parametrize("front", ["grpc", "remoting"])
def test_a_batch_answered_by_the_key_reports_the_first_copys_id(front: str, tmp_path: Path) -> None:
    """Matched by IDEMPOTENCY_KEY: the SDK reports the first copy's place and message id."""
    config = BrokerConfig(
        data_dir=tmp_path / "data", default_queues=QUEUES, dedup_window_seconds=600,
        remoting_port=0, namesrv_port=0,
    )  # fmt: skip
    with (
        EmbeddedBroker(config) as broker,
        Producer(
            broker.address if front == "grpc" else f"rocketmq://{broker.namesrv_address}"
        ) as producer,
    ):
        first = producer.send(Message(TOPIC, b"a", properties={"IDEMPOTENCY_KEY": "k1"}))
        batch = [
            Message(TOPIC, b"b", properties={"IDEMPOTENCY_KEY": "k2"}),
            Message(TOPIC, b"a again", properties={"IDEMPOTENCY_KEY": "k1"}),
            Message(TOPIC, b"b again", properties={"IDEMPOTENCY_KEY": "k2"}),
        ]
        results = producer.send_batch(batch)
        again = producer.send(Message(TOPIC, b"a 3", properties={"IDEMPOTENCY_KEY": "k1"}))
        bodies = Counter(m.body for m in read_topic(broker.address, TOPIC, QUEUES))
    assert results[1].msg_id == first.msg_id == again.msg_id
    assert place(results[1]) == place(first) == place(again)
    assert results[2].msg_id == results[0].msg_id and place(results[2]) == place(results[0])
    assert bodies == Counter([b"a", b"b"])


def test_a_key_outside_the_window_is_stored_again() -> None:
    clock = FakeClock()
    with TestBroker(clock=clock, default_queues=QUEUES, dedup_window_seconds=60) as broker:
        first, again = send_twice(broker.address, frames(7), (0, 0))
        assert again.first_offset == first.first_offset == 0
        broker.restart()  # the window is refilled from the store
        _, again = send_twice(broker.address, frames(7), (0, 0))
        assert again.first_offset == 0
        clock.advance(61)
        late, _ = send_twice(broker.address, frames(7), (0, 0))
        assert late.first_offset == 1  # stored again, then deduplicated again
        broker.restart()
        clock.advance(61)  # the rebuild kept only the window: nothing of it is left
        late, _ = send_twice(broker.address, frames(7), (0, 0))
        assert late.first_offset == 2


def test_without_a_window_every_send_is_stored() -> None:
    with TestBroker(default_queues=QUEUES) as broker:
        first, again = send_twice(broker.address, frames(1), (0, 0))
        assert (first.first_offset, again.first_offset) == (0, 1)


def test_a_batch_over_several_queues_answers_each_message(broker: TestBroker) -> None:
    """The mixed-queue batch (one request with parts): each part answers message by message."""

    def keyed(n: int, shard: str) -> Message:
        return Message(
            TOPIC, b"m%d" % n, sharding_key=shard, properties={"IDEMPOTENCY_KEY": str(n)}
        )

    with Producer(broker.address) as producer:
        first = producer.send(keyed(1, "a"))
        batch = [keyed(2, "a"), keyed(1, "a"), keyed(3, "b"), keyed(3, "b")]
        results = producer.send_batch(batch)
    assert len({r.queue.queue_id for r in results}) == 2
    assert (results[1].msg_id, place(results[1])) == (first.msg_id, place(first))
    assert (results[3].msg_id, place(results[3])) == (results[2].msg_id, place(results[2]))
    assert place(results[0]) == (first.queue.queue_id, first.queue_offset + 1)
    bodies = Counter(m.body for m in read_topic(broker.address, TOPIC, QUEUES))
    assert bodies == Counter([b"m1", b"m2", b"m3"])


def test_messages_with_the_same_idempotency_key_are_stored_once(broker: TestBroker) -> None:
    """Message(idempotency_key=...): two sends of it are one message; received, it shows."""
    with Producer(broker.address) as producer:
        first = producer.send(Message(TOPIC, b"order 7", idempotency_key="order-7"))
        again = producer.send(Message(TOPIC, b"order 7", idempotency_key="order-7"))
    assert (again.msg_id, place(again)) == (first.msg_id, place(first))
    (received,) = read_topic(broker.address, TOPIC, QUEUES)
    assert received.idempotency_key == "order-7" and received.msg_id == first.msg_id


def test_a_refused_batch_with_duplicates_names_its_own_frame_and_stores_nothing(
    broker: TestBroker,
) -> None:
    """Its bad frame named by its index in the request, not among the new messages only."""
    send_twice(broker.address, frames(1), (0, 0))
    empty = pack_frame((9).to_bytes(16, "big"), 0, 0, 0, b"", b"", b"", b"", b"")
    with pytest.raises(OrderMQError, match="frame 2: message body is empty"):
        send_twice(broker.address, frames(1, 2) + empty, (0, 0))
    assert len(read_topic(broker.address, TOPIC, QUEUES)) == 1


def test_a_refused_part_with_duplicates_names_its_own_frame(broker: TestBroker) -> None:
    send_twice(broker.address, frames(1), (0, 0))
    empty = pack_frame((9).to_bytes(16, "big"), 0, 0, 0, b"", b"", b"", b"", b"")

    async def run() -> list[Appended | OrderMQError]:
        client = BrokerClient(broker.address)
        try:
            return await client.send_parts(TOPIC, [(0, frames(1, 2) + empty), (1, frames(3))])
        finally:
            await client.close()

    refused, stored = asyncio.run(run())
    assert isinstance(refused, OrderMQError) and "frame 2: message body is empty" in str(refused)
    assert isinstance(stored, Appended) and (stored.first_offset, stored.count) == (0, 1)
    assert len(read_topic(broker.address, TOPIC, QUEUES)) == 2


def send_parts(address: str, parts: list[tuple[int, bytes]]) -> list[Appended | OrderMQError]:
    """One Send request with a part for each (queue id, frames)."""

    async def run() -> list[Appended | OrderMQError]:
        client = BrokerClient(address)
        try:
            await client.query_route(TOPIC, create_if_missing=True)
            return await client.send_parts(TOPIC, parts)
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_the_same_message_in_two_parts_of_a_request_is_stored_once(flush_mode: str) -> None:
    """A key's second copy, in another queue's part, is a duplicate of its first."""
    with TestBroker(default_queues=QUEUES, dedup_window_seconds=600, flush_mode=flush_mode) as b:
        check_parts_share_first_copies(b)


def check_parts_share_first_copies(broker: TestBroker) -> None:
    first, second, third = send_parts(
        broker.address, [(1, frames(1, 2)), (3, frames(3, 1, 1)), (2, frames(2))]
    )
    assert isinstance(first, Appended) and (first.first_offset, first.count) == (0, 2)
    assert isinstance(second, Appended)
    assert places(second) == [(3, 0, False), (1, 0, True), (1, 0, True)]
    assert second.messages[1].msg_id == (1).to_bytes(16, "big") and second.durable
    assert isinstance(third, Appended) and third.queue_id == 1
    assert (third.first_offset, third.count) == (1, 1)  # wholly a duplicate: the first's place
    bodies = Counter(m.body for m in read_topic(broker.address, TOPIC, QUEUES))
    assert bodies == Counter([b"m1", b"m2", b"m3"])
    again = send_parts(broker.address, [(3, frames(3, 1)), (0, frames(2))])
    assert [places(a) for a in again if isinstance(a, Appended)] == [
        [(3, 0, True), (1, 0, True)], [(1, 1, True)],
    ]  # fmt: skip


def test_a_key_whose_first_part_is_refused_is_stored_in_the_next(broker: TestBroker) -> None:
    """A part is stored whole or refused whole: the other part's copy is then the first."""
    empty = pack_frame((9).to_bytes(16, "big"), 0, 0, 0, b"", b"", b"", b"", b"")
    refused, stored, out_of_range, last = send_parts(
        broker.address,
        [(0, frames(1) + empty), (2, frames(1, 2)), (QUEUES, frames(3)), (1, frames(3, 2))],
    )
    assert isinstance(refused, OrderMQError) and "frame 1: message body is empty" in str(refused)
    assert isinstance(out_of_range, OrderMQError)
    assert isinstance(stored, Appended) and (stored.first_offset, stored.count) == (0, 2)
    assert isinstance(last, Appended) and places(last) == [(1, 0, False), (2, 1, True)]
    bodies = Counter(m.body for m in read_topic(broker.address, TOPIC, QUEUES))
    assert bodies == Counter([b"m1", b"m2", b"m3"])


def test_send_batch_over_several_queues_stores_a_repeated_key_once(broker: TestBroker) -> None:
    """Through the SDK: the same idempotency key under two sharding keys (two queues)."""

    def keyed(body: bytes, shard: str, key: str) -> Message:
        return Message(TOPIC, body, sharding_key=shard, idempotency_key=key)

    with Producer(broker.address) as producer:
        batch = [keyed(b"a", "a", "k1"), keyed(b"b", "b", "k2"), keyed(b"a again", "b", "k1")]
        results = producer.send_batch(batch)
    assert results[0].queue != results[1].queue
    assert (results[2].msg_id, place(results[2])) == (results[0].msg_id, place(results[0]))
    bodies = Counter(m.body for m in read_topic(broker.address, TOPIC, QUEUES))
    assert bodies == Counter([b"a", b"b"])


def test_a_scheduled_part_is_kept_out_of_the_request_wide_rule(broker: TestBroker) -> None:
    """Delayed messages are not deduplicated: a scheduled part's copy is scheduled anyway."""
    delayed = pack_frame((1).to_bytes(16, "big"), 0, 0, 1, b"", b"", b"", b"", b"later")
    now, later = send_parts(broker.address, [(0, frames(1)), (1, delayed)])
    assert isinstance(now, Appended) and (now.first_offset, now.count, now.scheduled) == (
        0,
        1,
        False,
    )
    assert isinstance(later, Appended) and later.scheduled and not later.messages
