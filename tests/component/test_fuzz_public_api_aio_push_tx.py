"""The asyncio clients, the push consumers and the transaction producers called with
hostile arguments, over each transport.

As test_fuzz_public_api.py does for the blocking Producer, LitePullConsumer and
SimpleConsumer: every public method that takes arguments, of sdk.aio's Producer,
LitePullConsumer, SimpleConsumer and TransactionProducer, of sdk.TransactionProducer, and
of both PushConsumers (before start and while running), gets values a user could pass by
mistake. It must return within its bound, or raise an OrderMQError or a TypeError; never
anything else. Afterwards the clients still work: a send, a poll, a commit, a receive, a
transaction, and a push consumer still hands new messages to its listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st

import sdk.aio
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    Producer,
    PushConsumer,
    TransactionProducer,
)
from sdk.errors import ClientStateError
from tests.component.hostile_calls import (
    TOPIC,
    args,
    bounded,
    floats,
    ints,
    methods_with_arguments,
    mqs,
    offset_maps,
    queue_lists,
    refusing_at_once,
    resubscribe,
    run_examples,
    selectors,
    sendable,
    texts,
    waits,
    wrong,
)
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over

#: How long a push consumer may take to hand a new message to its listener.
DELIVERY_SECONDS = 15.0

Calls = dict[str, tuple[Callable[..., Any], st.SearchStrategy[Any]]]


class Committing:
    """A transaction listener whose local transactions all commit."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Commit."""
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """Commit."""
        return LocalTransactionState.COMMIT_MESSAGE


