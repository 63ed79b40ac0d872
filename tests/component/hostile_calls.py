"""Hostile arguments for the clients' public methods, and how a call of one is judged.

Shared by the public API fuzz modules (test_fuzz_public_api*.py): the values a user could
pass by mistake (empty, huge, negative and non-finite numbers, names no broker has, queues
a topic does not have, values of the wrong type), a strategy of a method's (args, kwargs),
and `check`: the call returns, or raises an OrderMQError or a TypeError, within its bound.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import threading
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sdk import Message, MessageQueue
from sdk.errors import InvalidMessageError, OrderMQError
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
    properties=st.none() | st.sampled_from([{"p": "v"}]),
    delay_seconds=st.none() | st.sampled_from([1, 3600.5]),  # what a transaction refuses
)
#: What a send is given: messages, and values that are none.
sendable = messages | wrong
waits = st.sampled_from(SHORT_WAITS)
#: What send()'s selector is given: none, what is no selector, and what picks a bad queue.
selectors = st.none() | wrong | st.sampled_from([len, lambda queues, message, arg: queues[-1]])
queue_lists = st.lists(mqs, max_size=3) | wrong
#: What commit() is given: queue -> offset maps (keys of any hashable type), and others.
offset_maps = (
    st.dictionaries(
        queues_of(TOPIC) | wrong.filter(lambda v: v.__hash__ is not None), ints | wrong, max_size=2
    )
    | wrong
)


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
    with contextlib.suppress(OrderMQError):
        made(what, call)


def run_examples(
    name: str,
    method: Callable[..., Any],
    arguments: st.SearchStrategy[Any],
    examples: tuple[int, int] = (12, 300),
) -> None:
    """`method` called with each drawn (args, kwargs); see check.

    `examples`: as fuzz_settings takes them (make test's, the long form's).
    """

    @fuzz_settings(*examples)
    @given(arguments)
    def run(drawn: tuple[tuple[Any, ...], dict[str, Any]]) -> None:
        positional, keywords = drawn
        check(f"{name}{drawn!r}", lambda: method(*positional, **keywords))

    run()


def made(what: str, call: Callable[[], Any]) -> Any:
    """`call()`'s result within its bound; None when it raised a TypeError; an OrderMQError
    it raised goes to the caller; anything else fails the test."""
    try:
        return bounded(call)
    except (OrderMQError, AssertionError):
        raise
    except TypeError:
        return None
    except Exception as exc:
        raise AssertionError(f"{what} raised {type(exc).__name__}: {exc}") from exc


def args(*positional: st.SearchStrategy[Any], **optional: st.SearchStrategy[Any]) -> Any:
    """A strategy of (args, kwargs): each positional argument, and any of the keywords."""
    return st.tuples(st.tuples(*positional), st.fixed_dictionaries({}, optional=optional))


def methods_with_arguments(cls: type) -> list[str]:
    """The public methods of `cls` that take an argument (start() and the like take none)."""
    return [
        name
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_") and len(inspect.signature(member).parameters) > 1
    ]


def resubscribe(simple: Any) -> None:
    """Subscribe to TOPIC only (the examples' topics, valid ones included, are dropped):
    receive() takes subscribed topics in turn, and reports one that does not exist."""
    for topic in simple.subscriptions():
        simple.unsubscribe(topic)
    simple.subscribe(TOPIC)


def refusing_at_once(send_oneway: Callable[[Any], None]) -> Callable[[Any], None]:
    """`send_oneway`, which must refuse what is not a Message when called: a one-way send
    reports nothing later (a failure is only logged), so a value it cannot send at all
    would otherwise be lost without the caller knowing."""

    def call(message: Any) -> None:
        if isinstance(message, Message):
            send_oneway(message)
            return
        try:
            send_oneway(message)
        except InvalidMessageError:
            return
        raise AssertionError(f"send_oneway({message!r}) did not raise InvalidMessageError")

    return call
