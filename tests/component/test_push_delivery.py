"""Push delivery with credits (PushConsumerConfig.delivery="push") against an in-process broker.

The broker sends each held queue's batches on the Exchange stream within the credit the
consumer grants; orderly consumers keep their locks, and the broker ends a queue's
subscription when its lock is lost. Over rocketmq://, or with a broker that does not
serve subscriptions, the consumer pulls.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.errors import invalid
from mockbroker.push import Credit
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
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk._transport.broker_client import BrokerClient
from sdk._transport.protocol import GroupInfo, PullResult
from sdk.consumer.config import MIB
from sdk.consumer.process_queue import ProcessQueue
from sdk.errors import LockNotHeldError, StaleEpochError
from tests.component.transports import BrokerOver, broker_over
from tests.support import wait_until

PUSH = PushConsumerConfig(
    suspend_current_queue_time=0.01, persist_interval=0.2, pull_error_backoff=0.2, delivery="push"
)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerOver]:
    """A broker with one queue per topic, reached over gRPC."""
    with broker_over("grpc", tmp_path / "broker", default_queues=1) as b:
        yield b


class Recorder(MessageListenerOrderly):
    """Records the bodies it is called with; holds a call on `hold` until `go` is set."""

    def __init__(self, hold: bytes | None = None, *, hold_all: bool = False) -> None:
        self.seen: list[bytes] = []
        self.hold = hold
        self.hold_all = hold_all  # hold every call until `go`
        self.holding = threading.Event()
        self.go = threading.Event()
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.seen.extend(m.body for m in msgs)
        if self.hold_all or any(m.body == self.hold for m in msgs):
            self.holding.set()
            self.go.wait(30)
        return ConsumeOrderlyStatus.SUCCESS

    def bodies(self) -> list[bytes]:
        with self.lock:
            return list(self.seen)


def body(i: int) -> bytes:
    return f"{i:05d}".encode()


def send(address: str, n: int, start: int = 0) -> None:
    with Producer(address) as p:
        msgs = [Message("orders", body(i), sharding_key="k") for i in range(start, start + n)]
        for i in range(0, n, 500):
            p.send_batch(msgs[i : i + 500])


def consumer(
    address: str, listener: Recorder, config: PushConsumerConfig = PUSH, group: str = "g"
) -> PushConsumer:
    c = PushConsumer(
        group, address, config=config, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    c.subscribe("orders", "*")
    c.register_message_listener(listener)
    return c


def subscriptions(broker: EmbeddedBroker) -> list[Credit]:
    """The credit of every push subscription the broker serves now."""
    messaging = broker.broker._messaging
    assert messaging is not None
    return messaging.exchanges.subscriptions


def process_queue(c: PushConsumer) -> ProcessQueue | None:
    queues = list(c._core._queues.values())
    return queues[0] if queues else None


def pulls(broker: EmbeddedBroker) -> int:
    state = broker.broker.state
    assert state is not None
    return sum(n for (method, _), n in state.requests.by_code.items() if method == "Pull")


def test_an_orderly_consumer_gets_a_queue_in_order_through_push(tmp_path: Path) -> None:
    with broker_over("grpc", tmp_path / "broker") as broker:  # 8 queues
        msgs = [Message("orders", f"{j % 16}:{j}".encode(), sharding_key=f"k{j % 16}")
                for j in range(2000)]  # fmt: skip
        with Producer(broker.address) as p:
            for i in range(0, 2000, 500):
                p.send_batch(msgs[i : i + 500])
        listener = Recorder()
        c = consumer(broker.address, listener)
        c.start()
        try:
            wait_until(lambda: len(listener.bodies()) >= 2000, 30, "every message")
            assert len(subscriptions(broker.embedded)) == 8  # one per held queue
        finally:
            c.shutdown()
        assert pulls(broker.embedded) == 0
        by_key: dict[str, list[int]] = {}
        for b in listener.bodies():
            key, seq = b.decode().split(":")
            by_key.setdefault(key, []).append(int(seq))
        assert sum(len(v) for v in by_key.values()) == 2000
        for seqs in by_key.values():
            assert seqs == sorted(seqs)


def test_the_broker_sends_no_more_than_the_credit_while_the_listener_is_slow(
    broker: BrokerOver,
) -> None:
    send(broker.address, 300)
    listener = Recorder(hold=body(0))
    config = dataclasses.replace(PUSH, pull_threshold_for_queue=10)
    c = consumer(broker.address, listener, config)
    c.start()
    try:
        assert listener.holding.wait(30)

        def spent() -> bool:
            subs = subscriptions(broker.embedded)
            return len(subs) == 1 and subs[0].messages == 0

        wait_until(spent, 10, "the subscription's credit spent")
        (credit,) = subscriptions(broker.embedded)
        assert credit.sent == 10  # the cache's room, and not one more
        pq = process_queue(c)
        assert pq is not None and pq.count == 10
        listener.go.set()
        wait_until(lambda: len(listener.bodies()) >= 300, 30, "every message")
    finally:
        listener.go.set()
        c.shutdown()
    assert listener.bodies() == [body(i) for i in range(300)]
    assert pulls(broker.embedded) == 0


def test_messages_larger_than_the_byte_threshold_keep_coming_through_push(
    broker: BrokerOver,
) -> None:
    # Each message is larger than the whole byte room: the broker sends it anyway (a
    # batch serves one record at least) and goes into debt for the difference. A client
    # whose view stopped at zero granted too little each time: the debt grew by a
    # message's excess each time until the broker's credit never opened again.
    n, big = 6, b"x" * (3 * MIB // 2)
    with Producer(broker.address) as p:
        for i in range(n):
            p.send(Message("orders", big + body(i), sharding_key="k"))
    listener = Recorder()
    c = consumer(
        broker.address, listener, dataclasses.replace(PUSH, pull_threshold_bytes_for_queue=MIB)
    )
    c.start()
    try:
        wait_until(lambda: len(listener.bodies()) >= n, 30, "every large message")
    finally:
        c.shutdown()
    assert [b[len(big) :] for b in listener.bodies()] == [body(i) for i in range(n)]
    assert pulls(broker.embedded) == 0


def test_a_lost_lock_ends_the_subscription_and_the_new_owner_goes_on_in_order(
    broker: BrokerOver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "ordermq.consumer")
    send(broker.address, 200)
    first = Recorder(hold=body(50))
    # a stays out of the group once expired: no heartbeat brings it back during the test.
    a = consumer(broker.address, first, dataclasses.replace(PUSH, heartbeat_interval=3600))
    a.start()
    b: PushConsumer | None = None
    try:
        assert first.holding.wait(30)
        assert len(subscriptions(broker.embedded)) == 1
        second = Recorder()
        b = consumer(broker.address, second)
        b.start()
        # a goes silent: the broker drops it and its lock; b takes the queue.
        broker.embedded.expire_client(a.client_id)
        wait_until(lambda: len(second.bodies()) >= 150, 30, "b consumed the rest")
        pq = process_queue(a)
        assert pq is None or not pq.locked  # a was fenced (or gave the queue up)
        # The broker ended a's subscription for its lost lock.
        assert any("does not hold its lock" in r.getMessage() for r in caplog.records)
        first.go.set()  # a's listener call, running when the lock was lost, ends
        send(broker.address, 50, start=200)
        wait_until(lambda: second.bodies()[-1:] == [body(249)], 30, "b consumed the new ones")
    finally:
        first.go.set()
        a.shutdown()
        if b is not None:
            b.shutdown()
    # a handed nothing to its listener after the call that was running when it lost the
    # lock; b went on from the committed offset, in order, and nothing was lost.
    assert first.bodies() == [body(i) for i in range(51)]
    seen = second.bodies()
    start = int(seen[0])
    assert start <= 50
    assert seen == [body(i) for i in range(start, 250)]


def test_a_rebalance_during_a_listener_call_moves_the_queue_once_the_call_ends(
    tmp_path: Path,
) -> None:
    with broker_over("grpc", tmp_path / "broker", default_queues=2) as broker:
        msgs = [Message("orders", f"{j % 20}:{j}".encode(), sharding_key=f"k{j % 20}")
                for j in range(400)]  # fmt: skip
        with Producer(broker.address) as p:
            p.send_batch(msgs)
        first = Recorder(hold_all=True)
        a = consumer(broker.address, first)
        a.start()
        b: PushConsumer | None = None
        try:
            assert first.holding.wait(30)
            wait_until(lambda: len(subscriptions(broker.embedded)) == 2, 10, "a subscribed")
            second = Recorder()
            b = consumer(broker.address, second)
            b.start()
            # a must give one queue to b, while a listener call on it runs.
            wait_until(lambda: bool(a._core._releasing_since), 30, "a releasing a queue")
            assert second.bodies() == []
            first.hold_all = False
            first.go.set()
            wait_until(lambda: len(first.bodies()) + len(second.bodies()) >= 400, 30, "all")
            assert second.bodies()
        finally:
            first.go.set()
            a.shutdown()
            if b is not None:
                b.shutdown()
    # a committed what it handled before it unlocked the queue: nothing handled twice,
    # nothing lost, and each key in order at each consumer.
    assert sorted(first.bodies() + second.bodies()) == sorted(m.body for m in msgs)
    for listener in (first, second):
        by_key: dict[str, list[int]] = {}
        for got in listener.bodies():
            key, seq = got.decode().split(":")
            by_key.setdefault(key, []).append(int(seq))
        for seqs in by_key.values():
            assert seqs == sorted(seqs)


def test_the_consumer_resubscribes_from_its_offset_after_a_broker_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "broker"
    listener = Recorder()
    with EmbeddedBroker(BrokerConfig(data_dir=data, default_queues=1)) as first:
        address = first.address
        port = int(address.rsplit(":", 1)[1])
        send(address, 100)
        c = consumer(address, listener)
        c.start()
        try:
            wait_until(lambda: len(listener.bodies()) >= 100, 30, "the first hundred")
        except BaseException:
            c.shutdown()
            raise
    try:
        with EmbeddedBroker(BrokerConfig(data_dir=data, default_queues=1, port=port)) as second:
            send(second.address, 100, start=100)
            wait_until(lambda: len(listener.bodies()) >= 200, 30, "the second hundred")
            wait_until(lambda: len(subscriptions(second)) == 1, 10, "subscribed again")
            assert pulls(second) == 0
    finally:
        c.shutdown()
    seen = listener.bodies()
    assert seen[:100] == [body(i) for i in range(100)]
    # After the restart the queue is read again from the last committed offset at most.
    again = seen[100:]
    assert again == [body(i) for i in range(int(again[0]), 200)]


def test_over_rocketmq_the_consumer_pulls(tmp_path: Path) -> None:
    with broker_over("rocketmq", tmp_path / "broker", default_queues=1) as broker:
        send(broker.address, 100)
        listener = Recorder()
        c = consumer(broker.address, listener)
        c.start()
        try:
            wait_until(lambda: len(listener.bodies()) >= 100, 30, "every message")
        finally:
            c.shutdown()
        assert listener.bodies() == [body(i) for i in range(100)]


def _refuse_as_before_push(request: object, client: str) -> NoReturn:
    """How a broker of before push delivery answered a Subscribe: an unknown body."""
    raise invalid("INVALID_ARGUMENT", "request 1 carries no send, pull or cancel")


@pytest.mark.parametrize("answer", ["UNIMPLEMENTED", "older broker"])
def test_a_broker_without_subscriptions_is_pulled_from(broker: BrokerOver, answer: str) -> None:
    messaging = broker.broker._messaging
    assert messaging is not None
    if answer == "UNIMPLEMENTED":
        messaging.exchanges._subscribe = None  # a broker that does not serve them
    else:
        messaging.exchanges._subscribe = _refuse_as_before_push
    send(broker.address, 100)
    listener = Recorder()
    c = consumer(broker.address, listener)
    c.start()
    try:
        wait_until(lambda: len(listener.bodies()) >= 100, 30, "every message")
    finally:
        c.shutdown()
    assert listener.bodies() == [body(i) for i in range(100)]
    assert pulls(broker.embedded) > 0
    assert not c._core._push


def test_a_subscription_ends_when_its_lock_changes_hands(broker: BrokerOver) -> None:
    send(broker.address, 5)
    queue = MessageQueue("orders", "broker-a", 0)
    info = GroupInfo("g", "CONSUME_ORDERLY", subscriptions=(("orders", "*"),))

    async def main() -> None:
        client = BrokerClient(broker.address)
        try:
            for who in ("a", "b"):
                await client.heartbeat(who, [info])
            epoch = (await client.lock_batch("g", "a", [queue]))[queue]
            stale = await client.subscribe(
                "g", queue, 0, client_id="a", lock_epoch=epoch + 1, credit_messages=10,
                credit_bytes=MIB,
            )  # fmt: skip
            with pytest.raises(StaleEpochError):
                await stale.next()
            sub = await client.subscribe(
                "g", queue, 0, client_id="a", lock_epoch=epoch, credit_messages=3,
                credit_bytes=MIB,
            )  # fmt: skip
            first = await sub.next()
            assert [m.queue_offset for m in first.messages] == [0, 1, 2]  # the credit
            assert (sub.credit.messages, first.next_offset) == (0, 3)
            # a's lock goes (it went silent) and b takes the queue: a's subscription,
            # waiting for credit, ends at once.
            await asyncio.to_thread(broker.embedded.expire_client, "a")
            assert await client.lock_batch("g", "b", [queue])
            async with asyncio.timeout(10):
                with pytest.raises(LockNotHeldError):
                    await sub.next()
            assert subscriptions(broker.embedded) == []
        finally:
            await client.close()

    asyncio.run(main())


def test_credit_granted_later_lets_the_broker_send_more(broker: BrokerOver) -> None:
    send(broker.address, 10)
    queue = MessageQueue("orders", "broker-a", 0)

    async def main() -> None:
        client = BrokerClient(broker.address)
        try:
            sub = await client.subscribe(
                "g", queue, 0, client_id="a", lock_epoch=0, credit_messages=4,
                credit_bytes=MIB, max_messages=3,
            )  # fmt: skip
            got = [m.queue_offset for m in (await sub.next()).messages]
            got += [m.queue_offset for m in (await sub.next()).messages]
            assert got == [0, 1, 2, 3]  # batches of 3 at most, 4 in all
            wait_until(lambda: subscriptions(broker.embedded)[0].messages == 0, 10)
            sub.grant(100, MIB)
            while len(got) < 10:
                got += [m.queue_offset for m in (await sub.next()).messages]
            assert got == list(range(10))
            sub.close()
            await asyncio.to_thread(
                wait_until, lambda: subscriptions(broker.embedded) == [], 10, "cancelled"
            )
        finally:
            await client.close()

    asyncio.run(main())


def test_a_batch_handler_takes_batches_in_the_stream_reader_until_it_declines_one(
    broker: BrokerOver,
) -> None:
    """Subscription.on_batch: batches reach the handler in the Exchange stream's reader
    task, in order, with no task hand-off; the batch it declines and the rest come from
    next(), still in order, and the credit counts every batch once."""
    send(broker.address, 10)
    queue = MessageQueue("orders", "broker-a", 0)

    async def main() -> None:
        client = BrokerClient(broker.address)
        taken: list[int] = []
        tasks: set[str] = set()

        def handler(result: PullResult) -> bool:
            offsets = [m.queue_offset for m in result.messages]
            if offsets[-1] >= 6:
                return False
            task = asyncio.current_task()
            tasks.add(task.get_name() if task else "")
            taken.extend(offsets)
            return True

        try:
            sub = await client.subscribe(
                "g", queue, 0, client_id="a", lock_epoch=0, credit_messages=10,
                credit_bytes=MIB, max_messages=3,
            )  # fmt: skip
            sub.on_batch(handler)
            got: list[int] = []
            while len(taken) + len(got) < 10:
                got += [m.queue_offset for m in (await sub.next()).messages]
            assert taken + got == list(range(10)) and taken
            assert all(name.startswith("exchange-reader") for name in tasks), tasks
            assert sub.credit.messages == 0
            sub.close()
        finally:
            await client.close()

    asyncio.run(main())


def test_a_batch_handler_that_raises_does_not_end_the_subscription_unseen(
    broker: BrokerOver,
) -> None:
    """What the handler raises comes from next() (the stream's reader goes on serving the
    others), and the subscription is still open: closing it cancels it at the broker,
    which would otherwise keep sending into it up to its credit."""
    send(broker.address, 3)
    queue = MessageQueue("orders", "broker-a", 0)

    async def main() -> None:
        client = BrokerClient(broker.address)

        def handler(result: PullResult) -> bool:
            raise RuntimeError("cannot take it")

        try:
            sub = await client.subscribe(
                "g", queue, 0, client_id="a", lock_epoch=0, credit_messages=10,
                credit_bytes=MIB, max_messages=1,
            )  # fmt: skip
            sub.on_batch(handler)
            with pytest.raises(RuntimeError, match="cannot take it"):
                await sub.next()
            assert [m.queue_offset for m in (await sub.next()).messages] == [1]
            sub.close()
            await asyncio.to_thread(
                wait_until, lambda: subscriptions(broker.embedded) == [], 10, "cancelled"
            )
        finally:
            await client.close()

    asyncio.run(main())


def test_a_concurrent_consumer_gets_every_message_through_push(broker: BrokerOver) -> None:
    send(broker.address, 300)
    seen: list[bytes] = []
    lock = threading.Lock()

    class Listener(MessageListenerConcurrently):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeConcurrentlyStatus:
            with lock:
                seen.extend(m.body for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    c = PushConsumer(
        "g", broker.address, config=PUSH, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    c.subscribe("orders", "*")
    c.register_message_listener(Listener())
    c.start()
    try:
        wait_until(lambda: len(seen) >= 300, 30, "every message")
        assert subscriptions(broker.embedded)
    finally:
        c.shutdown()
    assert sorted(seen) == [body(i) for i in range(300)]
    assert pulls(broker.embedded) == 0


def test_a_subscription_that_caught_up_waits_for_an_append_without_reading_again(
    broker: BrokerOver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At a low rate each batch is one message that reaches the queue's end: the broker
    waits for the next append right away. It read the queue once more per batch (and
    found nothing) before waiting: two reads per message, not one."""
    state = broker.embedded.broker.state
    assert state is not None
    store = state.store
    reads = 0
    get = store.get

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal reads
        reads += 1
        return get(*args, **kwargs)  # type: ignore[arg-type]

    send(broker.address, 1)  # the topic
    listener = Recorder()
    c = consumer(broker.address, listener)
    c.start()
    try:
        wait_until(lambda: len(listener.bodies()) == 1, 10, "the first message")
        monkeypatch.setattr(store, "get", counted)
        with Producer(broker.address) as p:
            for i in range(1, 41):
                p.send(Message("orders", body(i), sharding_key="k"))
                wait_until(lambda i=i: len(listener.bodies()) == i + 1, 10, "the message")
        assert listener.bodies() == [body(i) for i in range(41)]
        assert reads <= 40 + 4, reads  # a few appends may be read before they are notified
    finally:
        c.shutdown()
