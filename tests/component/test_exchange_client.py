"""BrokerClient's Send and Pull on the Exchange stream, against the embedded broker."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport import exchange as exchange_module
from sdk._transport.broker_client import BrokerClient, PullStatus
from sdk._transport.status import to_ordermq_error
from sdk._wire import encode_frame
from sdk.errors import BrokerUnavailableError, OrderMQError, RequestTimeoutError
from tests.component.coordination import mq
from tests.component.pulling import read_queue
from tests.support import pinned, wait_until

T = TypeVar("T")
WAIT = 10.0  # seconds any awaited condition may take before the test fails


def frame(body: bytes, n: int = 0) -> bytes:
    return encode_frame(msg_id=n.to_bytes(16, "big"), born_timestamp_ms=1, body=body)


def held(broker: EmbeddedBroker) -> int:
    state = broker.broker.state
    assert state is not None
    return state.holder.held


def open_streams(broker: EmbeddedBroker) -> int:
    return broker.broker.exchange_streams


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    await asyncio.to_thread(wait_until, condition, WAIT, what)


async def eventually(attempt: Callable[[], Awaitable[T]], what: str) -> T:
    """`attempt()` retried while the broker is unavailable, for at most WAIT seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return await attempt()
        except BrokerUnavailableError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} still failing after {WAIT}s") from None
        await asyncio.sleep(0.01)  # the polling interval of tests.support.wait_until


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(main(), 3 * WAIT)

    return asyncio.run(bounded())


@pytest.fixture
def client_broker(broker: EmbeddedBroker) -> Iterator[EmbeddedBroker]:
    """The embedded broker with topic "t" (8 queues)."""

    async def create() -> None:
        client = BrokerClient(broker.address)
        await client.create_topic("t", 8)
        await client.close()

    asyncio.run(create())
    yield broker


def test_pipelined_sends_to_one_queue_are_stored_in_call_order(
    client_broker: EmbeddedBroker,
) -> None:
    async def main() -> list[int]:
        client = BrokerClient(client_broker.address)
        appended = await asyncio.gather(
            *(client.send("t", 2, frame(str(i).encode(), i)) for i in range(500))
        )
        assert open_streams(client_broker) == 1
        await client.close()
        return [a.first_offset for a in appended]

    assert run(main) == list(range(500))
    stored = read_queue(client_broker.address, mq("t", 2))
    assert [m.body for m in stored] == [str(i).encode() for i in range(500)]


def test_a_held_pull_is_woken_by_a_send_on_the_same_stream(client_broker: EmbeddedBroker) -> None:
    async def main() -> None:
        client = BrokerClient(client_broker.address)
        pull = asyncio.create_task(client.pull("g", mq("t", 3), 0, suspend_timeout=15))
        await wait_for(lambda: held(client_broker) == 1, "the pull to be held")
        appended = await client.send("t", 3, frame(b"wake up"))
        result = await pull
        assert appended.first_offset == 0
        assert (result.status, [m.body for m in result.messages]) == (
            PullStatus.FOUND, [b"wake up"],
        )  # fmt: skip
        assert open_streams(client_broker) == 1
        await client.close()

    run(main)


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
def test_a_held_pull_its_caller_gave_up_on_frees_its_slot(
    client_broker: EmbeddedBroker, how: str
) -> None:
    async def main() -> None:
        client = BrokerClient(client_broker.address)
        timeout = 2.0 if how == "timed out" else None  # long enough to see it held
        pull = asyncio.create_task(
            client.pull("g", mq("t", 4), 0, suspend_timeout=30, timeout=timeout)
        )
        await wait_for(lambda: held(client_broker) == 1, "the pull to be held")
        if how == "cancelled":
            pull.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pull
        else:
            with pytest.raises(RequestTimeoutError, match="pull of t queue 4"):
                await pull
        await wait_for(lambda: held(client_broker) == 0, "the held pull to be freed")
        # The stream carries on.
        assert (await client.send("t", 4, frame(b"after"))).first_offset == 0
        assert open_streams(client_broker) == 1
        await client.close()

    run(main)


