"""ordermq's clients over RocketMQ remoting ("rocketmq://"): what it refuses, and bad servers.

The clients' behaviour over this transport is tested by the modules that run over each
transport (tests/component/transports.py); here: choosing it, each operation RocketMQ
cannot do (UnsupportedByTransportError, by name), and servers that answer badly, each of
which ends in a clear OrderMQError rather than a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    Producer,
    PushConsumer,
    PushConsumerConfig,
    SimpleConsumer,
)
from sdk._remoting.codec import encode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.message_layout import COMPRESSED_FLAG, decompress_body
from sdk._remoting.translate import COMPRESS_OVER_BYTES, compressed, from_frame
from sdk._transport import connect, remoting_transport
from sdk._transport.codec import encode_message
from sdk._transport.grpc_transport import GrpcTransport
from sdk._transport.remoting_transport import RemotingTransport
from sdk.errors import (
    BrokerError,
    BrokerUnavailableError,
    InvalidArgumentError,
    OrderMQError,
    TopicNotFoundError,
    UnsupportedByTransportError,
)
from sdk.message import MessageQueue
from sdk.testing import FakeClock
from tests.component.pulling import read_queue
from tests.component.transports import BrokerOver, broker_over
from tests.support import wait_until


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerOver]:
    with broker_over("rocketmq", tmp_path / "broker") as b:
        yield b


# ---------------------------------------------------------------------------- choosing
@pytest.mark.parametrize(
    "endpoints",
    ["rocketmq://ns1:9876;ns2:9876", "rocketmq://ns1:9876,ns2:9876",
     ["rocketmq://ns1:9876", "rocketmq://ns2:9876"], ["rocketmq://ns1:9876", "ns2:9876"]],
    ids=["semicolons", "commas", "list", "list-scheme-once"],
)  # fmt: skip
def test_a_rocketmq_scheme_chooses_remoting_with_every_name_server(
    endpoints: str | list[str],
) -> None:
    transport = connect(endpoints)
    assert isinstance(transport, RemotingTransport)
    assert transport.name_servers == ["ns1:9876", "ns2:9876"]
    assert isinstance(connect("h1:1;h2:2"), GrpcTransport)


@pytest.mark.parametrize(
    ("endpoints", "words"),
    [("kafka://k:9092", "unknown scheme 'kafka://'"),
     (["h1:1", "rocketmq://ns:9876"], "only the first endpoint's scheme")],
    ids=["unknown", "second-only"],
)  # fmt: skip
def test_other_schemes_are_refused_naming_the_accepted_forms(
    endpoints: str | list[str], words: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=words) as caught:
        connect(endpoints)
    assert "rocketmq://ns1:9876;ns2:9876" in str(caught.value)


# ---------------------------------------------------------------------------- refused
def test_what_rocketmq_cannot_do_is_refused_by_name(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        refused = [
            Message("t", b"x", deliver_at=time.time() + 60),
            Message("t", b"x", delay_seconds=7),  # not one of the 18 levels
            Message("t", b"x", properties={"empty": ""}),
            Message("t", b"x", keys=["two words"]),
        ]
        for message in refused:
            with pytest.raises(UnsupportedByTransportError, match="rocketmq://") as caught:
                producer.send(message)
            assert caught.value.transport == "rocketmq://"
        with pytest.raises(UnsupportedByTransportError, match="cancelling scheduled message"):
            producer.cancel("0" * 32)
        # a delay of one of RocketMQ's levels is sent, and waits (level 2: 5 s)
        sent = producer.send(Message("t", b"later", delay_seconds=5, sharding_key="k"))
        assert sent.queue_offset == -1
    with LitePullConsumer("g", broker.address, auto_commit=False) as reader:
        reader.assign([sent.queue])
        assert reader.poll(0.3) == []


def test_a_simple_consumer_is_refused_by_name(broker: BrokerOver) -> None:
    with Producer(broker.address) as producer:
        producer.send(Message("jobs", b"x"))
    with SimpleConsumer("workers", broker.address, await_duration=0.1) as consumer:
        consumer.subscribe("jobs")
        with pytest.raises(UnsupportedByTransportError, match="receiving with an invisible"):
            consumer.receive()


def test_a_large_body_is_sent_compressed_and_read_plain(broker: BrokerOver) -> None:
    body = b"compressible " * 1000
    frame = encode_message(Message("t", body), bytes(16), 1.0)[4:]
    wire = compressed(from_frame(frame))
    assert wire.sys_flag & COMPRESSED_FLAG and len(wire.body) < COMPRESS_OVER_BYTES
    assert decompress_body(wire.body, wire.sys_flag, max_bytes=len(body)) == body
    small = compressed(from_frame(encode_message(Message("t", b"small"), bytes(16), 1.0)[4:]))
    assert small.sys_flag == 0 and small.body == b"small"
    with Producer(broker.address) as producer:
        sent = producer.send(Message("t", body, sharding_key="k"))
    with LitePullConsumer("g", broker.address, auto_commit=False) as reader:
        reader.assign([sent.queue])
        reader.seek(sent.queue, sent.queue_offset)
        got = reader.poll(5.0)
    assert [m.body for m in got] == [body]


# ---------------------------------------------------------------------------- bad servers
Answer = Callable[[RemotingCommand, asyncio.StreamWriter], Awaitable[None]]


async def serve(answer: Answer) -> tuple[asyncio.Server, str]:
    """A server that reads remoting frames and hands each to `answer`."""

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from sdk._remoting.codec import read_command

        try:
            while (command := await read_command(reader)) is not None:
                await answer(command, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def route_for(broker_address: str) -> Answer:
    body = json.dumps({
        "brokerDatas": [{"brokerName": "b", "cluster": "c", "brokerAddrs": {"0": broker_address}}],
        "queueDatas": [{"brokerName": "b", "perm": 6, "readQueueNums": 2, "writeQueueNums": 2,
                        "topicSysFlag": 0}],
    }).encode()  # fmt: skip

    async def answer(command: RemotingCommand, writer: asyncio.StreamWriter) -> None:
        writer.write(encode(command.response(body=body)))
        await writer.drain()

    return answer


@pytest.fixture
def dead_address() -> str:
    """An address nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_route_naming_a_dead_broker_fails_the_send_clearly(dead_address: str) -> None:
    async def scenario() -> None:
        server, ns = await serve(await route_for(dead_address))
        transport = connect(f"rocketmq://{ns}")
        try:
            queues = await transport.writable_queues("t")
            assert queues == [MessageQueue("t", "b", 0), MessageQueue("t", "b", 1)]
            prepared = transport.prepare(Message("t", b"x"), bytes(16), time.time())
            with pytest.raises(BrokerUnavailableError, match=f"connect to {dead_address}"):
                await asyncio.wait_for(transport.send(queues[0], [prepared], timeout=2), 10)
        finally:
            await transport.close()
            server.close()

    asyncio.run(scenario())


