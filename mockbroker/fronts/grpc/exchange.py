"""The Exchange stream: Send, Pull and Subscribe requests multiplexed on one gRPC call.

A unary call costs the broker a few hundred microseconds of CPU whatever it carries; a
request on an open stream costs about half. Each request runs as a task of its own, so a
held pull does not hold up the requests behind it, and is answered (by id) when it
completes. Sends are appended in the order they arrive: their tasks start in creation
order and a send appends before its first await (only its flush wait comes after), or,
with fair scheduling, holds its queue from its first step (mockbroker/fair_store.py).

A Subscribe (push delivery, Delivery.subscribe) is answered many times: each batch is an
answer with its id, until an error ends it or the client cancels it; its Credit requests
grant more (mockbroker/push.py). It holds one slot of the stream while it lives.

A client's sends' messages count against its limit (mockbroker/limits.py) from when they
are read until they are stored, its pulls' answers until they are handed to gRPC; past
the limit the stream reads no more requests until some are answered, so a client that
sends faster than the broker stores waits, held back by gRPC's flow control, instead of
filling the broker's memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator

import grpc
from google.protobuf.message import Message

from mockbroker.errors import BrokerError, invalid
from mockbroker.fronts.grpc_errors import MalformedRequest
from mockbroker.limits import ClientLimits
from mockbroker.push import Credit
from mockbroker.request_stats import RequestStats
from sdk._batching import join_repeated, settled
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb

log = logging.getLogger("ordermq.broker")

#: Requests one stream may have in flight (held pulls included); the stream reads no
#: more until one is answered.
MAX_IN_FLIGHT = 10_000

Incoming = pb.ExchangeRequest | MalformedRequest
#: The handlers get the request and the client (its connection's peer), and fill the
#: answer they are given (the one inside the stream's envelope).
SendHandler = Callable[[pb.SendRequest, str, pb.SendResponse], Awaitable[pb.SendResponse]]
PullHandler = Callable[[pb.PullRequest, str, pb.PullResponse], Awaitable[pb.PullResponse]]
#: A subscription's credit (refusing a bad one) and its batches, for the request and client.
SubscribeHandler = Callable[[pb.Subscribe, str], tuple[Credit, AsyncIterator[pb.PullResponse]]]
#: The ACL's check of one request on the stream, as the RPC it carries ("Send", "Pull"):
#: BrokerError (UNAUTHENTICATED, PERMISSION_DENIED) if refused (fronts/grpc/auth.py).
RequestCheck = Callable[[str, Message], None]


#: Most answers one ExchangeBatched message carries...
MAX_BATCH = 256
#: ... and most bytes of pulled records, unless one answer alone has more.
BATCH_BYTES = 1024 * 1024
#: Writes serialized ExchangeResponses at once if it can without waiting; False: not.
WriteNow = Callable[[bytes], bool]
#: An answer, the bytes it holds, and whether handing it on frees its request's slot.
_Answer = tuple[pb.ExchangeResponse, int, bool]

#: The RPC a request on the stream does the work of, by its body's field name.
_METHODS = {"send": "Send", "pull": "Pull", "subscribe": "Pull"}


def _error(request_id: int, code: str, reason: str, message: str) -> pb.ExchangeResponse:
    return pb.ExchangeResponse(
        id=request_id, error=pb.ExchangeError(code=code, reason=reason, message=message)
    )


def _refusal(request_id: int, exc: BrokerError) -> pb.ExchangeResponse:
    return _error(request_id, exc.status.name, exc.reason, exc.message)


class ExchangeStream:
    """Serves one client's Exchange call."""

    def __init__(
        self,
        send: SendHandler,
        pull: PullHandler,
        stats: RequestStats,
        client: str,
        limits: ClientLimits,
        check: RequestCheck | None = None,
        subscribe: SubscribeHandler | None = None,
        write_now: WriteNow | None = None,
    ) -> None:
        """Serve one stream; `write_now` as ExchangeStreams.serve_batches takes it.

        `write_now` writes serialized ExchangeResponses at once if the connection takes
        them without waiting (False: not written), where the front can (the port).
        """
        self._send = send
        self._pull = pull
        self._subscribe = subscribe
        self._write_now = write_now
        self._idle = False  # serve_batches waits for an answer with nothing carried
        self._credits: dict[int, Credit] = {}  # the open subscriptions' credit, by id
        self._stats = stats
        self._client = client
        self._check = check
        self._tasks: dict[int, asyncio.Task[bool]] = {}
        self._answers: asyncio.Queue[_Answer | None] = asyncio.Queue()
        # A request holds a slot from when it is read until its answer has been handed to
        # gRPC: a client that sends faster than it reads is held back by flow control.
        self._room = asyncio.Semaphore(MAX_IN_FLIGHT)
        # So do the bytes of its messages, in requests and in answers not yet handed on.
        self._limits = limits
        self._closing = False
        self._malformed: MalformedRequest | None = None

    def _hold(self, n: int) -> None:
        self._limits.hold(self._client, n)

    async def serve(self, requests: AsyncIterator[Incoming]) -> AsyncGenerator[pb.ExchangeResponse]:
        """Answer `requests` until the client half-closes (and all are answered).

        A request that does not parse is read as the stream's last: once the requests
        before it are answered, serve raises its BrokerError (INVALID_ARGUMENT).
        """
        async with contextlib.aclosing(self.serve_batches(requests, most=1)) as batches:
            async for [answer] in batches:
                yield answer

    async def serve_batches(
        self, requests: AsyncIterator[Incoming], *, most: int = MAX_BATCH
    ) -> AsyncGenerator[list[pb.ExchangeResponse]]:
        """`serve`, several answers at a time: those ready when the next is asked for.

        At most `most` answers, whose pulled records come to at most BATCH_BYTES unless
        the first alone is larger. gRPC asks for the next once it has written one, so
        what becomes ready meanwhile goes together.
        """
        reader = asyncio.create_task(self._read(requests))
        answers = self._answers
        carried: _Answer | None = None
        try:
            while True:
                if carried is None:
                    self._idle = answers.empty()
                    first = await answers.get()
                    self._idle = False
                else:
                    first = carried
                if first is None:
                    break
                if most > 1 and not answers.empty():
                    # Others are ready: requests are finishing together, more may be about
                    # to. A lone answer is written at once.
                    await settled(answers)
                batch, taken, carried, ended = [first], first[1], None, False
                while len(batch) < most and not answers.empty():
                    item = answers.get_nowait()
                    if item is None:
                        ended = True
                        break
                    if item[1] and taken + item[1] > BATCH_BYTES:
                        carried = item
                        break
                    batch.append(item)
                    taken += item[1]
                yield [answer for answer, _, _ in batch]
                for _, size, last in batch:
                    self._hold(-size)
                    if last:
                        self._room.release()
                if ended:
                    break
            if self._malformed is not None:
                raise self._malformed.error
        finally:
            reader.cancel()
            for task in list(self._tasks.values()):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    def close(self) -> None:
        """Stop taking requests; end the stream once those in flight are answered."""
        self._closing = True
        self._end_if_idle()

    async def _read(self, requests: AsyncIterator[Incoming]) -> None:
        incoming = aiter(requests)
        try:
            while not self._closing:
                await self._room.acquire()
                await self._limits.room(self._client)
                try:
                    request = await anext(incoming)
                except StopAsyncIteration:  # the client half-closed
                    break
                if self._closing:
                    break
                if isinstance(request, MalformedRequest):
                    self._stats.refused("Exchange", request.error)
                    self._malformed = request  # its id is unknown: nothing can answer it
                    break
                self._dispatch(request)
        finally:
            self._closing = True
            self._end_if_idle()

    def _end_if_idle(self) -> None:
        if self._closing and not self._tasks:
            self._answers.put_nowait(None)

    def _dispatch(self, request: pb.ExchangeRequest) -> None:
        rid = request.id
        kind = request.WhichOneof("body")
        if kind == "cancel":
            task = self._tasks.get(rid)
            if task is not None:
                task.cancel()
            self._room.release()  # a cancel is never answered
            return
        if kind == "credit":
            self._room.release()  # a credit is never answered
            credit = self._credits.get(rid)
            if credit is not None:
                try:
                    credit.grant(request.credit.messages, request.credit.bytes)
                except BrokerError as exc:
                    self._stats.refused("Exchange", exc)
                    task = self._tasks.get(rid)
                    if task is not None:
                        task.cancel()
                        self._answer(_refusal(rid, exc), last=False)
            return
        if kind is None and request.ByteSize() == pb.ExchangeRequest(id=rid).ByteSize():
            self._refuse(
                rid, f"request {rid} carries no body (send, pull, subscribe, credit, cancel)"
            )
            return
        if kind is None or (kind == "subscribe" and self._subscribe is None):
            # A body of a later protocol version (an unknown field), or one not served.
            unserved = BrokerError(
                grpc.StatusCode.UNIMPLEMENTED,
                "NOT_IMPLEMENTED",
                f"request {rid} carries no body this broker serves",
            )
            self._stats.refused("Exchange", unserved)
            self._answer(_refusal(rid, unserved))
            return
        if rid in self._tasks:
            self._refuse(rid, f"request id {rid} is already in flight on this stream")
            return
        size = request.ByteSize() if kind == "send" else 0
        self._hold(size)
        run = self._run_subscription(rid, request) if kind == "subscribe" else None
        task = asyncio.create_task(run or self._run(rid, request, _METHODS[kind], size))
        self._tasks[rid] = task
        task.add_done_callback(functools.partial(self._finished, rid))

    def _refuse(self, rid: int, message: str) -> None:
        exc = invalid("INVALID_ARGUMENT", message)
        self._stats.refused("Exchange", exc)
        self._answer(_refusal(rid, exc))

    async def _run(self, rid: int, request: pb.ExchangeRequest, method: str, size: int) -> bool:
        """Handle one request; True once its answer is queued (False: cancelled)."""
        try:
            if self._check is not None:
                self._check(method, request.send if method == "Send" else request.pull)
            answer = pb.ExchangeResponse(id=rid)
            if method == "Send":
                await self._send(request.send, self._client, answer.send)
            else:
                await self._pull(request.pull, self._client, answer.pull)
        except BrokerError as exc:
            self._stats.refused(method, exc)
            answer = _refusal(rid, exc)
        except asyncio.CancelledError:
            self._stats.cancelled(method)
            self._hold(-size)
            return False  # cancelled by the client, or the stream is gone: no answer
        except Exception as exc:
            self._stats.crashed(method)
            log.exception("exchange request %d failed", rid)
            # What gRPC answers a unary call whose handler raised.
            answer = _error(rid, "UNKNOWN", "", f"Unexpected {type(exc)}: {exc}")
        else:
            self._stats.answered(method)
        self._hold(-size)
        self._answer(answer)
        return True

    async def _run_subscription(self, rid: int, request: pb.ExchangeRequest) -> bool:
        """Serve one subscription: a batch answer each, until an error (its last answer)."""
        try:
            if self._check is not None:
                self._check("Pull", request.subscribe)
            assert self._subscribe is not None
            credit, batches = self._subscribe(request.subscribe, self._client)
            self._credits[rid] = credit
            try:
                async for batch in batches:
                    self._answer(pb.ExchangeResponse(id=rid, pull=batch), last=False)
            finally:
                self._credits.pop(rid, None)
            # A subscription ends only by an error or OFFSET_ILLEGAL: this is its last answer,
            # with a reason as every refusal has.
            answer = _error(
                rid, "OUT_OF_RANGE", "INVALID_OFFSET",
                f"subscription {rid} ended: its offset is outside the queue (the "
                "OFFSET_ILLEGAL batch before this answer says where to start again)",
            )  # fmt: skip
        except BrokerError as exc:
            self._stats.refused("Subscribe", exc)
            answer = _refusal(rid, exc)
        except asyncio.CancelledError:
            self._stats.cancelled("Subscribe")
            return False
        except Exception as exc:
            self._stats.crashed("Subscribe")
            log.exception("exchange subscription %d failed", rid)
            answer = _error(rid, "UNKNOWN", "", f"Unexpected {type(exc)}: {exc}")
        else:
            self._stats.answered("Subscribe")
        self._answer(answer)
        return True

    @property
    def subscriptions(self) -> list[Credit]:
        """The credit of every open subscription of this stream."""
        return list(self._credits.values())

    def _answer(self, answer: pb.ExchangeResponse, *, last: bool = True) -> None:
        """Queue an answer for the client; its pulled messages count until handed on.

        `last`: it ends its request (not a subscription's batch), freeing its slot.
        """
        size = answer.pull.ByteSize() if answer.HasField("pull") else 0
        if last and not size and self._written_now(answer):
            self._room.release()
            return
        self._hold(size)
        self._answers.put_nowait((answer, size, last))

    def _written_now(self, answer: pb.ExchangeResponse) -> bool:
        """Write the answer of the only request in flight at once, where the front can.

        With nothing else to answer and the stream waiting for answers, going through
        the queue would only cost the stream's task a wake-up and a pass through
        serve_batches (a few us of a small send's ~95 us of broker CPU); answers of
        requests in flight together go through it, joined into one write.
        """
        return (
            self._write_now is not None
            and self._idle
            and len(self._tasks) <= 1  # the answered request's task, finishing
            and self._answers.empty()
            and self._write_now(join_repeated([answer.SerializeToString()]))
        )

    def _finished(self, rid: int, task: asyncio.Task[bool]) -> None:
        # A done callback, not a finally in _run: it runs even for a task cancelled
        # before its first step.
        if self._tasks.get(rid) is task:
            del self._tasks[rid]
        if task.cancelled() or not task.result():
            self._room.release()  # no answer will free its slot
        self._end_if_idle()


