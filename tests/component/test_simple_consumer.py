"""sdk.SimpleConsumer and sdk.aio.SimpleConsumer against an EmbeddedBroker on a FakeClock.

Through the public API only: a job's time to run, its expiry and re-delivery with the
attempt one higher, extension (change_invisible_duration and keep_invisible), the dead
letter after the last attempt, long polling, receipts across broker restarts, both faces,
and the errors raised before anything is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import sdk.aio
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import LitePullConsumer, Message, MessageExt, Producer, Receipt, SimpleConsumer
from sdk.errors import (
    ClientStateError,
    InvalidArgumentError,
    InvalidReceiptError,
    InvalidTagExpressionError,
    ReceiptExpiredError,
    TopicNotFoundError,
)
from sdk.testing import FakeClock
from tests.component.test_producer import Restartable
from tests.support import wait_until

TOPIC = "jobs"
GROUP = "workers"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b", port=0), clock=clock) as b:
        yield b


def send(broker: EmbeddedBroker, *bodies: bytes, topic: str = TOPIC) -> None:
    with Producer(broker.address) as producer:
        for body in bodies:
            producer.send(Message(topic, body))


def consumer(broker: EmbeddedBroker, clock: FakeClock, **kw: Any) -> SimpleConsumer:
    """A SimpleConsumer of GROUP on TOPIC that does not wait when there is nothing."""
    options: dict[str, Any] = {"await_duration": 0, "clock": clock} | kw
    c = SimpleConsumer(options.pop("group", GROUP), broker.address, **options)
    c.subscribe(TOPIC)
    return c


def pop_state(broker: EmbeddedBroker) -> dict[str, Any]:
    state = broker.broker.state
    assert state is not None
    return state.pop.describe()


@pytest.fixture
def workers(broker: EmbeddedBroker, clock: FakeClock) -> Iterator[SimpleConsumer]:
    send(broker, b"job-1", b"job-2")
    with consumer(broker, clock) as c:
        yield c


def test_a_job_is_hidden_for_its_time_to_run_then_delivered_again_unless_acked(
    workers: SimpleConsumer, clock: FakeClock
) -> None:
    got = workers.receive(max_messages=16, invisible_duration=30)
    assert sorted(m.body for m in got) == [b"job-1", b"job-2"]
    assert [m.delivery_attempt for m in got] == [1, 1]
    assert all(m.receipt is not None for m in got)
    assert workers.receive() == [], "both are hidden for their time to run"
    first, second = sorted(got, key=lambda m: m.body)
    workers.ack(first)

    clock.advance(30)  # job-2's time ran out
    again = workers.receive(invisible_duration=30)
    assert [(m.body, m.delivery_attempt) for m in again] == [(b"job-2", 2)]
    assert again[0].msg_id == second.msg_id
    with pytest.raises(ReceiptExpiredError):
        workers.ack(second)  # the first delivery's receipt
    workers.ack(again[0])
    workers.ack(again[0])  # a repeat is harmless
    clock.advance(3600)
    assert workers.receive() == [], "acked jobs never come back"


def test_change_invisible_duration_extends_a_job_and_replaces_its_receipt(
    workers: SimpleConsumer, clock: FakeClock
) -> None:
    got = workers.receive(max_messages=1, invisible_duration=10)
    [job] = got
    before = dataclasses.replace(job)  # the message as received, with its first receipt
    clock.advance(8)
    workers.change_invisible_duration(job, 30)
    assert job.receipt != before.receipt
    with pytest.raises(InvalidReceiptError):
        workers.ack(before)  # replaced by the change
    clock.advance(10)  # 18 s after the receive: past the first 10 s, within the new 30
    assert [m.body for m in workers.receive(max_messages=16, invisible_duration=5)] == [b"job-2"], (
        "the extended job stays hidden"
    )
    workers.ack(job)
    assert job.delivery_attempt == 1


def test_change_invisible_duration_to_zero_gives_a_job_back_at_once(
    workers: SimpleConsumer,
) -> None:
    [job] = workers.receive(max_messages=1, invisible_duration=60)
    workers.change_invisible_duration(job, 0)
    got = workers.receive(max_messages=16, invisible_duration=60)
    assert sorted((m.msg_id, m.delivery_attempt) for m in got if m.msg_id == job.msg_id) == [
        (job.msg_id, 2)
    ]


def test_keep_invisible_renews_until_the_ack_and_stops_there(
    workers: SimpleConsumer, broker: EmbeddedBroker, clock: FakeClock
) -> None:
    [job] = workers.receive(max_messages=1, invisible_duration=9)
    with workers.keep_invisible(job) as kept:
        for renewals in (1, 2, 3):
            clock.advance(6)  # a third of the 9 s is left: time to renew
            wait_until(lambda n=renewals: kept.renewals == n, 10, f"renewal {renewals}")
        # 18 s after the receive, twice its time to run: still hidden from the group
        others = workers.receive(max_messages=16, invisible_duration=60)
        assert [m.body for m in others] == [b"job-2"]
        workers.ack(others[0])
        workers.ack(job)
        assert not kept.active and kept.error is None
    clock.advance(3600)
    assert workers.receive(invisible_duration=60) == []
    assert kept.renewals == 3


def test_keep_invisible_stops_at_the_end_of_its_block_and_the_job_comes_back(
    workers: SimpleConsumer, clock: FakeClock
) -> None:
    [job] = workers.receive(max_messages=1, invisible_duration=9)
    with workers.keep_invisible(job, invisible_duration=12) as kept:
        clock.advance(6)
        wait_until(lambda: kept.renewals == 1, 10, "the renewal")
    assert not kept.active
    workers.receive(max_messages=1, invisible_duration=60)  # job-2, out of the way
    clock.advance(11)  # 17 s: the renewal at 6 s hid it for 12 s; nothing renewed since
    assert workers.receive(max_messages=16) == []
    clock.advance(1)
    [back] = workers.receive(max_messages=16)
    assert (back.msg_id, back.delivery_attempt) == (job.msg_id, 2)


def test_keep_invisible_reports_a_receipt_it_cannot_renew(
    workers: SimpleConsumer, clock: FakeClock
) -> None:
    [job] = workers.receive(max_messages=1, invisible_duration=9)
    stale = dataclasses.replace(job)
    workers.change_invisible_duration(job, 9)  # `stale` holds the replaced receipt
    with workers.keep_invisible(stale) as kept:
        clock.advance(6)
        wait_until(lambda: not kept.active, 10, "the keeper to give up")
    assert isinstance(kept.error, InvalidReceiptError)
    workers.ack(job)


def test_a_job_delivered_too_often_goes_to_the_dead_letter_topic(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, b"poison")
    with consumer(broker, clock, max_delivery_attempts=2) as c:
        for attempt in (1, 2):
            [job] = c.receive(max_messages=1, invisible_duration=5)
            assert (job.body, job.delivery_attempt) == (b"poison", attempt)
            clock.advance(5)  # the worker "crashed": no ack
        dead = SimpleConsumer("undertakers", broker.address, await_duration=0, clock=clock)
        dead.subscribe(f"%DLQ%{GROUP}")
        with dead:

            def arrived() -> list[MessageExt]:
                try:
                    return dead.receive(max_messages=16, invisible_duration=60)
                except TopicNotFoundError:  # the first dead letter creates the topic
                    return []

            found: list[MessageExt] = []
            wait_until(lambda: bool(found.extend(arrived()) or found), 30, "the dead letter")
            assert [m.body for m in found] == [b"poison"]
            dead.ack(found[0])
        assert c.receive(max_messages=16) == [], "a dead-lettered job is not delivered again"


def test_a_waiting_receive_is_answered_by_a_send_or_empty_when_its_time_is_up(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, b"first")
    c = consumer(broker, clock, await_duration=30)
    holder = broker.broker.state.holder  # type: ignore[union-attr]
    c.start()
    try:
        c.ack(c.receive(max_messages=1)[0])
        answers: list[list[MessageExt]] = []
        waiter = threading.Thread(target=lambda: answers.append(c.receive(max_messages=4)))
        waiter.start()
        wait_until(lambda: bool(holder.held), 10, "the receive to wait at the broker")
        send(broker, b"wake")
        waiter.join(30)
        assert [[m.body for m in a] for a in answers] == [[b"wake"]]
        c.ack(answers[0][0])

        waiter = threading.Thread(target=lambda: answers.append(c.receive(max_messages=4)))
        waiter.start()
        wait_until(lambda: bool(holder.held), 10, "the receive to wait at the broker")
        clock.advance(30)
        waiter.join(30)
        assert answers[1:] == [[]], "nothing came within await_duration"
    finally:
        c.shutdown()


def test_the_asyncio_face_receives_keeps_and_acks(broker: EmbeddedBroker, clock: FakeClock) -> None:
    send(broker, b"job-1")
    holder = broker.broker.state.holder  # type: ignore[union-attr]

    async def main() -> None:
        async with sdk.aio.SimpleConsumer(
            GROUP, broker.address, await_duration=30, clock=clock
        ) as c:
            c.subscribe(TOPIC)
            [job] = await c.receive(max_messages=4, invisible_duration=9)
            assert job.delivery_attempt == 1
            async with c.keep_invisible(job) as kept:
                clock.advance(6)
                while kept.renewals < 1:
                    await asyncio.sleep(0.01)
                waiting = asyncio.ensure_future(c.receive(max_messages=4, invisible_duration=9))
                while not holder.held:
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(send, broker, b"job-2")
                assert [m.body for m in await waiting] == [b"job-2"]
                await c.ack(job)
                assert not kept.active
            clock.advance(9)  # job-2 was not acked: it comes back
            [back] = await c.receive(max_messages=4, invisible_duration=9)
            assert (back.body, back.delivery_attempt) == (b"job-2", 2)
            await c.change_invisible_duration(back, 60)
            await c.ack(back)
            with pytest.raises(InvalidArgumentError):
                await c.receive(max_messages=0)

    asyncio.run(main())


# ---------------------------------------------------------------------- restarts


class InThreads:
    """The blocking face, called as the asyncio face is: each call awaited in a thread."""

    def __init__(self, consumer: SimpleConsumer) -> None:
        self._consumer = consumer

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        return functools.partial(asyncio.to_thread, getattr(self._consumer, name))


async def receipts_across_restarts(c: Any, broker: Restartable, clock: FakeClock) -> None:
    """Jobs received from one broker settled, left and extended at the same one restarted.

    `c` is a started consumer of GROUP on TOPIC with the asyncio face's calls; the
    consumer stays up (and its connections open) while the broker restarts under it.
    """
    done, dropped, extended = sorted(await c.receive(invisible_duration=30), key=lambda m: m.body)
    assert (done.body, dropped.body, extended.body) == (b"done", b"dropped", b"extended")
    replaced = dataclasses.replace(extended)
    await c.change_invisible_duration(extended, 120)
    await asyncio.to_thread(broker.restart)

    await c.ack(done)  # a receipt the broker handed out before its restart
    with pytest.raises(InvalidReceiptError):
        await c.ack(replaced)  # the change made before the restart still stands
    clock.advance(30)  # dropped's time to run is up; extended has 90 s left
    [back] = await c.receive(invisible_duration=30)
    assert (back.msg_id, back.delivery_attempt) == (dropped.msg_id, 2)
    with pytest.raises(ReceiptExpiredError):
        await c.ack(dropped)
    await c.change_invisible_duration(extended, 10)  # a pre-restart receipt, changed after
    await asyncio.to_thread(broker.restart)

    await c.ack(back)
    assert await c.receive(invisible_duration=30) == [], "extended is hidden for 10 s more"
    clock.advance(10)
    [again] = await c.receive(invisible_duration=30)
    assert (again.msg_id, again.delivery_attempt) == (extended.msg_id, 2)
    await c.ack(again)
    clock.advance(3600)
    assert await c.receive(invisible_duration=30) == [], "acked jobs never come back"


@pytest.mark.parametrize("face", ["blocking", "asyncio"])
def test_receipts_outlive_a_broker_restart_on_the_same_data_dir(
    tmp_path: Path, clock: FakeClock, face: str
) -> None:
    with Restartable(tmp_path / "b", clock=clock) as broker:
        with Producer(broker.address) as producer:
            # One queue: `done` is settled above an offset that is not (`dropped`'s), the
            # case a restart must remember beyond the group's committed offset.
            for body in (b"dropped", b"done", b"extended"):
                producer.send(Message(TOPIC, body, sharding_key="one-queue"))

        async def main() -> None:
            if face == "asyncio":
                async with sdk.aio.SimpleConsumer(
                    GROUP, broker.address, await_duration=0, clock=clock
                ) as c:
                    c.subscribe(TOPIC)
                    await receipts_across_restarts(c, broker, clock)
            else:
                with SimpleConsumer(GROUP, broker.address, await_duration=0, clock=clock) as b:
                    b.subscribe(TOPIC)
                    await receipts_across_restarts(InThreads(b), broker, clock)

        asyncio.run(main())


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kw",
    [
        {"max_messages": 0},
        {"max_messages": 1001},
        {"max_messages": True},
        {"max_messages": 2.0},
        {"invisible_duration": 0},
        {"invisible_duration": -1},
        {"invisible_duration": 12 * 3600 + 1},
        {"invisible_duration": "30"},
    ],
)
def test_bad_receive_arguments_are_refused_before_anything_is_sent(
    workers: SimpleConsumer, broker: EmbeddedBroker, kw: dict[str, Any]
) -> None:
    with pytest.raises(InvalidArgumentError):
        workers.receive(**kw)
    assert pop_state(broker) == {}


@pytest.mark.parametrize(
    "kw",
    [{"await_duration": -1}, {"await_duration": 61}, {"max_delivery_attempts": 0}],
)
def test_bad_consumer_options_are_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgumentError):
        SimpleConsumer(GROUP, "127.0.0.1:1", **kw)


def test_a_receive_before_start_or_subscribe_or_after_shutdown_is_a_state_error(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, b"x")
    c = SimpleConsumer(GROUP, broker.address, await_duration=0, clock=clock)
    c.subscribe(TOPIC)
    with pytest.raises(ClientStateError):
        c.receive()
    bare = SimpleConsumer(GROUP, broker.address, await_duration=0, clock=clock)
    with bare, pytest.raises(ClientStateError, match="subscribe"):
        bare.receive()
    with c:
        pass
    with pytest.raises(ClientStateError):
        c.receive()
    with pytest.raises(InvalidTagExpressionError):
        SimpleConsumer(GROUP, broker.address).subscribe(TOPIC, "a ||")
    assert pop_state(broker) == {}


def test_acking_a_message_no_simple_consumer_of_the_group_received_is_refused(
    workers: SimpleConsumer, broker: EmbeddedBroker, clock: FakeClock
) -> None:
    with LitePullConsumer("pullers", broker.address) as puller:
        puller.assign(puller.fetch_message_queues(TOPIC))
        for mq in puller.assignment():
            puller.seek_to_begin(mq)
        pulled = puller.poll(timeout=10)
    assert pulled and pulled[0].receipt is None and pulled[0].delivery_attempt == 0
    with pytest.raises(InvalidArgumentError, match="not received by a SimpleConsumer"):
        workers.ack(pulled[0])
    with pytest.raises(InvalidArgumentError):
        workers.change_invisible_duration(pulled[0], 10)
    with pytest.raises(InvalidArgumentError):
        workers.keep_invisible(pulled[0])

    with consumer(broker, clock, group="others") as others:
        [theirs] = others.receive(max_messages=1, invisible_duration=60)
    before = pop_state(broker)
    with pytest.raises(InvalidArgumentError, match="others"):
        workers.ack(theirs)
    assert pop_state(broker) == before
    [job] = workers.receive(max_messages=1, invisible_duration=60)
    before = pop_state(broker)
    with pytest.raises(InvalidArgumentError):
        workers.change_invisible_duration(job, -1)
    assert pop_state(broker) == before
    workers.ack(job)


def test_a_receipt_the_broker_never_issued_is_invalid(
    workers: SimpleConsumer, broker: EmbeddedBroker
) -> None:
    [job] = workers.receive(max_messages=1, invisible_duration=60)
    assert job.receipt is not None
    forged = dataclasses.replace(
        job, receipt=dataclasses.replace(job.receipt, handle="bm90IGEgcmVjZWlwdA")
    )
    with pytest.raises(InvalidReceiptError):
        workers.ack(forged)
    with pytest.raises(InvalidReceiptError):
        workers.change_invisible_duration(forged, 10)
    workers.ack(job)
    assert isinstance(job.receipt, Receipt)


def test_a_topic_that_does_not_exist_is_reported(broker: EmbeddedBroker, clock: FakeClock) -> None:
    c = SimpleConsumer(GROUP, broker.address, await_duration=0, clock=clock)
    c.subscribe("missing")
    with c, pytest.raises(TopicNotFoundError):
        c.receive()


def test_a_fifo_consumer_gets_one_message_of_a_sharding_key_at_a_time(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    with Producer(broker.address) as producer:
        for step in (b"created", b"paid"):
            producer.send(Message(TOPIC, step, sharding_key="order-7"))
    with consumer(broker, clock, fifo=True) as c:
        [first] = c.receive(max_messages=16, invisible_duration=30)
        assert first.body == b"created"
        assert c.receive(max_messages=16) == [], "the next waits for the first's ack"
        c.ack(first)
        assert [m.body for m in c.receive(max_messages=16)] == [b"paid"]
