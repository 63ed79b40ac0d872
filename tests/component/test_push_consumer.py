"""The push consumer against an in-process broker."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageModel,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk._transport.broker_client import BrokerClient
from sdk.errors import ClientStateError, InvalidArgumentError, InvalidTagExpressionError
from sdk.testing import FakeClock
from tests.component.coordination import run
from tests.component.pulling import read_queue
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over
from tests.support import wait_until


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    """The broker, reached over each transport in turn (tests/component/transports.py)."""
    with broker_over(request.param, tmp_path / "broker") as b:
        yield b


FAST = PushConsumerConfig(suspend_current_queue_time=0.01, persist_interval=0.2)


class Recorder(MessageListenerOrderly):
    """Records (key, seq) per consumer; answers from `fail` when a body is in it."""

    def __init__(self, fail: set[bytes] | None = None) -> None:
        self.seen: list[MessageExt] = []
        self.fail = fail or set()
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.seen.extend(msgs)
        if any(m.body in self.fail for m in msgs):
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        return ConsumeOrderlyStatus.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.seen]


def consumer(broker: BrokerOver, listener: object, group: str = "g", **kw: object) -> PushConsumer:
    kw.setdefault("config", FAST)
    kw.setdefault("consume_from_where", ConsumeFromWhere.FIRST_OFFSET)
    c = PushConsumer(group, broker.address, **kw)  # type: ignore[arg-type]
    c.subscribe("orders", str(kw.pop("expression", "*")) if "expression" in kw else "*")
    c.register_message_listener(listener)  # type: ignore[arg-type]
    return c


def send_keyed(broker: BrokerOver, n: int, keys: int = 20) -> None:
    with Producer(broker.address) as p:
        msgs = [Message("orders", f"{i % keys}:{i // keys}".encode(), sharding_key=f"k{i % keys}")
                for i in range(n)]  # fmt: skip
        for i in range(0, n, 500):
            p.send_batch(msgs[i : i + 500])


def lock_owners(broker: BrokerOver, group: str = "g") -> dict[int, str]:
    state = broker.broker.state
    assert state is not None
    return {q: v.client_id for (_t, q), v in state.locks.locks(group).items() if v.live}


def test_three_consumers_share_the_queues_without_overlap_and_keep_key_order(
    broker: BrokerOver,
) -> None:
    send_keyed(broker, 3000)
    listeners = [Recorder() for _ in range(3)]
    consumers = [consumer(broker, lst) for lst in listeners]
    for c in consumers:
        c.start()
    try:
        wait_until(lambda: sum(len(lst.seen) for lst in listeners) >= 3000, 30)

        def shares() -> list[int]:
            owners = list(lock_owners(broker).values())
            return sorted(owners.count(c.client_id) for c in consumers)

        # Three owners may show while a queue moves (released, not locked yet): the
        # rebalance is over once all 8 queues are held, 3, 3 and 2.
        wait_until(lambda: shares() == [2, 3, 3], 30, "the 8 queues shared 2, 3, 3")
    finally:
        for c in consumers:
            c.shutdown()
    by_key: dict[str, list[int]] = defaultdict(list)
    for lst in listeners:
        for m in lst.seen:
            key, seq = m.body.decode().split(":")
            by_key[key].append(int(seq))
    # A key can change hands during the rebalance, but no key is seen out of order by any one
    # consumer, and nothing is lost.
    for lst in listeners:
        per_key: dict[str, list[int]] = defaultdict(list)
        for m in lst.seen:
            key, seq = m.body.decode().split(":")
            per_key[key].append(int(seq))
        for seqs in per_key.values():
            assert seqs == sorted(seqs)
    assert all(set(seqs) == set(range(150)) for seqs in by_key.values())
    assert lock_owners(broker) == {}, "shutdown unlocks"


def test_a_message_that_always_fails_reaches_the_dlq_and_the_queue_moves_on(
    broker: BrokerOver,
) -> None:
    with Producer(broker.address) as p:
        p.send_batch(
            [Message("orders", b, sharding_key="same") for b in (b"ok-1", b"poison", b"ok-2")]
        )
    listener = Recorder(fail={b"poison"})
    config = PushConsumerConfig(suspend_current_queue_time=0.01, max_reconsume_times=3)
    with consumer(broker, listener, config=config):
        wait_until(lambda: b"ok-2" in listener.bodies(), 20)
    # RocketMQ's count: one try, then max_reconsume_times retries.
    assert listener.bodies() == [b"ok-1", *[b"poison"] * 4, b"ok-2"]
    [dead] = read_queue(broker.address, MessageQueue("%DLQ%g", "broker-a", 0))
    assert (dead.body, dead.reconsume_times) == (b"poison", 3)


def test_tag_filtering_delivers_only_matching_messages(broker: BrokerOver) -> None:
    with Producer(broker.address) as p:
        p.send_batch([Message("orders", b"%d" % i, tags="A" if i % 3 == 0 else "B",
                              sharding_key="k") for i in range(30)])  # fmt: skip
    listener = Recorder()
    c = PushConsumer("g", broker.address, config=FAST,
                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    c.subscribe("orders", "A")
    c.register_message_listener(listener)
    with c:
        wait_until(lambda: len(listener.seen) >= 10, 20)
    assert listener.bodies() == [b"%d" % i for i in range(0, 30, 3)]


def test_a_tag_expression_with_spaces_around_the_bars_matches_each_tag(
    broker: BrokerOver,
) -> None:
    tags = ["paid", "refunded", "created"]
    with Producer(broker.address) as p:
        p.send_batch([Message("orders", b"%d" % i, tags=tags[i % 3], sharding_key="k")
                      for i in range(30)])  # fmt: skip
    listener = Recorder()
    c = PushConsumer("g", broker.address, config=FAST,
                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    c.subscribe("orders", "  paid ||refunded ")
    c.register_message_listener(listener)
    with c:
        wait_until(lambda: len(listener.seen) >= 20, 20)
    assert listener.bodies() == [b"%d" % i for i in range(30) if i % 3 != 2]


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        (ConsumeFromWhere.FIRST_OFFSET, [b"old", b"new"]),
        (ConsumeFromWhere.LAST_OFFSET, [b"old", b"new"]),  # a young queue
        (ConsumeFromWhere.TIMESTAMP, [b"new"]),
    ],
)
def test_consume_from_where_for_a_new_group(
    tmp_path: Path, where: ConsumeFromWhere, expected: list[bytes]
) -> None:
    clock = FakeClock()
    config = BrokerConfig(data_dir=tmp_path)
    with EmbeddedBroker(config, clock=clock) as broker, Producer(broker.address) as p:
        p.send(Message("orders", b"old", sharding_key="k"))
        clock.advance(60)
        listener = Recorder()
        assigned = threading.Event()
        c = consumer(broker, listener, consume_from_where=where,
                     consume_timestamp=clock.now() - 1,
                     on_queues_assigned=lambda queues: assigned.set())  # fmt: skip
        with c:
            assert assigned.wait(20), "the start offsets are fixed before this hook runs"
            p.send(Message("orders", b"new", sharding_key="k"))
            wait_until(lambda: b"new" in listener.bodies(), 20)
        assert listener.bodies() == expected


def test_offsets_survive_a_consumer_restart(broker: BrokerOver) -> None:
    send_keyed(broker, 200)
    first = Recorder()
    with consumer(broker, first):
        wait_until(lambda: len(first.seen) == 200, 20)
    queues = {m.queue for m in first.seen}
    ends = {q: max(m.queue_offset for m in first.seen if m.queue == q) + 1 for q in queues}

    async def committed(c: BrokerClient) -> dict[MessageQueue, int | None]:
        return {q: await c.query_offset("g", q) for q in queues}

    assert run(broker.grpc_address, committed) == ends, "shutdown persisted every offset"
    second = Recorder()
    with consumer(broker, second):
        send_keyed(broker, 10)
        wait_until(lambda: len(second.seen) >= 10, 20)
    assert all(m.queue_offset >= ends.get(m.queue, 0) for m in second.seen)
    assert len(second.seen) == 10


def test_rebalance_hooks_see_queues_after_lock_and_before_unlock(broker: BrokerOver) -> None:
    events: list[tuple[str, int, bool]] = []

    def assigned(queues: list[MessageQueue]) -> None:
        owners = lock_owners(broker)
        events.append(("assigned", len(queues), all(q.queue_id in owners for q in queues)))

    def revoked(queues: list[MessageQueue]) -> None:
        owners = lock_owners(broker)
        events.append(("revoked", len(queues), all(q.queue_id in owners for q in queues)))

    with Producer(broker.address) as p:  # RocketMQ creates a topic by its first send
        p.send(Message("orders", b"x"))
    c = consumer(broker, Recorder(), on_queues_assigned=assigned, on_queues_revoked=revoked)
    with c:
        wait_until(lambda: bool(events), 20)
    assert events == [("assigned", 8, True), ("revoked", 8, True)]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_concurrent_listener_retries_through_the_retry_topic(
    tmp_path: Path, transport: str
) -> None:
    clock = FakeClock()
    attempts: dict[bytes, int] = defaultdict(int)

    class Flaky(MessageListenerConcurrently):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeConcurrentlyStatus:
            for m in msgs:
                attempts[m.body] += 1
                if m.body == b"flaky" and m.reconsume_times == 0:
                    assert m.topic == "orders"
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    with broker_over(transport, tmp_path, clock=clock) as broker:
        with Producer(broker.address) as p:
            p.send_batch([Message("orders", b"fine"), Message("orders", b"flaky")])
        with consumer(broker, Flaky()):
            wait_until(lambda: attempts[b"flaky"] == 1 and attempts[b"fine"] == 1, 20)
            state = broker.broker.state
            assert state is not None
            # the consumer's send-back must have reached the broker before time moves on
            wait_until(lambda: state.scheduler.pending == 1, 20, "the scheduled retry")
            clock.advance(10.1)  # the retry's delay level 3: 10 s on the broker clock
            wait_until(lambda: attempts[b"flaky"] == 2, 20)
    assert dict(attempts) == {b"fine": 1, b"flaky": 2}


def test_async_listeners_on_the_asyncio_consumer(broker: BrokerOver) -> None:
    send_keyed(broker, 100, keys=5)

    class AsyncRecorder(MessageListenerOrderly):
        def __init__(self) -> None:
            self.seen: list[bytes] = []

        async def consume_message(  # type: ignore[override]
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            await asyncio.sleep(0)
            self.seen.extend(m.body for m in msgs)
            return ConsumeOrderlyStatus.SUCCESS

    async def main() -> list[bytes]:
        listener = AsyncRecorder()
        c = sdk.aio.PushConsumer("g", broker.address, config=FAST,
                                 consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        c.subscribe("orders")
        c.register_message_listener(listener)
        async with c:
            for _ in range(2000):  # at most 20 s
                if len(listener.seen) >= 100:
                    break
                await asyncio.sleep(0.01)
        return listener.seen

    seen = asyncio.run(main())
    for key in range(5):
        seqs = [int(b.split(b":")[1]) for b in seen if b.startswith(b"%d:" % key)]
        assert seqs == list(range(20))


def test_bad_input_is_refused_at_the_call(broker: BrokerOver) -> None:
    c = PushConsumer("g", broker.address)
    with pytest.raises(InvalidArgumentError, match="MessageListenerOrderly"):
        c.register_message_listener(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidTagExpressionError):
        c.subscribe("orders", "A ||")
    with pytest.raises(ClientStateError, match="listener"):
        c.start()
    with pytest.raises(InvalidArgumentError, match="pull_threshold_for_queue"):
        PushConsumerConfig(pull_threshold_for_queue=0)
    with pytest.raises(InvalidArgumentError, match="suspend_current_queue_time"):
        PushConsumerConfig(suspend_current_queue_time=60)
    with pytest.raises(InvalidArgumentError, match="consume_timestamp"):
        PushConsumer("g", broker.address, consume_from_where=ConsumeFromWhere.TIMESTAMP)
    send_keyed(broker, 1)
    started = consumer(broker, Recorder())
    with started, pytest.raises(ClientStateError, match="before start"):
        started.subscribe("other")


def test_broadcasting_members_each_get_every_message_and_keep_their_own_offsets(
    broker: BrokerOver, tmp_path: Path
) -> None:
    send_keyed(broker, 300)
    listeners = [Recorder(), Recorder()]

    def member(i: int, listener: Recorder) -> PushConsumer:
        c = PushConsumer("fanout", broker.address, message_model=MessageModel.BROADCASTING,
                         consume_from_where=ConsumeFromWhere.FIRST_OFFSET, config=FAST,
                         offset_dir=tmp_path / f"member-{i}")  # fmt: skip
        c.subscribe("orders")
        c.register_message_listener(listener)
        return c

    members = [member(i, lst) for i, lst in enumerate(listeners)]
    for c in members:
        c.start()
    try:
        wait_until(lambda: all(len(lst.seen) == 300 for lst in listeners), 20)
    finally:
        for c in members:
            c.shutdown()
    assert lock_owners(broker, "fanout") == {}, "broadcasting members take no locks"
    assert (tmp_path / "member-0" / "offsets.json").exists()
    send_keyed(broker, 20)
    again = Recorder()
    with member(0, again):
        wait_until(lambda: len(again.seen) == 20, 20)
    assert len(again.seen) == 20, "the restarted member resumed from its own offsets"


def test_consumers_log_stable_events(broker: BrokerOver, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "ordermq")
    send_keyed(broker, 10)
    with consumer(broker, Recorder()):
        wait_until(lambda: any(getattr(r, "event", "") == "queue.added" for r in caplog.records))
    events = {getattr(r, "event", None) for r in caplog.records}
    assert {"lock.granted", "queue.added", "rebalance", "queue.removed"} <= events
