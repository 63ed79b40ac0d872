"""A batch over several queues is one Send request: parts stored or refused one by one."""

from __future__ import annotations

import asyncio
import errno
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.errors import invalid
from sdk import Message, MessageQueue, PartialBatchError, Producer, ProducerConfig
from sdk._transport.broker_client import BrokerClient
from sdk._transport.codec import encode_message
from sdk._transport.protocol import Appended
from sdk.errors import (
    BatchTooLargeError,
    BrokerUnavailableError,
    InvalidMessageError,
    InvalidQueueError,
    InvalidTopicError,
    OrderMQError,
)
from sdk.selector import shard_index
from tests.component.pulling import read_queue, read_topic

TOPIC = "orders"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data")) as b:
        yield b


def sends_answered(broker: EmbeddedBroker) -> int:
    state = broker.broker.state
    assert state is not None
    return state.requests.by_code.get(("Send", "OK"), 0)


def frames(*bodies: bytes) -> bytes:
    return b"".join(
        encode_message(Message(TOPIC, body), n.to_bytes(16, "big"), 0.0)
        for n, body in enumerate(bodies)
    )


def send_parts(
    broker: EmbeddedBroker, parts: list[tuple[int, bytes]], topic: str = TOPIC
) -> list[Appended | OrderMQError]:
    async def run() -> list[Appended | OrderMQError]:
        client = BrokerClient(broker.address)
        try:
            await client.query_route(topic, create_if_missing=True)
            return await client.send_parts(topic, parts, timeout=10)
        finally:
            await client.close()

    return asyncio.run(run())


def mixed(n: int, keys: int = 1000) -> list[Message]:
    return [
        Message(TOPIC, f"{i % keys}:{i}".encode(), sharding_key=f"order-{i % keys}")
        for i in range(n)
    ]


def test_a_mixed_key_batch_is_one_request_with_results_in_input_order(
    broker: EmbeddedBroker,
) -> None:
    batch = mixed(100)
    with Producer(broker.address) as producer:
        producer.send(Message(TOPIC, b"first", sharding_key="warm-up"))  # routes known
        before = sends_answered(broker)
        results = producer.send_batch(batch)
        assert sends_answered(broker) - before == 1
    assert len({r.queue.queue_id for r in results}) == 8  # it did span every queue
    for message, result in zip(batch, results, strict=True):
        assert result.queue.queue_id == shard_index(message.sharding_key or "", 8)
    everything = [m for m in read_topic(broker.address, TOPIC) if m.sharding_key != "warm-up"]
    stored = {(m.queue.queue_id, m.queue_offset): m.body for m in everything}
    for message, result in zip(batch, results, strict=True):
        assert stored[(result.queue.queue_id, result.queue_offset)] == message.body
    by_key: dict[str, list[int]] = {}
    for m in everything:
        key, n = m.body.decode().split(":")
        by_key.setdefault(key, []).append(int(n))
    assert all(ns == sorted(ns) for ns in by_key.values())  # per-key order kept


def test_each_part_is_stored_or_refused_on_its_own(broker: EmbeddedBroker) -> None:
    outcomes = send_parts(
        broker,
        [(0, frames(b"a0", b"a1")), (99, frames(b"x")), (1, b"\x00\x00\x00\x09garbage!!"),
         (2, frames(b"c0")), (0, frames(b"a2"))],
    )  # fmt: skip
    first, bad_queue, malformed, third, again = outcomes
    assert first == Appended(True, 0, 2) and third == Appended(True, 0, 1)
    assert again == Appended(True, 2, 1)  # one queue's parts: stored in request order
    assert isinstance(bad_queue, InvalidQueueError)
    assert isinstance(malformed, InvalidMessageError) and malformed.reason == "MALFORMED_FRAME"
    queue = MessageQueue(TOPIC, "broker-a", 0)
    assert [m.body for m in read_queue(broker.address, queue)] == [b"a0", b"a1", b"a2"]
    assert read_queue(broker.address, MessageQueue(TOPIC, "broker-a", 1)) == []


def test_the_request_as_a_whole_is_refused_for_a_bad_topic_or_too_many_bytes(
    broker: EmbeddedBroker,
) -> None:
    with pytest.raises(InvalidTopicError):
        send_parts(broker, [(0, frames(b"a"))], topic="%RETRY%nope")
    four_mib = frames(b"x" * (2 * 1024 * 1024), b"y" * (2 * 1024 * 1024))
    with pytest.raises(BatchTooLargeError, match="in 8 parts"):  # each part within the limit
        send_parts(broker, [(q, four_mib) for q in range(8)])
    assert read_topic(broker.address, TOPIC) == []


