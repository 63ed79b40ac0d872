"""Key mode (ordering=ProcessingOrder.KEY): order per sharding key, keys of a queue in parallel.

Each test runs over both transports. The topic has one queue, so every key shares it: in
queue mode its messages are called one at a time; in key mode different keys run side by
side, each key strictly in order and never twice at once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from sdk import (
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageQueue,
    ProcessingOrder,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk._transport.broker_client import BrokerClient
from sdk.consumer.key_dispatch import KeyDispatch
from sdk.errors import InvalidArgumentError
from tests.component.pulling import read_queue
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over
from tests.support import wait_until

TOPIC = "keyed"
FAST = PushConsumerConfig(suspend_current_queue_time=0.01, persist_interval=0.2)


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    """A broker whose topic TOPIC has a single queue, over each transport in turn."""
    with broker_over(request.param, tmp_path / "broker") as b:

        async def create() -> None:
            client = BrokerClient(b.grpc_address)
            try:
                await client.create_topic(TOPIC, 1)
            finally:
                await client.close()

        asyncio.run(create())
        yield b


def send(broker: BrokerOver, keys: list[str], per_key: int) -> None:
    """`per_key` messages "key:seq" for each key, keys interleaved in the queue."""
    with Producer(broker.address) as p:
        p.send_batch([Message(TOPIC, f"{k}:{s}".encode(), sharding_key=k)
                      for s in range(per_key) for k in keys])  # fmt: skip


class Timeline(MessageListenerOrderly):
    """Records every call (key, seqs, start, end) and how many ran at once; each call
    sleeps `work` seconds; a body in `fail` fails its call. Calls after the first
    `open_calls` wait for `gate` before they begin their work (None: none waits)."""

    def __init__(
        self, work: float = 0.0, fail: frozenset[bytes] = frozenset(), open_calls: int | None = None
    ) -> None:
        self.work, self.fail, self.open_calls = work, fail, open_calls
        self.gate = threading.Event()
        self.calls: list[tuple[str, list[int], float, float]] = []
        self.running = self.most_at_once = self.begun = 0
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.begun += 1
            gated = self.open_calls is not None and self.begun > self.open_calls
        if gated:
            self.gate.wait()
        with self.lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        start = time.monotonic()
        time.sleep(self.work)
        failed = any(m.body in self.fail for m in msgs)
        with self.lock:
            self.running -= 1
            if not failed:
                key = msgs[0].body.decode().split(":")[0]
                seqs = [int(m.body.decode().split(":")[1]) for m in msgs]
                self.calls.append((key, seqs, start, time.monotonic()))
        if failed:
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    def handled(self) -> int:
        with self.lock:
            return sum(len(seqs) for _k, seqs, _s, _e in self.calls)

    def by_key(self) -> dict[str, list[tuple[list[int], float, float]]]:
        out: dict[str, list[tuple[list[int], float, float]]] = defaultdict(list)
        with self.lock:
            for key, seqs, start, end in self.calls:
                out[key].append((seqs, start, end))
        return out


def consumer(broker: BrokerOver, listener: object, ordering: ProcessingOrder,
             **kw: object) -> PushConsumer:  # fmt: skip
    kw.setdefault("config", FAST)
    c = PushConsumer("g", broker.address, ordering=ordering,
                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET, **kw)  # type: ignore[arg-type]  # fmt: skip
    c.subscribe(TOPIC)
    c.register_message_listener(listener)  # type: ignore[arg-type]
    return c


def assert_in_order_one_call_at_a_time(listener: Timeline, keys: list[str], per_key: int) -> None:
    for key in keys:
        calls = sorted(listener.by_key()[key], key=lambda c: c[1])
        assert [s for seqs, _b, _e in calls for s in seqs] == list(range(per_key)), key
        for (_s, _b, end), (_s2, begin, _e) in itertools.pairwise(calls):
            assert begin >= end, f"{key}: a call began before the previous one ended"


@pytest.mark.parametrize("ordering", [ProcessingOrder.QUEUE, ProcessingOrder.KEY])
def test_keys_of_one_queue_run_side_by_side_in_key_mode_each_in_order(
    broker: BrokerOver, ordering: ProcessingOrder
) -> None:
    keys, per_key = [f"k{i}" for i in range(8)], 5
    send(broker, keys, per_key)
    listener = Timeline(work=0.02)
    with consumer(broker, listener, ordering):
        wait_until(lambda: listener.handled() >= len(keys) * per_key, 30, "every message")
    assert_in_order_one_call_at_a_time(listener, keys, per_key)
    if ordering is ProcessingOrder.KEY:
        assert listener.most_at_once > 1, "keys of the queue ran side by side"
    else:
        assert listener.most_at_once == 1, "queue mode: one call at a time per queue"


def test_calls_at_once_stop_at_max_keys_in_flight_per_queue(broker: BrokerOver) -> None:
    keys, per_key = [f"k{i}" for i in range(12)], 2
    send(broker, keys, per_key)
    listener = Timeline(work=0.05)
    config = PushConsumerConfig(suspend_current_queue_time=0.01, max_keys_in_flight_per_queue=3)
    with consumer(broker, listener, ProcessingOrder.KEY, config=config):
        wait_until(lambda: listener.handled() >= len(keys) * per_key, 30, "every message")
    assert listener.most_at_once == 3
    assert_in_order_one_call_at_a_time(listener, keys, per_key)


def committed(broker: BrokerOver) -> int | None:
    async def query() -> int | None:
        client = BrokerClient(broker.grpc_address)
        try:
            return await client.query_offset("g", MessageQueue(TOPIC, "broker-a", 0))
        finally:
            await client.close()

    return asyncio.run(query())


def test_a_failing_key_stalls_alone_and_the_queue_commits_before_it(broker: BrokerOver) -> None:
    keys, per_key = ["bad", "k1", "k2", "k3"], 4
    send(broker, keys, per_key)  # "bad:1" is the queue's offset 4
    listener = Timeline(fail=frozenset({b"bad:1"}))
    with consumer(broker, listener, ProcessingOrder.KEY):
        wait_until(
            lambda: all(len(listener.by_key()[k]) == per_key for k in keys[1:]),
            30,
            "the other keys finished",
        )
        time.sleep(0.2)  # retries of bad:1 go on meanwhile
        assert [seqs for seqs, _b, _e in listener.by_key()["bad"]] == [[0]], "bad waits at 1"
    assert committed(broker) == 4, "the queue commits up to bad:1, its lowest unfinished"


def test_a_key_out_of_retries_goes_to_the_dead_letter_queue_and_moves_on(
    broker: BrokerOver,
) -> None:
    send(broker, ["bad", "ok"], 3)
    listener = Timeline(fail=frozenset({b"bad:0"}))
    config = PushConsumerConfig(suspend_current_queue_time=0.01, max_reconsume_times=2)
    with consumer(broker, listener, ProcessingOrder.KEY, config=config):
        wait_until(lambda: listener.handled() >= 5, 30, "all but bad:0")
    assert [seqs for seqs, _b, _e in listener.by_key()["bad"]] == [[1], [2]]
    [dead] = read_queue(broker.grpc_address, MessageQueue("%DLQ%g", "broker-a", 0))
    assert (dead.body, dead.reconsume_times) == (b"bad:0", 2)
    wait_until(lambda: committed(broker) == 6, 10, "the queue committed to its end")


@pytest.mark.parametrize("policy", ["stall", "dead-letter"])
def test_a_poisoned_key_among_100_holds_up_none_of_the_other_99(
    broker: BrokerOver, policy: str
) -> None:
    """One key's first message always fails. Stalled (retried without end, RocketMQ's
    orderly default) it holds back only its own key; dead-lettered after its retries, its
    key goes on after it. Either way the other 99 keys of the queue finish, in order."""
    keys, per_key = [f"k{i:02d}" for i in range(100)], 3
    send(broker, keys, per_key)
    listener = Timeline(fail=frozenset({b"k00:0"}))
    retries = None if policy == "stall" else 2
    config = PushConsumerConfig(suspend_current_queue_time=0.01, max_reconsume_times=retries)
    with consumer(broker, listener, ProcessingOrder.KEY, config=config):
        wait_until(lambda: listener.handled() >= 99 * per_key + (policy != "stall") * 2, 30,
                   "the other 99 keys finished")  # fmt: skip
    assert_in_order_one_call_at_a_time(listener, keys[1:], per_key)
    poisoned = [s for seqs, _b, _e in listener.by_key()["k00"] for s in seqs]
    if policy == "stall":
        assert poisoned == [], "the poisoned key waits at its first message"
        assert committed(broker) == 0, "the queue commits up to k00:0, its lowest unfinished"
    else:
        assert poisoned == [1, 2]
        [dead] = read_queue(broker.grpc_address, MessageQueue("%DLQ%g", "broker-a", 0))
        assert dead.body == b"k00:0"


def test_the_queue_driver_goes_on_after_an_unexpected_error_with_what_it_had_taken(
    broker: BrokerOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys, per_key = ["k1", "k2", "k3"], 3
    send(broker, keys, per_key)
    next_call, failed = KeyDispatch.next_call, threading.Event()

    def fails_once(self: KeyDispatch, most: int) -> object:
        if not failed.is_set():
            failed.set()
            raise RuntimeError("unexpected (test)")
        return next_call(self, most)

    monkeypatch.setattr(KeyDispatch, "next_call", fails_once)
    listener = Timeline()
    with consumer(broker, listener, ProcessingOrder.KEY):
        wait_until(lambda: listener.handled() == len(keys) * per_key, 30, "all handled")
    assert failed.is_set()
    assert_in_order_one_call_at_a_time(listener, keys, per_key)
    assert committed(broker) == len(keys) * per_key


def test_async_listeners_run_keys_side_by_side_on_the_loop(broker: BrokerOver) -> None:
    keys, per_key = [f"k{i}" for i in range(6)], 4
    send(broker, keys, per_key)

    class AsyncTimeline(MessageListenerOrderly):
        def __init__(self) -> None:
            self.seen: dict[str, list[int]] = defaultdict(list)
            self.running = self.most_at_once = 0

        async def consume_message(  # type: ignore[override]
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
            await asyncio.sleep(0.01)
            self.running -= 1
            for m in msgs:
                key, seq = m.body.decode().split(":")
                self.seen[key].append(int(seq))
            return ConsumeOrderlyStatus.SUCCESS

    async def main() -> AsyncTimeline:
        listener = AsyncTimeline()
        c = sdk.aio.PushConsumer("g", broker.address, config=FAST, ordering=ProcessingOrder.KEY,
                                 consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        c.subscribe(TOPIC)
        c.register_message_listener(listener)
        async with c:
            async with asyncio.timeout(30):
                while sum(map(len, listener.seen.values())) < len(keys) * per_key:
                    await asyncio.sleep(0.01)
        return listener

    listener = asyncio.run(main())
    assert {k: listener.seen[k] for k in keys} == {k: list(range(per_key)) for k in keys}
    assert listener.most_at_once > 1


def test_key_mode_is_refused_with_a_concurrent_listener_or_a_wrong_type(
    broker: BrokerOver,
) -> None:
    class Concurrent(MessageListenerConcurrently):
        def consume_message(self, msgs: list[MessageExt], context: object) -> object:
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = PushConsumer("g", broker.address, ordering=ProcessingOrder.KEY)
    with pytest.raises(InvalidArgumentError, match="needs a MessageListenerOrderly"):
        c.register_message_listener(Concurrent())  # type: ignore[abstract]
    with pytest.raises(InvalidArgumentError, match="ordering must be a ProcessingOrder, not str"):
        PushConsumer("g", broker.address, ordering="key")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="max_keys_in_flight_per_queue"):
        PushConsumerConfig(max_keys_in_flight_per_queue=0)


def test_a_queue_handed_over_mid_run_keeps_each_key_in_order_and_never_twice_at_once(
    broker: BrokerOver,
) -> None:
    """The first consumer shuts down while its key calls run (as on SIGTERM); the queue
    moves to the second only once those calls returned; every key stays in order, with
    no two calls of one key at once across both, and nothing is lost."""
    keys, per_key = [f"k{i}" for i in range(8)], 6
    send(broker, keys, per_key)
    # The first consumer's second round of calls waits until the second consumer is up:
    # else a busy machine may let the first finish every key before the hand-over.
    first, second = Timeline(work=0.03, open_calls=len(keys)), Timeline(work=0.03)

    def done(key: str) -> set[int]:
        return {s for t in (first, second) for seqs, _b, _e in t.by_key()[key] for s in seqs}

    a = consumer(broker, first, ProcessingOrder.KEY)
    b = consumer(broker, second, ProcessingOrder.KEY)
    a.start()
    try:
        wait_until(lambda: first.handled() >= len(keys), 30, "the first consumer busy")
        b.start()
        first.gate.set()  # its calls in flight go on: the shutdown waits for them
        a.shutdown()  # calls in flight finish; the queue is unlocked after them
        wait_until(lambda: all(done(k) == set(range(per_key)) for k in keys), 30,
                   "every message handled")  # fmt: skip
    finally:
        first.gate.set()
        a.shutdown()
        b.shutdown()
    assert second.handled() > 0, "the queue moved to the second consumer"
    for key in keys:
        calls = sorted((c for t in (first, second) for c in t.by_key()[key]), key=lambda c: c[1])
        for (_s, _b, end), (_s2, begin, _e) in itertools.pairwise(calls):
            assert begin >= end, f"{key}: two calls at once across the hand-over"
        top = -1
        for seqs, _b, _e in calls:  # a re-delivery repeats; nothing comes before its turn
            assert seqs[0] <= top + 1, f"{key}: {seqs} before {top + 1}"
            top = max(top, *seqs)
