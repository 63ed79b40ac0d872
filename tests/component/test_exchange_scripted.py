"""The client side of the Exchange stream, against a scripted in-process gRPC server.

The server is a bare grpc.aio server on loopback whose Exchange streams the test drives
request by request: it sees what the client wrote and answers (or breaks) as told.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.broker_client import Appended, BrokerClient, PullStatus
from sdk._transport.exchange import EXCHANGE_BATCHED_PATH, Exchange, ExchangeUnsupportedError
from sdk._transport.status import REASON_KEY, to_ordermq_error
from sdk._wire import GRPC_MAX_MESSAGE_BYTES
from sdk.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    ClientStateError,
    InvalidQueueError,
    OrderMQError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from sdk.message import MessageQueue

SERVICE = "ordermq.v1.MessagingService"
WAIT = 5.0  # seconds any awaited condition may take before the test fails


class ScriptedStream:
    """One Exchange call as the server sees it."""

    def __init__(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.context = context
        self.requests: asyncio.Queue[pb.ExchangeRequest] = asyncio.Queue()
        self.outcome: asyncio.Future[tuple[grpc.StatusCode, str] | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.cancelled = asyncio.Event()

    async def next_request(self) -> pb.ExchangeRequest:
        return await asyncio.wait_for(self.requests.get(), WAIT)

    async def answer(self, response: pb.ExchangeResponse) -> None:
        await self.context.write(response)

    def end(self, code: grpc.StatusCode | None = None, details: str = "") -> None:
        """End the call: OK when `code` is None, else with that status."""
        self.outcome.set_result(None if code is None else (code, details))


class ScriptedBroker(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Serves Exchange as the test scripts it, and unary Send and Pull with fixed answers.

    With exchange=False it has no Exchange method: the client gets UNIMPLEMENTED.
    """

    def __init__(
        self,
        *,
        exchange: bool = True,
        silent_batched: bool = False,
        greeting: asyncio.Event | None = None,
    ) -> None:
        """`silent_batched`: ExchangeBatched is served but never greets (a stuck broker).

        `greeting`: ExchangeBatched is served, greeting once it is set; its messages go
        to `batched` with whether the greeting had been written, each send answered.
        """
        self.exchange = exchange
        self.silent_batched = silent_batched
        self.greeting = greeting
        self.batched: list[tuple[bool, pb.ExchangeRequests]] = []
        self.exchange_probes = 0  # Exchange streams half-closed with nothing written
        self.methods: list[str] = []  # every method called, in order
        self.unary_sends: list[pb.SendRequest] = []
        self.unary_pulls: list[pb.PullRequest] = []
        self.streams: asyncio.Queue[ScriptedStream] = asyncio.Queue()
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers((self,))
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        self.methods.append(method)
        if method == f"/{SERVICE}/ExchangeBatched" and self.silent_batched:
            return grpc.stream_stream_rpc_method_handler(self._silent)
        if method == f"/{SERVICE}/ExchangeBatched" and self.greeting is not None:
            return grpc.stream_stream_rpc_method_handler(self._greeting_when_told)
        if method == f"/{SERVICE}/Exchange" and self.exchange:
            return grpc.stream_stream_rpc_method_handler(
                self._exchange,
                request_deserializer=pb.ExchangeRequest.FromString,
                response_serializer=pb.ExchangeResponse.SerializeToString,
            )
        if method == f"/{SERVICE}/Send":
            return grpc.unary_unary_rpc_method_handler(
                self._send,
                request_deserializer=pb.SendRequest.FromString,
                response_serializer=pb.SendResponse.SerializeToString,
            )
        if method == f"/{SERVICE}/Pull":
            return grpc.unary_unary_rpc_method_handler(
                self._pull,
                request_deserializer=pb.PullRequest.FromString,
                response_serializer=pb.PullResponse.SerializeToString,
            )
        return None

    async def next_stream(self) -> ScriptedStream:
        return await asyncio.wait_for(self.streams.get(), WAIT)

    async def _exchange(self, _: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        first = await context.read()
        if not isinstance(first, pb.ExchangeRequest):
            # Half-closed with nothing written (the client asks whether Exchange is
            # served): ended at once, OK, as the broker does.
            self.exchange_probes += 1
            return
        stream = ScriptedStream(context)
        stream.requests.put_nowait(first)
        self.streams.put_nowait(stream)

        async def read() -> None:
            while isinstance(request := await context.read(), pb.ExchangeRequest):
                stream.requests.put_nowait(request)

        reader = asyncio.create_task(read())
        try:
            outcome = await stream.outcome
        except asyncio.CancelledError:
            stream.cancelled.set()  # the client cancelled the call
            raise
        finally:
            reader.cancel()
        if outcome is not None:
            await context.abort(*outcome)

    async def _silent(self, _: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await asyncio.Event().wait()  # until the client cancels the call

    async def _greeting_when_told(
        self, _: object, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        assert self.greeting is not None
        greeted = False

        async def read() -> None:
            while isinstance(message := await context.read(), bytes):
                requests = pb.ExchangeRequests.FromString(message)
                self.batched.append((greeted, requests))
                answers = [sent(r.id, 5) for r in requests.requests if r.HasField("send")]
                await context.write(pb.ExchangeResponses(responses=answers).SerializeToString())

        reader = asyncio.create_task(read())
        try:
            await self.greeting.wait()
            await context.write(b"")  # an ExchangeResponses with no answers
            greeted = True
            await reader
        finally:
            reader.cancel()

    async def _send(self, request: pb.SendRequest, _: object) -> pb.SendResponse:
        self.unary_sends.append(request)
        return pb.SendResponse(status=pb.SEND_OK, first_queue_offset=7, count=1)

    async def _pull(self, request: pb.PullRequest, _: object) -> pb.PullResponse:
        self.unary_pulls.append(request)
        return pb.PullResponse(status=pb.NO_NEW_MESSAGE, next_offset=request.offset)


@contextlib.asynccontextmanager
async def scripted(
    exchange: bool = True,
    *,
    batched: bool = False,
    silent_batched: bool = False,
    connected: Callable[[], Awaitable[None]] | None = None,
    disconnected: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[tuple[ScriptedBroker, Exchange]]:
    """A scripted broker and an Exchange client of it, closed afterwards.

    `batched`: the client tries ExchangeBatched first, as BrokerClient's does.
    """
    broker = ScriptedBroker(exchange=exchange, silent_batched=silent_batched)
    await broker.server.start()
    channel = grpc.aio.insecure_channel(broker.address)
    open_batched = (
        channel.stream_stream(
            EXCHANGE_BATCHED_PATH, response_deserializer=pb.ExchangeResponses.FromString
        )
        if batched
        else None
    )
    client = Exchange(pb_grpc.MessagingServiceStub(channel).Exchange, broker.address,
                      connected=connected, open_batched=open_batched,
                      disconnected=disconnected)  # fmt: skip
    try:
        yield broker, client
    finally:
        await client.close()
        await channel.close(None)
        await broker.server.stop(None)


def send(queue_id: int = 0, frames: bytes = b"frame") -> pb.ExchangeRequest:
    return pb.ExchangeRequest(send=pb.SendRequest(topic="t", queue_id=queue_id, frames=frames))


def pull(offset: int = 0) -> pb.ExchangeRequest:
    return pb.ExchangeRequest(
        pull=pb.PullRequest(group="g", topic="t", queue_id=1, offset=offset, max_messages=1)
    )


def sent(rid: int, offset: int) -> pb.ExchangeResponse:
    answer = pb.SendResponse(status=pb.SEND_OK, first_queue_offset=offset, count=1)
    return pb.ExchangeResponse(id=rid, send=answer)


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 4 * WAIT))


def unary_error(code: grpc.StatusCode, reason: str | None, details: str) -> OrderMQError:
    """What the unary call raises for that status."""
    trailing = grpc.aio.Metadata((REASON_KEY, reason)) if reason else grpc.aio.Metadata()
    return to_ordermq_error(
        grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details, None)
    )


def same_error(a: BaseException, b: BaseException) -> bool:
    assert isinstance(a, OrderMQError) and isinstance(b, OrderMQError)
    return (type(a), a.code, a.reason, a.message) == (type(b), b.code, b.reason, b.message)


def test_requests_are_written_in_call_order_and_answers_matched_by_id() -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            calls = [
                asyncio.create_task(client.call(send(frames=b"a"))),
                asyncio.create_task(client.call(pull(offset=5))),
                asyncio.create_task(client.call(send(frames=b"c"))),
            ]
            stream = await broker.next_stream()
            a, p, c = [await stream.next_request() for _ in calls]
            assert (a.send.frames, p.pull.offset, c.send.frames) == (b"a", 5, b"c")
            assert len({a.id, p.id, c.id}) == 3
            # Answered in another order than asked.
            await stream.answer(sent(c.id, 30))
            await stream.answer(pb.ExchangeResponse(id=p.id, pull=pb.PullResponse(next_offset=6)))
            await stream.answer(sent(a.id, 10))
            got_a, got_p, got_c = await asyncio.gather(*calls)
            assert got_a.send.first_queue_offset == 10
            assert got_p.pull.next_offset == 6
            assert got_c.send.first_queue_offset == 30

    run(main)


@pytest.mark.parametrize(
    ("code", "reason", "message", "expected"),
    [
        ("NOT_FOUND", "TOPIC_NOT_FOUND", "topic 't' does not exist", TopicNotFoundError),
        ("OUT_OF_RANGE", "INVALID_QUEUE", "queue 9 of 't' does not exist", InvalidQueueError),
        ("RESOURCE_EXHAUSTED", "", "too busy", BrokerBusyError),  # no reason: by the code
    ],
)
def test_an_error_answer_raises_what_the_unary_call_raises(
    code: str, reason: str, message: str, expected: type[OrderMQError]
) -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            call = asyncio.create_task(client.call(send()))
            stream = await broker.next_stream()
            request = await stream.next_request()
            error = pb.ExchangeError(code=code, reason=reason, message=message)
            await stream.answer(pb.ExchangeResponse(id=request.id, error=error))
            with pytest.raises(expected) as raised:
                await call
            unary = unary_error(grpc.StatusCode[code], reason, message)
            assert same_error(raised.value, unary)
            assert raised.value.message == message
            # The stream carries on.
            call = asyncio.create_task(client.call(send()))
            request = await stream.next_request()
            await stream.answer(sent(request.id, 1))
            assert (await call).send.first_queue_offset == 1

    run(main)


def test_a_timeout_raises_the_deadline_error_and_cancels_the_request() -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            call = asyncio.create_task(client.call(send(queue_id=3), timeout=0.05))
            stream = await broker.next_stream()
            request = await stream.next_request()  # and never answered
            with pytest.raises(RequestTimeoutError) as raised:
                await call
            assert raised.value.code == "DEADLINE_EXCEEDED"
            assert type(raised.value) is type(
                unary_error(grpc.StatusCode.DEADLINE_EXCEEDED, None, "Deadline Exceeded")
            )
            assert "send to t queue 3" in raised.value.message
            assert f"request {request.id}" in raised.value.message
            cancel = await stream.next_request()
            assert (cancel.WhichOneof("body"), cancel.id) == ("cancel", request.id)
            # A late answer to the abandoned request is ignored; the stream carries on.
            await stream.answer(sent(request.id, 0))
            call = asyncio.create_task(client.call(send()))
            request = await stream.next_request()
            await stream.answer(sent(request.id, 1))
            assert (await call).send.first_queue_offset == 1

    run(main)


def test_a_request_abandoned_before_it_was_written_never_reaches_the_broker() -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            # Nothing runs between these lines: both requests wait in the outbox.
            held = asyncio.create_task(client.call(pull()))
            late = asyncio.create_task(client.call(send(frames=b"late"), timeout=0))
            with pytest.raises(RequestTimeoutError):
                await late
            after = asyncio.create_task(client.call(send(frames=b"after")))
            stream = await broker.next_stream()
            first, second = await stream.next_request(), await stream.next_request()
            # The timed-out send was neither written nor cancelled: the broker never saw it.
            assert (first.WhichOneof("body"), second.send.frames) == ("pull", b"after")
            await stream.answer(sent(second.id, 0))
            await after
            held.cancel()

    run(main)


def test_a_request_over_the_message_size_limit_is_refused_before_it_is_written() -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            huge = send(frames=bytes(GRPC_MAX_MESSAGE_BYTES))
            with pytest.raises(BrokerBusyError, match="over the limit") as raised:
                await client.call(huge)
            assert raised.value.code == "RESOURCE_EXHAUSTED"
            call = asyncio.create_task(client.call(send()))  # the stream is unharmed
            stream = await broker.next_stream()
            request = await stream.next_request()
            assert request.send.frames == b"frame"
            await stream.answer(sent(request.id, 2))
            assert (await call).send.first_queue_offset == 2

    run(main)


def test_a_cancelled_caller_cancels_its_request_on_the_broker() -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            call = asyncio.create_task(client.call(pull()))
            stream = await broker.next_stream()
            request = await stream.next_request()
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            cancel = await stream.next_request()
            assert (cancel.WhichOneof("body"), cancel.id) == ("cancel", request.id)
            assert not stream.cancelled.is_set()  # the stream itself stays open

    run(main)


@pytest.mark.parametrize(
    "status",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNKNOWN,
     None],
)  # fmt: skip
def test_a_broken_stream_fails_every_pending_call_and_the_next_call_opens_a_new_one(
    status: grpc.StatusCode | None,
) -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            calls = [asyncio.create_task(client.call(r)) for r in (send(), pull(), send())]
            stream = await broker.next_stream()
            for _ in calls:
                await stream.next_request()
            stream.end(status, "connection reset")  # None: ends without an error
            for outcome in await asyncio.gather(*calls, return_exceptions=True):
                assert isinstance(outcome, BrokerUnavailableError)
                assert outcome.code == "UNAVAILABLE" and outcome.retriable
                if status is None:
                    assert "closed before answering" in outcome.message
                else:  # whatever ended the stream, its requests may be resent
                    assert status.name in outcome.message
            call = asyncio.create_task(client.call(send()))
            second = await broker.next_stream()
            request = await second.next_request()
            await second.answer(sent(request.id, 4))
            assert (await call).send.first_queue_offset == 4

    run(main)


