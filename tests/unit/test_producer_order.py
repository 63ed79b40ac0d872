"""Per-queue order when sends fail: the spool, the accumulator, send_batch, send_async.

No sockets: a scripted broker stores what it is sent per queue and refuses what a test
tells it to; routes come from a script too; backoffs run on a fake clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from sdk import AccumulatorConfig, Message, MessageQueue, PartialBatchError, ProducerConfig
from sdk._transport.codec import MessageIdGenerator, encode_message
from sdk._transport.protocol import Appended
from sdk._wire import FRAME_FIELDS, FRAME_LEN_PREFIX, MAX_SEND_BYTES
from sdk.errors import (
    BrokerUnavailableError,
    FlushTimeoutError,
    InvalidArgumentError,
    InvalidMessageError,
    OrderMQError,
    TopicNotFoundError,
)
from sdk.message import SendResult, SendStatus, build_send_results
from sdk.producer import EarlierSendFailedError, core, retry
from sdk.producer.accumulator import Accumulator, Part
from sdk.producer.core import ProducerCore
from sdk.producer.spool import Spool
from sdk.selector import shard_index
from sdk.testing import FakeClock
from tests.unit.fake_transport import FramesTransport

QUEUES = 4
TOPIC = "orders"
Refusal = Callable[[int, list[bytes]], OrderMQError | None]


def split(frames: bytes) -> list[tuple[bytes, int]]:
    """(body, deliver_at_ms) of each frame of a send request."""
    out = []
    pos = 0
    while pos < len(frames):
        (length,) = FRAME_LEN_PREFIX.unpack_from(frames, pos)
        fields = FRAME_FIELDS.unpack_from(frames, pos + 4)
        end = pos + 4 + length
        out.append((frames[end - fields[-1] : end], fields[2]))
        pos = end
    return out


class ScriptedBroker:
    """Stores bodies per queue in arrival order; refuses what `refuse` returns an error for.

    Like the real broker it refuses a request over the size limit and one that mixes
    delayed and immediate messages. `gate`, when set, holds every request until it opens.
    """

    def __init__(self) -> None:
        self.stored: dict[int, list[bytes]] = defaultdict(list)
        self.requests: list[tuple[int, list[bytes]]] = []  # every request, refused or not
        self.refuse: Refusal = lambda queue_id, bodies: None
        self.gate: asyncio.Event | None = None
        self.in_flight: dict[int, int] = defaultdict(int)
        self.most_in_flight: dict[int, int] = defaultdict(int)
        self.limit = MAX_SEND_BYTES

    async def send(
        self, topic: str, queue_id: int, frames: bytes, *, timeout: float | None = None
    ) -> Appended:
        parsed = split(frames)
        bodies = [body for body, _ in parsed]
        self.requests.append((queue_id, bodies))
        self.in_flight[queue_id] += 1
        self.most_in_flight[queue_id] = max(self.most_in_flight[queue_id], self.in_flight[queue_id])
        try:
            await asyncio.sleep(0)  # let any concurrent request of the same queue start
            if self.gate is not None:
                await self.gate.wait()
            if len(frames) > self.limit:
                raise OrderMQError("BATCH_TOO_LARGE", reason="BATCH_TOO_LARGE")
            if len({deliver_at > 0 for _, deliver_at in parsed}) > 1:
                raise InvalidMessageError("a batch is either all scheduled or all for now")
            refusal = self.refuse(queue_id, bodies)
            if refusal is not None:
                raise refusal
        finally:
            self.in_flight[queue_id] -= 1
        first = len(self.stored[queue_id])
        self.stored[queue_id] += bodies
        return Appended(True, first, len(bodies), scheduled=parsed[0][1] > 0)

    def attempts(self, queue_id: int) -> int:
        """Requests the queue received, refused or not."""
        return sum(q == queue_id for q, _ in self.requests)

    def count(self) -> int:
        """Messages stored over all queues."""
        return sum(map(len, self.stored.values()))


class Routes:
    """Route queries that fail (with `error`) while `down`, and for the next `failures` calls."""

    def __init__(self) -> None:
        self.down = False
        self.failures = 0
        self.calls = 0
        self.error: OrderMQError = BrokerUnavailableError("failed to connect to all addresses")
        self.transport: FramesTransport

    async def writable_queues(self, topic: str) -> list[MessageQueue]:
        self.calls += 1
        await asyncio.sleep(0)  # a query: sends made meanwhile wait behind it
        if self.down or self.failures > 0:
            self.failures = max(0, self.failures - 1)
            raise self.error
        return [MessageQueue(topic, "broker-a", q) for q in range(QUEUES)]


@pytest.fixture
def broker() -> ScriptedBroker:
    return ScriptedBroker()


@pytest.fixture
def routes(broker: ScriptedBroker) -> Routes:
    script = Routes()
    script.transport = FramesTransport(broker, script.writable_queues)
    return script


@contextlib.asynccontextmanager
async def producer(
    routes: Routes, config: ProducerConfig, clock: FakeClock
) -> AsyncIterator[ProducerCore]:
    """A producer core whose transport sends to the broker fixture, routes by `routes`."""
    core_ = ProducerCore(routes.transport, config=config, clock=clock)
    await core_.start()
    try:
        yield core_
    finally:
        await core_.shutdown()


async def until(condition: Callable[[], bool], clock: FakeClock, what: str) -> None:
    """Poll `condition`, moving the fake clock past every backoff; fail after 10 s."""
    deadline = time.monotonic() + 10
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        if clock.sleepers:
            clock.advance(60)
        await asyncio.sleep(0.001)


def small_requests(routes: Routes, broker: ScriptedBroker) -> None:
    """Requests of at most 2000 bytes: three 500-byte messages."""
    routes.transport.max_send_bytes = 2000
    broker.limit = 2000


def key_for(queue_id: int, n: int = 0) -> str:
    """The n-th key "k<i>" that shards to `queue_id`."""
    keys = [f"k{i}" for i in range(1000) if shard_index(f"k{i}", QUEUES) == queue_id]
    return keys[n]


def keyed(key: str, count: int, size: int = 0, delay_seconds: float | None = None) -> list[Message]:
    """Messages "<key>:<n>" (padded to `size` bytes), n = 0 .. count - 1."""
    return [
        Message(TOPIC, f"{key}:{n}".encode().ljust(size, b"."), sharding_key=key,
                delay_seconds=delay_seconds)
        for n in range(count)
    ]  # fmt: skip


def by_key(broker: ScriptedBroker) -> dict[str, list[int]]:
    """Each key's sequence numbers in the order its queue stored them."""
    out: dict[str, list[int]] = defaultdict(list)
    for queue_id, bodies in broker.stored.items():
        for body in bodies:
            key, n = body.rstrip(b".").decode().split(":")
            assert shard_index(key, QUEUES) == queue_id
            out[key].append(int(n))
    return dict(out)


