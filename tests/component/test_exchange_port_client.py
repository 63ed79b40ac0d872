"""ordermq's clients on a broker's Exchange port: the route names it, they carry their
sends, pulls and push subscriptions there instead of on gRPC's ExchangeBatched, and go
back to gRPC when the port cannot be reached. The last tests drive the client's side of
the wire (PortCall) against scripted servers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.errors import invalid
from mockbroker.fronts.exchange_port import ExchangePort, connection_error, frame
from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
    TLSConfig,
    _wire,
    shard_index,
)
from sdk import Producer as BlockingProducer
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport import exchange_port
from sdk._transport.broker_client import BrokerClient
from sdk._transport.codec import encode_message
from sdk._transport.exchange_port import PortCall
from sdk._wire import EXCHANGE_PORT_PREAMBLE
from sdk.aio import Producer
from sdk.errors import ClientStateError
from sdk.message import MessageQueue
from tests.component.test_exchange_downgrade import Recorder
from tests.faultproxy import FaultProxy
from tests.support import pinned, wait_until
from tests.tls_certs import issue

WAIT = 10.0
KEYS = [f"order-{k}" for k in range(4)]


def start(config: BrokerConfig) -> EmbeddedBroker:
    broker = EmbeddedBroker(config)
    broker.start()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(BrokerConfig(data_dir=tmp_path / "data", exchange_port=0, default_queues=4))
    try:
        yield b
    finally:
        b.stop()


def port_of(broker: EmbeddedBroker) -> ExchangePort:
    port = broker.broker.exchange_port
    assert port is not None
    return port


def streams_served(broker: EmbeddedBroker) -> str:
    """What a failed only_on_the_port saw: the broker's streams and its port's connections."""
    port = port_of(broker)
    return (
        f"{broker.broker.exchange_streams} Exchange stream(s) served, {port.streams} on the "
        f"port of its {port.connections} connection(s) ({port.accepted_connections} accepted "
        "in all)"
    )


def only_on_the_port(broker: EmbeddedBroker) -> bool:
    """Every Exchange stream the broker serves is a connection to its port, now or within
    WAIT: a gRPC stream a client began on ends once its port stream took over and the
    gRPC stream's last answer came."""
    deadline = time.monotonic() + WAIT
    port = port_of(broker)
    # The port's streams, not its connections: a connection still opening serves no
    # stream yet, while the client's requests go on its gRPC stream (counted above).
    while not broker.broker.exchange_streams == port.streams == port.connections > 0:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def send_keys(producer: BlockingProducer, round_: int, per_key: int = 5) -> list[str]:
    sent = []
    for i in range(per_key):
        for key in KEYS:
            body = f"{round_}:{key}:{i}"
            producer.send(Message("orders", body.encode(), sharding_key=key))
            sent.append(body)
    return sent


def in_key_order(seen: list[str], sent: list[str]) -> None:
    for key in KEYS:
        mine = [b for b in seen if b.split(":")[1] == key]
        assert mine == [b for b in sent if b.split(":")[1] == key], key


def each_key_in_order(seen: list[str], sent: list[str], keys: list[str]) -> None:
    """Bodies "key:..." seen in the order sent, key by key."""
    for key in keys:
        mine = [b for b in seen if b.startswith(key + ":")]
        assert mine == [b for b in sent if b.startswith(key + ":")], key


def all_stored(broker: EmbeddedBroker, count: int) -> list[str]:
    """The `count` bodies stored on "orders", polled by a group of their own, in order."""
    consumer = LitePullConsumer("check", broker.address)
    consumer.subscribe("orders", "*")
    consumer.start()
    try:
        return poll_all(consumer, count, "all stored")
    finally:
        consumer.shutdown()


def poll_all(consumer: LitePullConsumer, count: int, what: str) -> list[str]:
    """The bodies `consumer` polls until it has `count`, in the order polled."""
    seen: list[str] = []

    def polled() -> bool:
        seen.extend(m.body.decode() for m in consumer.poll(0.2))
        return len(seen) >= count

    wait_until(polled, WAIT, what)
    return seen


