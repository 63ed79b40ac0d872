"""Clients and a broker that is down, restarted, or not up yet when they start."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
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


#: How long the slow link below holds back the broker's first bytes: longer than the
#: 100-120 ms a connection attempt had while the channel options set
#: grpc.min_reconnect_backoff_ms to 100 (gRPC core takes it as the minimum connect timeout).
SLOW_HANDSHAKE = 0.5


def _pump(source: socket.socket, sink: socket.socket, hold: float) -> None:
    with contextlib.suppress(OSError):
        first = True
        while data := source.recv(65536):
            if first and hold:
                time.sleep(hold)  # the broker's SETTINGS frame, late
            first = False
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@contextlib.contextmanager
def slow_handshake_link(target: str, hold: float) -> Iterator[str]:
    """A TCP forwarder to `target` that holds each connection's first answer `hold` s."""
    host, port = target.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", 0))
    sockets: list[socket.socket] = [listener]

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = listener.accept()
                upstream = socket.create_connection((host, int(port)), timeout=10)
                upstream.settimeout(None)
                sockets.extend((client, upstream))
                for args in ((client, upstream, 0.0), (upstream, client, hold)):
                    threading.Thread(target=_pump, args=args, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_a_call_without_wait_gets_a_slow_broker_connection_it_asked_for(
    broker: EmbeddedBroker,
) -> None:
    # A busy machine: the broker's HTTP/2 handshake takes half a second. An admin call
    # (no deadline, no wait_for_ready) must get the connection, not UNAVAILABLE with
    # "connection attempt timed out before receiving SETTINGS frame".
    async def main() -> dict[str, object]:
        with slow_handshake_link(broker.address, SLOW_HANDSHAKE) as address:
            client = BrokerClient(address)
            try:
                return await client.admin("BrokerStatus")
            finally:
                await client.close()

    assert isinstance(asyncio.run(main()), dict)
