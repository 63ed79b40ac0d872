"""Producer: retries across a broker restart, the accumulator, back-pressure, the spool."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    AccumulatorConfig,
    EarlierSendFailedError,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    ProducerConfig,
    SendResult,
    SendStatus,
    shard_index,
)
from sdk.aio import Producer as AsyncProducer
from sdk.clock import Clock
from sdk.errors import (
    BrokerUnavailableError,
    BufferFullError,
    InvalidArgumentError,
    InvalidMessageError,
    OrderMQError,
)
from tests.component.pulling import read_queue, read_topic
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over
from tests.support import pinned, wait_until


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    """The broker, reached over each transport in turn (tests/component/transports.py)."""
    with broker_over(request.param, tmp_path / "broker") as b:
        yield b


class Restartable:
    """An embedded broker that can be stopped and started again on the same ports.

    `address` is the endpoint for `transport` (tests/component/transports.py); `clock`,
    the brokers' clock (None: the system's).
    """

    def __init__(
        self, data_dir: Path, transport: str = "grpc", *, clock: Clock | None = None
    ) -> None:
        self.clock = clock
        self.transport = transport
        # ports 0 at the first start; pinned to what it bound for the next ones
        self.config = BrokerConfig(data_dir=data_dir, port=0, remoting_port=0, namesrv_port=0)
        self.broker: EmbeddedBroker | None = None

    @property
    def address(self) -> str:
        """The endpoint for the transport (the broker must have started once)."""
        assert self.config.port, "not started yet"
        if self.transport == "rocketmq":
            return f"rocketmq://127.0.0.1:{self.config.namesrv_port}"
        return f"127.0.0.1:{self.config.port}"

    def start(self) -> None:
        self.broker = EmbeddedBroker(self.config, clock=self.clock)
        self.broker.start()
        self.config = pinned(self.config, self.broker)

    def stop(self) -> None:
        assert self.broker is not None
        self.broker.stop()
        self.broker = None

    def restart(self) -> None:
        """Stop the broker and start it again on its data directory and ports."""
        self.stop()
        self.start()

    def __enter__(self) -> Restartable:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.broker is not None:
            self.stop()


@pytest.fixture(params=TRANSPORTS)
def restartable(request: pytest.FixtureRequest, tmp_path: Path) -> Restartable:
    r = Restartable(tmp_path / "broker", request.param)
    r.start()
    yield r  # type: ignore[misc]
    if r.broker is not None:
        r.stop()


def assert_key_order(messages: list[MessageExt]) -> None:
    """No key ever shows sequence n + 1 before n (duplicates of earlier ones allowed)."""
    seen: dict[str, int] = defaultdict(lambda: -1)
    for m in messages:
        key, seq = m.body.decode().split(":")
        assert int(seq) <= seen[key] + 1, f"{key}: {seq} after {seen[key]}"
        seen[key] = max(seen[key], int(seq))


def test_a_keyed_send_retries_its_own_queue_across_a_broker_restart(
    restartable: Restartable, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ordermq.producer")
    config = ProducerConfig(
        retry_times=16, retry_backoff=0.05, retry_backoff_max=0.3, send_timeout=2
    )
    with Producer(restartable.address, config=config) as producer:
        producer.send(Message("orders", b"before", sharding_key="order-7"))
        restartable.stop()
        outcome: Future[SendResult] = producer.send_async(
            Message("orders", b"after", sharding_key="order-7")
        )
        wait_until(lambda: "retrying" in caplog.text, 10, "a failed attempt")
        restartable.start()
        result = outcome.result(timeout=30)
    assert result.queue.queue_id == shard_index("order-7", 8)
    assert [m.body for m in read_queue(restartable.address, result.queue)] == [b"before", b"after"]


def test_invalid_input_is_never_retried(restartable: Restartable) -> None:
    with Producer(restartable.address) as producer, pytest.raises(InvalidArgumentError):
        producer.send(Message("orders", b"x"), selector=lambda qs, m, a: MessageQueue("x", "y", 9))


def test_the_accumulator_batches_and_keeps_each_keys_order(restartable: Restartable) -> None:
    config = ProducerConfig(accumulator=AccumulatorConfig(batch_max_messages=100, linger=0.01))
    with Producer(restartable.address, config=config) as producer:
        futures = [
            producer.send_async(Message("orders", f"k{i % 13}:{i // 13}".encode(),
                                        sharding_key=f"k{i % 13}"))
            for i in range(2600)
        ]  # fmt: skip
        results = [f.result(timeout=30) for f in futures]
    assert len({(r.queue, r.queue_offset) for r in results}) == 2600
    messages = read_topic(restartable.address, "orders")
    assert len(messages) == 2600
    assert_key_order(messages)


def test_blocking_sends_started_one_after_another_are_stored_in_that_order(
    broker: BrokerOver,
) -> None:
    with Producer(broker.address) as producer:
        futures = [
            producer.send_async(Message("orders", b"%d" % i, sharding_key="k")) for i in range(30)
        ]
        producer.send_oneway(Message("orders", b"30", sharding_key="k"))
        last = producer.send(Message("orders", b"31", sharding_key="k"))
        assert [f.result(timeout=10).queue for f in futures] == [last.queue] * 30
    assert [m.body for m in read_queue(broker.address, last.queue)] == [
        b"%d" % i for i in range(32)
    ]


def test_blocking_sends_admitted_behind_a_request_in_flight_make_no_task_each(
    tmp_path: Path,
) -> None:
    made: list[str] = []

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(coro.__qualname__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    results: list[SendResult] = []
    with (
        EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data")) as embedded,
        Producer(embedded.address) as producer,
    ):
        producer.send(Message("orders", b"warm-up", sharding_key="k"))  # the route known
        loop_thread = producer._loop
        assert loop_thread is not None
        release = loop_thread.hold()
        loop_thread._loop.set_task_factory(counting)  # type: ignore[arg-type]
        threads = [
            threading.Thread(
                target=lambda n=n: results.append(
                    producer.send(Message("orders", b"%d" % n, sharding_key=f"k{n}"))
                )
            )
            for n in range(8)
        ]
        for t in threads:
            t.start()
        wait_until(lambda: len(loop_thread._incoming) == 8, 10, "the 8 sends queued")
        release.set()
        for t in threads:
            t.join(10)
        sends = [m for m in made if m.startswith(("ProducerCore", "Accumulator.send"))]
    assert len(results) == 8
    # The first goes at once, a request of its own in a task; the seven admitted behind
    # it wait on their buffered messages' futures (a task each before).
    assert sends == ["Accumulator.send_claimed"]


def test_threads_waiting_on_buffered_sends_each_get_an_answer_when_the_producer_shuts_down(
    restartable: Restartable,
) -> None:
    """With the broker gone, 8 threads' sends wait in the buffer (on their futures, no
    task each) behind a request that retries; a shutdown meanwhile answers every one."""
    config = ProducerConfig(send_timeout=0.5, retry_times=1, retry_backoff=1, retry_backoff_max=1)
    outcomes: dict[int, object] = {}
    producer = Producer(restartable.address, config=config)
    producer.start()
    producer.fetch_publish_message_queues("orders")
    restartable.stop()

    def send(n: int) -> None:
        try:
            outcomes[n] = producer.send(Message("orders", b"%d" % n, sharding_key=f"k{n}"))
        except OrderMQError as exc:
            outcomes[n] = exc

    # The 8 sends are admitted together, before the first one's request runs: over
    # rocketmq:// a stopped broker refuses at once, and a request that gave up before the
    # last thread had sent left fewer than 8 waiting (a CI run on a busy machine). Its
    # retry waits 1 s, time enough to see them all waiting.
    loop_thread = producer._loop
    assert loop_thread is not None
    release = loop_thread.hold()
    threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    wait_until(lambda: len(loop_thread._incoming) == 8, 10, "the 8 sends queued")
    release.set()
    accumulator = producer._core._accumulator
    assert accumulator is not None
    wait_until(lambda: accumulator.pending == 8, 10, "the 8 sends admitted")
    producer.shutdown()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)
    assert sorted(outcomes) == list(range(8))
    assert all(isinstance(o, OrderMQError) for o in outcomes.values()), outcomes


@pytest.mark.parametrize("when_full", ["fail", "block"])
def test_a_full_buffer_applies_back_pressure(restartable: Restartable, when_full: str) -> None:
    accumulator = AccumulatorConfig(
        batch_max_messages=10, buffer_max_messages=20, linger=0,
        when_full=when_full, block_timeout=0.2,  # type: ignore[arg-type]
    )  # fmt: skip
    config = ProducerConfig(
        accumulator=accumulator, retry_times=16, retry_backoff=1, retry_backoff_max=2
    )
    with Producer(restartable.address, config=config) as producer:
        producer.fetch_publish_message_queues("orders")
        restartable.stop()  # the broker is gone: batches stay in flight, retrying
        accepted = [
            producer.send_async(Message("orders", b"m", sharding_key="k")) for _ in range(20)
        ]
        overflow = producer.send_async(Message("orders", b"one too many", sharding_key="k"))
        with pytest.raises(BufferFullError, match="limit 20"):
            overflow.result(timeout=10)
        restartable.start()
        assert all(f.result(timeout=60).status is SendStatus.SEND_OK for f in accepted)


def test_the_spool_keeps_what_it_accepted_through_a_broker_outage(
    restartable: Restartable, tmp_path: Path
) -> None:
    config = ProducerConfig(spool_dir=tmp_path / "spool", retry_times=0, send_timeout=2)
    with Producer(restartable.address, config=config) as producer:
        for i in range(300):
            if i == 100:
                restartable.stop()
            if i == 200:
                restartable.start()
            result = producer.send(Message("orders", f"k{i % 7}:{i // 7}".encode(),
                                           sharding_key=f"k{i % 7}"))  # fmt: skip
            assert result.status is SendStatus.SPOOLED
        producer.flush(timeout=60)
    messages = read_topic(restartable.address, "orders")
    assert {m.body for m in messages} == {f"k{i % 7}:{i // 7}".encode() for i in range(300)}
    assert_key_order(messages)
    for m in messages:
        assert m.queue.queue_id == shard_index(m.sharding_key or "", 8)


def test_a_spool_delivers_messages_left_by_an_earlier_producer(
    restartable: Restartable, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    restartable.stop()
    # shutdown gives the spool send_timeout to drain; the broker is down, so keep it short
    with Producer(
        restartable.address, config=ProducerConfig(spool_dir=spool, send_timeout=0.5)
    ) as first:
        for i in range(50):
            first.send(Message("orders", f"k{i % 5}:{i // 5}".encode(), sharding_key=f"k{i % 5}"))
    # the broker was down the whole time: everything is still in the spool file
    restartable.start()
    with Producer(restartable.address, config=ProducerConfig(spool_dir=spool)) as second:
        second.flush(timeout=60)
    messages = read_topic(restartable.address, "orders")
    assert len(messages) == 50
    assert_key_order(messages)


def test_spool_and_accumulator_are_exclusive_and_a_spool_routes_by_key_only(
    restartable: Restartable, tmp_path: Path
) -> None:
    with pytest.raises(InvalidArgumentError, match="exclusive"):
        Producer("127.0.0.1:1", config=ProducerConfig(
            spool_dir=tmp_path, accumulator=AccumulatorConfig()))  # fmt: skip
    config = ProducerConfig(spool_dir=tmp_path / "spool")
    with (
        Producer(restartable.address, config=config) as producer,
        pytest.raises(InvalidArgumentError, match="sharding key only"),
    ):
        producer.send(Message("orders", b"x"), selector=lambda qs, m, a: qs[0])


def test_asyncio_producer_flushes_its_accumulator(restartable: Restartable) -> None:
    import sdk.aio

    async def main() -> int:
        config = ProducerConfig(accumulator=AccumulatorConfig(linger=0.05))
        async with sdk.aio.Producer(restartable.address, config=config) as producer:
            tasks = [asyncio.create_task(producer.send(Message("orders", b"%d" % i)))
                     for i in range(100)]  # fmt: skip
            await producer.flush(10)
            return sum(t.done() for t in tasks)

    assert asyncio.run(main()) == 100


def test_asyncio_send_oneway_refuses_what_is_not_a_message_at_once(broker: BrokerOver) -> None:
    """It raised nothing: its task failed later with only a log line ("one-way send
    failed"), so the caller never learnt; the blocking face raised at once."""

    async def main() -> None:
        async with AsyncProducer(broker.address) as producer:
            for value in (None, b"body", "text", {"topic": "orders"}):
                with pytest.raises(InvalidMessageError, match=r"send_oneway\(\) takes a Message"):
                    producer.send_oneway(value)  # type: ignore[arg-type]
            producer.send_oneway(Message("orders", b"after"))

    asyncio.run(main())
    assert [m.body for m in read_topic(broker.address, "orders")] == [b"after"]


NATURAL = ProducerConfig(accumulator=AccumulatorConfig(linger=0))


def natural_messages(caller: int, count: int) -> list[Message]:
    """A caller's messages "<key>:<n>" over three keys of its own, n counting per key."""
    keys = [f"c{caller}-k{k}" for k in range(3)]
    return [Message("natural", f"{keys[n % 3]}:{n // 3}".encode(), sharding_key=keys[n % 3])
            for n in range(count)]  # fmt: skip


def sends_answered(embedded: EmbeddedBroker) -> int:
    state = embedded.broker.state
    assert state is not None
    return state.requests.by_code.get(("Send", "OK"), 0)


def from_tasks(address: str, callers: int, each: int) -> None:
    async def run() -> None:
        async with AsyncProducer(address, config=NATURAL) as producer:

            async def caller(n: int) -> None:
                for m in natural_messages(n, each):
                    await producer.send(m)  # one after another: each key's order holds

            await asyncio.gather(*(caller(n) for n in range(callers)))

    asyncio.run(run())


def from_threads(address: str, callers: int, each: int) -> None:
    with Producer(address, config=NATURAL) as producer:

        def caller(n: int) -> None:
            for m in natural_messages(n, each):
                producer.send(m)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


@pytest.mark.parametrize("face", [from_tasks, from_threads], ids=["tasks", "threads"])
def test_natural_batching_shares_requests_among_callers_and_keeps_each_keys_order(
    tmp_path: Path, face: Callable[[str, int, int], None]
) -> None:
    callers, each = 8, 30
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data")) as embedded:
        with Producer(embedded.address) as warm_up:  # the topic exists
            warm_up.send(Message("natural", b"warm-up:0", sharding_key="warm-up"))
        before = sends_answered(embedded)
        face(embedded.address, callers, each)
        requests = sends_answered(embedded) - before
        stored = read_topic(embedded.address, "natural")
    # Without it, a request per send (240). Tasks share by construction: all 8 start on
    # one turn of the loop, while at most 2 requests can be in flight, and each answer
    # wakes its callers together (60-65 requests in a probe). Threads share only as far
    # as the machine lets them overlap (151 requests on a loaded machine once): their
    # count is not a property of the code, only that each gets its result and each key's
    # order holds. The exact sharing is tested with fakes in tests/unit.
    if face is from_tasks:
        assert requests < callers * each
    sequences: dict[str, list[int]] = defaultdict(list)
    for m in stored:
        key, n = m.body.decode().split(":")
        sequences[key].append(int(n))
    del sequences["warm-up"]
    assert len(sequences) == callers * 3
    assert all(s == list(range(each // 3)) for s in sequences.values())


def test_natural_batching_through_a_full_disk_answers_every_caller_and_stores_none_in_half(
    tmp_path: Path,
) -> None:
    """8 callers keep sending their own key while the disk fills up, then has room again.

    Each send gets a SendResult or an OrderMQError: DISK_FULL for a refused part, or
    EarlierSendFailedError (caused by it) for a send queued behind one on its queue.
    Without retries a refused send is not stored, so the broker holds exactly the
    acknowledged messages, where their results say, each key's in send order.
    """
    usage = tmp_path / "disk.json"
    room, full = (json.dumps({"total_bytes": 10**9, "other_used_bytes": used})
                  for used in (0, 95 * 10**7))  # fmt: skip
    usage.write_text(room)
    config = BrokerConfig(data_dir=tmp_path / "data", disk_usage_file=usage,
                          disk_check_seconds=0.05)  # fmt: skip
    keys = [f"caller-{n}" for n in range(8)]
    outcomes: dict[str, list[SendResult | BaseException]] = {key: [] for key in keys}

    def answers(key: str, kind: type) -> int:
        return sum(isinstance(o, kind) for o in outcomes[key])

    async def until(condition: Callable[[], bool], what: str) -> None:
        async with asyncio.timeout(20):  # a bound, not a timing: fails with `what`
            while not condition():
                await asyncio.sleep(0.01)
        assert condition(), what

    async def run(embedded: EmbeddedBroker) -> None:
        state = embedded.broker.state
        assert state is not None
        producer_config = ProducerConfig(accumulator=AccumulatorConfig(linger=0), retry_times=0)
        stop = asyncio.Event()
        async with AsyncProducer(embedded.address, config=producer_config) as producer:

            async def caller(key: str) -> None:
                while not stop.is_set():
                    body = f"{key}:{len(outcomes[key])}".encode()
                    try:
                        async with asyncio.timeout(20):
                            outcome: SendResult | BaseException = await producer.send(
                                Message("natural", body, sharding_key=key)
                            )
                    except Exception as exc:  # TimeoutError: no answer, checked below
                        outcome = exc
                    outcomes[key].append(outcome)

            callers = [asyncio.create_task(caller(key)) for key in keys]
            try:
                await until(lambda: all(answers(k, SendResult) >= 10 for k in keys), "acks")
                usage.write_text(full)
                await until(lambda: all(answers(k, OrderMQError) for k in keys), "refusals")
                usage.write_text(room)
                await until(lambda: not state.store.refusing_sends, "room again")
                acked = {k: answers(k, SendResult) for k in keys}
                await until(lambda: all(answers(k, SendResult) >= acked[k] + 10 for k in keys),
                            "acks after the disk has room again")  # fmt: skip
            finally:
                stop.set()
                async with asyncio.timeout(30):
                    await asyncio.gather(*callers)

    with EmbeddedBroker(config) as embedded:
        asyncio.run(run(embedded))
        stored = read_topic(embedded.address, "natural")
    where = {(m.queue.queue_id, m.queue_offset): m.body for m in stored}
    acked_count = 0
    for key, sends in outcomes.items():
        for n, outcome in enumerate(sends):
            body = f"{key}:{n}".encode()
            if isinstance(outcome, SendResult):
                acked_count += 1
                assert where[(outcome.queue.queue_id, outcome.queue_offset)] == body
                continue
            cause = outcome.cause if isinstance(outcome, EarlierSendFailedError) else outcome
            assert isinstance(cause, BrokerUnavailableError), f"{body!r}: {outcome!r}"
            assert cause.reason == "DISK_FULL", f"{body!r}: {outcome!r}"
    assert len(stored) == acked_count, "a refused send was stored"
    sequences: dict[str, list[int]] = defaultdict(list)
    for m in stored:  # queue by queue, each in offset order
        key, n = m.body.decode().split(":")
        sequences[key].append(int(n))
    for key, ns in sequences.items():  # the refused ones leave gaps
        assert ns == sorted(ns), f"{key}: stored out of send order"
