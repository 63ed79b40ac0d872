"""The per-client limit (mockbroker/limits.py) on an Exchange stream and on unary sends.

Past the limit a client's stream reads no more requests until some are answered, its
pulls wait before reading, and a unary send is refused with RESOURCE_EXHAUSTED and
changes nothing. Driven without sockets: requests come from an async generator that
counts what the stream took, the handlers wait on a gate, the test reads the answers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.fronts.grpc import exchange
from mockbroker.fronts.grpc.exchange import ExchangeStream
from mockbroker.limits import ClientLimits
from mockbroker.request_stats import RequestStats
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb

LIMIT = 1000


def send(rid: int, size: int) -> pb.ExchangeRequest:
    return pb.ExchangeRequest(id=rid, send=pb.SendRequest(topic="t", frames=bytes(size)))


def pull(rid: int) -> pb.ExchangeRequest:
    return pb.ExchangeRequest(id=rid, pull=pb.PullRequest(topic="t", max_messages=1))


class Client:
    """The requests a client writes; `taken` counts those the stream read."""

    def __init__(self, requests: list[pb.ExchangeRequest]) -> None:
        self.requests = requests
        self.taken = 0
        self.done_writing = asyncio.Event()

    async def stream(self) -> AsyncIterator[pb.ExchangeRequest]:
        for request in self.requests:
            self.taken += 1
            yield request
        await self.done_writing.wait()  # then half-closes


class Handlers:
    """Send and pull handlers that answer once the gate opens; pulls answer `pulled` bytes."""

    def __init__(self, pulled: int = 0) -> None:
        self.gate = asyncio.Event()
        self.pulled = pulled
        self.clients: set[str] = set()

    async def send(
        self, request: pb.SendRequest, client: str, answer: pb.SendResponse
    ) -> pb.SendResponse:
        self.clients.add(client)
        await self.gate.wait()
        answer.count = 1
        return answer

    async def pull(
        self, request: pb.PullRequest, client: str, answer: pb.PullResponse
    ) -> pb.PullResponse:
        self.clients.add(client)
        await self.gate.wait()
        answer.records = bytes(self.pulled)
        answer.record_count = 1
        return answer


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_past_the_limit_a_clients_further_sends_wait_unread_until_answers_go_out() -> None:
    async def main() -> tuple[int, int, list[int], set[str]]:
        limits = ClientLimits(LIMIT)
        handlers = Handlers()
        client = Client([send(i, 600) for i in range(1, 6)])
        stream = ExchangeStream(handlers.send, handlers.pull, RequestStats(), "peer-1", limits)
        answers = stream.serve(client.stream())
        first = asyncio.ensure_future(anext(answers))
        await settle()
        taken_while_held = client.taken  # 600 held: the next is read; 1 200: no more
        handlers.gate.set()
        got = [(await first).id]
        while len(got) < 5:
            got.append((await anext(answers)).id)
        client.done_writing.set()
        async for _ in answers:
            pass
        return taken_while_held, limits.held("peer-1"), sorted(got), handlers.clients

    taken, left, answered, clients = asyncio.run(main())
    assert taken == 2
    assert answered == [1, 2, 3, 4, 5], "the held-back requests were served later, all of them"
    assert left == 0
    assert clients == {"peer-1"}, "the handlers hear which client asked"


class Paced:
    """A client that writes each request when the test says so; `taken` counts reads."""

    def __init__(self) -> None:
        self.outbox: asyncio.Queue[pb.ExchangeRequest | None] = asyncio.Queue()
        self.taken = 0

    async def stream(self) -> AsyncIterator[pb.ExchangeRequest]:
        while (request := await self.outbox.get()) is not None:
            self.taken += 1
            yield request


def test_answers_not_yet_handed_on_count_against_the_limit() -> None:
    async def main() -> tuple[int, int, list[int]]:
        handlers = Handlers(pulled=2 * LIMIT)
        client = Paced()
        stream = ExchangeStream(
            handlers.send, handlers.pull, RequestStats(), "peer-1", ClientLimits(LIMIT)
        )
        answers = stream.serve(client.stream())
        first = asyncio.ensure_future(anext(answers))
        for request in (pull(1), pull(2)):
            client.outbox.put_nowait(request)
        await settle()
        handlers.gate.set()  # both answer; the first is handed on, the second waits
        got = [(await first).id]
        # The stream was already waiting for a request when the answer went over the
        # limit: it takes that one, and no more.
        client.outbox.put_nowait(send(3, 10))
        client.outbox.put_nowait(send(4, 10))
        await settle()
        taken_while_over = client.taken
        got += [(await anext(answers)).id for _ in range(3)]
        client.outbox.put_nowait(None)
        async for _ in answers:
            pass
        return taken_while_over, client.taken, got

    taken_while_over, taken, answered = asyncio.run(main())
    assert taken_while_over == 3, "a 2 000-byte answer not yet handed on holds the stream"
    assert (taken, sorted(answered)) == (4, [1, 2, 3, 4])


def test_a_pull_waits_for_room_before_it_reads() -> None:
    async def main() -> list[str]:
        limits = ClientLimits(LIMIT)
        events: list[str] = []
        limits.hold("peer-1", LIMIT)

        async def pull() -> None:
            await limits.room("peer-1")
            events.append("pull read")

        task = asyncio.create_task(pull())
        await settle()
        events.append("room made")
        limits.hold("peer-1", -1)
        await task
        await limits.room("peer-2")  # another client is not held back
        return events

    assert asyncio.run(main()) == ["room made", "pull read"]


def test_a_unary_send_past_the_limit_is_refused_and_holds_nothing() -> None:
    limits = ClientLimits(LIMIT)
    with limits.unary("peer-1", 10 * LIMIT):  # the first is taken, however large
        with pytest.raises(BrokerError) as caught, limits.unary("peer-1", 10):
            pass
        assert limits.held("peer-1") == 10 * LIMIT
        with limits.unary("peer-2", 10):
            pass
    assert caught.value.status == StatusCode.RESOURCE_EXHAUSTED
    assert caught.value.reason == "CLIENT_OVER_LIMIT"
    assert "client_max_in_flight_bytes" in caught.value.message
    assert limits.held("peer-1") == 0 and limits.refused == 1


def test_one_request_is_taken_however_large() -> None:
    async def main() -> list[int]:
        handlers = Handlers()
        handlers.gate.set()
        client = Client([send(1, 10 * LIMIT), send(2, 10)])
        stream = ExchangeStream(
            handlers.send, handlers.pull, RequestStats(), "peer-1", ClientLimits(LIMIT)
        )
        answers = stream.serve(client.stream())
        got = [(await anext(answers)).id, (await anext(answers)).id]
        client.done_writing.set()
        async for _ in answers:
            pass
        return got

    assert asyncio.run(main()) == [1, 2]


def test_requests_cancelled_before_their_handlers_ran_free_their_slots(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A request's slot comes back when its task ends; one cancelled before its first step
    # never runs its handler, and its slot must come back too, else the stream reads no more.
    monkeypatch.setattr(exchange, "MAX_IN_FLIGHT", 2)

    async def main() -> tuple[list[int], int]:
        handlers = Handlers()  # the gate opens once every request was read
        done_writing = asyncio.Event()

        async def requests() -> AsyncIterator[pb.ExchangeRequest]:
            for rid in range(1, 6):  # each followed at once by its cancel
                yield send(rid, 10)
                yield pb.ExchangeRequest(id=rid, cancel=pb.ExchangeCancel())
            yield send(9, 10)
            handlers.gate.set()
            await done_writing.wait()

        stream = ExchangeStream(
            handlers.send, handlers.pull, RequestStats(), "peer-1", ClientLimits(LIMIT)
        )
        got: list[int] = []
        async with asyncio.timeout(10):
            answers = stream.serve(requests())
            got.append((await anext(answers)).id)
            done_writing.set()
            async for answer in answers:  # ends once nothing is in flight
                got.append(answer.id)
        return got, len(stream._tasks)

    got, left = asyncio.run(main())
    assert got == [9], "read and answered after five cancelled, with two slots"
    assert left == 0