def test_close_fails_pending_calls_and_cancels_the_stream() -> None:
    async def main() -> None:
        async with scripted() as (broker, client):
            call = asyncio.create_task(client.call(pull()))
            stream = await broker.next_stream()
            await stream.next_request()
            await client.close()
            # Not retriable: a send cut off by closing its producer must not be resent.
            with pytest.raises(ClientStateError, match="closed") as raised:
                await call
            assert not raised.value.retriable
            await asyncio.wait_for(stream.cancelled.wait(), WAIT)
            with pytest.raises(ClientStateError, match="closed"):
                await client.call(send())

    run(main)


def test_broker_client_sends_and_pulls_on_the_exchange() -> None:
    async def main() -> None:
        async with scripted() as (broker, _):
            client = BrokerClient(broker.address)
            appending = asyncio.create_task(client.send("t", 2, b"frames", timeout=5))
            stream = await broker.next_stream()
            request = await stream.next_request()
            assert (request.send.topic, request.send.queue_id, request.send.frames) == (
                "t", 2, b"frames",
            )  # fmt: skip
            await stream.answer(
                pb.ExchangeResponse(
                    id=request.id,
                    send=pb.SendResponse(status=pb.SEND_OK, first_queue_offset=3, count=1),
                )
            )
            assert await appending == Appended(True, 3, 1)
            pulling = asyncio.create_task(
                client.pull("g", MessageQueue("t", "b", 1), 9, suspend_timeout=2)
            )
            request = await stream.next_request()
            assert (request.pull.offset, request.pull.suspend_timeout_ms) == (9, 2000)
            answer = pb.PullResponse(status=pb.NO_NEW_MESSAGE, next_offset=9, max_offset=9)
            await stream.answer(pb.ExchangeResponse(id=request.id, pull=answer))
            result = await pulling
            assert (result.status, result.next_offset, result.messages) == (
                PullStatus.NO_NEW_MESSAGE, 9, [],
            )  # fmt: skip
            await client.close()
            assert broker.unary_sends == broker.unary_pulls == []

    run(main)


