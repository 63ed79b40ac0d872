"""The blocking clients' public methods called with hostile arguments, over each transport.

Each call, on a running Producer, LitePullConsumer or SimpleConsumer (and the Message and
MessageQueue constructors), gets values a user could pass by mistake: empty, huge,
negative and non-finite numbers, names no broker has, queues a topic does not have,
messages of other clients, values of the wrong type. It must return within its bound, or
raise an OrderMQError (a bad value: one that is also a ValueError) or a TypeError (a value
of the wrong type); never anything else (a KeyError, AttributeError or IndexError from
inside the SDK). After each method's examples the clients still work: a send, a poll and
a commit to the broker succeed (a bad value a client kept would fail them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st

from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    SimpleConsumer,
)
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


@dataclass
class Clients:
    """The broker and running clients one transport's examples call."""

    broker: BrokerOver
    producer: Producer
    reader: LitePullConsumer
    simple: SimpleConsumer | None  # None over rocketmq:// (RocketMQ 4 has no pop)
    received: list[MessageExt]  # by the SimpleConsumer (their receipts may be settled since)
    pulled: list[MessageExt]  # by the LitePullConsumer (no receipt)


@pytest.fixture(scope="module", params=TRANSPORTS)
def clients(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Clients]:
    data_dir = tmp_path_factory.mktemp(f"fuzz-api-{request.param}") / "broker"
    with contextlib.ExitStack() as stack:
        b = stack.enter_context(broker_over(request.param, data_dir))
        producer = stack.enter_context(Producer(b.address))
        producer.send_batch([Message(TOPIC, b"m%d" % i, sharding_key=f"k{i}") for i in range(32)])
        reader = LitePullConsumer(
            "fuzz-readers", b.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
        )
        reader.assign(producer.fetch_publish_message_queues(TOPIC))
        stack.enter_context(reader)
        pulled = bounded(lambda: reader.poll(timeout=5.0))
        simple, received = None, []
        if request.param == "grpc":
            simple = SimpleConsumer("fuzz-simple", b.address, await_duration=0.05)
            simple.subscribe(TOPIC)
            stack.enter_context(simple)
            received = bounded(lambda: simple.receive(max_messages=4, invisible_duration=30))
        assert pulled and (received or simple is None), "the fixture's clients read the topic"
        yield Clients(b, producer, reader, simple, received, pulled)


def still_works(c: Clients) -> None:
    """A send, a poll, a commit (of what the reader holds) and a receive succeed."""
    result = bounded(lambda: c.producer.send(Message(TOPIC, b"after", sharding_key="k0")))
    assert result.queue_offset >= 0
    queues = bounded(lambda: c.producer.fetch_publish_message_queues(TOPIC))
    bounded(lambda: c.reader.assign(queues))  # what the examples reassigned
    c.reader.resume(queues)  # what the examples paused
    bounded(lambda: c.reader.poll(timeout=0.05))
    bounded(lambda: c.reader.commit())
    simple = c.simple
    if simple is not None:
        resubscribe(simple)  # what the examples unsubscribed, narrowed or added
        bounded(lambda: simple.receive(max_messages=1, invisible_duration=1))