def test_a_route_is_known_without_asking_until_it_is_due_again(
    dead_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a producer's send takes without awaiting a route lookup (issue 35)."""

    async def scenario() -> None:
        server, ns = await serve(await route_for(dead_address))
        transport = connect(f"rocketmq://{ns}")
        try:
            assert transport.known_writable_queues("t") is None  # never asked
            queues = await transport.writable_queues("t")
            assert transport.known_writable_queues("t") == queues
            monkeypatch.setattr(remoting_transport, "ROUTE_REFRESH_SECONDS", -1.0)
            assert transport.known_writable_queues("t") is None  # due: send() asks again
        finally:
            await transport.close()
            server.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("reply", "error", "words"),
    [
        (lambda c: encode(c.response(code=999, remark="what is this")), BrokerError,
         "CODE_999: what is this"),
        (lambda c: encode(c.response(code=17, remark="no route")), TopicNotFoundError,
         "TOPIC_NOT_EXIST: no route"),
        (lambda c: encode(c.response(body=b"{not json")), BrokerError, "does not parse"),
        (lambda c: struct.pack(">I", 4) + b"\xff\xff", BrokerError, "malformed frame|closed"),
        (lambda c: encode(c.response())[:10], BrokerError, "stream ended 6 bytes into a frame"),
        (lambda c: b"", BrokerUnavailableError, "did not answer request code 105 within 0.3 s"),
    ],
    ids=["unknown-code", "no-route", "bad-json", "bad-header", "truncated", "silent"],
)  # fmt: skip
def test_a_name_server_answering_badly_ends_in_a_clear_error(
    reply: Callable[[RemotingCommand], bytes],
    error: type[OrderMQError],
    words: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The silent name server's error is the request's timeout: short, to be waited for. The
    # others answer, and their error must not race that timeout: a process stopped 0.3 s (a
    # loaded machine) failed the truncated answer with "did not answer ... within 0.3 s".
    seconds = 0.3 if error is BrokerUnavailableError else 30.0
    monkeypatch.setattr(remoting_transport, "REQUEST_SECONDS", seconds)

    async def answer(command: RemotingCommand, writer: asyncio.StreamWriter) -> None:
        data = reply(command)
        if data:
            writer.write(data)
            await writer.drain()
            if len(data) < 30:  # a cut-short or malformed frame: nothing follows
                writer.close()

    async def scenario() -> None:
        server, ns = await serve(answer)
        transport = connect(f"rocketmq://{ns}")
        try:
            with pytest.raises(error, match=words):
                await asyncio.wait_for(transport.readable_queues("t"), 10)
        finally:
            await transport.close()
            server.close()

    asyncio.run(scenario())


def test_name_servers_are_asked_in_turn_past_one_that_is_down(
    broker: BrokerOver, dead_address: str
) -> None:
    with Producer(broker.address) as producer:
        producer.send(Message("t", b"x"))

    async def scenario() -> int:
        transport = connect(f"rocketmq://{dead_address};{broker.embedded.namesrv_address}")
        try:
            return len(await transport.readable_queues("t"))
        finally:
            await transport.close()

    assert asyncio.run(scenario()) == 8


# ---------------------------------------------------------------------------- send-back
@pytest.mark.parametrize("path", ["send-msg-back", "retry-topic-send"])
def test_a_failing_message_is_retried_then_dead_lettered_with_its_fields(
    tmp_path: Path, path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """CONSUMER_SEND_MSG_BACK, or (when a broker refuses it) the retry-topic send."""
    caplog.set_level(logging.INFO, "ordermq.remoting")
    used: list[str] = []
    if path == "retry-topic-send":

        async def refuse(*args: object) -> None:
            used.append("refused")
            raise BrokerError("CONSUMER_SEND_MSG_BACK refused, as a test")

        monkeypatch.setattr(RemotingTransport, "_send_msg_back", refuse)
    clock = FakeClock()
    attempts: list[MessageExt] = []

    class Failing(MessageListenerConcurrently):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
        ) -> ConsumeConcurrentlyStatus:
            attempts.extend(msgs)
            return ConsumeConcurrentlyStatus.RECONSUME_LATER

    config = PushConsumerConfig(max_reconsume_times=2, consume_message_batch_max_size=1)
    with broker_over("rocketmq", tmp_path, clock=clock) as broker:
        with Producer(broker.address) as producer:
            sent = producer.send(Message("orders", b"poison", tags="T", keys="k1",
                                         properties={"p": "v"}, sharding_key="o-1"))  # fmt: skip
        consumer = PushConsumer("g", broker.address, config=config,
                                consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        consumer.subscribe("orders")
        consumer.register_message_listener(Failing())
        state = broker.broker.state
        assert state is not None
        with consumer:
            for tries, delay in ((1, 10.1), (2, 30.1)):  # levels 3 and 4
                wait_until(lambda t=tries: len(attempts) == t, 20, f"try {tries}")
                wait_until(lambda: state.scheduler.pending == 1, 20, "the retry scheduled")
                clock.advance(delay)
            wait_until(lambda: len(attempts) == 3, 20, "the last try")
            dlq = MessageQueue("%DLQ%g", "broker-a", 0)

            def dead_letters() -> list[MessageExt]:
                # The last try is counted before its send-back creates the DLQ topic.
                try:
                    return read_queue(broker.grpc_address, dlq)
                except TopicNotFoundError:
                    return []

            wait_until(lambda: bool(dead_letters()), 20, "dead letter")
        [dead] = read_queue(broker.grpc_address, dlq)
    assert [(m.reconsume_times, m.topic, m.msg_id) for m in attempts] == [
        (0, "orders", sent.msg_id), (1, "orders", sent.msg_id), (2, "orders", sent.msg_id),
    ]  # fmt: skip
    assert (dead.body, dead.msg_id, dead.tags, dead.keys, dead.sharding_key) == (
        b"poison", sent.msg_id, "T", ("k1",), "o-1",
    )  # fmt: skip
    assert dead.properties["p"] == "v" and dead.properties["ORIGIN_TOPIC"] == "orders"
    assert used == ([] if path == "send-msg-back" else ["refused"] * 3)
    fell_back = caplog.text.count("sending it to %RETRY%g")
    assert fell_back == (0 if path == "send-msg-back" else 3)