async def leave_in_spool(directory: Path, messages: list[Message]) -> None:
    """Spool messages as a producer that never reached a broker leaves them."""
    spool = Spool(directory)
    spool.open()
    spool.start()
    ids = MessageIdGenerator()
    await spool.append(
        [
            (m.topic, m.sharding_key, encode_message(m, ids.next(), time.time())[4:])
            for m in messages
        ]
    )
    await spool.close()


def spooling(directory: Path) -> ProducerConfig:
    return ProducerConfig(spool_dir=directory, retry_times=0, send_timeout=1)


# ---------------------------------------------------------------------------------- spool


@pytest.mark.parametrize("fails", ["route", "send"])
def test_a_spool_whose_first_round_fails_delivers_each_queue_in_acceptance_order(
    broker: ScriptedBroker, routes: Routes, tmp_path: Path, fails: str
) -> None:
    """Issue 22: the first route query after a broker restart failed, the next ones did
    not, and the messages routed by those were stored before the held-back earlier ones."""
    keys = [f"k{i}" for i in range(5)]
    messages = [m for n in range(10) for m in (keyed(k, 10)[n] for k in keys)]
    clock = FakeClock()

    async def main() -> None:
        await leave_in_spool(tmp_path, messages)
        if fails == "route":
            routes.failures = 1
        else:
            refused = {shard_index("k0", QUEUES)}

            def refuse_once(queue_id: int, bodies: list[bytes]) -> OrderMQError | None:
                if queue_id in refused:
                    refused.discard(queue_id)
                    return BrokerUnavailableError("the broker restarts")
                return None

            broker.refuse = refuse_once
        async with producer(routes, spooling(tmp_path), clock) as p:
            await until(lambda: broker.count() == 50, clock, "every spooled message stored")
            await p.flush(5)

    asyncio.run(main())
    assert by_key(broker) == {k: list(range(10)) for k in keys}


def test_a_spool_resolves_a_topics_route_once_per_round(
    broker: ScriptedBroker, routes: Routes, tmp_path: Path
) -> None:
    clock = FakeClock()

    async def main() -> None:
        await leave_in_spool(tmp_path, keyed("a", 20) + keyed("b", 20))
        async with producer(routes, spooling(tmp_path), clock) as p:
            await p.flush(5)

    asyncio.run(main())
    assert routes.calls == 1
    assert by_key(broker) == {"a": list(range(20)), "b": list(range(20))}