def test_a_full_disk_refuses_every_part_and_the_producer_reports_it(tmp_path: Path) -> None:
    usage = tmp_path / "disk.json"
    usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 0}))
    config = BrokerConfig(data_dir=tmp_path / "data", disk_usage_file=usage,
                          disk_check_seconds=0.05)  # fmt: skip
    with (
        EmbeddedBroker(config) as broker,
        Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer,
    ):
        producer.send_batch(mixed(16))
        usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 95 * 10**7}))
        state = broker.broker.state
        assert state is not None
        _wait(lambda: state.store.refusing_sends)
        with pytest.raises(BrokerUnavailableError) as refused:
            producer.send_batch(mixed(16))
        assert refused.value.reason == "DISK_FULL"
        assert len(read_topic(broker.address, TOPIC)) == 16
        usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 0}))
        _wait(lambda: not state.store.refusing_sends)
        producer.send_batch(mixed(16))
        assert len(read_topic(broker.address, TOPIC)) == 32


def test_a_refused_part_fails_its_messages_and_the_rest_are_stored(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker refuses one queue's part (as it would a malformed one): a partial batch."""
    state = broker.broker.state
    assert state is not None
    real_check = state.store.check
    refused_queue = shard_index("order-3", 8)

    def refusing(frames: bytes, **kw: Any) -> Any:
        if b"order-3" in frames:  # the sharding key of the part for `refused_queue`
            raise invalid("MALFORMED_FRAME", "refused for the test")
        return real_check(frames, **kw)

    real_usual = state.store.check_usual_parts

    def not_usual(parts: list[bytes], **kw: Any) -> Any:
        # as scan_parts does for a request with a part its checks refuse: part by part
        return None if any(b"order-3" in p for p in parts) else real_usual(parts, **kw)

    monkeypatch.setattr(state.store, "check", refusing)
    monkeypatch.setattr(state.store, "check_usual_parts", not_usual)
    batch = mixed(40, keys=8)
    with (
        Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer,
        pytest.raises(PartialBatchError) as caught,
    ):
        producer.send_batch(batch)
    failed = [m for m, r in zip(batch, caught.value.results, strict=True) if r is None]
    assert failed and all(shard_index(m.sharding_key or "", 8) == refused_queue for m in failed)
    assert len(read_topic(broker.address, TOPIC)) == len(batch) - len(failed)


@pytest.mark.parametrize("fair", [True, False], ids=["fair scheduling", "unsliced"])
def test_a_request_for_several_queues_is_one_commit_log_write_and_one_flush_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fair: bool
) -> None:
    config = BrokerConfig(data_dir=tmp_path / "data", flush_mode="sync", fair_scheduling=fair)
    with EmbeddedBroker(config) as broker:
        state = broker.broker.state
        assert state is not None
        store = state.store
        send_parts(broker, [(0, frames(b"warm-up"))])  # the topic exists
        appends: list[int] = []
        waits: list[int] = []
        real_append, real_durable = store.commitlog.append, store.durable

        def counting_append(data: bytes) -> int:
            appends.append(len(data))
            return real_append(data)

        async def counting_durable(end: int) -> bool:
            waits.append(end)
            return await real_durable(end)

        monkeypatch.setattr(store.commitlog, "append", counting_append)
        monkeypatch.setattr(store, "durable", counting_durable)
        outcomes = send_parts(
            broker,
            [(1, frames(b"b0", b"b1")), (2, frames(b"c0")), (3, frames(b"d0")),
             (1, frames(b"b2"))],
        )  # fmt: skip
        assert outcomes == [
            Appended(True, 0, 2), Appended(True, 0, 1), Appended(True, 0, 1), Appended(True, 2, 1)
        ]  # fmt: skip
        assert (len(appends), len(waits)) == (1, 1)
        assert store.commitlog.flushed >= waits[0], "answered before its fsync"
        queue = MessageQueue(TOPIC, "broker-a", 1)
        assert [m.body for m in read_queue(broker.address, queue)] == [b"b0", b"b1", b"b2"]


