"""Clients and a broker that is down, restarted, or not up yet when they start."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import ConsumeFromWhere, LitePullConsumer, Message, Producer, ProducerConfig
from sdk._transport.broker_client import BrokerClient
from sdk.errors import ClientStateError, OrderMQError
from tests.component.test_producer import Restartable


@pytest.fixture
def restartable(tmp_path: Path) -> Restartable:
    r = Restartable(tmp_path / "broker")
    r.start()
    yield r  # type: ignore[misc]
    if r.broker is not None:
        r.stop()


def test_a_new_client_works_at_once_after_a_restart_another_client_saw(
    restartable: Restartable,
) -> None:
    with Producer(restartable.address, config=ProducerConfig(retry_times=0)) as first:
        first.send(Message("orders", b"before"))
        restartable.stop()
        # This client's channel now backs off from the dead address; the clients below
        # must not inherit that backoff (gRPC shares connections between channels).
        with pytest.raises(OrderMQError):
            first.send(Message("orders", b"refused"), timeout=0.5)
        restartable.start()
        with Producer(restartable.address) as second:
            second.send(Message("orders", b"after"))
        consumer = LitePullConsumer(
            "reader", restartable.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
        )
        consumer.subscribe("orders")
        with consumer:
            got: list[bytes] = []
            while len(got) < 2 and (batch := consumer.poll(timeout=5)):
                got += [m.body for m in batch]
    assert sorted(got) == [b"after", b"before"]


def start_producer(address: str) -> Callable[[], object]:
    producer = Producer(address)
    producer.start()

    def first_send() -> object:
        try:
            return producer.send(Message("orders", b"first"))
        finally:
            producer.shutdown()

    return first_send


def start_consumer(address: str) -> Callable[[], object]:
    consumer = LitePullConsumer("reader", address)
    consumer.subscribe("orders")

    def start() -> object:
        consumer.start()
        consumer.shutdown()
        return consumer.client_id

    return start


@pytest.mark.parametrize("first_call", [start_producer, start_consumer])
def test_a_client_whose_broker_comes_up_within_its_deadline_succeeds(
    tmp_path: Path, first_call: Callable[[str], Callable[[], object]]
) -> None:
    with socket.socket() as listener, ThreadPoolExecutor(1) as pool:
        # A listener that refuses gRPC holds the port until the client has tried it.
        # SO_REUSEADDR, and an abortive close of the attempt: no TIME_WAIT left on the
        # port may keep the broker from binding it (it did on a busy machine, when the
        # attempt was closed before the client had sent anything).
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)
        port = listener.getsockname()[1]
        outcome: Future[object] = pool.submit(first_call(f"127.0.0.1:{port}"))
        attempt, _ = listener.accept()
        attempt.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        attempt.close()
        listener.close()
        with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker", port=port)):
            assert outcome.result(timeout=30)


def test_closing_a_client_fails_a_request_waiting_for_its_broker_as_closed() -> None:
    async def main() -> None:
        with socket.socket() as listener:  # a port nobody serves gRPC on
            listener.bind(("127.0.0.1", 0))
            listener.listen()
            client = BrokerClient(f"127.0.0.1:{listener.getsockname()[1]}")
            waiting = asyncio.create_task(client.send("t", 0, b"frame", timeout=30))
            await asyncio.to_thread(listener.accept)  # the request waits for a connection
            await client.close()
            with pytest.raises(ClientStateError, match="closed"):
                await asyncio.wait_for(waiting, 10)

    asyncio.run(main())
