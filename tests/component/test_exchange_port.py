"""The broker's Exchange port: ordermq's Exchange stream over framed TCP (or TLS).

A client here speaks the wire as docs/wire-format.md gives it (the preamble, then
length-prefixed ExchangeRequests and ExchangeResponses), against an embedded broker with
`exchange_port=0`. What it stores is read back over gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.__main__ import parse_args
from mockbroker.fronts.exchange_port import PREAMBLE
from mockbroker.fronts.grpc.exchange import ExchangeStream
from sdk import Message
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.codec import MessageIdGenerator, encode_message
from sdk._wire import GRPC_MAX_MESSAGE_BYTES
from sdk.message import MessageQueue
from tests.component.pulling import read_queue
from tests.component.scraping import scrape
from tests.tls_certs import Issued, issue

WAIT = 10.0  # seconds any answer may take before the test fails
IDS = MessageIdGenerator()


class PortClient:
    """One connection to the Exchange port: frames out, frames in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, address: str, *, preamble: bytes = PREAMBLE, tls: ssl.SSLContext | None = None
    ) -> AsyncIterator[PortClient]:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=tls)
        writer.write(preamble)
        try:
            yield cls(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, ssl.SSLError):
                await writer.wait_closed()

    def write(self, *requests: pb.ExchangeRequest) -> None:
        self.write_frame(pb.ExchangeRequests(requests=requests).SerializeToString())

    def write_frame(self, body: bytes, length: int | None = None) -> None:
        self.writer.write(struct.pack(">I", len(body) if length is None else length) + body)

    async def message(self) -> pb.ExchangeResponses | None:
        """The next frame; None at the end of the connection."""
        async with asyncio.timeout(WAIT):
            try:
                (length,) = struct.unpack(">I", await self.reader.readexactly(4))
                body = await self.reader.readexactly(length)
            except asyncio.IncompleteReadError:
                return None
        return pb.ExchangeResponses.FromString(body)

    async def read(self) -> list[pb.ExchangeResponse] | None:
        """The answers of the next frame; None at the end of the connection."""
        message = await self.message()
        return None if message is None else list(message.responses)

    async def greeted(self) -> None:
        assert await self.read() == [], "the broker's first frame carries no answer"

    async def answers(self, count: int) -> dict[int, pb.ExchangeResponse]:
        """The next `count` answers (over as many frames as they come in), by id."""
        got: dict[int, pb.ExchangeResponse] = {}
        while len(got) < count:
            frame = await self.read()
            assert frame is not None, f"the connection ended after {len(got)} answers"
            got.update((a.id, a) for a in frame)
        return got


def send(rid: int, body: bytes, queue_id: int = 0) -> pb.ExchangeRequest:
    frames = encode_message(Message("orders", body, sharding_key="k"), IDS.next(), time.time())
    request = pb.SendRequest(topic="orders", queue_id=queue_id, frames=frames)
    return pb.ExchangeRequest(id=rid, send=request)


def subscribe(rid: int, credit: int, max_messages: int = 32) -> pb.ExchangeRequest:
    """A push subscription of queue 0 from offset 0, with `credit` messages of credit."""
    request = pb.Subscribe(group="g", topic="orders", queue_id=0, offset=0, tag_expression="*",
                           max_messages=max_messages, max_bytes=1 << 20,
                           credit_messages=credit)  # fmt: skip
    return pb.ExchangeRequest(id=rid, subscribe=request)


def subscriptions(b: EmbeddedBroker) -> int:
    """Push subscriptions the broker serves now."""
    assert b.broker._messaging is not None
    return len(b.broker._messaging.exchanges.subscriptions)


def start(tmp_path: Path, **config: Any) -> EmbeddedBroker:
    broker = EmbeddedBroker(
        BrokerConfig(data_dir=tmp_path / "data", exchange_port=0, default_queues=1, **config)
    )
    broker.start()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path)
    try:
        yield b
    finally:
        b.stop()


def address(b: EmbeddedBroker) -> str:
    assert b.exchange_address is not None
    return b.exchange_address


