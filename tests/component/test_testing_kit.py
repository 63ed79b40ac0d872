"""sdk.testing: TestBroker's restarts on the same address and data, losing a client, and a
consumer paused past its lease."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import sdk.aio
from sdk import (
    ConsumeFromWhere,
    Message,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk.errors import ClientStateError
from sdk.message import MessageExt, MessageQueue
from sdk.testing import FakeClock, OrderRecorder, TestBroker, assert_handled_in_order, paused
from tests.support import wait_until

FAST = PushConsumerConfig(persist_interval=0.1, rebalance_interval=0.2, heartbeat_interval=30)


def test_a_restart_keeps_the_address_and_the_data_and_close_removes_its_own_dir() -> None:
    broker = TestBroker(default_queues=1).start()
    try:
        address, data_dir = broker.address, broker.data_dir
        with Producer(address) as producer:
            producer.send(Message("t", b"kept", sharding_key="k"))
        broker.restart()
        assert broker.address == address
        recorder = OrderRecorder()
        consumer = PushConsumer("g", address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
        consumer.subscribe("t")
        consumer.register_message_listener(recorder)
        with consumer:
            recorder.wait_for(1)
        assert_handled_in_order({"k": [b"kept"]}, recorder)
    finally:
        broker.close()
    assert not data_dir.exists()
    with pytest.raises(RuntimeError, match="not started"):
        _ = broker.address


def test_a_given_data_dir_stays(tmp_path: Path) -> None:
    with TestBroker(tmp_path / "data"):
        pass
    assert (tmp_path / "data").is_dir()


def test_a_lost_client_leaves_its_group_and_the_other_member_takes_its_queues() -> None:
    with TestBroker(default_queues=4) as broker:
        with Producer(broker.address) as producer:  # the topic, with its 4 queues
            producer.send(Message("t", b"x", sharding_key="k"))
        a, b = (
            PushConsumer("g", broker.address, config=FAST,
                         consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
            for _ in range(2)
        )  # fmt: skip
        held: dict[str, int] = {}
        for c in (a, b):
            c.subscribe("t")
            c.register_message_listener(OrderRecorder())
        a.start()
        try:
            wait_until(lambda: _locks(broker, a.client_id) == 4, 10, "a holds every queue")
            b.start()
            wait_until(lambda: _locks(broker, b.client_id) == 2, 10, "b takes half")
            held["a"] = _locks(broker, a.client_id)
            assert broker.lose_client(a.client_id) == held["a"] == 2
            # a's heartbeats come 30 s apart: b alone is a member now, and takes them all
            wait_until(lambda: _locks(broker, b.client_id) == 4, 10, "b takes every queue")
            with pytest.raises(ValueError, match="no client 'nobody' is known to the broker"):
                broker.lose_client("nobody")
        finally:
            a.shutdown()
            b.shutdown()


def test_a_consumer_paused_past_its_lease_hands_its_queue_over_and_calls_nothing_stale() -> None:
    """a is paused (as by SIGSTOP) in the middle of its messages, past its lease and its
    client timeout; b takes the queue; a's listener thread, let go once b has finished,
    starts no call for the messages a had buffered, and every key stays in order."""
    clock = FakeClock()
    sent = [b"%d" % i for i in range(20)]
    stuck, go_on = threading.Event(), threading.Event()

    def slow_at_5(m: MessageExt) -> None:
        if m.body == b"5":
            stuck.set()
            go_on.wait(10)

    with TestBroker(clock=clock, default_queues=1) as broker:
        with Producer(broker.address, clock=clock) as producer:
            producer.send_batch([Message("t", body, sharding_key="k") for body in sent])
        ra, rb = OrderRecorder(slow_at_5, name="a"), OrderRecorder(name="b")
        prefer_b = PreferB()
        a, b = (
            PushConsumer("g", broker.address, config=FAST, clock=clock,
                         consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                         allocate_strategy=prefer_b)
            for _ in range(2)
        )  # fmt: skip
        prefer_b.b = b.client_id
        for c, r in ((a, ra), (b, rb)):
            c.subscribe("t")
            c.register_message_listener(r)
        a.start()
        try:
            assert stuck.wait(10), "a is in its call for 5, with 6-19 buffered"
            with paused(a):
                b.start()

                def b_took_over() -> bool:
                    clock.advance(1)  # past a's lease (30 s), the broker's (60 s) and 120 s
                    return len(rb.handled) >= len(sent) and _members(broker) == [b.client_id]

                wait_until(b_took_over, 20, "b handled the queue, and a, silent, left the group")
                go_on.set()  # a's call for 5 returns; its thread must start no other
                wait_until(lambda: any(h.body == b"5" for h in ra.handled), 10, "5 returned")
        finally:
            go_on.set()
            a.shutdown()
            b.shutdown()
    assert [h.body for h in ra.handled] == sent[:6], "a called nothing after its lease"
    assert_handled_in_order({"k": sent}, ra, rb, max_duplicates=6)
    with pytest.raises(ClientStateError, match="shut down"), paused(a):
        pass
    aio_client: Any = sdk.aio.Producer("127.0.0.1:1")
    with pytest.raises(TypeError, match="an asyncio client shares"), paused(aio_client):
        pass


class PreferB:
    """Every queue to the consumer `b` while it is a member, else to the first member."""

    b = ""

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:  # fmt: skip
        owner = self.b if self.b in cid_all else min(cid_all)
        return list(mq_all) if current_cid == owner else []


def _members(broker: TestBroker) -> list[str]:
    embedded = broker._embedded  # inspection: the group's members now
    assert embedded is not None
    return list(embedded.broker.state.groups.members("g"))


def _locks(broker: TestBroker, client_id: str) -> int:
    embedded = broker._embedded  # inspection: who holds which lock now
    assert embedded is not None
    state = embedded.broker.state
    return sum(v.client_id == client_id and v.live for v in state.locks.locks("g").values())
