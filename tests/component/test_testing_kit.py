"""sdk.testing.TestBroker: restarts on the same address and data; losing a client."""

from __future__ import annotations

from pathlib import Path

import pytest

from sdk import (
    ConsumeFromWhere,
    Message,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk.testing import OrderRecorder, TestBroker, assert_handled_in_order
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


def _locks(broker: TestBroker, client_id: str) -> int:
    embedded = broker._embedded  # inspection: who holds which lock now
    assert embedded is not None
    state = embedded.broker.state
    return sum(v.client_id == client_id and v.live for v in state.locks.locks("g").values())
