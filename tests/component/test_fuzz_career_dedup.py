"""Career and DedupCoordinator, both faces, called with hostile arguments.

As test_fuzz_public_api.py does for the clients (with its helpers, hostile_calls.py): the
constructors of sdk.Career, sdk.aio.Career, sdk.DedupCoordinator and
sdk.aio.DedupCoordinator, and every public method that takes arguments, get values a user
could pass by mistake: empty, huge, negative and non-finite numbers, names no career may
have, endpoints nobody serves, callbacks and clocks that are none, values of the wrong
type. Each call must return within its bound or raise an OrderMQError or a TypeError. A
career that was made is started and shut down. Afterwards each object still works: the
running careers still hold their terms, and a coordinator still runs and shares work.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import strategies as st

import sdk
import sdk.aio
from mockbroker import BrokerConfig, EmbeddedBroker
from tests.component.hostile_calls import (
    args,
    bounded,
    floats,
    ints,
    methods_with_arguments,
    run_examples,
    texts,
    wrong,
)
from tests.support import wait_until

Calls = dict[str, tuple[Callable[..., Any], st.SearchStrategy[Any]]]


class EventLoop:
    """An asyncio loop on a thread of its own, for the asyncio faces."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, make: Callable[[], Any]) -> Any:
        """`make()` on the loop, awaited when it gives an awaitable; its result."""

        async def on_loop() -> Any:
            result = make()
            return await result if asyncio.iscoroutine(result) else result

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result()

    def close(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


@dataclass
class Objects:
    """The broker, a running career of each face, a coordinator of each face."""

    address: str
    loop: EventLoop
    career: sdk.Career
    async_career: sdk.aio.Career
    dedup: sdk.DedupCoordinator
    async_dedup: sdk.aio.DedupCoordinator


def nothing(epoch: int) -> None:
    """A blocking career callback that does nothing."""


async def nothing_async(epoch: int) -> None:
    """An asyncio career callback that does nothing."""


@pytest.fixture(scope="module")
def objects(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Objects]:
    data_dir = tmp_path_factory.mktemp("fuzz-career-dedup") / "broker"
    loop = EventLoop()
    with contextlib.ExitStack() as stack:
        stack.callback(loop.close)
        b = stack.enter_context(EmbeddedBroker(BrokerConfig(data_dir=data_dir)))
        career = stack.enter_context(
            sdk.Career("fuzz-blocking", b.address, nothing, nothing, nothing)
        )
        async_career = loop.run(
            lambda: sdk.aio.Career(
                "fuzz-asyncio", b.address, nothing_async, nothing_async, nothing_async
            )
        )
        loop.run(async_career.start)
        stack.callback(loop.run, async_career.shutdown)
        wait_until(lambda: career.epoch is not None and async_career.epoch is not None, 15)
        yield Objects(
            b.address,
            loop,
            career,
            async_career,
            sdk.DedupCoordinator(ttl_seconds=60),
            loop.run(lambda: sdk.aio.DedupCoordinator(ttl_seconds=60)),
        )


def made_and_stopped(make: Callable[..., sdk.Career]) -> Callable[..., None]:
    """`make(*a, **kw)`; a career it made is started and shut down."""

    def call(*a: Any, **kw: Any) -> None:
        with make(*a, **kw):
            pass

    return call


def made_and_stopped_async(loop: EventLoop) -> Callable[..., None]:
    """sdk.aio.Career(*a, **kw) on `loop`; one it made is started and shut down."""

    def call(*a: Any, **kw: Any) -> None:
        career = loop.run(lambda: sdk.aio.Career(*a, **kw))
        loop.run(career.start)
        loop.run(career.shutdown)

    return call


def career_arguments(address: str, callback: Callable[[int], Any]) -> st.SearchStrategy[Any]:
    """A career constructor's (args, kwargs)."""
    seconds = floats | ints | wrong
    callbacks = st.just(callback) | wrong
    return args(
        st.sampled_from(["fuzz-made", "a" * 121, "bad name"]) | texts | wrong,
        st.sampled_from([address, "127.0.0.1:1", "", "h:70000", [address], [""]]) | texts | wrong,
        callbacks,
        callbacks,
        callbacks,
        lease_seconds=seconds,
        renew_interval_seconds=seconds,
        execute_interval_seconds=seconds,
        topic=texts | wrong,
        clock=wrong,
        tls=wrong,
        credentials=wrong,
    )


def works() -> st.SearchStrategy[Any]:
    """What run() is given as its work: callables that return, raise, or are none."""

    def raising() -> None:
        raise sdk.OrderMQError("the work failed")

    return st.sampled_from([lambda: 1, raising, len]) | wrong


def async_works() -> st.SearchStrategy[Any]:
    """What the asyncio run() is given: coroutine functions, ones that return no
    awaitable, and what is not callable."""

    async def one() -> int:
        return 1

    return st.sampled_from([one, lambda: 1]) | wrong


def dedup_arguments() -> st.SearchStrategy[Any]:
    """A coordinator constructor's (args, kwargs): keyword-only arguments, and a
    positional one it refuses."""
    return args(ttl_seconds=floats | ints | wrong, max_keys=ints | wrong, clock=wrong) | args(
        floats
    )


def calls(o: Objects) -> Calls:
    """Each public method and a strategy of the (args, kwargs) it is called with."""
    loop = o.loop
    return {
        "Career": (made_and_stopped(sdk.Career), career_arguments(o.address, nothing)),
        "Career.holds": (o.career.holds, args(ints | wrong)),
        "aio.Career": (made_and_stopped_async(loop), career_arguments(o.address, nothing_async)),
        "aio.Career.holds": (o.async_career.holds, args(ints | wrong)),
        "DedupCoordinator": (sdk.DedupCoordinator, dedup_arguments()),
        "DedupCoordinator.run": (o.dedup.run, args(texts | wrong, works())),
        "DedupCoordinator.waiting": (o.dedup.waiting, args(texts | wrong)),
        "aio.DedupCoordinator": (
            lambda *a, **kw: loop.run(lambda: sdk.aio.DedupCoordinator(*a, **kw)),
            dedup_arguments(),
        ),
        "aio.DedupCoordinator.run": (
            lambda *a, **kw: loop.run(lambda: o.async_dedup.run(*a, **kw)),
            args(texts | wrong, async_works()),
        ),
        "aio.DedupCoordinator.waiting": (o.async_dedup.waiting, args(texts | wrong)),
    }


CLASSES = {
    "Career": sdk.Career,
    "aio.Career": sdk.aio.Career,
    "DedupCoordinator": sdk.DedupCoordinator,
    "aio.DedupCoordinator": sdk.aio.DedupCoordinator,
}
METHODS = [
    "Career", "Career.holds", "aio.Career", "aio.Career.holds", "DedupCoordinator",
    "DedupCoordinator.run", "DedupCoordinator.waiting", "aio.DedupCoordinator",
    "aio.DedupCoordinator.run", "aio.DedupCoordinator.waiting",
]  # fmt: skip


AFTER = itertools.count()


def still_works(o: Objects) -> None:
    """The careers still hold their terms; each coordinator runs once and shares."""
    assert o.career.epoch is not None and o.career.holds(o.career.epoch)
    assert o.async_career.epoch is not None and o.async_career.holds(o.async_career.epoch)
    ran: list[int] = []
    key = f"after-{next(AFTER)}"  # a key no earlier check left a value for
    assert [o.dedup.run(key, lambda: ran.append(1) or 7) for _ in range(2)] == [7, 7]

    async def seven() -> int:
        ran.append(1)
        return 7

    assert [o.loop.run(lambda: o.async_dedup.run(key, seven)) for _ in range(2)] == [7, 7]
    assert ran == [1, 1], "each coordinator ran the work once and shared its value"


def test_every_public_method_is_listed() -> None:
    public = {f"{n}.{m}" for n, cls in CLASSES.items() for m in methods_with_arguments(cls)}
    assert sorted(public | set(CLASSES)) == sorted(METHODS)


def test_every_listed_method_is_fuzzed(objects: Objects) -> None:
    assert sorted(calls(objects)) == sorted(METHODS)


@pytest.mark.parametrize("name", METHODS)
def test_hostile_arguments_raise_only_the_sdks_errors(objects: Objects, name: str) -> None:
    method, arguments = calls(objects)[name]
    run_examples(name, method, arguments, (12, 200))
    still_works(objects)


@pytest.mark.parametrize("face", [sdk.DedupCoordinator, sdk.aio.DedupCoordinator])
def test_a_clock_that_is_no_clock_is_refused_when_given(face: type[Any]) -> None:
    # It was kept, and the first run() failed with AttributeError ('str' object has no
    # attribute 'monotonic').
    with pytest.raises(sdk.OrderMQError, match=r"clock must be a Clock .* not str"):
        face(ttl_seconds=1, clock="system")


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_a_career_refuses_a_clock_that_is_no_clock(face: str) -> None:
    # It was kept: the career's campaign then failed in the background, on its first
    # read of the time, and the candidate never campaigned.
    make = sdk.Career if face == "blocking" else sdk.aio.Career
    with pytest.raises(sdk.OrderMQError, match=r"clock must be a Clock .* not int"):
        bounded(lambda: make("c", "127.0.0.1:1", nothing, nothing, nothing, clock=5))