def stored(b: EmbeddedBroker, topic: str = "orders") -> list[bytes]:
    return [m.body for m in read_queue(b.address, MessageQueue(topic, "broker-a", 0))]


def test_sends_and_a_pull_are_answered_by_id_and_stored_in_order(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> None:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            client.write(send(1, b"a"), send(2, b"b"))
            client.write(send(3, b"c"))
            sent = await client.answers(3)
            assert [sent[i].send.first_queue_offset for i in (1, 2, 3)] == [0, 1, 2]
            pull = pb.PullRequest(group="g", topic="orders", queue_id=0, offset=1, max_messages=8,
                                  max_bytes=1 << 20, tag_expression="*")  # fmt: skip
            client.write(pb.ExchangeRequest(id=4, pull=pull))
            (answer,) = (await client.answers(1)).values()
            assert answer.id == 4 and answer.pull.status == pb.FOUND
            assert answer.pull.next_offset == 3

    asyncio.run(main())
    assert stored(broker) == [b"a", b"b", b"c"]


def test_the_answer_of_a_lone_request_is_written_at_once_and_answers_together_joined(
    broker: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no other request in flight, an answer skips the stream's queue (its task's
    wake-up costs a turn of the loop); answers of requests in flight together are
    joined into frames by it."""
    at_once: list[bool] = []
    real = ExchangeStream._written_now

    def spied(self: ExchangeStream, answer: pb.ExchangeResponse) -> bool:
        at_once.append(real(self, answer))
        return at_once[-1]

    monkeypatch.setattr(ExchangeStream, "_written_now", spied)

    async def main() -> list[int]:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            for rid in range(1, 6):  # one after another
                client.write(send(rid, b"lone %d" % rid))
                assert (await client.answers(1))[rid].send.first_queue_offset == rid - 1
            client.write(*(send(rid, b"together %d" % rid) for rid in range(6, 14)))
            frames = []
            while sum(frames) < 8:
                answers = await client.read()
                assert answers is not None
                frames.append(len(answers))
            return frames

    frames = asyncio.run(main())
    assert at_once[:5] == [True] * 5
    assert len(at_once) == 13 and not any(at_once[5:])
    assert len(frames) < 8, f"the answers together went one a frame: {frames}"
    assert stored(broker) == [b"lone %d" % i for i in range(1, 6)] + [
        b"together %d" % i for i in range(6, 14)
    ]


def test_a_request_the_broker_refuses_is_answered_with_its_error_and_the_stream_goes_on(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> None:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            client.write(send(1, b"x", queue_id=9), send(2, b"ok"))  # the topic has 1 queue
            answers = await client.answers(2)
            assert answers[1].error.code == "OUT_OF_RANGE", answers[1]
            assert answers[2].send.first_queue_offset == 0

    asyncio.run(main())
    assert stored(broker) == [b"ok"]


def test_a_push_subscription_delivers_within_its_credit(broker: EmbeddedBroker) -> None:
    async def main() -> None:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            client.write(*(send(i, b"m%d" % i) for i in range(1, 6)))
            await client.answers(5)
            client.write(subscribe(10, credit=2))
            batch = (await client.answers(1))[10].pull
            assert batch.status == pb.FOUND and batch.next_offset == 2  # 2 credits
            client.write(pb.ExchangeRequest(id=10, credit=pb.Credit(messages=3)))
            batch = (await client.answers(1))[10].pull
            assert batch.next_offset == 5

    asyncio.run(main())


def test_the_end_of_the_clients_input_ends_the_stream_once_its_requests_are_answered(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> None:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            client.write(send(1, b"last"))
            client.writer.write_eof()
            assert list(await client.answers(1)) == [1]
            assert await client.read() is None

    asyncio.run(main())
    assert stored(broker) == [b"last"]


@pytest.mark.parametrize(
    ("frame", "length", "code", "reason"),
    [
        (b"\xff\xff\xff", None, "INVALID_ARGUMENT", "INVALID_ARGUMENT"),  # does not parse
        (b"", GRPC_MAX_MESSAGE_BYTES + 1, "RESOURCE_EXHAUSTED", "FRAME_TOO_LARGE"),
        # Id 0 names the connection's own error: an answer to a request of id 0 would
        # read as the end of the connection.
        (
            pb.ExchangeRequests(requests=[send(0, b"zero")]).SerializeToString(),
            None,
            "INVALID_ARGUMENT",
            "REQUEST_ID_ZERO",
        ),
    ],
    ids=["malformed", "too large", "request id 0"],
)
def test_a_bad_frame_ends_the_connection_with_an_error_after_the_answers_before_it(
    broker: EmbeddedBroker, frame: bytes, length: int | None, code: str, reason: str
) -> None:
    async def main() -> None:
        async with PortClient.open(address(broker)) as client:
            await client.greeted()
            client.write(send(1, b"before"))
            client.write_frame(frame, length)
            client.write(send(2, b"after"))  # never read
            answers = await client.answers(2)
            assert answers[1].send.first_queue_offset == 0
            assert (answers[0].error.code, answers[0].error.reason) == (code, reason)
            assert await client.read() is None

    asyncio.run(main())
    assert stored(broker) == [b"before"]


def test_a_connection_without_the_preamble_is_told_what_the_port_serves_and_closed(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> None:
        async with PortClient.open(address(broker), preamble=b"PRI * HTTP/2.0\r\n") as client:
            (answer,) = await client.read() or [None]
            assert answer is not None and answer.id == 0
            assert answer.error.reason == "NOT_EXCHANGE_PROTOCOL"
            assert "not ordermq's Exchange protocol" in answer.error.message
            assert await client.read() is None

    asyncio.run(main())


def test_a_client_that_sends_no_preamble_is_dropped_after_the_peer_wait(
    broker: EmbeddedBroker,
) -> None:
    port = broker.broker.exchange_port
    assert port is not None
    port.peer_wait_seconds = 0.2

    async def main() -> None:
        async with PortClient.open(address(broker), preamble=b"") as client:
            assert await client.read() is None

    asyncio.run(main())


def test_connections_past_the_per_host_limit_are_closed_at_once(
    broker: EmbeddedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    port = broker.broker.exchange_port
    assert port is not None
    port.max_connections_per_host = 1

    async def main() -> None:
        async with PortClient.open(address(broker)) as first:
            await first.greeted()
            async with PortClient.open(address(broker)) as second:
                with contextlib.suppress(ConnectionError):
                    assert await second.read() is None
            first.write(send(1, b"still served"))
            assert 1 in await first.answers(1)
        assert port.refused_connections == 1

    asyncio.run(main())
    assert "(limits 4096 and 1 per host); 1 refused so far" in caplog.text


def test_over_tls_with_the_brokers_certificate(tmp_path: Path) -> None:
    certs: Issued = issue(tmp_path / "certs")
    b = start(tmp_path, tls_cert=certs.cert, tls_key=certs.key)
    try:

        async def main() -> None:
            context = ssl.create_default_context(cafile=str(certs.ca))
            async with PortClient.open(address(b), tls=context) as client:
                await client.greeted()
                client.write(send(1, b"private"))
                assert (await client.answers(1))[1].send.first_queue_offset == 0
            with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
                async with PortClient.open(address(b)) as plain:  # no TLS: not served
                    assert await plain.read() is None
                    raise ConnectionError("closed")

        asyncio.run(main())
    finally:
        b.stop()


def test_the_command_line_turns_it_on(tmp_path: Path) -> None:
    args = ["--data-dir", str(tmp_path), "--exchange-port", "0"]
    assert parse_args(args).exchange_port == 0


def test_a_ping_is_answered_and_a_client_silent_after_the_brokers_ping_is_closed(
    tmp_path: Path,
) -> None:
    """Keepalive: a client's ping gets a pong at once. The broker pings a connection it
    has read nothing on for keepalive_seconds: one that answers stays open, one that
    answers nothing within as long again is closed, its push subscription with it."""
    b = start(tmp_path, keepalive_seconds=0.3)
    ping = pb.ExchangeRequests(ping=True).SerializeToString()
    pong = pb.ExchangeRequests(pong=True).SerializeToString()

    async def main() -> None:
        async with PortClient.open(address(b)) as answering, PortClient.open(address(b)) as silent:
            await answering.greeted()
            await silent.greeted()
            answering.write(send(1, b"first"))
            assert list(await answering.answers(1)) == [1]
            silent.write(subscribe(1, credit=10))
            answering.write_frame(ping)
            answer = await answering.message()
            assert answer is not None and answer.pong and not answer.responses
            for _ in range(3):  # the broker's pings, each answered
                answer = await answering.message()
                assert answer is not None and answer.ping
                answering.write_frame(pong)
            answer = await silent.message()
            assert answer is not None and [a.id for a in answer.responses] == [1]  # pushed
            answer = await silent.message()
            assert answer is not None and answer.ping
            assert await silent.message() is None, "the silent client is closed"
            answering.write(send(2, b"still open"))
            assert list(await answering.answers(1)) == [2]

    try:
        asyncio.run(main())
        assert subscriptions(b) == 0
        assert stored(b) == [b"first", b"still open"]
    finally:
        b.stop()


def test_a_client_that_stops_reading_is_dropped_and_holds_up_nobody(
    broker: EmbeddedBroker,
) -> None:
    """Its subscription's batches fill the socket: the broker waits peer_wait_seconds for
    it to read, then drops it, while another client's requests are answered meanwhile."""
    port = broker.broker.exchange_port
    assert port is not None
    port.peer_wait_seconds = 0.5
    body = b"x" * 4000

    async def main() -> None:
        async with PortClient.open(address(broker)) as writer:
            await writer.greeted()
            for i in range(0, 2000, 100):
                writer.write(*(send(i + j + 1, body) for j in range(100)))
                await writer.answers(100)
            async with PortClient.open(address(broker)) as stalled:
                stalled.write(subscribe(1, credit=10_000, max_messages=100))  # never read
                for i in range(5):
                    writer.write(send(10_000 + i, b"on"))
                    assert 10_000 + i in await writer.answers(1)
                    await asyncio.sleep(0.2)
                async with asyncio.timeout(WAIT):
                    while port.connections > 1:
                        await asyncio.sleep(0.05)

    asyncio.run(main())


def test_stop_ends_the_connections_of_clients_that_wait_on_subscriptions(
    tmp_path: Path,
) -> None:
    b = start(tmp_path)
    stopped = False
    try:

        async def main() -> None:
            nonlocal stopped
            async with PortClient.open(address(b)) as client:
                await client.greeted()
                client.write(send(1, b"only"))  # the topic exists: the subscription waits
                await client.answers(1)
                client.write(subscribe(2, credit=100))
                assert (await client.answers(1))[2].pull.next_offset == 1  # then waits
                assert subscriptions(b) == 1
                async with asyncio.timeout(WAIT):
                    await asyncio.to_thread(b.stop)
                stopped = True
                while (frame := await client.read()) is not None:
                    assert all(a.id == 2 for a in frame)

        asyncio.run(main())
    finally:
        if not stopped:
            b.stop()


def test_the_metrics_count_the_ports_connections(tmp_path: Path) -> None:
    b = start(tmp_path, metrics_port=0)
    try:
        assert b.broker.metrics_port is not None
        metrics_port = b.broker.metrics_port

        def sample(name: str) -> float:
            return scrape(metrics_port)[(f"ordermq_exchange_port_connections{name}", ())]

        async def main() -> None:
            async with PortClient.open(address(b)) as client:
                await client.greeted()
                assert await asyncio.to_thread(sample, "") == 1
            async with asyncio.timeout(WAIT):
                while await asyncio.to_thread(sample, "") != 0:
                    await asyncio.sleep(0.05)

        asyncio.run(main())
        assert sample("_accepted_total") == 1
        assert sample("_refused_total") == 0
    finally:
        b.stop()