#: Each public method and a strategy of the (args, kwargs) it is called with.
def calls(c: Clients) -> dict[str, tuple[Callable[..., Any], st.SearchStrategy[Any]]]:
    p, r = c.producer, c.reader
    held = st.sampled_from(c.received + c.pulled) | wrong
    found: dict[str, tuple[Callable[..., Any], st.SearchStrategy[Any]]] = {
        "Producer.send": (
            p.send,
            args(sendable, selector=selectors, arg=wrong, timeout=floats | wrong),
        ),
        "Producer.send_async": (
            lambda *a, **kw: p.send_async(*a, **kw).result(),
            args(sendable, selector=selectors, arg=wrong),
        ),
        "Producer.send_batch": (p.send_batch, args(st.lists(sendable, max_size=3) | wrong)),
        "Producer.send_oneway": (refusing_at_once(p.send_oneway), args(sendable)),
        "Producer.fetch_publish_message_queues": (
            p.fetch_publish_message_queues,
            args(texts | wrong),
        ),
        "Producer.cancel": (p.cancel, args(texts | wrong)),
        "Producer.flush": (p.flush, args(waits | wrong)),
        "LitePullConsumer.subscribe": (
            r.subscribe,
            args(texts | wrong, expression=texts | wrong),
        ),
        "LitePullConsumer.assign": (r.assign, args(queue_lists)),
        "LitePullConsumer.committed": (r.committed, args(mqs)),
        "LitePullConsumer.offsets_for_timestamp": (
            r.offsets_for_timestamp,
            args(mqs, floats | wrong),
        ),
        "LitePullConsumer.seek": (r.seek, args(mqs, ints | wrong)),
        "LitePullConsumer.seek_to_begin": (r.seek_to_begin, args(mqs)),
        "LitePullConsumer.seek_to_end": (r.seek_to_end, args(mqs)),
        "LitePullConsumer.commit": (
            r.commit,
            args(offset_maps, persist=st.booleans() | wrong),
        ),
        "LitePullConsumer.pause": (r.pause, args(queue_lists)),
        "LitePullConsumer.resume": (r.resume, args(queue_lists)),
        "LitePullConsumer.poll": (r.poll, args(waits | wrong)),
        "LitePullConsumer.fetch_message_queues": (r.fetch_message_queues, args(texts | wrong)),
        "Message": (Message, args(texts | wrong, st.sampled_from([b"", b"x", "text"]) | wrong)),
        "MessageQueue": (MessageQueue, args(texts | wrong, texts | wrong, ints | wrong)),
    }
    s = c.simple
    if s is not None:
        found |= {
            "SimpleConsumer.receive": (
                s.receive,
                args(ints | wrong, invisible_duration=floats | wrong),
            ),
            "SimpleConsumer.subscribe": (
                s.subscribe,
                args(texts | wrong, expression=texts | wrong),
            ),
            "SimpleConsumer.unsubscribe": (s.unsubscribe, args(texts | wrong)),
            "SimpleConsumer.ack": (s.ack, args(held)),
            "SimpleConsumer.keep_invisible": (
                lambda *a, **kw: kept_invisible(s, *a, **kw),
                args(held, invisible_duration=floats | wrong),
            ),
            "SimpleConsumer.change_invisible_duration": (
                s.change_invisible_duration,
                args(held, floats | wrong),
            ),
        }
    return found


def kept_invisible(simple: SimpleConsumer, *a: Any, **kw: Any) -> None:
    """keep_invisible(*a, **kw), entered and left at once."""
    with simple.keep_invisible(*a, **kw):
        pass


METHODS = [
    "Producer.send", "Producer.send_async", "Producer.send_batch", "Producer.send_oneway",
    "Producer.fetch_publish_message_queues", "Producer.cancel", "Producer.flush",
    "LitePullConsumer.subscribe", "LitePullConsumer.assign", "LitePullConsumer.committed",
    "LitePullConsumer.offsets_for_timestamp",
    "LitePullConsumer.seek", "LitePullConsumer.seek_to_begin", "LitePullConsumer.seek_to_end",
    "LitePullConsumer.commit", "LitePullConsumer.pause", "LitePullConsumer.resume",
    "LitePullConsumer.poll", "LitePullConsumer.fetch_message_queues",
    "SimpleConsumer.subscribe", "SimpleConsumer.unsubscribe", "SimpleConsumer.receive",
    "SimpleConsumer.ack", "SimpleConsumer.change_invisible_duration",
    "SimpleConsumer.keep_invisible", "Message", "MessageQueue",
]  # fmt: skip
CLASSES = {"Producer": Producer, "LitePullConsumer": LitePullConsumer,
           "SimpleConsumer": SimpleConsumer}  # fmt: skip


def test_every_public_method_is_listed() -> None:
    public = {f"{n}.{m}" for n, cls in CLASSES.items() for m in methods_with_arguments(cls)}
    assert sorted(public - set(METHODS)) == []


def test_every_public_method_is_fuzzed(clients: Clients) -> None:
    simple = [m for m in METHODS if m.startswith("SimpleConsumer.")]
    expected = METHODS if clients.simple is not None else sorted(set(METHODS) - set(simple))
    assert sorted(calls(clients)) == sorted(expected)


@pytest.mark.parametrize("name", METHODS)
def test_hostile_arguments_raise_only_the_sdks_errors(clients: Clients, name: str) -> None:
    found = calls(clients)
    if name not in found:
        pytest.skip(f"{name} is not served over {clients.broker.transport}")
    method, arguments = found[name]
    run_examples(name, method, arguments)
    still_works(clients)