def test_a_broker_without_exchange_gets_unary_send_and_pull() -> None:
    async def main() -> None:
        async with scripted(exchange=False) as (broker, _):
            client = BrokerClient(broker.address)
            assert await client.send("t", 2, b"one") == Appended(True, 7, 1)
            assert await client.send("t", 2, b"two") == Appended(True, 7, 1)
            result = await client.pull("g", MessageQueue("t", "b", 1), 4)
            await client.close()
            assert (result.status, result.next_offset) == (PullStatus.NO_NEW_MESSAGE, 4)
            assert [r.frames for r in broker.unary_sends] == [b"one", b"two"]
            assert [r.offset for r in broker.unary_pulls] == [4]
            assert broker.methods == [
                f"/{SERVICE}/ExchangeBatched",  # tried once: UNIMPLEMENTED
                f"/{SERVICE}/Exchange",  # tried once: UNIMPLEMENTED
                f"/{SERVICE}/Send",
                f"/{SERVICE}/Send",
                f"/{SERVICE}/Pull",
            ]

    run(main)


def test_on_a_broker_without_exchange_batched_calls_and_subscriptions_go_on_exchange() -> None:
    """An older broker refuses ExchangeBatched whole (UNIMPLEMENTED) before it serves any
    of it: what was made meanwhile goes on an Exchange stream, once each, in call order,
    once the broker was asked whether it serves Exchange."""

    async def main() -> None:
        async with scripted(batched=True) as (broker, client):
            first = asyncio.create_task(client.call(send(frames=b"a")))
            second = asyncio.create_task(client.call(send(frames=b"b")))
            subscribe = pb.ExchangeRequest(subscribe=pb.Subscribe(topic="t", queue_id=1))
            subscription = await client.subscribe(subscribe, WAIT)
            stream = await broker.next_stream()
            got = [await stream.next_request() for _ in range(3)]
            assert [r.WhichOneof("body") for r in got] == ["send", "send", "subscribe"]
            assert [r.send.frames for r in got[:2]] == [b"a", b"b"]
            for request, offset in zip(got[:2], (10, 11), strict=True):
                await stream.answer(sent(request.id, offset))
            batch = pb.PullResponse(status=pb.FOUND, next_offset=1)
            await stream.answer(pb.ExchangeResponse(id=got[2].id, pull=batch))
            assert (await first).send.first_queue_offset == 10
            assert (await second).send.first_queue_offset == 11
            assert (await subscription.next()).next_offset == 1
            # Exchange is asked for with nothing written first, then carries the requests.
            assert broker.methods == [f"/{SERVICE}/ExchangeBatched"] + 2 * [f"/{SERVICE}/Exchange"]
            assert broker.exchange_probes == 1
            assert broker.streams.empty(), "one Exchange stream"

    run(main)