class ExchangeStreams:
    """Every open Exchange stream of a broker, so that shutdown can end them."""

    def __init__(
        self,
        send: SendHandler,
        pull: PullHandler,
        stats: RequestStats,
        limits: ClientLimits,
        subscribe: SubscribeHandler | None = None,
    ) -> None:
        self._send = send
        self._pull = pull
        self._subscribe = subscribe
        self._stats = stats
        self._limits = limits
        self._open: set[ExchangeStream] = set()
        self._closed = False

    async def serve(
        self, requests: AsyncIterator[Incoming], client: str, check: RequestCheck | None = None
    ) -> AsyncGenerator[pb.ExchangeResponse]:
        """One stream's answers; see ExchangeStream.serve. `client`: its connection's peer.

        `check`: the ACL's check of each request (None: no ACL).
        """
        with self._opened(client, check) as stream:
            async with contextlib.aclosing(stream.serve(requests)) as answers:
                async for answer in answers:
                    yield answer

    async def serve_batches(
        self,
        requests: AsyncIterator[Incoming],
        client: str,
        check: RequestCheck | None = None,
        write_now: WriteNow | None = None,
    ) -> AsyncGenerator[list[pb.ExchangeResponse]]:
        """`serve`, several answers at a time (ExchangeStream.serve_batches).

        `write_now`: how the front writes a lone answer at once (see ExchangeStream).
        """
        with self._opened(client, check, write_now) as stream:
            async with contextlib.aclosing(stream.serve_batches(requests)) as batches:
                async for batch in batches:
                    yield batch

    @contextlib.contextmanager
    def _opened(
        self, client: str, check: RequestCheck | None, write_now: WriteNow | None = None
    ) -> Iterator[ExchangeStream]:
        stream = ExchangeStream(
            self._send, self._pull, self._stats, client, self._limits, check, self._subscribe,
            write_now,
        )  # fmt: skip
        if self._closed:
            stream.close()
        self._open.add(stream)
        try:
            yield stream
        finally:
            self._open.discard(stream)

    @property
    def subscriptions(self) -> list[Credit]:
        """The credit of every open push subscription, over every stream."""
        return [c for stream in self._open for c in stream.subscriptions]

    @property
    def open_streams(self) -> int:
        """How many Exchange streams are being served."""
        return len(self._open)

    def close(self) -> None:
        """End every stream once its requests in flight are answered; refuse new ones."""
        self._closed = True
        for stream in self._open:
            stream.close()