async def unary_error(address: str, request: pb.SendRequest | pb.PullRequest) -> OrderMQError:
    """What the unary Send or Pull raises for `request` (through the SDK's mapping)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)
        try:
            if isinstance(request, pb.SendRequest):
                await stub.Send(request)
            else:
                await stub.Pull(request)
        except grpc.aio.AioRpcError as exc:
            return to_ordermq_error(exc)
    raise AssertionError(f"the unary call succeeded: {request}")


@pytest.mark.parametrize(
    ("topic", "queue_id", "frames"),
    [
        ("t", 99, frame(b"x")),  # INVALID_QUEUE
        ("t", 0, frame(b"")),  # EMPTY_BODY
        ("t", 0, b"\x01\x02"),  # MALFORMED_FRAME
        ("%bad", 0, frame(b"x")),  # INVALID_TOPIC
    ],
)
def test_a_bad_send_raises_what_the_unary_send_raises(
    client_broker: EmbeddedBroker, topic: str, queue_id: int, frames: bytes
) -> None:
    async def main() -> tuple[OrderMQError, OrderMQError]:
        client = BrokerClient(client_broker.address)
        with pytest.raises(OrderMQError) as raised:
            await client.send(topic, queue_id, frames)
        assert open_streams(client_broker) == 1
        await client.close()
        request = pb.SendRequest(topic=topic, queue_id=queue_id, frames=frames)
        return raised.value, await unary_error(client_broker.address, request)

    streamed, unary = run(main)
    assert (type(streamed), streamed.code, streamed.reason, streamed.message) == (
        type(unary), unary.code, unary.reason, unary.message,
    )  # fmt: skip
    assert streamed.reason is not None


@pytest.mark.parametrize(
    ("topic", "max_messages"),
    [("t", 0), ("missing", 1)],  # INVALID_ARGUMENT, TOPIC_NOT_FOUND
)
def test_a_bad_pull_raises_what_the_unary_pull_raises(
    client_broker: EmbeddedBroker, topic: str, max_messages: int
) -> None:
    async def main() -> tuple[OrderMQError, OrderMQError]:
        client = BrokerClient(client_broker.address)
        with pytest.raises(OrderMQError) as raised:
            await client.pull("g", mq(topic, 0), 0, max_messages=max_messages)
        await client.close()
        request = pb.PullRequest(
            group="g", topic=topic, queue_id=0, max_messages=max_messages,
            max_bytes=4 * 1024 * 1024, tag_expression="*",
        )  # fmt: skip
        return raised.value, await unary_error(client_broker.address, request)

    streamed, unary = run(main)
    assert (type(streamed), streamed.code, streamed.reason, streamed.message) == (
        type(unary), unary.code, unary.reason, unary.message,
    )  # fmt: skip


def test_a_broker_restart_mid_stream(tmp_path: Path) -> None:
    first = EmbeddedBroker(BrokerConfig(data_dir=tmp_path, port=0))
    first.start()
    address = first.address
    config = pinned(first.config, first)
    second = EmbeddedBroker(config)

    async def main() -> None:
        client = BrokerClient(address)
        await client.create_topic("t", 8)
        await client.send("t", 0, frame(b"before"))
        pull = asyncio.create_task(client.pull("g", mq("t", 1), 0, suspend_timeout=30))
        await wait_for(lambda: held(first) == 1, "the pull to be held")
        await asyncio.to_thread(first.stop)
        # A stopping broker answers its held pulls before it ends the stream.
        assert (await pull).status is PullStatus.NO_NEW_MESSAGE
        with pytest.raises(BrokerUnavailableError):
            await client.send("t", 0, frame(b"while down"))
        await asyncio.to_thread(second.start)
        appended = await eventually(
            lambda: client.send("t", 0, frame(b"after")), "a send after the restart"
        )
        assert appended.first_offset == 1
        await client.close()

    try:
        run(main)
    finally:
        first.stop()
        second.stop()
    with EmbeddedBroker(config) as third:
        assert [m.body for m in read_queue(third.address, mq("t", 0))] == [b"before", b"after"]


class CuttableProxy:
    """A TCP proxy to `target` whose connections can be cut at once (a network failure)."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.connections: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    def cut(self) -> None:
        """Reset every open connection, both ways."""
        for writer in self.connections:
            writer.transport.abort()
        self.connections.clear()

    async def close(self) -> None:
        self.cut()
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.connections += [writer, up_writer]
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()


def test_a_dropped_connection_fails_pending_calls_and_later_calls_succeed(
    client_broker: EmbeddedBroker,
) -> None:
    async def main() -> None:
        proxy = CuttableProxy(client_broker.address)
        client = BrokerClient(await proxy.start())
        await client.send("t", 5, frame(b"first"))
        pulls = [
            asyncio.create_task(client.pull("g", mq("t", q), 0, suspend_timeout=30)) for q in (6, 7)
        ]
        await wait_for(lambda: held(client_broker) == 2, "the pulls to be held")
        proxy.cut()
        for outcome in await asyncio.gather(*pulls, return_exceptions=True):
            assert isinstance(outcome, BrokerUnavailableError), outcome
        # The broker saw its stream go and let go of the pulls.
        await wait_for(lambda: held(client_broker) == 0, "the held pulls to be freed")
        appended = await eventually(
            lambda: client.send("t", 5, frame(b"second")), "a send after the cut"
        )
        assert appended.first_offset == 1
        await client.close()
        await proxy.close()

    run(main)


def test_concurrent_requests_share_stream_messages_and_each_gets_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: list[int] = []
    join = exchange_module.join_repeated

    def counted(serialized: list[bytes]) -> bytes:
        written.append(len(serialized))
        return join(serialized)

    monkeypatch.setattr(exchange_module, "join_repeated", counted)
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b")) as broker:

        async def main() -> list[int]:
            client = BrokerClient(broker.address)
            try:
                await client.create_topic("t", 2)
                sends = [client.send("t", 1, frame(b"m%d" % n, n)) for n in range(40)]
                return [a.first_offset for a in await asyncio.gather(*sends)]
            finally:
                await client.close()

        offsets = run(main)
    assert offsets == list(range(40)), "stored in call order, each answered"
    assert sum(written) == 40 and len(written) < 10, written


def test_a_lone_request_is_written_at_once_and_a_crowd_after_the_loop_settled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settles: list[int] = []
    settled = exchange_module.settled

    async def counted(queue: asyncio.Queue[object]) -> None:
        settles.append(queue.qsize())
        await settled(queue)

    monkeypatch.setattr(exchange_module, "settled", counted)
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b")) as broker:

        async def main() -> None:
            client = BrokerClient(broker.address)
            try:
                await client.create_topic("t", 2)
                await client.send("t", 0, frame(b"alone"))
                assert settles == [], "one request queued: written without waiting"
                await asyncio.gather(*(client.send("t", 1, frame(b"m%d" % n, n)) for n in range(5)))
                assert settles and settles[0] >= 1, "others were queued: the loop settled first"
            finally:
                await client.close()

        run(main)
