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
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
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
from sdk.errors import OrderMQError
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over
from tests.fuzzing import fuzz_settings

TOPIC = "orders"
#: Longest any call may take (the bounded waits below are far shorter).
CALL_SECONDS = 15.0

#: Values of the wrong type, for any parameter.
WRONG_TYPES = [None, b"bytes", 1.5, [], {}, object(), True]
TEXT = [
    "", " ", TOPIC, "no-such-topic", "a" * 256, "bad topic", "%RETRY%orders", "\x00", "é",
    "*", "TagA || TagB", "||", "rmq_sys_x", "a\nb",
]  # fmt: skip
INTS = [-1, 0, 1, 7, 2**31, 2**63, -(2**63), 2**64, 10**20]
FLOATS = [-1.0, 0.0, 0.001, math.nan, math.inf, -math.inf, 1e300, -0.0]
#: Waits that must end (a poll or receive waits this long at most when nothing comes).
SHORT_WAITS = [-1.0, 0.0, 0.001, 0.05, math.nan, -math.inf]

texts = st.sampled_from(TEXT) | st.text(max_size=20)
ints = st.sampled_from(INTS) | st.integers()
floats = st.sampled_from(FLOATS) | st.floats()
wrong = st.sampled_from(WRONG_TYPES)


def queues_of(topic: str) -> st.SearchStrategy[MessageQueue]:
    """Queues of `topic` and of elsewhere: real ones, and ones nobody has."""
    return st.builds(
        MessageQueue,
        st.sampled_from([topic, "no-such-topic", ""]),
        st.sampled_from(["broker-a", "broker-zz", ""]),
        st.sampled_from([0, 1, 7, 8, 99, -1, 2**40]),
    )


mqs = queues_of(TOPIC) | wrong
messages = st.builds(
    Message,
    st.sampled_from([TOPIC, "no-such-topic-yet"]),
    st.sampled_from([b"x", b"y" * 1000]),
    tags=st.none() | st.sampled_from(["TagA", "a" * 200]),
    keys=st.sampled_from([(), ("k1",), ("k1", "k2")]),
    sharding_key=st.none() | st.sampled_from(["k", "é" * 10]),
)


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


def bounded(call: Callable[[], Any], seconds: float = CALL_SECONDS) -> Any:
    """`call()` in a thread: its result or its exception; fails if it takes over `seconds`."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"the call did not return within {seconds} s"
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


def check(what: str, call: Callable[[], Any]) -> None:
    """The call returns, or raises OrderMQError or TypeError, within its bound."""
    try:
        bounded(call)
    except (OrderMQError, TypeError):
        pass
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"{what} raised {type(exc).__name__}: {exc}") from exc


def still_works(c: Clients) -> None:
    """A send, a poll and a commit to the broker (of what the reader holds) succeed."""
    result = bounded(lambda: c.producer.send(Message(TOPIC, b"after", sharding_key="k0")))
    assert result.queue_offset >= 0
    assert bounded(lambda: c.producer.fetch_publish_message_queues(TOPIC))
    c.reader.resume(sorted(c.reader.assignment()))  # what the examples paused
    bounded(lambda: c.reader.poll(timeout=0.05))
    bounded(lambda: c.reader.commit())


def args(*positional: st.SearchStrategy[Any], **optional: st.SearchStrategy[Any]) -> Any:
    """A strategy of (args, kwargs): each positional argument, and any of the keywords."""
    return st.tuples(st.tuples(*positional), st.fixed_dictionaries({}, optional=optional))


#: Each public method and a strategy of the (args, kwargs) it is called with.
def calls(c: Clients) -> dict[str, tuple[Callable[..., Any], st.SearchStrategy[Any]]]:
    p, r = c.producer, c.reader
    held = st.sampled_from(c.received + c.pulled) | wrong
    waits = st.sampled_from(SHORT_WAITS)
    hashable = queues_of(TOPIC) | wrong.filter(lambda v: v.__hash__ is not None)
    offsets = st.dictionaries(hashable, ints | wrong, max_size=2) | wrong
    queue_lists = st.lists(mqs, max_size=3) | wrong
    sendable = messages | wrong
    found: dict[str, tuple[Callable[..., Any], st.SearchStrategy[Any]]] = {
        "Producer.send": (p.send, args(sendable, timeout=floats | wrong)),
        "Producer.send_batch": (p.send_batch, args(st.lists(sendable, max_size=3) | wrong)),
        "Producer.send_oneway": (p.send_oneway, args(sendable)),
        "Producer.fetch_publish_message_queues": (
            p.fetch_publish_message_queues,
            args(texts | wrong),
        ),
        "Producer.cancel": (p.cancel, args(texts | wrong)),
        "Producer.flush": (p.flush, args(waits | wrong)),
        "LitePullConsumer.committed": (r.committed, args(mqs)),
        "LitePullConsumer.offsets_for_timestamp": (
            r.offsets_for_timestamp,
            args(mqs, floats | wrong),
        ),
        "LitePullConsumer.seek": (r.seek, args(mqs, ints | wrong)),
        "LitePullConsumer.seek_to_begin": (r.seek_to_begin, args(mqs)),
        "LitePullConsumer.seek_to_end": (r.seek_to_end, args(mqs)),
        "LitePullConsumer.commit": (r.commit, args(offsets)),
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
            "SimpleConsumer.ack": (s.ack, args(held)),
            "SimpleConsumer.change_invisible_duration": (
                s.change_invisible_duration,
                args(held, floats | wrong),
            ),
        }
    return found


METHODS = [
    "Producer.send", "Producer.send_batch", "Producer.send_oneway",
    "Producer.fetch_publish_message_queues", "Producer.cancel", "Producer.flush",
    "LitePullConsumer.committed", "LitePullConsumer.offsets_for_timestamp",
    "LitePullConsumer.seek", "LitePullConsumer.seek_to_begin", "LitePullConsumer.seek_to_end",
    "LitePullConsumer.commit", "LitePullConsumer.pause", "LitePullConsumer.resume",
    "LitePullConsumer.poll", "LitePullConsumer.fetch_message_queues",
    "SimpleConsumer.receive", "SimpleConsumer.ack", "SimpleConsumer.change_invisible_duration",
    "Message", "MessageQueue",
]  # fmt: skip


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

    @fuzz_settings(12, 300)
    @given(arguments)
    def run(drawn: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        positional, keywords = drawn
        check(f"{name}{drawn!r}", lambda: method(*positional, **keywords))

    run()
    still_works(clients)