class AsyncCommitting:
    """Committing, for sdk.aio.TransactionProducer."""

    async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Commit."""
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """Commit."""
        return LocalTransactionState.COMMIT_MESSAGE


class Recording(MessageListenerConcurrently):
    """Keeps the bodies of the messages it is handed; wait_for(body) waits for one."""

    def __init__(self) -> None:
        self.bodies: set[bytes] = set()
        self._changed = threading.Condition()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        """Record the bodies."""
        with self._changed:
            self.bodies.update(m.body for m in msgs)
            self._changed.notify_all()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    def wait_for(self, body: bytes) -> bool:
        """True once a message with `body` came, False if none within DELIVERY_SECONDS."""
        with self._changed:
            return self._changed.wait_for(lambda: body in self.bodies, DELIVERY_SECONDS)


class EventLoop:
    """An asyncio loop on a thread of its own, for the asyncio clients under test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, call: Callable[[], Any]) -> Any:
        """`call()` on the loop, awaited when it gives an awaitable; its result."""

        async def on_loop() -> Any:
            result = call()
            return await result if inspect.isawaitable(result) else result

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result()

    def blocking(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """`method` as a blocking call, run on the loop (see run)."""
        return lambda *a, **kw: self.run(lambda: method(*a, **kw))

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class Clients:
    """The broker and running clients one transport's examples call."""

    broker: BrokerOver
    loop: EventLoop
    producer: sdk.aio.Producer
    reader: sdk.aio.LitePullConsumer
    simple: sdk.aio.SimpleConsumer | None  # None over rocketmq:// (RocketMQ 4 has no pop)
    transactions: TransactionProducer
    async_transactions: sdk.aio.TransactionProducer
    held: list[MessageExt]  # received by the SimpleConsumer, or pulled by the reader


@pytest.fixture(scope="module", params=TRANSPORTS)
def broker(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[BrokerOver]:
    data_dir = tmp_path_factory.mktemp(f"fuzz-api-more-{request.param}") / "broker"
    with broker_over(request.param, data_dir) as b, Producer(b.address) as producer:
        producer.send_batch([Message(TOPIC, b"m%d" % i, sharding_key=f"k{i}") for i in range(32)])
        yield b


@pytest.fixture(scope="module")
def event_loop_thread() -> Iterator[EventLoop]:
    event_loop = EventLoop()
    yield event_loop
    event_loop.close()


@pytest.fixture(scope="module")
def clients(broker: BrokerOver, event_loop_thread: EventLoop) -> Iterator[Clients]:
    loop = event_loop_thread
    with contextlib.ExitStack() as stack:
        producer = started(loop, stack, lambda: sdk.aio.Producer(broker.address))
        queues = loop.run(lambda: producer.fetch_publish_message_queues(TOPIC))
        reader = started(loop, stack, lambda: assigned_reader(broker.address, queues))
        held = loop.run(lambda: reader.poll(timeout=5.0))
        simple = None
        if broker.transport == "grpc":
            simple = started(loop, stack, lambda: subscribed_simple(broker.address))
            held += loop.run(lambda: simple.receive(max_messages=4, invisible_duration=30))
        tx = stack.enter_context(TransactionProducer(broker.address, Committing(), group="fuzz-tx"))
        async_tx = started(
            loop,
            stack,
            lambda: sdk.aio.TransactionProducer(
                broker.address, AsyncCommitting(), group="fuzz-async-tx"
            ),
        )
        assert held, "the fixture's consumers read the topic"
        yield Clients(broker, loop, producer, reader, simple, tx, async_tx, held)


def started(loop: EventLoop, stack: contextlib.ExitStack, make: Callable[[], Any]) -> Any:
    """The asyncio client `make()` builds, made and started on the loop; shut down on exit."""
    client = loop.run(make)
    loop.run(client.start)
    stack.callback(loop.run, client.shutdown)
    return client


def assigned_reader(address: str, queues: list[Any]) -> sdk.aio.LitePullConsumer:
    """An asyncio LitePullConsumer of every queue of the topic, from its first message."""
    reader = sdk.aio.LitePullConsumer(
        "fuzz-async-readers", address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    reader.assign(queues)
    return reader


def subscribed_simple(address: str) -> sdk.aio.SimpleConsumer:
    """An asyncio SimpleConsumer of the topic that waits little for messages."""
    simple = sdk.aio.SimpleConsumer("fuzz-async-simple", address, await_duration=0.05)
    simple.subscribe(TOPIC)
    return simple


def still_works(c: Clients) -> None:
    """A send, a poll, a commit, a receive and both transactions succeed."""
    run = c.loop.run
    result = bounded(lambda: run(lambda: c.producer.send(Message(TOPIC, b"after"))))
    assert result.queue_offset >= 0
    queues = bounded(lambda: run(lambda: c.producer.fetch_publish_message_queues(TOPIC)))
    bounded(lambda: run(lambda: c.reader.assign(queues)))  # what the examples reassigned
    run(lambda: c.reader.resume(queues))  # what the examples paused
    bounded(lambda: run(lambda: c.reader.poll(timeout=0.05)))
    bounded(lambda: run(c.reader.commit))
    if c.simple is not None:
        simple = c.simple
        resubscribe(simple)
        bounded(lambda: run(lambda: simple.receive(max_messages=1, invisible_duration=1)))
    commits(c.transactions.send_message_in_transaction)
    commits(c.loop.blocking(c.async_transactions.send_message_in_transaction))


def commits(send_message_in_transaction: Callable[..., Any]) -> None:
    """A transactional send succeeds, and its local transaction committed."""
    sent = bounded(lambda: send_message_in_transaction(Message(TOPIC, b"after")))
    assert sent.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE


async def kept_invisible(simple: sdk.aio.SimpleConsumer, *a: Any, **kw: Any) -> None:
    """keep_invisible(*a, **kw), entered and left at once."""
    async with simple.keep_invisible(*a, **kw):
        pass


#: Each public method and a strategy of the (args, kwargs) it is called with.
def calls(c: Clients) -> Calls:
    on_loop = c.loop.blocking
    p, r = c.producer, c.reader
    found: Calls = {
        "aio.Producer.send": (
            on_loop(p.send),
            args(sendable, selector=selectors, arg=wrong, timeout=floats | wrong),
        ),
        "aio.Producer.send_batch": (
            on_loop(p.send_batch),
            args(st.lists(sendable, max_size=3) | wrong, timeout=floats | wrong),
        ),
        "aio.Producer.send_oneway": (
            refusing_at_once(on_loop(p.send_oneway)),
            args(sendable),
        ),
        "aio.Producer.fetch_publish_message_queues": (
            on_loop(p.fetch_publish_message_queues),
            args(texts | wrong),
        ),
        "aio.Producer.cancel": (on_loop(p.cancel), args(texts | wrong)),
        "aio.Producer.flush": (on_loop(p.flush), args(waits | wrong)),
        "aio.LitePullConsumer.subscribe": (
            on_loop(r.subscribe),
            args(texts | wrong, expression=texts | wrong),
        ),
        "aio.LitePullConsumer.assign": (on_loop(r.assign), args(queue_lists)),
        "aio.LitePullConsumer.committed": (on_loop(r.committed), args(mqs)),
        "aio.LitePullConsumer.offsets_for_timestamp": (
            on_loop(r.offsets_for_timestamp),
            args(mqs, floats | wrong),
        ),
        "aio.LitePullConsumer.seek": (on_loop(r.seek), args(mqs, ints | wrong)),
        "aio.LitePullConsumer.seek_to_begin": (on_loop(r.seek_to_begin), args(mqs)),
        "aio.LitePullConsumer.seek_to_end": (on_loop(r.seek_to_end), args(mqs)),
        "aio.LitePullConsumer.commit": (
            on_loop(r.commit),
            args(offset_maps, persist=st.booleans() | wrong),
        ),
        "aio.LitePullConsumer.pause": (on_loop(r.pause), args(queue_lists)),
        "aio.LitePullConsumer.resume": (on_loop(r.resume), args(queue_lists)),
        "aio.LitePullConsumer.poll": (on_loop(r.poll), args(waits | wrong)),
        "aio.LitePullConsumer.fetch_message_queues": (
            on_loop(r.fetch_message_queues),
            args(texts | wrong),
        ),
        "TransactionProducer.send_message_in_transaction": (
            c.transactions.send_message_in_transaction,
            args(sendable, arg=wrong),
        ),
        "aio.TransactionProducer.send_message_in_transaction": (
            on_loop(c.async_transactions.send_message_in_transaction),
            args(sendable, arg=wrong),
        ),
    }
    if c.simple is not None:
        s = c.simple
        held = st.sampled_from(c.held) | wrong
        found |= {
            "aio.SimpleConsumer.subscribe": (
                on_loop(s.subscribe),
                args(texts | wrong, expression=texts | wrong),
            ),
            "aio.SimpleConsumer.unsubscribe": (on_loop(s.unsubscribe), args(texts | wrong)),
            "aio.SimpleConsumer.receive": (
                on_loop(s.receive),
                args(ints | wrong, invisible_duration=floats | wrong),
            ),
            "aio.SimpleConsumer.ack": (on_loop(s.ack), args(held)),
            "aio.SimpleConsumer.change_invisible_duration": (
                on_loop(s.change_invisible_duration),
                args(held, floats | wrong),
            ),
            "aio.SimpleConsumer.keep_invisible": (
                on_loop(lambda *a, **kw: kept_invisible(s, *a, **kw)),
                args(held, invisible_duration=floats | wrong),
            ),
        }
    return found


def push_calls(consumer: Any, loop: EventLoop) -> Calls:
    """A push consumer's methods (blocking, or asyncio run on `loop`) and their arguments."""
    face = "aio." if isinstance(consumer, sdk.aio.PushConsumer) else ""
    call = loop.blocking if face else (lambda method: method)
    listeners = wrong | st.sampled_from([len, "listener", Recording, lambda msgs, context: None])
    return {
        f"{face}PushConsumer.subscribe": (
            call(consumer.subscribe),
            args(texts | wrong, expression=texts | wrong),
        ),
        f"{face}PushConsumer.register_message_listener": (
            call(consumer.register_message_listener),
            args(listeners),
        ),
    }


_bodies = itertools.count()


def consumes(broker: BrokerOver, listener: Recording) -> None:
    """A message sent now reaches `listener`."""
    body = b"pushed-%d" % next(_bodies)
    with Producer(broker.address) as producer:
        producer.send(Message(TOPIC, body))
    assert listener.wait_for(body), f"the push consumer did not consume {body!r}"


FACES = ("blocking", "aio")


def new_push_consumer(
    face: str, group: str, clients: Clients
) -> tuple[Any, Callable[[], None], Callable[[], None]]:
    """A PushConsumer of `face` (not started), from the first offset; its start and shutdown."""
    address, where = clients.broker.address, ConsumeFromWhere.FIRST_OFFSET
    if face == "blocking":
        consumer = PushConsumer(group, address, consume_from_where=where)
        return consumer, consumer.start, consumer.shutdown
    loop = clients.loop
    aio = loop.run(lambda: sdk.aio.PushConsumer(group, address, consume_from_where=where))
    return aio, loop.blocking(aio.start), loop.blocking(aio.shutdown)


CLASSES = {
    "aio.Producer": sdk.aio.Producer,
    "aio.LitePullConsumer": sdk.aio.LitePullConsumer,
    "aio.SimpleConsumer": sdk.aio.SimpleConsumer,
    "aio.PushConsumer": sdk.aio.PushConsumer,
    "PushConsumer": PushConsumer,
    "TransactionProducer": TransactionProducer,
    "aio.TransactionProducer": sdk.aio.TransactionProducer,
}


METHODS = sorted(
    f"{prefix}.{name}" for prefix, cls in CLASSES.items() for name in methods_with_arguments(cls)
)
PUSH_METHODS = [m for m in METHODS if m.split(".")[-2] == "PushConsumer"]
CLIENT_METHODS = [m for m in METHODS if m not in PUSH_METHODS]


def test_every_public_method_is_fuzzed(clients: Clients) -> None:
    fuzzed = [*calls(clients)]
    for face in FACES:
        consumer, _start, _shutdown = new_push_consumer(face, "fuzz-list", clients)
        fuzzed += push_calls(consumer, clients.loop)
    simple = [m for m in METHODS if m.startswith("aio.SimpleConsumer.")]
    expected = METHODS if clients.simple is not None else sorted(set(METHODS) - set(simple))
    assert sorted(fuzzed) == expected


@pytest.mark.parametrize("name", CLIENT_METHODS)
def test_hostile_arguments_raise_only_the_sdks_errors(clients: Clients, name: str) -> None:
    found = calls(clients)
    if name not in found:
        pytest.skip(f"{name} is not served over {clients.broker.transport}")
    run_examples(name, *found[name])
    still_works(clients)


@pytest.mark.parametrize("face", FACES)
def test_push_consumer_hostile_arguments(clients: Clients, face: str) -> None:
    """Before start and while running; then it consumes (with what the test set last)."""
    group = f"fuzz-push-{face}-{clients.broker.transport}"
    consumer, start, shutdown = new_push_consumer(face, group, clients)
    for name, (method, arguments) in push_calls(consumer, clients.loop).items():
        run_examples(name, method, arguments)
    listener = Recording()
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    start()
    try:
        consumes(clients.broker, listener)
        for name, (method, arguments) in push_calls(consumer, clients.loop).items():
            run_examples(name, method, arguments)
        with pytest.raises(ClientStateError):
            consumer.subscribe(TOPIC)  # set before start only: nothing above changed it
        consumes(clients.broker, listener)
    finally:
        shutdown()