def _wait(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_message_the_broker_refuses_fails_its_queues_part_alone_and_is_named(
    broker: EmbeddedBroker,
) -> None:
    """Through the public API: a message only the broker can refuse (deliver-at over 40 days
    ahead: the client does not know the broker's clock), inside a batch over several queues.

    Its part (its queue's delayed messages, a part of their own) is refused whole, nothing
    of it stored or scheduled; every other part is stored, its queue's due-now messages
    included. PartialBatchError names the refused message by its index in the batch.
    """
    state = broker.broker.state
    assert state is not None
    batch = mixed(24, keys=8)
    bad_key = batch[5].sharding_key
    batch[5] = Message(TOPIC, b"5:5", sharding_key=bad_key, deliver_at=time.time() + 50 * 86400)
    batch[13] = Message(TOPIC, b"5:13", sharding_key=bad_key, delay_seconds=60)  # valid
    with (
        Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer,
        pytest.raises(PartialBatchError) as caught,
    ):
        producer.send_batch(batch)
    partial = caught.value
    assert [i for i, r in enumerate(partial.results) if r is None] == [5, 13]
    [error] = partial.errors
    assert isinstance(error, InvalidMessageError) and isinstance(error, OrderMQError)
    assert error.reason == "INVALID_DELIVERY_TIME"
    assert "more than 40 days ahead" in str(error)
    assert "22 of 24 messages were stored" in str(partial)
    assert "messages 5, 13 " in str(partial), "the refused messages are named by batch index"
    assert state.scheduler.pending == 0  # the valid delayed message of the part: not kept
    stored = {(m.queue.queue_id, m.queue_offset): m.body for m in read_topic(broker.address, TOPIC)}
    assert len(stored) == 22
    for message, result in zip(batch, partial.results, strict=True):
        if result is not None:
            assert stored[(result.queue.queue_id, result.queue_offset)] == message.body
    bad_queue = shard_index(bad_key or "", 8)
    same_queue = [
        m.body
        for i, m in enumerate(batch)
        if i not in (5, 13) and shard_index(m.sharding_key or "", 8) == bad_queue
    ]
    assert b"5:21" in same_queue  # the refused message's key's due-now one: stored, in order
    assert [stored[q] for q in sorted(stored) if q[0] == bad_queue] == same_queue


def test_a_refused_message_of_a_one_part_batch_fails_the_batch_whole_and_is_named(
    broker: EmbeddedBroker,
) -> None:
    """One part (one queue's delayed messages): the broker's error is the batch's, and its
    frame number is the message's index in the batch."""
    now = time.time()
    batch = [
        Message(
            TOPIC, b"%d" % i, sharding_key="order-1", deliver_at=now + (60 if i != 2 else -3600)
        )
        for i in range(4)
    ]
    with (
        Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer,
        pytest.raises(InvalidMessageError, match=r"^frame 2: deliver-at .* in the past$") as caught,
    ):
        producer.send_batch(batch)
    assert caught.value.reason == "INVALID_DELIVERY_TIME"
    state = broker.broker.state
    assert state is not None and state.scheduler.pending == 0
    assert read_topic(broker.address, TOPIC) == []


def test_a_request_checked_in_one_turn_is_written_in_that_turn(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a one-queue send: checks and write share one turn of the fair scheduler (a second
    turn, its locks and its await cost each mixed-key batch more than a one-queue one)."""
    state = broker.broker.state
    assert state is not None and state.sliced is not None
    send_parts(broker, [(0, frames(b"warm-up"))])  # the topic exists
    scheduler = state.sliced.scheduler
    turns: list[object] = []
    real_turn = scheduler.turn

    def counting_turn(client: Any) -> Any:
        turns.append(client)
        return real_turn(client)

    monkeypatch.setattr(scheduler, "turn", counting_turn)
    outcomes = send_parts(
        broker, [(1, frames(b"b0", b"b1")), (2, frames(b"c0")), (1, frames(b"b2"))]
    )
    assert outcomes == [Appended(True, 0, 2), Appended(True, 0, 1), Appended(True, 2, 1)]
    assert len(turns) == 1
    queue = MessageQueue(TOPIC, "broker-a", 1)
    assert [m.body for m in read_queue(broker.address, queue)] == [b"b0", b"b1", b"b2"]


def test_a_full_disk_in_the_middle_of_a_requests_write_refuses_every_part_and_stores_nothing(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit-log write cut short by ENOSPC half-way: rolled back whole, every part
    refused with DISK_FULL, and the queues taken again at the offsets they had."""
    state = broker.broker.state
    assert state is not None
    store = state.store
    send_parts(broker, [(0, frames(b"before"))])
    real_append = store.commitlog.append

    def half_then_full(data: bytes) -> int:
        real_append(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store.commitlog, "append", half_then_full)
    outcomes = send_parts(
        broker, [(0, frames(b"a1", b"a2")), (3, frames(b"d0")), (0, frames(b"a3"))]
    )
    assert all(isinstance(o, BrokerUnavailableError) and o.reason == "DISK_FULL" for o in outcomes)
    monkeypatch.setattr(store.commitlog, "append", real_append)
    store.refusing_sends = False  # as the next disk check would find
    assert send_parts(broker, [(3, frames(b"d1")), (0, frames(b"after"))]) == [
        Appended(True, 0, 1), Appended(True, 1, 1)
    ]  # fmt: skip
    for queue_id, bodies in ((0, [b"before", b"after"]), (3, [b"d1"])):
        queue = MessageQueue(TOPIC, "broker-a", queue_id)
        assert [m.body for m in read_queue(broker.address, queue)] == bodies
