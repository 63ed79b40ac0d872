"""The broker's Exchange stream, spoken over raw gRPC: each request as its unary RPC would
answer it, concurrently, matched by id; cancels, half-close and shutdown end it cleanly.

Every test runs on Exchange and on ExchangeBatched (requests and answers several to a
stream message), which must behave alike request by request.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.fronts.grpc import exchange
from mockbroker.fronts.grpc.service import MessagingService
from sdk import Message
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.codec import MessageIdGenerator, encode_message
from sdk.testing import FakeClock
from tests.support import wait_until

T = TypeVar("T")
TOPIC = "ex"
IDS = MessageIdGenerator()


def frame(body: bytes = b"x") -> bytes:
    return encode_message(Message(TOPIC, body), IDS.next(), time.time())


def send(rid: int, queue_id: int, frames: bytes) -> pb.ExchangeRequest:
    return pb.ExchangeRequest(
        id=rid, send=pb.SendRequest(topic=TOPIC, queue_id=queue_id, frames=frames)
    )


def pull(rid: int, queue_id: int, offset: int, suspend_ms: int = 0) -> pb.ExchangeRequest:
    return pb.ExchangeRequest(
        id=rid,
        pull=pb.PullRequest(
            group="g", topic=TOPIC, queue_id=queue_id, offset=offset, max_messages=32,
            max_bytes=1 << 20, suspend_timeout_ms=suspend_ms, tag_expression="*",
        ),
    )  # fmt: skip


def held(broker: EmbeddedBroker) -> int:
    assert broker.broker.state is not None
    return broker.broker.state.holder.held


@contextlib.contextmanager
def grpc_topic(broker: EmbeddedBroker) -> Iterator[None]:
    """Create TOPIC (4 queues) on `broker`."""

    async def create() -> None:
        async with grpc.aio.insecure_channel(broker.address) as ch:
            admin = pb_grpc.AdminServiceStub(ch)
            await admin.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, queue_count=4))

    asyncio.run(create())
    yield


@pytest.fixture
def exbroker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b")) as b, grpc_topic(b):
        yield b


class Batched:
    """An ExchangeBatched call read and written as an Exchange call: one request a message
    written (or several, `write_many`), answers read one by one from their messages."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._ready: list[pb.ExchangeResponse] = []
        self._greeted = False
        self.messages_read = 0

    async def write(self, request: pb.ExchangeRequest) -> None:
        await self.write_many([request])

    async def write_many(self, requests: list[pb.ExchangeRequest]) -> None:
        await self._call.write(pb.ExchangeRequests(requests=requests))

    async def read(self) -> Any:
        if not self._greeted:
            greeting = await self._call.read()
            assert greeting == pb.ExchangeResponses(), "the first message carries no answer"
            self._greeted = True
        while not self._ready:
            message = await self._call.read()
            if message is grpc.aio.EOF:
                return message
            self.messages_read += 1
            self._ready.extend(message.responses)
        return self._ready.pop(0)

    async def done_writing(self) -> None:
        await self._call.done_writing()

    async def code(self) -> grpc.StatusCode:
        return await self._call.code()  # type: ignore[no-any-return]


#: The RPC the tests of this module run on (the autouse fixture `rpc` sets it).
RPC = ["Exchange"]


@pytest.fixture(autouse=True, params=["Exchange", "ExchangeBatched"])
def rpc(request: pytest.FixtureRequest) -> Iterator[str]:
    RPC[0] = request.param
    yield request.param
    RPC[0] = "Exchange"


def open_stream(stub: pb_grpc.MessagingServiceStub) -> Any:
    """An Exchange stream on `stub`, or an ExchangeBatched one read and written alike."""
    return stub.Exchange() if RPC[0] == "Exchange" else Batched(stub.ExchangeBatched())


def run(
    broker: EmbeddedBroker,
    body: Callable[[pb_grpc.MessagingServiceStub, Any], Awaitable[T]],
) -> T:
    """Run `body(stub, stream)` with one open Exchange (or ExchangeBatched) stream."""

    async def main() -> T:
        async with grpc.aio.insecure_channel(broker.address) as ch:
            stub = pb_grpc.MessagingServiceStub(ch)
            return await body(stub, open_stream(stub))

    return asyncio.run(main())


async def answers(stream: Any, n: int) -> list[pb.ExchangeResponse]:
    return [await stream.read() for _ in range(n)]


async def until_eof(stream: Any) -> list[pb.ExchangeResponse]:
    got = []
    while (answer := await stream.read()) is not grpc.aio.EOF:
        got.append(answer)
    return got


def test_a_held_pull_does_not_hold_up_the_send_behind_it(exbroker: EmbeddedBroker) -> None:
    async def body(stub: Any, stream: Any) -> list[pb.ExchangeResponse]:
        await stream.write(pull(1, 2, 0, suspend_ms=10_000))
        await asyncio.to_thread(wait_until, lambda: held(exbroker) == 1)
        await stream.write(send(2, 2, frame(b"wake")))
        got = await answers(stream, 2)
        await stream.done_writing()
        return got

    first, second = run(exbroker, body)
    assert (first.id, first.WhichOneof("body")) == (2, "send")
    assert (first.send.status, first.send.first_queue_offset, first.send.count) == (
        pb.SEND_OK,
        0,
        1,
    )
    assert (second.id, second.pull.status, second.pull.record_count) == (1, pb.FOUND, 1)