@pytest.mark.parametrize("request_kind", ["call", "subscription"])
def test_a_caller_still_connecting_when_another_learned_the_fallback_takes_it(
    request_kind: str,
) -> None:
    """The first request on a connection to a broker without Exchange meets the refusals
    (ExchangeBatched, then Exchange); one that waited for the connection meanwhile goes
    unary too, without asking the broker for Exchange once more (it did: CI, stop 66)."""

    async def main() -> None:
        held = asyncio.Event()  # the second caller's wait for the connection ends
        callers = 0

        async def connected() -> None:
            nonlocal callers
            callers += 1
            caller = callers
            await asyncio.sleep(0)  # both callers wait for the connection
            if caller > 1:
                await held.wait()

        async with scripted(exchange=False, batched=True, connected=connected) as (
            broker,
            client,
        ):
            first = asyncio.create_task(client.call(send(), WAIT))
            if request_kind == "call":
                second = asyncio.create_task(client.call(send(), WAIT))
            else:
                subscribe = pb.ExchangeRequest(subscribe=pb.Subscribe(topic="t", queue_id=1))
                second = asyncio.create_task(client.subscribe(subscribe, WAIT))
            with pytest.raises(ExchangeUnsupportedError):
                await first
            assert not client.supported
            held.set()
            with pytest.raises(ExchangeUnsupportedError):
                await second
            assert broker.methods == [f"/{SERVICE}/ExchangeBatched", f"/{SERVICE}/Exchange"]

    run(main)


