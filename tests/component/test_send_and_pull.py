"""What is sent is read back byte for byte, in order, at dense offsets."""

from __future__ import annotations

import asyncio
import collections
import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from sdk import Message, MessageQueue, Producer, SelectMessageQueueByHash, SendStatus, shard_index
from sdk._transport.broker_client import PullStatus
from sdk.errors import BrokerError, ClientStateError, CorruptRecordError, InvalidArgumentError
from tests.component.pulling import pull_once, read_queue
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    """The broker, reached over each transport in turn (tests/component/transports.py)."""
    with broker_over(request.param, tmp_path / "broker") as b:
        yield b


def random_message(rng: random.Random, key: str, values: tuple[str, ...]) -> Message:
    return Message(
        "orders",
        rng.randbytes(rng.randint(1, 3000)),
        tags=rng.choice([None, "created", "paid"]),
        keys=[f"k{rng.randint(0, 9)}", "ключ"][: rng.randint(0, 2)],
        properties={f"p{i}": rng.choice(values) for i in range(rng.randint(0, 3))},
        sharding_key=key,
    )


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_every_queue_reads_back_byte_for_byte_in_send_order(
    transport: str, flush_mode: str, tmp_path: Path
) -> None:
    with broker_over(transport, tmp_path / "broker", flush_mode=flush_mode) as broker:
        reads_back_byte_for_byte_in_send_order(broker)


def reads_back_byte_for_byte_in_send_order(broker: BrokerOver) -> None:
    rng = random.Random(1)
    # RocketMQ's properties string holds no empty value (test_remoting_transport.py)
    values = ("", "v", "значение") if broker.transport == "grpc" else ("v", "значение")
    sent: dict[MessageQueue, list[tuple[Message, int]]] = collections.defaultdict(list)
    with Producer(broker.address) as producer:
        singles = [random_message(rng, f"order-{rng.randint(0, 40)}", values) for _ in range(150)]
        for m in singles:
            r = producer.send(m)
            assert r.status is SendStatus.SEND_OK
            sent[r.queue].append((m, r.queue_offset))
        batch = [random_message(rng, f"order-{rng.randint(0, 40)}", values) for _ in range(300)]
        for m, r in zip(batch, producer.send_batch(batch), strict=True):
            sent[r.queue].append((m, r.queue_offset))
        queues = producer.fetch_publish_message_queues("orders")
    assert len(queues) == 8
    for queue in queues:
        got = read_queue(broker.address, queue)
        expected = sent[queue]
        assert [g.queue_offset for g in got] == list(range(len(expected)))
        assert [off for _, off in expected] == list(range(len(expected)))
        for g, (m, _) in zip(got, expected, strict=True):
            assert (g.body, g.tags, g.keys, g.properties, g.sharding_key) == (
                m.body, m.tags, m.keys, m.properties, m.sharding_key,
            )  # fmt: skip
            assert g.queue == queue and g.topic == "orders"
            assert shard_index(m.sharding_key or "", 8) == queue.queue_id


def test_msg_ids_are_unique_and_returned_on_read(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        results = producer.send_batch([Message("t", b"%d" % i) for i in range(200)])
    assert len({r.msg_id for r in results}) == 200
    got = read_queue(broker.address, results[0].queue)
    assert [g.msg_id for g in got] == [r.msg_id for r in results]


def test_keyless_batch_shares_one_queue_and_singles_go_round_robin(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        batch = producer.send_batch([Message("t", b"x") for _ in range(10)])
        singles = [producer.send(Message("t", b"y")).queue.queue_id for _ in range(16)]
    assert len({r.queue for r in batch}) == 1
    assert collections.Counter(singles) == {q: 2 for q in range(8)}


def test_selector_and_arg_choose_the_queue(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        r = producer.send(Message("t", b"x"), selector=SelectMessageQueueByHash(), arg="acct-9")
        assert r.queue.queue_id == shard_index("acct-9", 8)
        with pytest.raises(InvalidArgumentError, match="selector chose"):
            producer.send(
                Message("t", b"x"), selector=lambda qs, m, a: MessageQueue("t", "nowhere", 0)
            )


def test_send_async_and_oneway_reach_the_queue(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        futures = [
            producer.send_async(Message("t", b"a%d" % i, sharding_key="k")) for i in range(20)
        ]
        results = [f.result(timeout=10) for f in futures]
        producer.send_oneway(Message("t", b"oneway", sharding_key="k"))
        producer.send(Message("t", b"last", sharding_key="k"))  # same queue, after the oneway
    queue = results[0].queue
    bodies = [m.body for m in read_queue(broker.address, queue)]
    assert sorted(bodies[:20]) == sorted(b"a%d" % i for i in range(20))
    assert set(bodies[20:]) == {b"oneway", b"last"}


def test_asyncio_producer_shares_the_core(broker: BrokerOver) -> None:
    async def run() -> list[int]:
        async with sdk.aio.Producer(broker.address) as producer:
            results = await asyncio.gather(
                *(producer.send(Message("t", b"%d" % i, sharding_key="one")) for i in range(30))
            )
            return sorted(r.queue_offset for r in results)

    assert asyncio.run(run()) == list(range(30))


def test_pull_statuses_on_the_wire(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        r = producer.send_batch(
            [
                Message("t", b"%d" % i, tags="A" if i % 2 else "B", sharding_key="k")
                for i in range(6)
            ]
        )
    queue = r[0].queue
    assert pull_once(broker.address, queue, 6).status is PullStatus.NO_NEW_MESSAGE
    illegal = pull_once(broker.address, queue, 60)
    assert (illegal.status, illegal.next_offset, illegal.max_offset) == (
        PullStatus.OFFSET_ILLEGAL, 6, 6,
    )  # fmt: skip
    found = pull_once(broker.address, queue, 0, tag_expression="A")
    assert [m.body for m in found.messages] == [b"1", b"3", b"5"]
    nothing = pull_once(broker.address, queue, 0, tag_expression="C")
    assert (nothing.status, nothing.next_offset) == (PullStatus.NO_MATCHED_MESSAGE, 6)
    empty_queue = MessageQueue("t", queue.broker_name, (queue.queue_id + 1) % 8)
    assert pull_once(broker.address, empty_queue, 0).status is PullStatus.NO_NEW_MESSAGE


def test_a_corrupt_record_is_reported_not_served(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        results = producer.send_batch(
            [Message("t", b"body-%d" % i, sharding_key="k") for i in range(3)]
        )
    segment = sorted((broker.config.data_dir / "commitlog").iterdir())[0]
    data = bytearray(segment.read_bytes())
    at = data.index(b"body-1")
    with open(segment, "r+b") as f:
        f.seek(at)
        f.write(b"BODY-1")
        f.flush()
        os.fsync(f.fileno())
    queue = results[0].queue
    first = pull_once(broker.address, queue, 0)
    assert [m.body for m in first.messages] == [b"body-0"] and first.next_offset == 1
    # RocketMQ has no code for it: its answer is SYSTEM_ERROR, with the broker's words
    refused = CorruptRecordError if broker.transport == "grpc" else BrokerError
    with pytest.raises(refused, match=r"offset 1 .* corrupt|corrupt.* offset 1"):
        pull_once(broker.address, queue, 1)
    assert [m.body for m in pull_once(broker.address, queue, 2).messages] == [b"body-2"]


def test_a_producer_must_be_started(broker: BrokerOver) -> None:
    producer = Producer(broker.address)
    with pytest.raises(ClientStateError):
        producer.send(Message("t", b"x"))
    with pytest.raises(InvalidArgumentError):
        Producer("")