def test_a_spool_round_over_the_request_limit_goes_in_requests_one_after_another(
    broker: ScriptedBroker, routes: Routes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request per queue and round was refused for good once it passed 32 MiB."""
    small_requests(routes, broker)
    queue_id = shard_index("a", QUEUES)
    refused = [2]  # the second request of the queue fails once

    def refuse(q: int, bodies: list[bytes]) -> OrderMQError | None:
        if q == queue_id and broker.attempts(queue_id) in refused:
            refused.clear()
            return BrokerUnavailableError("the broker restarts")
        return None

    broker.refuse = refuse
    clock = FakeClock()

    async def main() -> None:
        await leave_in_spool(tmp_path, keyed("a", 12, size=500))
        async with producer(routes, spooling(tmp_path), clock) as p:
            await until(lambda: broker.count() == 12, clock, "every spooled message stored")
            await p.flush(5)

    asyncio.run(main())
    assert by_key(broker) == {"a": list(range(12))}  # no duplicate: stored requests are acked
    assert broker.most_in_flight[queue_id] == 1
    # the round in which the second request failed sent no third one
    assert [len(bodies) for _, bodies in broker.requests] == [3, 3, 3, 3, 3]


def test_a_spool_sends_delayed_and_immediate_messages_of_a_queue_in_separate_requests(
    broker: ScriptedBroker, routes: Routes, tmp_path: Path
) -> None:
    """The broker refuses a request that mixes them: the queue was stuck for good."""
    clock = FakeClock()
    messages = keyed("a", 2) + keyed("a", 2, delay_seconds=60) + keyed("a", 2)

    async def main() -> None:
        await leave_in_spool(tmp_path, messages)
        async with producer(routes, spooling(tmp_path), clock) as p:
            await until(lambda: broker.count() == 6, clock, "every spooled message stored")
            await p.flush(5)

    asyncio.run(main())
    assert [len(bodies) for _, bodies in broker.requests] == [2, 2, 2]
    assert by_key(broker) == {"a": [0, 1, 0, 1, 0, 1]}


def test_a_permanent_spool_failure_holds_its_queue_says_so_once_and_resumes_when_fixed(
    broker: ScriptedBroker, routes: Routes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ordermq.producer")
    stuck = shard_index("a", QUEUES)
    other = key_for((stuck + 1) % QUEUES)
    broker.refuse = lambda q, bodies: (
        InvalidMessageError("body over the broker's limit") if q == stuck else None
    )
    clock = FakeClock()

    async def main() -> None:
        await leave_in_spool(tmp_path, keyed("a", 5) + keyed(other, 5))
        async with producer(routes, spooling(tmp_path), clock) as p:
            await until(lambda: broker.attempts(stuck) >= 3, clock, "three failed rounds")
            assert by_key(broker) == {other: list(range(5))}
            with pytest.raises(TimeoutError, match="body over the broker's limit"):
                await p.flush(0.01)
            broker.refuse = lambda q, bodies: None
            await until(lambda: broker.count() == 10, clock, "the held-back queue stored")
            await p.flush(5)

    asyncio.run(main())
    assert by_key(broker) == {"a": list(range(5)), other: list(range(5))}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors
    assert f"{TOPIC} queue {stuck}" in errors[0] and "body over the broker's limit" in errors[0]
    assert any(f"{TOPIC} queue {stuck}" in r.getMessage() and "again" in r.getMessage()
               for r in caplog.records if r.levelno == logging.INFO)  # fmt: skip


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (BrokerUnavailableError("failed to connect to all addresses"), logging.WARNING),
        (TopicNotFoundError("no topic 'orders' and auto-create is off"), logging.ERROR),
    ],
)
def test_a_spooled_topic_without_a_route_is_held_and_named(
    broker: ScriptedBroker,
    routes: Routes,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    error: OrderMQError,
    level: int,
) -> None:
    routes.down = True
    routes.error = error
    clock = FakeClock()

    async def main() -> None:
        await leave_in_spool(tmp_path, keyed("a", 3))
        async with producer(routes, spooling(tmp_path), clock) as p:
            await until(lambda: routes.calls >= 3, clock, "three failed rounds")
            with pytest.raises(TimeoutError, match=f"topic '{TOPIC}'.*{error}"):
                await p.flush(0.01)
            routes.down = False
            await until(lambda: broker.count() == 3, clock, "the held-back topic stored")
            await p.flush(5)

    asyncio.run(main())
    assert by_key(broker) == {"a": [0, 1, 2]}
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.levelno for r in logged] == [level]
    assert f"topic '{TOPIC}'" in logged[0].getMessage() and str(error) in logged[0].getMessage()


def test_a_spool_round_that_breaks_unexpectedly_is_retried_not_abandoned(
    broker: ScriptedBroker,
    routes: Routes,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An error that was no OrderMQError (here the ack's write) ended delivery for good."""
    ack = Spool.ack
    failures = [OSError(28, "No space left on device")]

    async def failing_ack(spool: Spool, seqs: list[int]) -> None:
        if failures:
            raise failures.pop()
        await ack(spool, seqs)

    monkeypatch.setattr(Spool, "ack", failing_ack)
    clock = FakeClock()

    async def main() -> None:
        await leave_in_spool(tmp_path, keyed("a", 3))
        async with producer(routes, spooling(tmp_path), clock) as p:
            await until(lambda: broker.count() == 6, clock, "the round delivered again")
            await p.flush(5)

    asyncio.run(main())
    assert by_key(broker) == {"a": [0, 1, 2, 0, 1, 2]}  # at least once: not acked, resent
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "No space left on device" in errors[0].getMessage()


# ---------------------------------------------------------------------------------- accumulator


def stored_results(queue: MessageQueue, ids: list[bytes]) -> list[SendResult]:
    return build_send_results(SendStatus.SEND_OK, ids, queue, range(len(ids)))


OneQueueSend = Callable[[MessageQueue, list[bytes], list[bytes]], Awaitable[list[SendResult]]]


def accumulator(config: AccumulatorConfig, send: OneQueueSend) -> Accumulator:
    """An accumulator whose requests run `send` per part, and that retries nothing."""

    async def send_parts(parts: list[Part]) -> list[list[SendResult] | BaseException]:
        return list(
            await asyncio.gather(*(send(q, f, i) for q, f, i in parts), return_exceptions=True)
        )

    async def retry_part(
        q: MessageQueue, f: list[bytes], i: list[bytes], failure: BaseException, movable: bool
    ) -> list[SendResult]:
        raise failure

    return Accumulator(config, send_parts, retry_part, FakeClock(), MAX_SEND_BYTES)


def test_a_lone_caller_does_not_wake_the_accumulator_when_its_send_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Sends one after another: the sender looks for ready queues when a send arrives
    (and once more after starting its request), not again when the request ends with
    nothing else waiting."""
    queue = MessageQueue(TOPIC, "broker-a", 0)
    looks = 0
    take_ready = Accumulator._take_ready

    def counted(self: Accumulator) -> object:
        nonlocal looks
        looks += 1
        return take_ready(self)

    monkeypatch.setattr(Accumulator, "_take_ready", counted)

    async def send(q: MessageQueue, frames: list[bytes], ids: list[bytes]) -> list[SendResult]:
        await asyncio.sleep(0)  # the answer comes in a later pass of the loop
        return stored_results(q, ids)

    async def main() -> None:
        acc = accumulator(AccumulatorConfig(linger=0), send)
        for n in range(20):
            await (await acc.enqueue(queue, b"m%d" % n, b"%d" % n, acc.ticket()))
        await acc.close()

    asyncio.run(main())
    assert looks <= 2 * 20 + 1  # was 61: once more after every request, finding nothing


def test_close_returns_when_gather_over_finished_tasks_does_not_yield(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From Python 3.12, gather() over finished tasks returns without letting the loop
    run: close() waited for its task set to empty, which happens only in a later pass,
    and spun for ever (Producer.shutdown() hung at 100% CPU)."""
    real_gather, calls = asyncio.gather, 0

    def gather_as_in_python_312(*aws: Any, return_exceptions: bool = False) -> Any:
        nonlocal calls
        calls += 1
        assert calls < 1000, "gather() called over and over: close() does not end"
        futures = [asyncio.ensure_future(a) for a in aws]
        if futures and all(f.done() for f in futures):
            answer = asyncio.get_running_loop().create_future()
            answer.set_result([f.exception() or f.result() for f in futures])
            return answer
        return real_gather(*futures, return_exceptions=return_exceptions)

    monkeypatch.setattr(asyncio, "gather", gather_as_in_python_312)
    queue = MessageQueue(TOPIC, "broker-a", 0)

    async def send(q: MessageQueue, frames: list[bytes], ids: list[bytes]) -> list[SendResult]:
        await asyncio.sleep(0)
        return stored_results(q, ids)

    async def main() -> int:
        acc = accumulator(AccumulatorConfig(linger=0), send)
        sent = [await acc.enqueue(queue, b"m%d" % n, b"%d" % n, acc.ticket()) for n in range(5)]
        for result in sent:
            await result
        await acc.close()
        return len(sent)

    assert asyncio.run(main()) == 5


class AnsweredByHand:
    """An accumulator (natural batching, two requests in flight) whose requests wait until
    the test answers them; `requests`: each request's frames."""

    def __init__(self) -> None:
        self.requests: list[list[bytes]] = []
        self.answers: list[asyncio.Event] = []
        config = AccumulatorConfig(linger=0, max_requests_in_flight=2)
        self.acc = Accumulator(config, self._send_parts, self._retry, FakeClock(), MAX_SEND_BYTES)

    async def _send_parts(self, parts: list[Part]) -> list[list[SendResult] | BaseException]:
        self.requests.append([frame for _, frames, _ in parts for frame in frames])
        self.answers.append(asyncio.Event())
        await self.answers[-1].wait()
        return [stored_results(q, ids) for q, _, ids in parts]

    async def _retry(
        self, q: MessageQueue, f: list[bytes], i: list[bytes], failure: BaseException, m: bool
    ) -> list[SendResult]:
        raise failure

    async def caller(self, queue: MessageQueue, frames: list[bytes]) -> None:
        """Send `frames` one after another, each once the previous one was answered."""
        for frame in frames:
            await (await self.acc.enqueue(queue, frame, frame, self.acc.ticket()))

    async def until(self, condition: Callable[[], bool]) -> None:
        for _ in range(100):
            if condition():
                return
            await asyncio.sleep(0)
        raise AssertionError("not within 100 turns")


def test_a_send_made_as_its_answer_comes_waits_for_the_request_in_flight() -> None:
    """Two callers sending one after another, two requests in flight: each sent again as
    its answer came, beside the other's request, a request each for good where one could
    carry both. A send made on the turn its answer came now waits for the request in
    flight; a send that comes on its own still goes beside it."""
    qa, qb = MessageQueue(TOPIC, "broker-a", 0), MessageQueue(TOPIC, "broker-a", 1)
    s = AnsweredByHand()

    async def main() -> None:
        a = asyncio.create_task(s.caller(qa, [b"a0", b"a1"]))
        await s.until(lambda: len(s.requests) == 1)
        b = asyncio.create_task(s.caller(qb, [b"b0", b"b1"]))
        await s.until(lambda: len(s.requests) == 2)  # on its own: beside the first
        s.answers[0].set()
        await s.until(lambda: s.acc.pending == 2)  # a sent again
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(s.requests) == 2  # went at once as a third request
        s.answers[1].set()
        await s.until(lambda: len(s.requests) == 3)
        s.answers[2].set()
        await asyncio.gather(a, b)
        await s.acc.close()

    asyncio.run(main())
    assert s.requests == [[b"a0"], [b"b0"], [b"a1", b"b1"]]


def test_the_sender_looks_again_once_every_part_of_an_answered_request_was_settled() -> None:
    """A message waited behind a busy queue as a request of two parts came back. The sender
    woke as the first part was settled, before the callers of the second had run, and sent
    it with only the first part's caller's next message: the second's went alone after."""
    qa, qb = MessageQueue(TOPIC, "broker-a", 0), MessageQueue(TOPIC, "broker-a", 1)
    s = AnsweredByHand()

    async def main() -> None:
        callers = [
            asyncio.create_task(s.caller(qa, [b"a0", b"a1"])),
            asyncio.create_task(s.caller(qb, [b"b0", b"b1"])),
        ]
        await s.until(lambda: len(s.requests) == 1)
        callers.append(asyncio.create_task(s.caller(qa, [b"x"])))  # qa is busy: it waits
        await s.until(lambda: s.acc.pending == 3)
        s.answers[0].set()
        while not all(c.done() for c in callers):  # answer the rest as they come
            await asyncio.sleep(0)
            for answer in s.answers:
                answer.set()
        await s.acc.close()

    asyncio.run(main())
    assert s.requests == [[b"a0", b"b0"], [b"x", b"a1", b"b1"]]


@pytest.mark.parametrize(
    ("failure", "holds_back"),
    [
        (BrokerUnavailableError("retries exhausted"), True),
        (InvalidMessageError("refused"), True),
        (FlushTimeoutError("stored, fsync unconfirmed"), False),
    ],
)
def test_a_failed_accumulator_batch_fails_the_messages_queued_behind_it_unsent(
    failure: OrderMQError, holds_back: bool
) -> None:
    qa, qb = MessageQueue(TOPIC, "broker-a", 0), MessageQueue(TOPIC, "broker-a", 1)
    sent: list[tuple[MessageQueue, bytes]] = []
    gate = asyncio.Event()

    async def send(queue: MessageQueue, frames: list[bytes], ids: list[bytes]) -> list[SendResult]:
        sent.extend((queue, frame) for frame in frames)
        if len(sent) == 1:  # the first batch waits, then fails
            await gate.wait()
            raise failure
        return stored_results(queue, ids)

    async def main() -> list[object]:
        config = AccumulatorConfig(
            batch_max_messages=1, buffer_max_messages=10, linger=0, max_requests_in_flight=2
        )
        acc = accumulator(config, send)
        f1 = await acc.enqueue(qa, b"a1", b"1", acc.ticket())
        while not sent:  # its request is in flight
            await asyncio.sleep(0)
        behind = [await acc.enqueue(qa, b"a%d" % n, b"%d" % n, acc.ticket()) for n in (2, 3)]
        other = await acc.enqueue(qb, b"b1", b"4", acc.ticket())
        await asyncio.wait_for(other, 5)  # another queue does not wait
        gate.set()
        outcomes: list[object] = list(await asyncio.gather(f1, *behind, return_exceptions=True))
        after = await acc.enqueue(qa, b"a4", b"5", acc.ticket())  # made after the failure
        outcomes.append(await asyncio.wait_for(after, 5))
        assert acc.pending == 0
        await acc.close()
        return outcomes

    first, second, third, later = asyncio.run(main())
    assert first is failure
    if holds_back:
        for outcome in (second, third):
            assert isinstance(outcome, EarlierSendFailedError)
            assert outcome.cause is failure and str(failure) in str(outcome)
            assert not outcome.retriable
        assert [f for q, f in sent if q == qa] == [b"a1", b"a4"]
    else:
        assert [f for q, f in sent if q == qa] == [b"a1", b"a2", b"a3", b"a4"]
    assert isinstance(later, SendResult)


def test_a_send_that_waited_for_room_while_a_batch_of_its_queue_failed_fails_too() -> None:
    queue = MessageQueue(TOPIC, "broker-a", 0)
    gate = asyncio.Event()
    sent: list[bytes] = []

    async def send(q: MessageQueue, frames: list[bytes], ids: list[bytes]) -> list[SendResult]:
        sent.extend(frames)
        await gate.wait()
        raise BrokerUnavailableError("retries exhausted")

    async def main() -> list[object]:
        config = AccumulatorConfig(batch_max_messages=1, buffer_max_messages=1, linger=0)
        acc = accumulator(config, send)
        first = await acc.enqueue(queue, b"a1", b"1", acc.ticket())
        second = asyncio.create_task(acc.enqueue(queue, b"a2", b"2", acc.ticket()))
        await asyncio.sleep(0)  # it waits for room
        assert not second.done()
        gate.set()
        with pytest.raises(BrokerUnavailableError):
            await first
        return list(await asyncio.wait_for(asyncio.gather(second, return_exceptions=True), 5))

    [outcome] = asyncio.run(main())
    assert isinstance(outcome, EarlierSendFailedError)
    assert sent == [b"a1"]


def test_sends_waiting_behind_one_whose_route_lookup_failed_fail_too(
    broker: ScriptedBroker, routes: Routes
) -> None:
    """The issue's pattern in the accumulator: the first route lookup after a broker
    restart failed, the next one did not, and the later send was stored."""
    routes.failures = 1
    config = ProducerConfig(accumulator=AccumulatorConfig(linger=0))

    async def main() -> list[object]:
        async with producer(routes, config, FakeClock()) as p:
            made = [asyncio.create_task(p.send(m)) for m in keyed("a", 3)]
            outcomes: list[object] = list(await asyncio.gather(*made, return_exceptions=True))
            outcomes.append(await p.send(Message(TOPIC, b"a:3", sharding_key="a")))
            return outcomes

    first, second, third, after = asyncio.run(main())
    assert isinstance(first, BrokerUnavailableError)
    for outcome in (second, third):
        assert isinstance(outcome, EarlierSendFailedError) and outcome.cause is first
        assert f"topic '{TOPIC}'" in str(outcome)
    assert isinstance(after, SendResult)
    assert by_key(broker) == {"a": [3]}


@pytest.fixture
def instant_retries(monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Retry waits end when the returned event is set (set it at once for no wait)."""
    resume = asyncio.Event()

    async def wait(seconds: float) -> None:
        await resume.wait()

    monkeypatch.setattr(retry, "_sleep", wait)
    return resume


def first_request_refused(broker: ScriptedBroker) -> None:
    refused = [True]

    def refuse(queue_id: int, bodies: list[bytes]) -> OrderMQError | None:
        if refused:
            refused.clear()
            return BrokerUnavailableError("the broker restarts")
        return None

    broker.refuse = refuse


def test_the_accumulator_retries_a_batch_while_the_later_ones_of_its_queue_wait(
    broker: ScriptedBroker, routes: Routes, instant_retries: asyncio.Event
) -> None:
    first_request_refused(broker)
    config = ProducerConfig(
        retry_times=2, accumulator=AccumulatorConfig(batch_max_messages=1, linger=0)
    )

    clock = FakeClock()

    async def main() -> None:
        async with producer(routes, config, clock) as p:
            sends = [asyncio.create_task(p.send(m)) for m in keyed("a", 5)]
            await until(lambda: len(broker.requests) == 1, clock, "the failed attempt")
            instant_retries.set()
            await asyncio.wait_for(asyncio.gather(*sends), 5)

    asyncio.run(main())
    assert by_key(broker) == {"a": [0, 1, 2, 3, 4]}
    assert broker.most_in_flight[shard_index("a", QUEUES)] == 1


# ---------------------------------------------------------------------------------- direct sends


def test_concurrent_keyed_sends_without_the_accumulator_may_overtake_a_retry(
    broker: ScriptedBroker, routes: Routes, instant_retries: asyncio.Event
) -> None:
    """What the README says: each send is its own request with its own retries."""
    first_request_refused(broker)
    first, second = keyed("a", 2)

    clock = FakeClock()

    async def main() -> None:
        config = ProducerConfig(retry_times=2, accumulator=None)
        async with producer(routes, config, clock) as p:
            earlier = asyncio.create_task(p.send(first))
            await until(lambda: len(broker.requests) == 1, clock, "the failed attempt")
            await asyncio.wait_for(p.send(second), 5)  # while the first waits to retry
            instant_retries.set()
            await asyncio.wait_for(earlier, 5)
            await p.send(Message(TOPIC, b"a:2", sharding_key="a"))  # after both returned

    asyncio.run(main())
    assert by_key(broker) == {"a": [1, 0, 2]}


def test_send_batch_sends_one_queues_requests_one_after_another_and_stops_at_a_failure(
    broker: ScriptedBroker, routes: Routes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue's requests went concurrently: later ones could be stored before, or
    without, an earlier failed one."""
    small_requests(routes, broker)
    queue_id = shard_index("a", QUEUES)
    other = key_for((queue_id + 1) % QUEUES)

    def refuse(q: int, bodies: list[bytes]) -> OrderMQError | None:
        if q == queue_id and broker.attempts(queue_id) == 2:
            return InvalidMessageError("refused")
        return None

    broker.refuse = refuse

    async def main() -> PartialBatchError:
        async with producer(routes, ProducerConfig(retry_times=0), FakeClock()) as p:
            with pytest.raises(PartialBatchError) as caught:
                await p.send_batch(keyed("a", 12, size=500) + keyed(other, 2))
            return caught.value

    error = asyncio.run(main())
    assert by_key(broker) == {"a": [0, 1, 2], other: [0, 1]}
    assert broker.most_in_flight[queue_id] == 1
    assert broker.attempts(queue_id) == 2
    assert [r is not None for r in error.results] == [True] * 3 + [False] * 9 + [True] * 2
    refused, *later = error.errors
    assert isinstance(refused, InvalidMessageError)
    assert later and all(
        isinstance(e, EarlierSendFailedError) and e.cause is refused for e in later
    )


@pytest.mark.skipif(core._shard_groups_in_c is None, reason="sdk._speedups was not built")
def test_a_usual_batch_is_grouped_in_c_and_one_with_other_keys_in_python(
    broker: ScriptedBroker, routes: Routes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Grouping in Python costs a batch of 100 about 20 us: the usual batch must not."""
    hashed: list[str] = []

    def recorded_shard_index(key: str, count: int) -> int:
        hashed.append(key)
        return shard_index(key, count)

    monkeypatch.setattr(core, "shard_index", recorded_shard_index)
    usual = [m for k in ("a", "b", "c", "d") for m in keyed(k, 3)]
    other = keyed("ключ", 2) + keyed("a", 2)

    async def main() -> list[list[SendResult]]:
        async with producer(routes, ProducerConfig(), FakeClock()) as p:
            return [await p.send_batch(usual), await p.send_batch(other)]

    sent_usual, sent_other = asyncio.run(main())
    assert hashed == ["ключ", "ключ", "a", "a"]  # the usual batch was grouped in C
    assert by_key(broker) == {"a": [0, 1, 2, 0, 1], "b": [0, 1, 2], "c": [0, 1, 2], "d": [0, 1, 2],
                              "ключ": [0, 1]}  # fmt: skip
    for m, result in zip(usual + other, sent_usual + sent_other, strict=True):
        assert result.queue.queue_id == shard_index(m.sharding_key or "", QUEUES)


def test_send_batch_keeps_sending_keyless_requests_after_one_fails(
    broker: ScriptedBroker, routes: Routes, monkeypatch: pytest.MonkeyPatch
) -> None:
    small_requests(routes, broker)
    broker.refuse = lambda q, bodies: (
        InvalidMessageError("refused") if bodies[0].startswith(b"m0:") else None
    )
    messages = [Message(TOPIC, f"m{n}:".encode().ljust(500, b".")) for n in range(9)]

    async def main() -> PartialBatchError:
        async with producer(routes, ProducerConfig(retry_times=0), FakeClock()) as p:
            with pytest.raises(PartialBatchError) as caught:
                await p.send_batch(messages)
            return caught.value

    error = asyncio.run(main())
    assert [r is not None for r in error.results] == [False] * 3 + [True] * 6
    assert [type(e) for e in error.errors] == [InvalidMessageError]


class TwoBrokers(FramesTransport):
    """Queues 0 and 1 on broker-a and on broker-b, each broker a ScriptedBroker of its own."""

    def __init__(self) -> None:
        self.brokers = {name: ScriptedBroker() for name in ("broker-a", "broker-b")}
        super().__init__(self.brokers["broker-a"], self.routes)

    async def routes(self, topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, name, q) for name in self.brokers for q in range(2)]

    async def _send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        broker = self.brokers[queue.broker_name]
        return await broker.send(queue.topic, queue.queue_id, b"".join(prepared), timeout=timeout)


@pytest.mark.parametrize("first_chunk", ["alone", "shared with a keyed queue's"])
def test_a_keyless_batchs_later_requests_follow_its_first_to_the_queue_it_failed_over_to(
    first_chunk: str,
) -> None:
    """A keyless batch over three requests; broker-a, where its queue is, is down. The
    first request goes on to broker-b after its failure; the later ones went to broker-a
    again first, each costing an attempt, a backoff and a route refresh."""
    transport = TwoBrokers()
    transport.max_send_bytes = 2000  # three 500-byte messages a request
    down, up = transport.brokers["broker-a"], transport.brokers["broker-b"]
    down.refuse = lambda q, bodies: BrokerUnavailableError("broker-a is down")
    keyless = [Message(TOPIC, f"m{n}:".encode().ljust(500, b".")) for n in range(9)]
    # Queue 3 of the route: broker-b's queue 1; its request succeeds with the shared one.
    keyed = [Message(TOPIC, b"k", sharding_key=key_for(3))] if first_chunk != "alone" else []

    async def main() -> list[SendResult]:
        config = ProducerConfig(retry_times=1, retry_backoff=0)
        p = ProducerCore(transport, config=config, clock=FakeClock())
        await p.start()
        try:
            return await p.send_batch(keyless + keyed)
        finally:
            await p.shutdown()

    results = asyncio.run(main())
    if keyed:  # the first request carried both queues' first chunks
        assert transport.requests[0] == [(0, 3), (1, 1)]
        assert results[-1].queue == MessageQueue(TOPIC, "broker-b", 1)
    assert [q for q, _ in down.requests] == [0]  # the first chunk's first attempt only
    assert [len(bodies) for q, bodies in up.requests if q == 0] == [3, 3, 3]
    assert {r.queue for r in results[:9]} == {MessageQueue(TOPIC, "broker-b", 0)}
    assert up.stored[0] == [m.body for m in keyless]  # one queue, in batch order


# ---------------------------------------------------------------------------- natural batching


def natural(retry_times: int = 0) -> ProducerConfig:
    """Natural batching: no linger, one request in flight."""
    accumulator = AccumulatorConfig(linger=0, max_requests_in_flight=1)
    return ProducerConfig(retry_times=retry_times, accumulator=accumulator)


def callers_messages() -> list[Message]:
    """Eight messages of eight keys, two keys on each queue."""
    return [Message(TOPIC, f"{key_for(q, n)}:0".encode(), sharding_key=key_for(q, n))
            for q in range(QUEUES) for n in range(2)]  # fmt: skip


async def first_in_flight(p: ProducerCore, broker: ScriptedBroker, clock: FakeClock) -> Any:
    """Send "a:0" and return its task once its request waits at the broker's gate."""
    first = asyncio.create_task(p.send(Message(TOPIC, b"a:0", sharding_key="a")))
    await until(lambda: len(broker.requests) == 1, clock, "the first request")
    return first


async def all_waiting(p: ProducerCore, count: int, clock: FakeClock) -> None:
    """Until `count` messages wait in the producer's accumulator (or its request)."""
    accumulator = p._accumulator
    assert accumulator is not None
    await until(lambda: accumulator.pending == count, clock, f"{count} waiting messages")


def test_sends_made_while_a_request_is_in_flight_share_the_next_one_each_its_own_result(
    broker: ScriptedBroker, routes: Routes
) -> None:
    """Without it, each of these sends was a request of its own."""
    broker.gate = asyncio.Event()
    clock = FakeClock()
    messages = callers_messages()

    async def main() -> list[SendResult]:
        async with producer(routes, natural(), clock) as p:
            first = await first_in_flight(p, broker, clock)
            callers = [asyncio.create_task(p.send(m)) for m in messages]
            await all_waiting(p, 1 + len(messages), clock)
            broker.gate.set()
            await asyncio.wait_for(first, 5)
            return list(await asyncio.wait_for(asyncio.gather(*callers), 5))

    results = asyncio.run(main())
    assert routes.transport.requests == [
        [(shard_index("a", QUEUES), 1)],
        [(q, 2) for q in range(QUEUES)],  # every caller's message in one request
    ]
    for m, result in zip(messages, results, strict=True):
        assert m.sharding_key is not None
        assert result.queue.queue_id == shard_index(m.sharding_key, QUEUES)
        stored = broker.stored[result.queue.queue_id][result.queue_offset]
        assert stored == m.body  # its own result: where its message was stored


def test_callers_that_send_one_after_another_go_together_not_in_staggered_groups(
    broker: ScriptedBroker,
) -> None:
    """Eight callers, each sending again as its send returns, on the default producer
    (natural batching, two requests in flight). The first of the callers a request answered
    found the producer idle and sent alone, the others in the next request: two requests
    a round where one carries all eight (issue 35; over gRPC the groups' requests took
    turns, 2.5 messages a request). A request now ends once the callers it answered have
    sent again, and their sends do not open a request beside one in flight."""

    async def cached_routes(topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, "broker-a", q) for q in range(QUEUES)]  # no lookup

    transport = FramesTransport(broker, cached_routes)
    rounds = 10

    async def main() -> None:
        core_ = ProducerCore(transport, config=ProducerConfig(), clock=FakeClock())
        await core_.start()

        async def caller(key: str) -> None:
            for n in range(rounds):
                await core_.send(Message(TOPIC, f"{key}:{n}".encode(), sharding_key=key))

        try:
            keys = [key_for(q, n) for q in range(QUEUES) for n in range(2)]
            await asyncio.wait_for(asyncio.gather(*(caller(k) for k in keys)), 5)
        finally:
            await core_.shutdown()

    asyncio.run(main())
    sizes = [sum(n for _, n in request) for request in transport.requests]
    # The idle producer's first send went at once; the first caller is a round ahead.
    # Was [1, 8, 1, 8, ...]: each round in two requests, one caller alone in the first.
    assert sizes == [1] + [8] * (rounds - 1) + [7]
    assert {k: len(v) for k, v in by_key(broker).items()} == {
        key_for(q, n): rounds for q in range(QUEUES) for n in range(2)
    }


def test_a_refused_part_of_a_shared_request_fails_only_its_callers(
    broker: ScriptedBroker, routes: Routes
) -> None:
    broker.gate = asyncio.Event()
    refused = InvalidMessageError("queue 1 refuses")
    broker.refuse = lambda q, bodies: refused if q == 1 and len(broker.requests) > 1 else None
    clock = FakeClock()
    messages = callers_messages()

    async def main() -> list[object]:
        async with producer(routes, natural(), clock) as p:
            first = await first_in_flight(p, broker, clock)
            callers = [asyncio.create_task(p.send(m)) for m in messages]
            await all_waiting(p, 1 + len(messages), clock)
            broker.gate.set()
            await asyncio.wait_for(first, 5)
            return list(await asyncio.gather(*callers, return_exceptions=True))

    outcomes = asyncio.run(main())
    assert len(routes.transport.requests) == 2
    for m, outcome in zip(messages, outcomes, strict=True):
        assert m.sharding_key is not None
        if shard_index(m.sharding_key, QUEUES) == 1:
            assert outcome is refused
        else:
            assert isinstance(outcome, SendResult)
    assert 1 not in {q for q, bodies in broker.stored.items() if bodies}


def test_a_part_retried_alone_is_not_overtaken_by_later_sends_of_its_key(
    broker: ScriptedBroker, routes: Routes, instant_retries: asyncio.Event
) -> None:
    first_request_refused(broker)
    clock = FakeClock()
    other = key_for((shard_index("a", QUEUES) + 1) % QUEUES)

    async def main() -> None:
        async with producer(routes, natural(retry_times=2), clock) as p:
            earlier = asyncio.create_task(p.send(Message(TOPIC, b"a:0", sharding_key="a")))
            await until(lambda: len(broker.requests) == 1, clock, "the refused request")
            later = [asyncio.create_task(p.send(m)) for m in keyed("a", 3)[1:]]
            # another queue goes on while "a" waits to retry
            await asyncio.wait_for(p.send(Message(TOPIC, f"{other}:0".encode(),
                                                  sharding_key=other)), 5)  # fmt: skip
            assert by_key(broker) == {other: [0]}
            instant_retries.set()
            await asyncio.wait_for(asyncio.gather(earlier, *later), 5)

    asyncio.run(main())
    assert by_key(broker) == {"a": [0, 1, 2], other: [0]}
    assert broker.most_in_flight[shard_index("a", QUEUES)] == 1


def test_flush_returns_only_once_the_senders_have_their_results(
    routes: Routes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flush() returned as soon as the accumulator's count reached 0: the senders' futures
    were set, but the tasks awaiting them had not run yet, and a caller reading them right
    after flush() found sends not done. Polling at every turn of the loop (instead of
    every 10 ms) makes flush look on the turn the answer comes, where the race was lost."""
    monkeypatch.setattr(core, "FLUSH_POLL_SECONDS", 0)

    async def main() -> list[int]:
        config = ProducerConfig(accumulator=AccumulatorConfig(linger=0))
        not_done = []
        async with producer(routes, config, FakeClock()) as p:
            for senders in (1, 2, 5):
                tasks = [asyncio.create_task(p.send(keyed(f"k{n}", 1)[0])) for n in range(senders)]
                await p.flush(10)
                not_done.append(sum(not t.done() for t in tasks))
                await asyncio.gather(*tasks)
        return not_done

    assert asyncio.run(main()) == [0, 0, 0]


@pytest.mark.parametrize("spool", [False, True], ids=["plain", "spool"])
def test_a_batch_with_what_is_not_a_message_is_refused_naming_it_and_sends_nothing(
    routes: Routes, broker: ScriptedBroker, tmp_path: Path, spool: bool
) -> None:
    """It raised AttributeError from inside the encoding; the check costs a good batch
    nothing (it runs only once the encoding failed)."""

    async def main() -> None:
        config = spooling(tmp_path / "spool") if spool else ProducerConfig()
        async with producer(routes, config, FakeClock()) as p:
            batch: list[Any] = [keyed("k", 1)[0], None]
            with pytest.raises(InvalidMessageError, match=r"message 1\) takes a Message, not"):
                await p.send_batch(batch)

    asyncio.run(main())
    assert by_key(broker) == {}


def test_flush_with_nothing_to_send_returns_whatever_the_timeout(routes: Routes) -> None:
    """flush(0) with nothing accepted raised TimeoutError ("0 accepted message(s) did not
    reach the broker"), as did a negative or NaN timeout, which is now refused as bad input."""

    async def main() -> None:
        config = ProducerConfig(accumulator=AccumulatorConfig(linger=0))
        async with producer(routes, config, FakeClock()) as p:
            await p.flush(0)
            await p.send(keyed("k", 1)[0])
            await p.flush(0)
            for bad in (-1.0, float("nan")):
                with pytest.raises(InvalidArgumentError, match="flush timeout must be"):
                    await p.flush(bad)

    asyncio.run(main())


def test_a_partial_batch_error_names_the_failed_messages_by_their_index_in_the_batch() -> None:
    ok = SendResult(SendStatus.SEND_OK, "ID", MessageQueue("t", "b", 0), 0)
    refused = OrderMQError("frame 0: refused")  # the broker counts frames within the part
    one = PartialBatchError([ok, None, ok], [refused])
    assert str(one) == "2 of 3 messages were stored; message 1 failed: frame 0: refused"
    many = PartialBatchError([ok] + [None] * 12, [refused])
    assert str(many).startswith(
        "1 of 13 messages were stored; messages 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (12 in all) "
        "failed: frame 0"
    )


def test_a_send_to_an_idle_producer_goes_in_the_callers_task_not_the_accumulators(
    broker: ScriptedBroker, routes: Routes
) -> None:
    """Natural batching cost a lone caller a hand-off to the accumulator's sender and a
    task per request; a send that finds nothing in flight and nothing waiting is sent by
    its caller, as with no accumulator (and what comes meanwhile waits for it)."""
    tasks: list[asyncio.Task[Any] | None] = []
    send = broker.send

    async def noting(topic: str, queue_id: int, frames: bytes, **kw: Any) -> Appended:
        tasks.append(asyncio.current_task())
        return await send(topic, queue_id, frames, **kw)

    broker.send = noting  # type: ignore[method-assign]

    async def main() -> list[asyncio.Task[Any] | None]:
        async with producer(routes, natural(), FakeClock()) as p:
            callers = []
            for m in keyed("a", 3):
                callers.append(asyncio.create_task(p.send(m)))
                await callers[-1]
            return list(callers)

    callers = asyncio.run(main())
    assert tasks == callers
    assert by_key(broker) == {"a": [0, 1, 2]}


def test_a_lone_send_that_fails_fails_the_sends_of_its_queue_that_waited_behind_it(
    broker: ScriptedBroker, routes: Routes
) -> None:
    broker.gate = asyncio.Event()
    refused = InvalidMessageError("refused")
    broker.refuse = lambda q, bodies: refused if len(broker.requests) == 1 else None
    clock = FakeClock()

    async def main() -> list[object]:
        async with producer(routes, natural(), clock) as p:
            first = await first_in_flight(p, broker, clock)  # sent by its caller
            behind = [asyncio.create_task(p.send(m)) for m in keyed("a", 3)[1:]]
            await all_waiting(p, 3, clock)
            broker.gate.set()
            return list(await asyncio.gather(first, *behind, return_exceptions=True))

    first, *behind = asyncio.run(main())
    assert first is refused
    assert all(isinstance(e, EarlierSendFailedError) and e.cause is refused for e in behind)
    assert by_key(broker) == {}


def test_a_lone_send_cancelled_in_flight_lets_the_later_sends_of_its_queue_go(
    broker: ScriptedBroker, routes: Routes
) -> None:
    broker.gate = asyncio.Event()
    clock = FakeClock()

    async def main() -> list[SendResult]:
        async with producer(routes, natural(), clock) as p:
            first = await first_in_flight(p, broker, clock)
            behind = [asyncio.create_task(p.send(m)) for m in keyed("a", 3)[1:]]
            await all_waiting(p, 3, clock)
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first
            broker.gate.set()
            results = list(await asyncio.wait_for(asyncio.gather(*behind), 5))
            assert p._accumulator is not None and p._accumulator.pending == 0
            return results

    results = asyncio.run(main())
    assert [r.queue_offset for r in results] == [0, 1]
    assert by_key(broker) == {"a": [1, 2]}


@pytest.fixture
def known_routes(broker: ScriptedBroker, routes: Routes) -> Routes:
    """Routes as the gRPC transport keeps them: asked once per topic, then known."""
    routes.transport = FramesTransport(broker, routes.writable_queues, remember_routes=True)
    return routes


def test_a_known_route_is_still_asked_for_again_once_due(
    broker: ScriptedBroker, known_routes: Routes
) -> None:
    """A send that finds its route known admits itself without the lock, but not past the
    route's refresh interval: then it asks, as any send would."""
    clock = FakeClock()

    async def main() -> None:
        async with producer(known_routes, natural(), clock) as p:
            for m in keyed("a", 3):
                await p.send(m)
            assert known_routes.calls == 1
            clock.advance(p.config.route_refresh_interval)
            await p.send(Message(TOPIC, b"a:3", sharding_key="a"))

    asyncio.run(main())
    assert known_routes.calls == 2
    assert known_routes.transport.refreshes == 1
    assert by_key(broker) == {"a": [0, 1, 2, 3]}


def test_a_send_made_while_an_earlier_one_waits_for_room_does_not_overtake_it(
    broker: ScriptedBroker, known_routes: Routes
) -> None:
    """The earlier send waits for room in the admission; the later one, made by a caller
    whose send was just answered (before the waiting one has run again), must not slip
    in through the admission that awaits nothing while the buffer has room."""
    config = ProducerConfig(
        accumulator=AccumulatorConfig(
            linger=0, max_requests_in_flight=1, batch_max_messages=1, buffer_max_messages=1
        )
    )
    a0, a1, a2 = keyed("a", 3)

    async def main() -> None:
        async with producer(known_routes, config, FakeClock()) as p:
            await p.send(Message(TOPIC, b"b:0", sharding_key="b"))  # learns the route
            broker.gate = asyncio.Event()

            async def first_then_third() -> None:
                await p.send(a0)
                await p.send(a2)  # on the turn a0's answer came

            caller = asyncio.create_task(first_then_third())
            while not broker.requests or broker.requests[-1][1] != [b"a:0"]:
                await asyncio.sleep(0)
            second = asyncio.create_task(p.send(a1))  # the buffer is full: it waits
            for _ in range(5):
                await asyncio.sleep(0)
            assert not second.done()
            broker.gate.set()
            await asyncio.wait_for(asyncio.gather(caller, second), 5)

    asyncio.run(main())
    assert by_key(broker)["a"] == [0, 1, 2]


def test_a_send_that_waits_for_room_asks_its_selector_once(
    broker: ScriptedBroker, known_routes: Routes
) -> None:
    """A send that found no room without the lock waits for it under the lock, in the
    queue it chose: a user's selector (and the keyless round robin) is asked once a send."""
    config = ProducerConfig(
        accumulator=AccumulatorConfig(
            linger=0, max_requests_in_flight=1, batch_max_messages=1, buffer_max_messages=1
        )
    )
    asked: list[bytes] = []

    def second_queue(queues: list[MessageQueue], message: Message, arg: Any) -> MessageQueue:
        asked.append(message.body)
        return queues[1]

    async def main() -> None:
        async with producer(known_routes, config, FakeClock()) as p:
            await p.send(Message(TOPIC, b"b:0", sharding_key="b"))  # learns the route
            broker.gate = asyncio.Event()
            first = asyncio.create_task(p.send(Message(TOPIC, b"x:0"), selector=second_queue))
            while not broker.requests or broker.requests[-1][1] != [b"x:0"]:
                await asyncio.sleep(0)
            second = asyncio.create_task(p.send(Message(TOPIC, b"x:1"), selector=second_queue))
            for _ in range(5):
                await asyncio.sleep(0)
            assert not second.done()  # the buffer is full: it waits
            broker.gate.set()
            await asyncio.wait_for(asyncio.gather(first, second), 5)

    asyncio.run(main())
    assert asked == [b"x:0", b"x:1"]
    assert broker.stored[1] == [b"x:0", b"x:1"]


def held_in_flight(acc: Accumulator, queue: MessageQueue) -> bool:
    """Whether a part of `queue` is in flight (its buffer busy)."""
    return acc._queues[queue].busy


def test_the_sender_looks_only_at_the_queues_with_messages_waiting() -> None:
    """A buffer stays for every queue a producer ever sent to; the sender looked at all
    of them for every request (8 callers' sends 14% slower once 100 other topics had
    had a send each). It looks at those holding messages."""
    gate = asyncio.Event()
    held = MessageQueue("held", "broker-a", 0)

    async def send(q: MessageQueue, frames: list[bytes], ids: list[bytes]) -> list[SendResult]:
        if q == held:
            await gate.wait()
        return stored_results(q, ids)

    async def main() -> None:
        acc = accumulator(AccumulatorConfig(linger=0), send)
        queues = [MessageQueue(f"topic-{n}", "broker-a", q) for n in range(50) for q in range(4)]
        sent = [await acc.enqueue(q, b"x", b"%d" % i, acc.ticket()) for i, q in enumerate(queues)]
        await asyncio.wait_for(asyncio.gather(*sent), 5)
        assert acc._waiting == {}  # all answered: nothing to look at
        first = await acc.enqueue(held, b"a", b"a", acc.ticket())
        while not held_in_flight(acc, held):
            await asyncio.sleep(0)
        second = await acc.enqueue(held, b"b", b"b", acc.ticket())  # waits behind the first
        assert list(acc._waiting) == [held]
        gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), 5)
        assert acc._waiting == {}
        await acc.close()

    asyncio.run(main())