def test_a_fallback_lasts_as_long_as_the_connection_that_learned_it() -> None:
    """Refused on one connection, ExchangeBatched is asked for once more on the next (the
    broker behind the address may have been upgraded), not on each call meanwhile."""

    async def main() -> None:
        losses: asyncio.Queue[None] = asyncio.Queue()  # a connection lost, as the channel tells

        async def disconnected() -> None:
            await losses.get()

        refused_once = [f"/{SERVICE}/ExchangeBatched", *2 * [f"/{SERVICE}/Exchange"]]
        async with scripted(batched=True, disconnected=disconnected) as (broker, client):
            for offset in range(3):
                call = asyncio.create_task(client.call(send()))
                if offset == 0:
                    stream = await broker.next_stream()
                request = await stream.next_request()
                await stream.answer(sent(request.id, offset))
                assert (await call).send.first_queue_offset == offset
            assert broker.methods == refused_once  # the probe of Exchange, then its stream
            losses.put_nowait(None)
            stream.end(grpc.StatusCode.UNAVAILABLE, "connection lost")
            await stream_ended(client)
            call = asyncio.create_task(client.call(send()))
            stream = await broker.next_stream()
            request = await stream.next_request()
            await stream.answer(sent(request.id, 3))
            assert (await call).send.first_queue_offset == 3
            assert broker.methods == 2 * refused_once

    run(main)


