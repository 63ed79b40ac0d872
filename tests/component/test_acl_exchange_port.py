"""Accounts and permissions on the Exchange port (a broker with both --acl-file and
--exchange-port): the connection's hello is checked as an ExchangeBatched call's signed
opening, then each request as the RPC it carries.

The first tests speak the wire (tests/component/test_exchange_port.py's PortClient), the
last ones go through the SDK, whose clients sign their hello with their credentials.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mockbroker import EmbeddedBroker
from sdk import Credentials, LitePullConsumer, Message, MessageExt, Producer, ProducerConfig
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.exchange import EXCHANGE_BATCHED_PATH
from sdk._transport.signing import signed_hello
from sdk.errors import PermissionDeniedError
from sdk.testing import FakeClock
from tests.component.test_acl_grpc import ACL, ADMIN, CONSUMER, GROUP, PRODUCER, TOPIC, Snapshot
from tests.component.test_acl_grpc import acl_file as write_acl
from tests.component.test_exchange_port import PortClient, address, send
from tests.component.test_exchange_port import start as start_with_port
from tests.component.test_exchange_port_client import only_on_the_port, port_of
from tests.support import pinned, wait_until


def start(tmp_path: Path, text: str = ACL) -> EmbeddedBroker:
    return start_with_port(tmp_path, acl_file=write_acl(tmp_path / "plain_acl.yml", text))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path)
    try:
        with Producer(b.address, credentials=ADMIN) as p:  # the topic, and 2 to consume
            p.send_batch([Message(TOPIC, b"m%d" % i, sharding_key="k") for i in range(2)])
        yield b
    finally:
        b.stop()


def hello(credentials: Credentials, at: float | None = None) -> pb.ExchangeRequests:
    clock = FakeClock(start=time.time() if at is None else at)
    return pb.ExchangeRequests(hello=signed_hello(credentials, clock, EXCHANGE_BATCHED_PATH))


def pull(rid: int) -> pb.ExchangeRequest:
    request = pb.PullRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=0, max_messages=8,
                             max_bytes=1 << 20, tag_expression="*")  # fmt: skip
    return pb.ExchangeRequest(id=rid, pull=request)


async def send_answer(address: str, opening: pb.ExchangeRequests) -> pb.ExchangeResponse:
    """The answer to a send that rides in `opening`, the connection's first frame."""
    async with PortClient.open(address) as client:
        await client.greeted()
        opening.requests.append(send(1, b"a"))
        client.write_frame(opening.SerializeToString())
        return (await client.answers(1))[1]


async def refusal(address: str, opening: pb.ExchangeRequests | None) -> pb.ExchangeError:
    """The connection's error after `opening` (None: the client sends nothing)."""
    async with PortClient.open(address) as client:
        await client.greeted()
        if opening is not None:
            opening.requests.append(send(1, b"refused"))
            client.write_frame(opening.SerializeToString())
        frame = await client.read()
        assert frame is not None and len(frame) == 1 and frame[0].id == 0, frame
        assert await client.read() is None, "the broker closes after the connection's error"
        return frame[0].error


# ---------------------------------------------------------------- the wire: the hello
def test_a_signed_hello_is_served_and_each_request_checked_as_its_rpc(
    broker: EmbeddedBroker,
) -> None:
    before = Snapshot(broker)

    async def main() -> None:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            opening = hello(PRODUCER)
            opening.requests.extend([send(1, b"a"), pull(2)])
            client.write_frame(opening.SerializeToString())
            answers = await client.answers(2)
            assert answers[1].send.first_queue_offset == 2, answers[1]
            assert answers[2].error.code == "PERMISSION_DENIED", answers[2]
            assert "'producer-key'" in answers[2].error.message
            client.write(send(3, b"b"))  # the stream goes on after a refused request
            assert (await client.answers(1))[3].send.first_queue_offset == 3

    asyncio.run(main())
    assert Snapshot(broker).stored > before.stored


