"""The producer's send path without a broker: grouping, results and the fast builders."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from collections.abc import Iterator

import pytest

from sdk import (
    AccumulatorConfig,
    Message,
    MessageQueue,
    PartialBatchError,
    ProducerConfig,
    SendResult,
    SendStatus,
)
from sdk._transport.protocol import Appended
from sdk._wire import FRAME_FIELDS, FRAME_LEN_PREFIX
from sdk.errors import BrokerUnavailableError, TopicNotFoundError
from sdk.message import build_send_results
from sdk.producer import retry
from sdk.producer.core import ProducerCore, _final, _first_parts
from sdk.selector import shard_index
from tests.unit.fake_transport import FramesTransport

QUEUES = 4


def split(frames: bytes) -> Iterator[tuple[bytes, int]]:
    """(msg id, deliver_at_ms) of each frame of a send request."""
    pos = 0
    while pos < len(frames):
        (length,) = FRAME_LEN_PREFIX.unpack_from(frames, pos)
        msg_id, _born, deliver_at, *_ = FRAME_FIELDS.unpack_from(frames, pos + 4)
        yield msg_id, deliver_at
        pos += 4 + length


class FakeBroker:
    """Appends to per-queue counters; a request of delayed messages is scheduled."""

    def __init__(self, failing: set[int] | None = None) -> None:
        self.requests: list[tuple[int, list[bytes]]] = []
        self.next_offset = [100 * q for q in range(QUEUES)]
        self.failing = failing or set()

    async def send(
        self, topic: str, queue_id: int, frames: bytes, *, timeout: float | None = None
    ) -> Appended:
        if queue_id in self.failing:
            raise TopicNotFoundError(f"queue {queue_id} is gone")
        parsed = list(split(frames))
        self.requests.append((queue_id, [msg_id for msg_id, _ in parsed]))
        first = self.next_offset[queue_id]
        self.next_offset[queue_id] += len(parsed)
        return Appended(True, first, len(parsed), scheduled=any(d for _, d in parsed))


async def writable_queues(topic: str) -> list[MessageQueue]:
    return [MessageQueue(topic, "broker-a", q) for q in range(QUEUES)]


@pytest.fixture
def broker() -> FakeBroker:
    return FakeBroker()


def send_batch(
    broker: FakeBroker, messages: list[Message], max_send_bytes: int | None = None
) -> list[SendResult]:
    transport = FramesTransport(broker, writable_queues)
    if max_send_bytes is not None:
        transport.max_send_bytes = max_send_bytes

    async def main() -> list[SendResult]:
        producer = ProducerCore(transport, config=ProducerConfig(retry_times=0))
        await producer.start()
        try:
            return await producer.send_batch(messages)
        finally:
            await producer.shutdown()

    return asyncio.run(main())


def key_for(queue_id: int, n: int = 0) -> str:
    """The n-th key "k<i>" that shards to `queue_id`."""
    keys = (f"k{i}" for i in range(10_000) if shard_index(f"k{i}", QUEUES) == queue_id)
    for _ in range(n):
        next(keys)
    return next(keys)


def test_a_batch_for_one_queue_is_one_request_with_results_in_order(broker: FakeBroker) -> None:
    messages = [Message("orders", b"x%d" % i, sharding_key=key_for(2, i % 3)) for i in range(5)]
    results = send_batch(broker, messages)
    [(queue_id, ids)] = broker.requests
    assert queue_id == 2
    assert results == [
        SendResult(SendStatus.SEND_OK, msg_id.hex().upper(), MessageQueue("orders", "broker-a", 2),
                   200 + i)
        for i, msg_id in enumerate(ids)
    ]  # fmt: skip


def test_a_mixed_batch_goes_one_request_per_queue_and_answers_in_input_order(
    broker: FakeBroker,
) -> None:
    plan = [1, None, 3, 1, None, 0, 3, 1]  # queue of each keyed message; None: keyless
    messages = [
        Message("orders", b"x", sharding_key=None if q is None else key_for(q, i))
        for i, q in enumerate(plan)
    ]
    results = send_batch(broker, messages)
    keyless_queue = results[1].queue.queue_id
    assert results[4].queue.queue_id == keyless_queue
    assert [r.queue.queue_id for r in results] == [keyless_queue if q is None else q for q in plan]
    sent = {msg_id.hex().upper(): queue_id for queue_id, ids in broker.requests for msg_id in ids}
    assert len(sent) == len(messages) and len({r.msg_id for r in results}) == len(messages)
    assert all(sent[r.msg_id] == r.queue.queue_id for r in results)
    assert len(broker.requests) == len({r.queue for r in results})
    for queue_id in {r.queue.queue_id for r in results}:
        offsets = [r.queue_offset for r in results if r.queue.queue_id == queue_id]
        assert offsets == list(range(100 * queue_id, 100 * queue_id + len(offsets)))


def test_delayed_messages_go_in_their_own_request_and_have_no_offset_yet(
    broker: FakeBroker,
) -> None:
    key = key_for(1)
    messages = [
        Message("orders", b"now", sharding_key=key),
        Message("orders", b"later", sharding_key=key, delay_seconds=60),
        Message("orders", b"now again", sharding_key=key),
    ]
    results = send_batch(broker, messages)
    assert [queue_id for queue_id, _ in broker.requests] == [1, 1]
    assert [r.queue_offset for r in results] == [100, -1, 101]


def test_a_queue_over_the_request_size_limit_is_split_in_order(
    broker: FakeBroker,
) -> None:
    messages = [Message("orders", bytes(100), sharding_key=key_for(0)) for _ in range(5)]
    results = send_batch(broker, messages, max_send_bytes=400)  # two frames
    assert [len(ids) for _, ids in broker.requests] == [2, 2, 1]
    assert [r.queue_offset for r in results] == [0, 1, 2, 3, 4]


def test_a_failed_single_request_raises_its_error(broker: FakeBroker) -> None:
    broker.failing = {2}
    with pytest.raises(TopicNotFoundError, match="queue 2 is gone"):
        send_batch(broker, [Message("orders", b"x", sharding_key=key_for(2))])


def test_a_failed_queue_among_several_is_a_partial_batch(broker: FakeBroker) -> None:
    broker.failing = {2}
    messages = [
        Message("orders", b"x", sharding_key=key_for(1)),
        Message("orders", b"x", sharding_key=key_for(2)),
    ]
    with pytest.raises(PartialBatchError) as info:
        send_batch(broker, messages)
    stored, failed = info.value.results
    assert stored is not None and stored.queue_offset == 100 and failed is None


def test_built_send_results_are_the_same_as_constructed_ones() -> None:
    queue = MessageQueue("orders", "broker-a", 3)
    ids = [bytes(range(16)), bytes(range(1, 17))]
    built = build_send_results(SendStatus.SEND_OK, ids, queue, range(7, 9))
    made = [
        SendResult(SendStatus.SEND_OK, "000102030405060708090A0B0C0D0E0F", queue, 7),
        SendResult(SendStatus.SEND_OK, "0102030405060708090A0B0C0D0E0F10", queue, 8),
    ]
    assert built == made and [type(r) for r in built] == [SendResult, SendResult]
    assert [hash(r) for r in built] == [hash(r) for r in made]
    assert [repr(r) for r in built] == [repr(r) for r in made]
    assert [pickle.loads(pickle.dumps(r)) for r in built] == made
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].queue_offset = 1  # type: ignore[misc]
    with pytest.raises(ValueError):
        build_send_results(SendStatus.SEND_OK, ids, queue, range(1))


class Flaky(FakeBroker):
    """Refuses the first requests to some queues as unavailable (retriable).

    `flaky`: queue id -> how many of its first requests it refuses.
    """

    def __init__(self, flaky: dict[int, int]) -> None:
        super().__init__()
        self.flaky = dict(flaky)

    async def send(
        self, topic: str, queue_id: int, frames: bytes, *, timeout: float | None = None
    ) -> Appended:
        if self.flaky.get(queue_id, 0) > 0:
            self.flaky[queue_id] -= 1
            raise BrokerUnavailableError(f"queue {queue_id} is busy")
        return await super().send(topic, queue_id, frames, timeout=timeout)


def test_a_part_refused_retriably_in_a_shared_request_is_retried_alone_on_its_queue() -> None:
    broker = Flaky({2: 1})
    transport = FramesTransport(broker, writable_queues)
    plan = [0, 2, 1, 2, 3]
    messages = [Message("orders", b"x", sharding_key=key_for(q, i)) for i, q in enumerate(plan)]

    async def main() -> list[SendResult]:
        config = ProducerConfig(retry_times=1, retry_backoff=0)
        producer = ProducerCore(transport, config=config)
        await producer.start()
        try:
            return await producer.send_batch(messages)
        finally:
            await producer.shutdown()

    results = asyncio.run(main())
    assert transport.requests == [[(0, 1), (2, 2), (1, 1), (3, 1)], [(2, 2)]]
    assert [r.queue.queue_id for r in results] == plan
    assert [r.queue_offset for r in results] == [0, 200, 100, 201, 300]


def retried_batch(messages: list[Message], flaky: dict[int, int]) -> list[list[tuple[int, int]]]:
    """The requests of a batch sent to a Flaky broker, one retry allowed."""
    transport = FramesTransport(Flaky(flaky), writable_queues)

    async def main() -> None:
        config = ProducerConfig(retry_times=1, retry_backoff=0)
        producer = ProducerCore(transport, config=config)
        await producer.start()
        try:
            await producer.send_batch(messages)
        finally:
            await producer.shutdown()

    asyncio.run(main())
    return transport.requests


def test_in_a_mixed_batch_only_an_all_keyless_part_is_retried_on_another_queue() -> None:
    # The producer's first keyless queue in turn is queue 0. The shared request was each
    # part's first attempt: the one retry allowed goes alone, where a send's retry would.
    keyless = [Message("orders", b"x"), Message("orders", b"y")]
    keyed = [Message("orders", b"z", sharding_key=key_for(2))]
    first, *retries = retried_batch(keyless + keyed, {0: 1, 2: 1})
    assert first == [(0, 2), (2, 1)]
    assert sorted(retries) == [
        [(1, 2)],  # keyless: the next queue
        [(2, 1)],  # keyed: its own
    ]
    with_a_key = [Message("orders", b"w", sharding_key=key_for(0))]
    assert retried_batch(keyless + with_a_key + keyed, {0: 1}) == [
        [(0, 3), (2, 1)],
        [(0, 3)],  # a key among them: its queue
    ]


WAYS = ["send", "send_batch to one queue", "send_batch over two queues", "accumulator"]


@pytest.mark.parametrize("retry_times", [0, 2])
@pytest.mark.parametrize("way", WAYS)
def test_a_refused_message_has_the_policys_attempts_waits_and_refreshes_however_carried(
    way: str, retry_times: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A part of a shared request counts that request as its first attempt: it gets
    retry_times more, each after the backoff and a route refresh, as a send of its own."""
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retry, "_sleep", sleep)
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: 0.0)  # no jitter
    transport = FramesTransport(Flaky({2: 100}), writable_queues)
    refused = Message("orders", b"x", sharding_key=key_for(2))
    config = ProducerConfig(
        retry_times=retry_times,
        retry_backoff=0.1,
        retry_backoff_max=1.0,
        accumulator=AccumulatorConfig(linger=0) if way == "accumulator" else None,
    )

    async def main() -> None:
        producer = ProducerCore(transport, config=config)
        await producer.start()
        try:
            if way == "send_batch over two queues":
                others = [Message("orders", b"y", sharding_key=key_for(1))]
                with pytest.raises(PartialBatchError):
                    await producer.send_batch([refused, *others])
            elif way.startswith("send_batch"):
                with pytest.raises(BrokerUnavailableError):
                    await producer.send_batch([refused])
            else:
                with pytest.raises(BrokerUnavailableError):
                    await producer.send(refused)
        finally:
            await producer.shutdown()

    asyncio.run(main())
    attempts = [r for r in transport.requests if (2, 1) in r]
    assert len(attempts) == 1 + retry_times
    if way == "send_batch over two queues":
        assert attempts[0] == [(2, 1), (1, 1)]  # the first attempt: the shared request
    assert waits == pytest.approx([0.1, 0.2][:retry_times])
    assert transport.refreshes == retry_times


def test_only_a_retriable_failure_is_not_a_parts_last_word() -> None:
    assert _final([]) and _final(TopicNotFoundError("gone"))
    assert not _final(BrokerUnavailableError("busy"))


def test_the_first_parts_are_each_queues_first_chunk_in_plan_order() -> None:
    q0, q1 = (MessageQueue("orders", "broker-a", q) for q in range(2))
    prepared = [b"a", b"b", b"c", b"d"]
    ids = [b"0", b"1", b"2", b"3"]
    plan = [(q1, [[3, 1], [2]], False), (q0, [[0]], True)]
    assert _first_parts(plan, prepared, ids) == [
        (q1, [b"d", b"b"], [b"3", b"1"]),
        (q0, [b"a"], [b"0"]),
    ]