async def called(broker: ScriptedBroker) -> None:
    """Until a call of the client has reached `broker` (a loaded machine can take long)."""
    async with asyncio.timeout(WAIT):
        while not broker.methods:
            await asyncio.sleep(0.01)


async def stream_ended(client: Exchange) -> None:
    """Until the client has let its stream go."""
    async with asyncio.timeout(WAIT):
        while client._stream is not None:
            await asyncio.sleep(0.01)


def test_nothing_is_written_on_exchange_batched_before_the_broker_greets() -> None:
    """A write racing an older broker's refusal fails the call with INTERNAL in grpc.aio
    (the UNIMPLEMENTED lost, the fallback not taken): requests wait for the greeting."""

    async def main() -> None:
        greeting = asyncio.Event()
        broker = ScriptedBroker(greeting=greeting)
        await broker.server.start()
        client = BrokerClient(broker.address)
        try:
            calls = [asyncio.create_task(client.send("t", 1, b"a")) for _ in range(3)]
            await called(broker)  # the stream is open: what is written now can arrive
            await asyncio.sleep(0.2)  # what is written now reaches the broker meanwhile
            assert broker.methods == [f"/{SERVICE}/ExchangeBatched"]
            assert broker.batched == []
            greeting.set()
            assert [a.first_offset for a in await asyncio.gather(*calls)] == [5, 5, 5]
            assert [greeted for greeted, _ in broker.batched] == [True] * len(broker.batched)
            assert sum(len(r.requests) for _, r in broker.batched) == 3
        finally:
            await client.close()
            await broker.server.stop(None)

    run(main)


def test_a_subscription_on_a_stream_the_broker_never_opens_fails_within_its_timeout() -> None:
    """A subscription waits for the broker's greeting before it is written: a broker that
    never greets is unavailable (the subscription is not sent), within the timeout."""

    async def main() -> None:
        async with scripted(batched=True, silent_batched=True) as (broker, client):
            subscribe = pb.ExchangeRequest(subscribe=pb.Subscribe(topic="t", queue_id=1))
            with pytest.raises(BrokerUnavailableError, match="did not open the stream"):
                await client.subscribe(subscribe, 0.2)
            assert broker.methods == [f"/{SERVICE}/ExchangeBatched"]

    run(main)