def push_consumer(broker: EmbeddedBroker, listener: Recorder) -> PushConsumer:
    """An orderly push consumer of "orders" from its first offset, with push delivery."""
    consumer = PushConsumer(
        "g", broker.address, config=PushConsumerConfig(delivery="push"),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
    )  # fmt: skip
    consumer.subscribe("orders", "*")
    consumer.register_message_listener(listener)
    return consumer


def test_a_producer_and_an_orderly_push_consumer_go_on_the_port(
    broker: EmbeddedBroker,
) -> None:
    listener = Recorder()
    consumer = push_consumer(broker, listener)
    with BlockingProducer(broker.address) as producer:
        sent = send_keys(producer, 0)
        consumer.start()
        try:
            wait_until(lambda: len(listener.distinct()) == len(sent), WAIT, "all consumed")
            assert only_on_the_port(broker)
            in_key_order(listener.distinct(), sent)
        finally:
            consumer.shutdown()


def test_a_lite_pull_consumer_polls_through_the_port(broker: EmbeddedBroker) -> None:
    with BlockingProducer(broker.address) as producer:
        sent = send_keys(producer, 0)
    consumer = LitePullConsumer("lp", broker.address)
    consumer.subscribe("orders", "*")
    consumer.start()
    try:
        seen = poll_all(consumer, len(sent), "all polled")
        assert only_on_the_port(broker)
        in_key_order(seen, sent)
    finally:
        consumer.shutdown()


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("port", ["refused", "silent"])
def test_sends_go_on_grpc_while_the_port_cannot_be_reached(
    tmp_path: Path, port: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A route naming a port nothing listens on, or one that takes the connection and
    says nothing (a firewall, a proxy that passes only gRPC): the requests go on
    ExchangeBatched meanwhile, none waiting for the port, once each; once the port is
    given up (refused at once, silent after CONNECT_SECONDS), the next requests go there
    too, for as long as that connection lasts."""
    b = start(BrokerConfig(data_dir=tmp_path / "data", default_queues=4, exchange_port=None))

    async def sends(address: str) -> list[int]:
        async with Producer(b.address) as producer:
            await producer._core.writable_queues("orders")  # the route first: it has no port
            client = producer._core._transport.client(b.address)  # type: ignore[attr-defined]
            client.use_exchange_port(address)
            results = await asyncio.gather(
                *(producer.send(Message("orders", b"m%d" % i, sharding_key="k")) for i in range(6))
            )
            if port == "silent":
                assert client._exchange._port_attempt is not None, "the sends waited for it"
            await until(lambda: client._exchange._open_port is None, "the port given up")
            again = await producer.send(Message("orders", b"later", sharding_key="k"))
            assert b.broker.exchange_streams == 1  # the producer's, on gRPC
        return [r.queue_offset for r in [*results, again]]

    async def main() -> list[int]:
        silent, address = await scripted_port(b"")  # takes the preamble, never greets
        if port == "refused":
            silent.close()
            address = "127.0.0.1:1"
        try:
            return await sends(address)
        finally:
            silent.close()

    monkeypatch.setattr(exchange_port, "CONNECT_SECONDS", 2.0)
    try:
        assert asyncio.run(main()) == list(range(7))  # each stored once, in order
    finally:
        b.stop()


def route_of(broker: EmbeddedBroker) -> tuple[str, str]:
    """The Exchange port's address and the broker's id, as the broker's routes give them."""
    with BlockingProducer(broker.address) as producer:
        producer.send(Message("orders", b"route", sharding_key="k"))
        routes = producer._core._transport._routes["orders"]  # type: ignore[attr-defined]
    return routes[0].exchange_address, routes[0].exchange_broker_id


def test_the_broker_keeps_its_id_across_restarts_and_another_broker_has_its_own(
    tmp_path: Path,
) -> None:
    config = BrokerConfig(data_dir=tmp_path / "a", exchange_port=0)
    a = start(config)
    try:
        first = route_of(a)
    finally:
        a.stop()
    a = start(config)
    other = start(BrokerConfig(data_dir=tmp_path / "b", exchange_port=0))
    try:
        again, elsewhere = route_of(a), route_of(other)
    finally:
        a.stop()
        other.stop()
    assert len(first[1]) == 32 and again[1] == first[1]  # a port of its own each start
    assert elsewhere[1] not in ("", first[1])


def test_a_free_port_is_chosen_again_at_the_next_start_while_it_is_free(
    tmp_path: Path,
) -> None:
    """exchange_port=0 (the default): the port chosen is kept in the data directory and
    taken again at the next start, so that clients reconnect where they were; when
    another process holds it meanwhile, the broker takes another (and keeps that)."""
    config = BrokerConfig(data_dir=tmp_path / "data", exchange_port=0)
    ports = []
    for _ in range(2):
        b = start(config)
        ports.append(port_of(b).port)
        b.stop()
    assert ports[1] == ports[0]
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", ports[0]))
        holder.listen()
        b = start(config)
        try:
            ports.append(port_of(b).port)
            assert ports[2] != ports[0]
            with BlockingProducer(b.address) as producer:
                producer.send(Message("orders", b"moved", sharding_key="k"))
                assert only_on_the_port(b)
        finally:
            b.stop()
    b = start(config)
    try:
        assert port_of(b).port == ports[2]
    finally:
        b.stop()


def test_a_port_that_greets_with_another_brokers_id_is_not_used(tmp_path: Path) -> None:
    """A route older than a restart names a port another broker now serves (the port
    moved, and another broker on the host took its number): the client sees the other
    id in the greeting and stays on gRPC; nothing reaches the other broker."""
    a = start(BrokerConfig(data_dir=tmp_path / "a", exchange_port=0, default_queues=4))
    b = start(BrokerConfig(data_dir=tmp_path / "b", exchange_port=0, default_queues=4))

    _, a_id = route_of(a)  # stores "route" at offset 0

    async def main() -> list[int]:
        async with Producer(a.address) as producer:
            await producer._core.writable_queues("orders")  # a's route, read
            client = producer._core._transport.client(a.address)  # type: ignore[attr-defined]
            client.use_exchange_port(b.exchange_address, a_id)  # b's port, a's id
            results = [
                await producer.send(Message("orders", b"m%d" % i, sharding_key="k"))
                for i in range(1, 6)
            ]
            await until(lambda: client._exchange._open_port is None, "b's port given up")
            assert a.broker.exchange_streams == 1  # the producer's, on gRPC
        return [r.queue_offset for r in results]

    try:
        assert asyncio.run(main()) == list(range(1, 6))
        assert port_of(b).accepted_connections == 1  # greeted, then left
        assert b.broker.store.topics.find("orders") is None, "a send reached broker b"
    finally:
        a.stop()
        b.stop()


class HeldPort:
    """The clients' connections to a port wait for `opened` before they connect."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened = threading.Event()
        #: Connections waiting now (cancelled ones leave).
        self.waiting = 0
        connect = exchange_port._connect

        async def held(*args: object) -> object:
            self.waiting += 1
            try:
                while not self.opened.is_set():
                    await asyncio.sleep(0.005)
            finally:
                self.waiting -= 1
            return await connect(*args)  # type: ignore[arg-type]

        monkeypatch.setattr(exchange_port, "_connect", held)


def held_port(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """An event the clients' connections to a port wait for before they connect."""
    return HeldPort(monkeypatch).opened


def test_sends_move_to_the_port_once_it_greets(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sends made while the port connects go on gRPC; once the broker greets on the
    port, the next go there, and the gRPC stream ends after its last answer. Sends in
    flight across the move are stored once each, every key's in the order sent."""
    opened = held_port(monkeypatch)
    keys = [f"k{n}" for n in range(8)]

    async def main() -> list[str]:
        async with Producer(broker.address) as producer:
            sent = []
            for n in range(8):  # one after another, on gRPC
                body = f"{keys[n]}:{n // 8}"
                await producer.send(Message("orders", body.encode(), sharding_key=keys[n]))
                sent.append(body)
            assert (broker.broker.exchange_streams, port_of(broker).connections) == (1, 0)
            bodies = [f"{keys[n % 8]}:{n // 8}" for n in range(8, 800)]
            moving = [
                asyncio.ensure_future(producer.send(Message("orders", body.encode(),
                                                            sharding_key=body.split(":")[0])))
                for body in bodies
            ]  # fmt: skip
            opened.set()  # the port connects while these are in flight
            await asyncio.gather(*moving)
            sent += bodies
            await until(lambda: broker.broker.exchange_streams == port_of(broker).connections,
                        "the gRPC stream ended")  # fmt: skip
            return sent

    sent = asyncio.run(main())
    seen = all_stored(broker, len(sent))
    assert sorted(seen) == sorted(sent)  # each once
    each_key_in_order(seen, sent, keys)


def test_a_lone_callers_requests_are_written_at_once_and_concurrent_ones_joined(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One send after another skips the writer task (its wake-up costs a turn of the
    loop); sends made while others are in flight are joined into writes by it."""
    writes: list[tuple[str, int]] = []  # (by whom, requests in the write)
    real_write, real_write_now = PortCall.write, PortCall.write_now

    async def write(self: PortCall, message: bytes) -> None:
        writes.append(("writer", len(pb.ExchangeRequests.FromString(message).requests)))
        await real_write(self, message)

    def write_now(self: PortCall, message: bytes) -> None:
        writes.append(("at once", len(pb.ExchangeRequests.FromString(message).requests)))
        real_write_now(self, message)

    monkeypatch.setattr(PortCall, "write", write)
    monkeypatch.setattr(PortCall, "write_now", write_now)
    bodies = [f"{KEYS[n % 4]}:{n}" for n in range(60)]

    def sending(body: str) -> Message:
        return Message("orders", body.encode(), sharding_key=body.split(":")[0])

    async def main() -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        async with Producer(broker.address) as producer:
            await producer.send(sending(bodies[0]))
            # Served on the port and on nothing else: the gRPC stream ends once the client
            # took the port's (a connection counts before its stream does).
            port = port_of(broker)
            await until(lambda: broker.broker.exchange_streams == port.streams == 1,
                        "on the port, and gRPC's stream ended")  # fmt: skip
            writes.clear()
            for body in bodies[1:20]:
                await producer.send(sending(body))
            lone = writes[:]
            writes.clear()
            # requests made together (the producer's accumulator would join these sends)
            client = producer._core._transport.client(broker.address)  # type: ignore[attr-defined]
            now = time.time()
            await asyncio.gather(*(
                client.send("orders", shard_index(body.split(":")[0], 4),
                            encode_message(sending(body), n.to_bytes(16, "big"), now))
                for n, body in enumerate(bodies[20:])
            ))  # fmt: skip
            return lone, writes[:]

    lone, together = asyncio.run(main())
    assert lone == [("at once", 1)] * 19
    assert sum(n for _, n in together) == 40
    assert together[0] == ("at once", 1), "the first of them found the writer idle"
    assert any(by == "writer" and n > 1 for by, n in together), together
    each_key_in_order(all_stored(broker, len(bodies)), bodies, KEYS)


def test_closing_the_client_fails_a_request_left_on_the_replaced_grpc_stream_as_closed(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-polling pull made before the move to the port stays on the gRPC stream,
    which ends after its answer; closing the client meanwhile fails it as any request
    cut off by the close (ClientStateError: not to be resent), not as a lost connection."""
    opened = held_port(monkeypatch)
    with BlockingProducer(broker.address) as producer:
        producer.send(Message("orders", b"m", sharding_key="k"))
    empty = next(q for q in range(4) if q != shard_index("k", 4))  # the key's is not
    queue = MessageQueue("orders", "broker-a", empty)

    async def main() -> None:
        client = BrokerClient(broker.address)
        await client.query_route("orders")
        client.use_exchange_port(*route_of(broker))
        pulling = asyncio.ensure_future(client.pull("g", queue, 0, suspend_timeout=30))
        await until(lambda: broker.broker.exchange_streams == 1, "the pull on gRPC")
        opened.set()
        await until(lambda: port_of(broker).connections == 1, "the port connected")
        await until(lambda: client._exchange._stream is not None
                    and client._exchange._stream.port, "the move to the port")  # fmt: skip
        await client.close()
        with pytest.raises(ClientStateError):
            await pulling

    asyncio.run(main())


def test_a_push_subscription_waits_for_the_port_being_connected(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscription stays on the stream it was opened on: one made while the port
    connects waits for it, so that a push consumer does not stay on gRPC."""
    held = HeldPort(monkeypatch)
    with BlockingProducer(broker.address) as producer:
        sent = send_keys(producer, 0)
    assert port_of(broker).connections == 0
    listener = Recorder()
    consumer = push_consumer(broker, listener)
    consumer.start()
    try:
        # Its first Exchange request is a subscription: it started the port's connection.
        wait_until(lambda: held.waiting == 1, WAIT, "the consumer's subscriptions waiting")
        assert listener.distinct() == []
        held.opened.set()
        wait_until(lambda: len(listener.distinct()) == len(sent), WAIT, "all consumed")
        assert only_on_the_port(broker)
        in_key_order(listener.distinct(), sent)
    finally:
        consumer.shutdown()


def test_the_port_is_used_again_after_a_broker_restart(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "data", exchange_port=0, default_queues=4)
    b = start(config)
    config = pinned(config, b)
    assert config.exchange_port == port_of(b).port
    try:
        with BlockingProducer(b.address, config=ProducerConfig(retry_times=4)) as producer:
            sent = send_keys(producer, 0)
            assert only_on_the_port(b)
            b.stop()
            b = start(config)
            sent += send_keys(producer, 1)
            assert only_on_the_port(b)
    finally:
        b.stop()
    b = start(dataclasses.replace(config, exchange_port=None))
    try:
        assert sorted(all_stored(b, len(sent))) == sorted(sent)
    finally:
        b.stop()


def test_a_route_without_the_port_makes_the_client_forget_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker restarted with its port off: once the client reads its route again, it no
    longer tries the old port at each new stream (refused, or another service's now)."""
    opened = held_port(monkeypatch)  # the first send goes on gRPC, as it may when unheld
    config = BrokerConfig(data_dir=tmp_path / "data", exchange_port=0, default_queues=4)
    b = start(config)
    config = pinned(config, b)

    async def main(restarted: list[EmbeddedBroker]) -> None:
        async with Producer(b.address, config=ProducerConfig(retry_times=4)) as producer:
            await producer.send(Message("orders", b"on the port", sharding_key="k"))
            transport = producer._core._transport  # type: ignore[attr-defined]
            exchange = transport.client(b.address)._exchange
            opened.set()
            await until(lambda: exchange._stream is not None
                        and exchange._stream.port, "the move to the port")  # fmt: skip
            b.stop()
            restarted.append(start(dataclasses.replace(config, exchange_port=None)))
            await producer.send(Message("orders", b"on gRPC", sharding_key="k"))
            await transport.writable_queues("orders", refresh=True)
            assert exchange._port_opener is None, "the port is still tried"

    restarted: list[EmbeddedBroker] = []
    try:
        asyncio.run(main(restarted))
        assert len(all_stored(restarted[0], 2)) == 2
    finally:
        b.stop()
        for again in restarted:
            again.stop()


@pytest.mark.parametrize("proxied", [False, True], ids=["direct", "through-a-proxy"])
def test_over_tls_the_client_takes_the_port_with_its_tls_settings(
    tmp_path: Path, proxied: bool, request: pytest.FixtureRequest
) -> None:
    proxy: FaultProxy | None = request.getfixturevalue("process_proxy") if proxied else None
    certs = issue(tmp_path / "certs")
    b = start(BrokerConfig(data_dir=tmp_path / "data", exchange_port=0,
                           tls_cert=certs.cert, tls_key=certs.key))  # fmt: skip
    try:
        with BlockingProducer(b.address, tls=TLSConfig(ca_file=certs.ca)) as producer:
            producer.send(Message("orders", b"private", sharding_key="k"))
            assert only_on_the_port(b)
            if proxy is not None:  # TLS started inside the proxy's tunnel
                assert b.exchange_address in proxy.stats().targets
    finally:
        b.stop()


def test_the_port_is_reached_through_the_proxy_grpc_takes(
    broker: EmbeddedBroker, process_proxy: FaultProxy
) -> None:
    """grpc_proxy names the proxy this client reaches brokers through: the port's
    connections take it too (not straight to the port, where nothing may answer), and
    one that the proxy resets is opened again through it."""
    with BlockingProducer(broker.address, config=ProducerConfig(retry_times=4)) as producer:
        sent = send_keys(producer, 0)
        assert only_on_the_port(broker)
        assert process_proxy.stats().targets == {broker.address, broker.exchange_address}
        assert process_proxy.reset() >= 2
        sent += send_keys(producer, 1)
        assert only_on_the_port(broker)
    seen = all_stored(broker, len(sent))
    assert sorted(seen) == sorted(sent)  # each once
    in_key_order(seen, sent)


async def scripted_port(script: bytes) -> tuple[asyncio.Server, str]:
    """A server that reads the preamble and writes `script`, then keeps the connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(EXCHANGE_PORT_PREAMBLE))
        writer.write(script)
        await reader.read()  # until the client goes

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_the_port_call_raises_the_connections_error_as_its_status() -> None:
    """An answer of id 0 ends the connection with its error: the stream ends as a gRPC
    call with that status would."""
    ended = connection_error(invalid("FRAME_CUT_OFF", "the input ended in a frame"))

    async def main() -> None:
        server, address = await scripted_port(frame(b"") + ended)
        call = PortCall(address, None, None)
        try:
            assert list((await call.read()).responses) == []  # the greeting
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()
            assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert raised.value.details() == "the input ended in a frame"
        finally:
            call.cancel()
            server.close()

    asyncio.run(main())


def test_the_port_call_answers_pings_and_drops_a_port_that_answers_none_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keepalive: the broker's ping is answered with a pong; after GRPC_KEEPALIVE_MS with
    nothing read the client pings, and drops a connection that stays silent as long
    again (a read under way fails as UNAVAILABLE, so the stream's requests are retried)."""
    monkeypatch.setattr(_wire, "GRPC_KEEPALIVE_MS", 200)
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(len(EXCHANGE_PORT_PREAMBLE))
        writer.write(frame(b"") + frame(pb.ExchangeResponses(ping=True).SerializeToString()))
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(65536):
                received.extend(chunk)

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        call = PortCall(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", None, None)
        try:
            assert list((await call.read()).responses) == []  # the greeting
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call.read()  # the ping is answered, not returned
            assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "no answer to a keepalive ping within 0.2s" in (raised.value.details() or "")
        finally:
            call.cancel()
            server.close()

    asyncio.run(main())
    frames, rest = [], bytes(received)
    while rest:
        (length,) = struct.unpack(">I", rest[:4])
        frames.append(pb.ExchangeRequests.FromString(rest[4 : 4 + length]))
        rest = rest[4 + length :]
    assert [(f.HasField("hello"), f.pong, f.ping) for f in frames] == [
        (True, False, False),  # the opening
        (False, True, False),  # the pong
        (False, False, True),  # the client's ping, never answered
    ]


def test_a_port_that_does_not_greet_is_unavailable_and_a_cancel_ends_a_read() -> None:
    async def main() -> None:
        server, address = await scripted_port(frame(b"\x0a\x00"))  # not the greeting
        call = PortCall(address, None, None)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "did not greet" in (raised.value.details() or "")
        server.close()

        server, address = await scripted_port(frame(b""))
        call = PortCall(address, None, None)
        assert list((await call.read()).responses) == []
        reading = asyncio.ensure_future(call.read())
        await asyncio.sleep(0)  # the read starts waiting for a frame
        call.cancel()
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await reading
        assert raised.value.code() == grpc.StatusCode.CANCELLED
        server.close()

    asyncio.run(main())