# Each hello is signed when its test runs (dated then: one made at collection would be
# minutes old by the time a long run reaches the test).
@pytest.mark.parametrize(
    ("opening", "words"),
    [
        (lambda: hello(Credentials("producer-key", "wrong-one")), "signature does not match"),
        (lambda: hello(Credentials("nobody-key", "producer-secret")), "nobody-key"),
        (lambda: hello(PRODUCER, at=time.time() - 400), "outside its window of 300s"),
        (pb.ExchangeRequests, "carries no"),  # no hello: an anonymous caller
    ],
    ids=["wrong-secret", "unknown-key", "expired", "no-hello"],
)
def test_a_hello_the_acl_refuses_ends_the_connection_and_nothing_is_stored(
    broker: EmbeddedBroker, opening: Callable[[], pb.ExchangeRequests], words: str
) -> None:
    before = Snapshot(broker)
    error = asyncio.run(refusal(address(broker), opening()))
    assert error.code == "UNAUTHENTICATED" and words in error.message, error
    assert "secret" not in error.message.replace("secret key", "")
    assert Snapshot(broker) == before


def test_a_client_that_sends_no_hello_is_dropped_after_the_peer_wait(
    broker: EmbeddedBroker,
) -> None:
    port = broker.broker.exchange_port
    assert port is not None
    port.peer_wait_seconds = 0.2
    error = asyncio.run(refusal(address(broker), None))
    assert error.code == "UNAUTHENTICATED" and "no hello within 0.2 s" in error.message
    wait_until(lambda: port.connections == 0, 10, "the connection closed")


def test_a_global_white_address_needs_no_hello_signature(tmp_path: Path) -> None:
    b = start(tmp_path, "globalWhiteRemoteAddresses:\n  - 127.0.0.*\n" + ACL)
    try:
        opening = pb.ExchangeRequests(hello=pb.ExchangeHello())
        answer = asyncio.run(send_answer(address(b), opening))
        assert answer.send.first_queue_offset == 0, answer
    finally:
        b.stop()


def test_without_an_acl_the_hello_is_not_looked_at(tmp_path: Path) -> None:
    b = start_with_port(tmp_path)
    try:
        opening = hello(Credentials("producer-key", "wrong-one"))
        answer = asyncio.run(send_answer(address(b), opening))
        assert answer.send.first_queue_offset == 0, answer
    finally:
        b.stop()


# ---------------------------------------------------------------- the SDK's clients
def test_clients_with_credentials_produce_and_consume_on_the_port(
    broker: EmbeddedBroker,
) -> None:
    with Producer(broker.address, credentials=PRODUCER) as p:
        p.send(Message(TOPIC, b"m2", sharding_key="k"))
        assert only_on_the_port(broker)
    consumer = LitePullConsumer(GROUP, broker.address, credentials=CONSUMER, auto_commit=False)
    consumer.subscribe(TOPIC)
    with consumer:
        got: list[MessageExt] = []
        wait_until(lambda: bool(got.extend(consumer.poll(0.2))) or len(got) >= 3, what="3")
        assert only_on_the_port(broker)
    assert [m.body for m in got] == [b"m0", b"m1", b"m2"]


def test_a_producer_with_credentials_is_back_on_the_port_after_a_broker_restart(
    broker: EmbeddedBroker,
) -> None:
    """Each connection signs a fresh hello: the one made after the restart (on the same
    ports and data) is served, and the sends go on the port again."""
    config = pinned(broker.broker.config, broker)
    with Producer(broker.address, credentials=PRODUCER,
                  config=ProducerConfig(retry_times=4)) as p:  # fmt: skip
        p.send(Message(TOPIC, b"m2", sharding_key="k"))
        assert only_on_the_port(broker)
        broker.stop()
        again = EmbeddedBroker(config)
        again.start()
        try:
            p.send(Message(TOPIC, b"m3", sharding_key="k"))
            assert only_on_the_port(again)
            assert port_of(again).accepted_connections == 1
            admin = LitePullConsumer("check", again.address, credentials=ADMIN)
            admin.subscribe(TOPIC)
            with admin:
                got: list[MessageExt] = []
                wait_until(lambda: bool(got.extend(admin.poll(0.2))) or len(got) >= 4, what="4")
        finally:
            again.stop()  # the fixture's stop of the first changes nothing
    assert [m.body for m in got] == [b"m0", b"m1", b"m2", b"m3"]


def test_a_sub_only_account_cannot_send_on_the_port(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    with Producer(broker.address, credentials=CONSUMER) as p:
        with pytest.raises(PermissionDeniedError) as e:
            p.send(Message(TOPIC, b"refused", sharding_key="k"))
        assert only_on_the_port(broker)
    assert "'consumer-key'" in str(e.value) and "PUB" in str(e.value)
    assert not e.value.retriable
    assert Snapshot(broker) == before