def test_pipelined_sends_are_stored_in_the_order_they_arrive(exbroker: EmbeddedBroker) -> None:
    async def body(stub: Any, stream: Any) -> list[pb.ExchangeResponse]:
        for rid in range(1, 201):
            await stream.write(send(rid, 0, frame(rid.to_bytes(2, "big"))))
        got = await answers(stream, 200)
        await stream.done_writing()
        return got

    got = run(exbroker, body)
    assert sorted((a.id, a.send.first_queue_offset) for a in got) == [
        (rid, rid - 1) for rid in range(1, 201)
    ]


async def unary_error(call: Awaitable[Any]) -> tuple[str, str, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    reason = dict(info.value.trailing_metadata() or ()).get("ordermq-reason", "")
    return info.value.code().name, str(reason), info.value.details() or ""


@pytest.mark.parametrize(
    "request_",
    [
        pb.SendRequest(topic=TOPIC, queue_id=9, frames=frame()),  # no such queue
        pb.SendRequest(topic=TOPIC, queue_id=0, frames=b""),  # no frames
        pb.SendRequest(topic="not a topic", queue_id=0, frames=frame()),
        pb.PullRequest(group="g", topic=TOPIC, queue_id=0, max_messages=0, max_bytes=1),
    ],
)
def test_a_refused_request_is_answered_as_its_unary_rpc_ends(
    exbroker: EmbeddedBroker, request_: pb.SendRequest | pb.PullRequest
) -> None:
    kind = "send" if isinstance(request_, pb.SendRequest) else "pull"

    async def body(stub: Any, stream: Any) -> tuple[tuple[str, str, str], pb.ExchangeResponse]:
        unary = await unary_error((stub.Send if kind == "send" else stub.Pull)(request_))
        await stream.write(pb.ExchangeRequest(id=7, **{kind: request_}))
        got = await stream.read()
        await stream.done_writing()
        return unary, got

    unary, got = run(exbroker, body)
    assert got.id == 7 and got.WhichOneof("body") == "error"
    assert (got.error.code, got.error.reason, got.error.message) == unary


def test_requests_without_a_body_or_with_an_id_in_flight_are_refused(
    exbroker: EmbeddedBroker,
) -> None:
    async def body(stub: Any, stream: Any) -> list[pb.ExchangeResponse]:
        await stream.write(pull(5, 1, 0, suspend_ms=10_000))
        await asyncio.to_thread(wait_until, lambda: held(exbroker) == 1)
        await stream.write(pull(5, 1, 0))  # same id while the first is held
        await stream.write(pb.ExchangeRequest(id=6))
        got = await answers(stream, 2)
        await stream.write(send(8, 1, frame()))  # wakes the held pull 5
        got += await answers(stream, 2)
        await stream.done_writing()
        return got

    dup, empty, *rest = run(exbroker, body)
    assert (dup.id, dup.error.code, dup.error.reason) == (5, "INVALID_ARGUMENT", "INVALID_ARGUMENT")
    assert "already in flight" in dup.error.message
    assert (empty.id, empty.error.code) == (6, "INVALID_ARGUMENT")
    assert "carries no body" in empty.error.message
    assert sorted((a.id, a.WhichOneof("body")) for a in rest) == [(5, "pull"), (8, "send")]


def test_a_cancelled_pull_frees_its_slot_and_gets_no_answer(exbroker: EmbeddedBroker) -> None:
    async def body(stub: Any, stream: Any) -> tuple[list[pb.ExchangeResponse], int]:
        await stream.write(pull(1, 3, 0, suspend_ms=10_000))
        await asyncio.to_thread(wait_until, lambda: held(exbroker) == 1)
        await stream.write(pb.ExchangeRequest(id=1, cancel=pb.ExchangeCancel()))
        await asyncio.to_thread(wait_until, lambda: held(exbroker) == 0)
        await stream.write(pb.ExchangeRequest(id=99, cancel=pb.ExchangeCancel()))  # unknown
        await stream.write(send(2, 3, frame()))
        await stream.done_writing()
        got = await until_eof(stream)
        return got, (await stream.code()).value[0]

    got, code = run(exbroker, body)
    assert [(a.id, a.WhichOneof("body")) for a in got] == [(2, "send")]
    assert code == grpc.StatusCode.OK.value[0]


def test_half_close_ends_the_stream_once_every_request_is_answered(
    exbroker: EmbeddedBroker,
) -> None:
    async def body(stub: Any, stream: Any) -> tuple[list[int], grpc.StatusCode]:
        await stream.write(pull(1, 0, 0, suspend_ms=200))  # answered NO_NEW_MESSAGE later
        await stream.done_writing()
        ids = [a.id for a in await until_eof(stream)]
        return ids, await stream.code()

    assert run(exbroker, body) == ([1], grpc.StatusCode.OK)


def test_broker_shutdown_answers_held_pulls_and_ends_streams_without_waiting_out_the_grace(
    tmp_path: Path,
) -> None:
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b"))
    broker.start()
    stopped = False
    try:

        async def main() -> tuple[list[pb.ExchangeResponse], grpc.StatusCode]:
            nonlocal stopped
            async with grpc.aio.insecure_channel(broker.address) as ch:
                stub = pb_grpc.MessagingServiceStub(ch)
                stream = open_stream(stub)
                await stream.write(send(1, 0, frame() + frame()))
                await stream.read()
                await stream.write(pull(2, 0, 2, suspend_ms=30_000))
                await asyncio.to_thread(wait_until, lambda: held(broker) == 1)
                await asyncio.to_thread(broker.stop)
                stopped = True
                got: list[pb.ExchangeResponse] = await until_eof(stream)
                return got, await stream.code()

        got, code = asyncio.run(main())
    finally:
        if not stopped:
            broker.stop()
    # Ended by the broker once the held pull was answered, not cancelled after the grace.
    assert code == grpc.StatusCode.OK
    assert [(a.id, a.pull.status) for a in got] == [(2, pb.NO_NEW_MESSAGE)]


def test_a_stream_reads_no_more_requests_than_it_may_have_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(exchange, "MAX_IN_FLIGHT", 2)
    clock = FakeClock()
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b"), clock=clock) as broker:

        async def body(stub: Any, stream: Any) -> list[int]:
            for rid in (1, 2, 3):  # held until the clock passes their 10 s
                await stream.write(pull(rid, rid, 0, suspend_ms=10_000))
            await asyncio.to_thread(wait_until, lambda: held(broker) == 2)
            clock.advance(11)  # answers the two the broker took; only then is 3 read
            first = await answers(stream, 2)
            await asyncio.to_thread(wait_until, lambda: held(broker) == 1)
            clock.advance(11)
            [last] = await answers(stream, 1)
            await stream.done_writing()
            assert all(a.WhichOneof("body") == "pull" for a in [*first, last])
            return [*sorted(a.id for a in first), last.id]

        with grpc_topic(broker):
            assert run(broker, body) == [1, 2, 3]


def test_an_unexpected_failure_is_answered_as_grpc_answers_a_unary_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(
        self: MessagingService,
        request: pb.PullRequest,
        client: str,
        answer: pb.PullResponse | None = None,
    ) -> pb.PullResponse:
        raise RuntimeError("boom")

    monkeypatch.setattr(MessagingService, "pull", broken)
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b")) as broker:

        async def body(stub: Any, stream: Any) -> tuple[tuple[str, str], pb.ExchangeResponse]:
            code, _reason, message = await unary_error(stub.Pull(pull(1, 0, 0).pull))
            await stream.write(pull(1, 0, 0))
            got = await stream.read()
            await stream.done_writing()
            return (code, message), got

        unary, got = run(broker, body)
    assert (got.error.code, got.error.message) == unary == (
        "UNKNOWN", "Unexpected <class 'RuntimeError'>: boom",
    )  # fmt: skip


def test_answers_ready_together_go_in_one_message_and_sends_keep_their_order(
    exbroker: EmbeddedBroker, rpc: str
) -> None:
    if rpc == "Exchange":
        pytest.skip("one answer a message on Exchange")

    async def body(stub: Any, stream: Any) -> tuple[list[pb.ExchangeResponse], int]:
        await stream.write_many([send(rid, 1, frame(bytes([rid]))) for rid in range(1, 51)])
        got = await answers(stream, 50)
        await stream.done_writing()
        return got, stream.messages_read

    got, messages = run(exbroker, body)
    assert sorted((a.id, a.send.first_queue_offset) for a in got) == [
        (rid, rid - 1) for rid in range(1, 51)
    ]
    # 50 sends read from one message are stored before their answers are written.
    assert messages < 10, f"{messages} messages for 50 answers"


def test_a_lone_answer_is_written_at_once_and_answers_ready_together_after_the_loop_settled(
    exbroker: EmbeddedBroker, rpc: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if rpc == "Exchange":
        pytest.skip("one answer a message on Exchange")
    settles: list[int] = []
    settled = exchange.settled

    async def counted(queue: asyncio.Queue[object]) -> None:
        settles.append(queue.qsize())
        await settled(queue)

    monkeypatch.setattr(exchange, "settled", counted)

    async def body(stub: Any, stream: Any) -> tuple[list[int], list[int]]:
        await stream.write(send(1, 0, frame()))
        await answers(stream, 1)
        alone = list(settles)
        await stream.write_many([send(rid, 2, frame()) for rid in range(2, 12)])
        await answers(stream, 10)
        await stream.done_writing()
        return alone, settles

    alone, crowd = run(exbroker, body)
    assert alone == [], "one answer ready: written without waiting"
    assert crowd and crowd[0] >= 1, "others were ready: the loop settled first"
