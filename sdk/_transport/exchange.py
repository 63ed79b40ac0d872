"""Exchange: Send and Pull requests multiplexed on one long-lived bidi stream to a broker.

Push subscriptions (Subscribe) ride on it too: each is answered by many batches of its id
until an error ends it; Credit requests of its id grant more, a cancel ends it.

A unary call costs the client and the broker a few hundred microseconds of CPU whatever
it carries; a request on an open stream about a hundred. Each request carries an id and
its answer the same id; answers come in completion order. One writer task writes the
requests in the order they were made (grpc.aio allows one write at a time on a call), so
Sends to a queue reach the broker in call order; one reader task hands out the answers.

With a broker that serves ExchangeBatched (it greets the stream; an older one answers
UNIMPLEMENTED, and the requests go on an Exchange stream instead), the writer puts every
request made while it wrote the previous message into the next one, and the broker does
the same with its answers: a stream message costs about what a request did, whatever it
carries. When the broker's route names its Exchange port (framed TCP, no gRPC), the same
messages go there (sdk/_transport/exchange_port.py): the port is connected beside the gRPC
stream, which carries the requests until the broker greets on the port, and all of them
should it not answer (a firewall, a NAT that maps only the gRPC port). Requests made
after the move to the port may overtake ones made before it, still in flight on gRPC:
the producer never has two requests of one queue in flight, so its per-queue order holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

import grpc

from sdk._batching import join_repeated, settled
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.exchange_port import PortCall
from sdk._wire import GRPC_MAX_MESSAGE_BYTES
from sdk.errors import BrokerError, ClientStateError, error_from_status

log = logging.getLogger("ordermq.transport")

ExchangeCall = grpc.aio.StreamStreamCall[pb.ExchangeRequest, pb.ExchangeResponse]
OpenExchange = grpc.aio.StreamStreamMultiCallable[pb.ExchangeRequest, pb.ExchangeResponse]
#: ExchangeBatched, written serialized (ExchangeRequests, see sdk._batching.join_repeated).
BatchedCall = grpc.aio.StreamStreamCall[bytes, pb.ExchangeResponses]
OpenBatched = grpc.aio.StreamStreamMultiCallable[bytes, pb.ExchangeResponses]
#: Opens a connection to the broker's Exchange port (sdk/_transport/exchange_port.py).
OpenPort = Callable[[], PortCall]
EXCHANGE_BATCHED_PATH = "/ordermq.v1.MessagingService/ExchangeBatched"
ErrorFactory = Callable[[], Exception]
#: Takes a subscription's batch in the stream's reader; False: not taken, call it no more.
BatchHandler = Callable[[pb.PullResponse], bool]
#: Requests one stream carries at once; more wait here for a free slot (the broker reads
#: no more than this many at once either).
MAX_IN_FLIGHT = 10_000
#: Most requests one ExchangeBatched message carries...
MAX_BATCH = 256
#: ... and most bytes, unless one request alone has more.
BATCH_BYTES = 1024 * 1024
#: What carrying a request in an ExchangeRequests adds to it: its field's tag and length.
_WRAPPING = 16


class ExchangeUnsupportedError(Exception):
    """The broker does not serve Exchange (UNIMPLEMENTED): it served none of the requests."""


class _PortUnavailableError(Exception):
    """The broker's Exchange port could not be reached: the stream was never greeted.

    No request was written on it: they went on a gRPC stream.
    """


class _BatchingUnsupportedError(Exception):
    """The broker does not serve ExchangeBatched (UNIMPLEMENTED).

    It served none of the requests, which go on an Exchange stream instead.
    """


class Exchange:
    """At most one open Exchange stream on a channel, opened on first use.

    Create and use it on one event loop. A broken stream fails the requests awaiting an
    answer and is dropped; the next request opens a new one.
    """

    def __init__(
        self,
        open_stream: OpenExchange,
        target: str,
        connected: Callable[[], Awaitable[None]] | None = None,
        open_batched: OpenBatched | None = None,
        disconnected: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """`connected`: returns once the channel is connected (triggering a connection).

        `open_batched`: ExchangeBatched, tried first (None: Exchange only).
        `disconnected`: returns once the channel's connection is lost; a fallback learned
        on a connection holds until then (None: for the life of the client).
        """
        self._open_stream = open_stream
        self._open_batched = open_batched
        self._batched_opener = open_batched
        self._disconnected = disconnected
        #: Opens a stream on the broker's Exchange port (None: none, or not reachable on
        #: this connection), and the one the broker offered.
        self._open_port: OpenPort | None = None
        self._port_opener: OpenPort | None = None
        #: A stream on the port being connected beside the current one; it takes over
        #: once the broker greets on it.
        self._port_attempt: _Stream | None = None
        #: Streams the port's took the place of, until what awaits an answer on them has it.
        self._retiring: set[_Stream] = set()
        self._fallback_watch: asyncio.Task[None] | None = None
        #: Asks whether the broker serves Exchange, once ExchangeBatched was refused.
        self._probe: asyncio.Task[None] | None = None
        self._target = target
        self._connected = connected
        self._stream: _Stream | None = None
        self._last_id = 0
        self._supported = True
        self._closed = False
        self._slots = asyncio.Semaphore(MAX_IN_FLIGHT)

    def use_port(self, opener: OpenPort | None) -> None:
        """Open the next streams with `opener`, on the broker's Exchange port (None: none).

        The port is connected beside gRPC: at once if a stream is open on gRPC, else
        when the next one opens (a client that makes no Exchange request makes no
        connection). Should it not answer, the requests go on gRPC, for as long as the
        connection that learned it lasts (then the port is tried again).
        """
        self._open_port = self._port_opener = opener
        if self._stream is not None and opener is not None:
            self._try_port()

    @property
    def supported(self) -> bool:
        """False once the broker answered UNIMPLEMENTED: use the unary Send and Pull."""
        return self._supported

    async def call(
        self, envelope: pb.ExchangeRequest, timeout: float | None = None
    ) -> pb.ExchangeResponse:
        """Send `envelope` (a send or pull body; its id is set here) and await the answer.

        Raises what the unary call would: the broker's error, RequestTimeoutError when
        `timeout` passes (the broker is told to drop the request), BrokerUnavailableError
        when the stream breaks or, with a timeout, when the broker cannot be reached within
        it (without one, at once), ClientStateError when the client is closed.
        ExchangeUnsupportedError when the broker has no Exchange.
        """
        size = envelope.ByteSize()
        if size > GRPC_MAX_MESSAGE_BYTES - _WRAPPING:  # as gRPC refuses such a call, locally
            raise error_from_status(
                "RESOURCE_EXHAUSTED",
                None,
                f"{_describe(envelope)}: the request is {size} bytes, over the limit of "
                f"{GRPC_MAX_MESSAGE_BYTES}",
            )
        async with self._slots:
            return await self._call(envelope, timeout)

    async def _call(
        self, envelope: pb.ExchangeRequest, timeout: float | None
    ) -> pb.ExchangeResponse:
        if self._probe is not None:
            timeout = await self._probed(envelope, timeout)
        if not self._supported:
            raise ExchangeUnsupportedError("the broker does not serve Exchange")
        if self._stream is None and timeout is not None and not self._closed:
            loop = asyncio.get_running_loop()
            started = loop.time()
            await self._connect(envelope, timeout)
            timeout = max(0.0, timeout - (loop.time() - started))
            if self._learning():
                return await self._call(envelope, timeout)
        stream = self._stream_for(envelope)
        rid = envelope.id
        future = stream.submit(envelope)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        # A timer that fails the future, not asyncio.timeout_at around the await: that
        # costs a request about 3 us against 1 (it cancels and uncancels the task).
        expiry = None if deadline is None else loop.call_at(deadline, _expire, future)
        try:
            answer = await future
        except _BatchingUnsupportedError:  # on another stream
            left = None if deadline is None else deadline - loop.time()
            return await self._call(envelope, None if left is None else max(0.0, left))
        except _Expired:
            stream.abandon(rid, future)
            raise error_from_status(
                "DEADLINE_EXCEEDED",
                None,
                f"{_describe(envelope)}: no answer within {timeout:g}s "
                f"(request {rid} on the Exchange stream to {self._target})",
            ) from None
        except asyncio.CancelledError:
            stream.abandon(rid, future)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        kind = envelope.WhichOneof("body")
        if answer.WhichOneof("body") != kind:
            raise BrokerError(
                f"the broker answered {_describe(envelope)} (request {rid}) with "
                f"{answer.WhichOneof('body')!r}, not {kind!r}",
                code="INTERNAL",
            )
        return answer

    async def subscribe(self, envelope: pb.ExchangeRequest, timeout: float) -> ExchangeSubscription:
        """Open a subscription (`envelope` carries a Subscribe; its id is set here).

        Waits up to `timeout` for the broker to be reachable (BrokerUnavailableError);
        ExchangeUnsupportedError when the broker is known to have no Exchange. The
        broker's refusal comes from the subscription's first `next()`. A subscription
        stays on the stream it was opened on: while the port is being connected, it
        waits for it (within `timeout`; then it goes on gRPC).
        """
        if self._probe is not None:
            await self._probed(envelope, timeout)
        if not self._supported:
            raise ExchangeUnsupportedError("the broker does not serve Exchange")
        if self._stream is None and not self._closed:
            await self._connect(envelope, timeout)
            if self._learning():
                return await self.subscribe(envelope, timeout)
        attempt = self._try_port()
        if attempt is not None:
            assert attempt.greeted is not None
            await asyncio.wait([attempt.greeted], timeout=timeout)
        stream = self._stream_for(envelope)
        if stream.greeted is not None:
            # A subscription is answered many times: it starts on a stream the broker
            # serves, not one it might refuse whole after the first batch went to a caller.
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(stream.greeted)
            except _BatchingUnsupportedError:
                return await self.subscribe(envelope, timeout)  # on another stream
            except TimeoutError:
                raise _unavailable(
                    f"{_describe(envelope)}: the broker at {self._target} did not open the "
                    f"stream within {timeout:g}s (not sent)"
                ) from None
            except Exception:  # the stream ended: subscribe() hands that on
                pass
        return stream.subscribe(envelope)

    def _learning(self) -> bool:
        """Whether a stream another caller opened was refused, while this one connected.

        The caller then goes as that refusal tells (once the probe of Exchange answered),
        not on a stream of the method the broker just refused.
        """
        return self._probe is not None or not self._supported

    async def _probed(self, envelope: pb.ExchangeRequest, timeout: float | None) -> float | None:
        """Wait for the probe of Exchange; the time left of `timeout`.

        ExchangeUnsupportedError if the broker does not serve it.
        """
        probe = self._probe
        assert probe is not None
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(probe)
        except TimeoutError:
            raise _unavailable(
                f"{_describe(envelope)}: the broker at {self._target} did not tell whether "
                f"it serves Exchange within {timeout:g}s (not sent)"
            ) from None
        except asyncio.CancelledError:
            if not probe.cancelled():
                raise  # the caller was
            raise ClientStateError(f"the client of {self._target} was closed") from None
        if not self._supported:
            raise ExchangeUnsupportedError("the broker does not serve Exchange")
        return None if timeout is None else max(0.0, timeout - (loop.time() - started))

    async def _probe_exchange(self) -> None:
        """Ask whether the broker serves Exchange: open it, write nothing, half-close.

        A broker that serves it ends the stream at once (OK), an older one answers
        UNIMPLEMENTED. Requests are not written on the stream while this is unknown: a
        write racing the refusal fails the call with INTERNAL in grpc.aio, and the
        requests would not know to go unary.
        """
        call = self._open_stream(None)
        try:
            with contextlib.suppress(Exception):  # the call ended: read() tells how
                await call.done_writing()
            while isinstance(await call.read(), pb.ExchangeResponse):
                pass
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                log.info("%s: the broker does not serve Exchange either; using unary Send "
                         "and Pull", self._target)  # fmt: skip
                self._supported = False
            # Anything else: the requests go on Exchange, and meet what broke it there.
        finally:
            call.cancel()
            self._probe = None

    def _stream_for(self, envelope: pb.ExchangeRequest) -> _Stream:
        """The stream to write `envelope` on (opened if there is none), its id set."""
        if self._closed:
            raise ClientStateError(f"the client of {self._target} is closed")
        stream = self._stream
        if stream is None:
            opener = self._open_batched
            call = opener(None) if opener is not None else self._open_stream(None)
            stream = self._stream = _Stream(call, self._target, self._ended, opener is not None)
            self._try_port()
        self._last_id += 1
        envelope.id = self._last_id
        return stream

    def _try_port(self) -> _Stream | None:
        """The stream on the port being connected, started unless on it already; or None.

        Requests go on as they do until the broker greets on it: then it is the stream,
        and the one before ends once nothing on it awaits an answer.
        """
        if self._port_attempt is not None or self._open_port is None or self._closed:
            return self._port_attempt
        if self._stream is not None and self._stream.port:
            return None
        attempt = _Stream(self._open_port(), self._target, self._ended, True, port=True)
        self._port_attempt = attempt
        assert attempt.greeted is not None
        attempt.greeted.add_done_callback(functools.partial(self._port_greeted, attempt))
        return attempt

    def _port_greeted(self, attempt: _Stream, greeted: asyncio.Future[None]) -> None:
        if self._port_attempt is not attempt:
            return  # ended meanwhile (_ended)
        self._port_attempt = None
        if greeted.cancelled() or greeted.exception() is not None or attempt.ended:
            return  # _ended took what it tells
        previous, self._stream = self._stream, attempt
        if previous is not None:
            self._retiring.add(previous)
            previous.retire()

    async def _connect(self, envelope: pb.ExchangeRequest, timeout: float) -> None:
        """Wait up to `timeout` for the broker to be reachable before opening a stream.

        A stream opened on an unconnected channel would fail at once (gRPC fails fast),
        and one told to wait for the connection would carry requests written to it to the
        broker when it comes up, after their callers gave up and maybe sent them again.
        """
        if self._connected is None:
            return
        try:
            async with asyncio.timeout(timeout):
                await self._connected()
        except TimeoutError:
            raise _unavailable(
                f"{_describe(envelope)}: cannot reach the broker at {self._target} "
                f"within {timeout:g}s (not sent)"
            ) from None
        except Exception:
            if not self._closed:
                raise
            # gRPC's own error for a channel closed under the wait.
            raise ClientStateError(f"the client of {self._target} was closed") from None

    async def close(self) -> None:
        """Cancel the stream; requests awaiting an answer fail with ClientStateError.

        Not a retriable error: a request cut off by closing its client must not be resent.
        """
        self._closed = True
        watch, self._fallback_watch = self._fallback_watch, None
        if watch is not None:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        probe = self._probe
        if probe is not None:
            probe.cancel()
            await asyncio.gather(probe, return_exceptions=True)
        closed = functools.partial(ClientStateError, f"the client of {self._target} was closed")
        for stream in (self._stream, self._port_attempt, *self._retiring):
            if stream is not None:
                await stream.close(closed)
        self._stream = self._port_attempt = None

    def _ended(self, stream: _Stream, error: Exception) -> None:
        if self._stream is stream:
            self._stream = None
        if self._port_attempt is stream:
            self._port_attempt = None
        self._retiring.discard(stream)
        if isinstance(error, ExchangeUnsupportedError):
            log.info("%s: %s; using unary Send and Pull", self._target, error)
            self._supported = False
            self._until_disconnected()
        elif isinstance(error, _PortUnavailableError):
            log.warning("%s: %s; using gRPC", self._target, error)
            self._open_port = None
            self._until_disconnected()
        elif isinstance(error, _BatchingUnsupportedError):
            log.info("%s: %s; using Exchange", self._target, error)
            self._open_batched = None
            self._until_disconnected()
            if self._probe is None and not self._closed:
                self._probe = asyncio.get_running_loop().create_task(
                    self._probe_exchange(), name=f"exchange-probe-{self._target}"
                )

    def _until_disconnected(self) -> None:
        """Keep the fallback while the connection that learned it lasts.

        The broker behind the address may be replaced (rolled back, upgraded) only by
        one that takes new connections: the next connection tries ExchangeBatched again,
        and a broker that still lacks it is asked once more per connection, not per call.
        """
        if self._disconnected is None or self._fallback_watch is not None or self._closed:
            return
        self._fallback_watch = asyncio.get_running_loop().create_task(
            self._forget_fallback(self._disconnected), name=f"exchange-fallback-{self._target}"
        )

    async def _forget_fallback(self, disconnected: Callable[[], Awaitable[None]]) -> None:
        try:
            await disconnected()
        except Exception:  # the channel closed under the wait: close() follows
            return
        finally:
            self._fallback_watch = None
        if not self._closed:
            log.info("%s: connection lost; what it fell back from is tried again", self._target)
            self._supported = True
            self._open_batched = self._batched_opener
            self._open_port = self._port_opener


class ExchangeSubscription:
    """One Subscribe on a stream: its answers in order, and its credit grants."""

    def __init__(self, stream: _Stream, rid: int) -> None:
        self._stream = stream
        self.id = rid
        self._inbox: asyncio.Queue[pb.ExchangeResponse | Exception | _Raised] = asyncio.Queue()
        self._ended = False
        self._handler: BatchHandler | None = None

    def on_batch(self, handler: BatchHandler | None) -> None:
        """Hand each batch to `handler` in the stream's reader, in order, not to `next()`.

        A batch queued for `next()` wakes the task awaiting it: one hand-off per batch.
        Once `handler` returns False (it did not take the batch: `next()` returns it) or
        raises (`next()` raises that), it is called no more and later batches queue for
        `next()` as before; errors and the subscription's end always do.
        """
        self._handler = handler

    def _deliver(self, answer: pb.ExchangeResponse | Exception) -> None:
        handler = self._handler
        if handler is not None and not isinstance(answer, Exception) and answer.HasField("pull"):
            try:
                if handler(answer.pull):
                    return
            except Exception as exc:  # the reader serves every request: it must go on
                self._handler = None
                self._inbox.put_nowait(_Raised(exc))  # not the subscription's end
                return
            self._handler = None  # not taken: next() returns it, and the rest
        self._inbox.put_nowait(answer)

    async def next(self) -> pb.PullResponse:
        """The next batch; raises what ended the subscription (the broker's error, ...)."""
        item = await self._inbox.get()
        if isinstance(item, _Raised):
            raise item.error
        if isinstance(item, Exception):
            self._ended = True
            raise item
        if item.HasField("error"):
            self._ended = True
            e = item.error
            raise error_from_status(e.code, e.reason or None, e.message or e.code)
        if not item.HasField("pull"):
            self._ended = True
            raise BrokerError(
                f"the broker answered subscription {self.id} with "
                f"{item.WhichOneof('body')!r}, not 'pull'",
                code="INTERNAL",
            )
        return item.pull

    def grant(self, messages: int, size: int) -> None:
        """Grant the broker `messages` more records and `size` more bytes to send."""
        if not self._ended:
            self._stream.control(pb.ExchangeRequest(id=self.id, credit=pb.Credit(
                messages=messages, bytes=size)))  # fmt: skip

    def close(self) -> None:
        """End the subscription (the broker is told); batches not read yet are dropped."""
        if not self._ended:
            self._ended = True
            self._stream.unsubscribe(self.id)


class _Raised:
    """What a batch handler raised, for next() to raise: the subscription goes on."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Stream:
    """One Exchange call, its writer and reader tasks, and the requests awaiting answers."""

    def __init__(
        self,
        call: ExchangeCall | BatchedCall | PortCall,
        target: str,
        on_end: Callable[[_Stream, Exception], None],
        batched: bool = False,
        *,
        port: bool = False,
    ) -> None:
        """`batched`: an ExchangeBatched call; `port`: a PortCall (batched too)."""
        self._call = call
        self._batched = batched
        self._port = port
        self._target = target
        self._on_end = on_end
        self._outbox: asyncio.Queue[pb.ExchangeRequest | None] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[pb.ExchangeResponse]] = {}
        self._unwritten: set[int] = set()  # requests in the outbox, not yet written
        # The port's writer task waits for the outbox with nothing carried (`_write_now`).
        self._writer_idle = False
        self._subscriptions: dict[int, ExchangeSubscription] = {}
        self._ended = False
        self._retired = False
        self._loop = asyncio.get_running_loop()
        #: ExchangeBatched: done once the broker's greeting came (failed if the stream ended
        #: before: with _BatchingUnsupportedError when the broker does not serve it).
        self.greeted: asyncio.Future[None] | None = None
        if batched:
            self.greeted = self._loop.create_future()
            self.greeted.add_done_callback(_retrieved)
        self._writer = self._loop.create_task(self._write(), name=f"exchange-writer-{target}")
        self._reader = self._loop.create_task(self._read(), name=f"exchange-reader-{target}")

    @property
    def port(self) -> bool:
        """Whether this is a connection to the broker's Exchange port."""
        return self._port

    @property
    def ended(self) -> bool:
        """Whether the stream has ended (it takes no more requests)."""
        return self._ended

    def retire(self) -> None:
        """End the stream once nothing on it awaits an answer: another took its place."""
        self._retired = True
        self._end_if_idle()

    def _end_if_idle(self) -> None:
        if self._retired and not self._pending and not self._subscriptions:
            self._end(functools.partial(_unavailable, f"the Exchange stream to {self._target} "
                                        "was replaced"))  # fmt: skip

    def submit(self, envelope: pb.ExchangeRequest) -> asyncio.Future[pb.ExchangeResponse]:
        """Queue `envelope` for writing; the future of its answer."""
        future: asyncio.Future[pb.ExchangeResponse] = self._loop.create_future()
        self._pending[envelope.id] = future
        if not self._write_now(envelope):
            self._unwritten.add(envelope.id)
            self._outbox.put_nowait(envelope)
        return future

    def _write_now(self, envelope: pb.ExchangeRequest) -> bool:
        """Write a lone request on the port at once; False: it goes through the outbox.

        A caller with no other request awaiting an answer on the stream (one send after
        another) while the writer waits with nothing queued: the writer task's wake-up
        would only cost a turn of the loop, about a tenth of the request's client CPU.
        Requests made while others are in flight (callers woken together by one answer)
        go through the outbox, which the writer joins into one write, in the order made.
        """
        if not (self._writer_idle and self._port) or len(self._pending) > 1:
            return False
        call = self._call
        assert isinstance(call, PortCall)
        if not (self._outbox.empty() and call.writable_now()):
            return False
        call.write_now(join_repeated([envelope.SerializeToString()]))
        return True

    def subscribe(self, envelope: pb.ExchangeRequest) -> ExchangeSubscription:
        """Queue a Subscribe for writing; the subscription its answers go to."""
        subscription = ExchangeSubscription(self, envelope.id)
        if self._ended:
            subscription._deliver(_unavailable(f"the Exchange stream to {self._target} ended"))
            return subscription
        self._subscriptions[envelope.id] = subscription
        self._outbox.put_nowait(envelope)
        return subscription

    def control(self, envelope: pb.ExchangeRequest) -> None:
        """Queue a Credit (never answered) for writing."""
        if not self._ended:
            self._outbox.put_nowait(envelope)

    def unsubscribe(self, rid: int) -> None:
        """Forget subscription `rid` and tell the broker to end it."""
        if self._subscriptions.pop(rid, None) is not None and not self._ended:
            self._outbox.put_nowait(pb.ExchangeRequest(id=rid, cancel=pb.ExchangeCancel()))
            self._end_if_idle()

    def abandon(self, rid: int, future: asyncio.Future[pb.ExchangeResponse]) -> None:
        """Forget request `rid`, so that the broker does not act on it.

        Not written yet, it never will be; written and unanswered, the broker is told to
        drop it.
        """
        if future.done() and not future.cancelled():
            future.exception()  # answered meanwhile: nobody will read it
        if self._pending.pop(rid, None) is None or self._ended:
            return
        if rid in self._unwritten:
            self._unwritten.discard(rid)  # the writer skips it
        else:
            self._outbox.put_nowait(pb.ExchangeRequest(id=rid, cancel=pb.ExchangeCancel()))
        self._end_if_idle()

    async def close(self, error: ErrorFactory) -> None:
        """End the stream, failing what awaits an answer with `error()`, and await its tasks."""
        self._end(error)
        await asyncio.gather(self._writer, self._reader, return_exceptions=True)

    def _end(self, error: ErrorFactory) -> None:
        if self._ended:
            return
        self._ended = True
        # Cancelling the call ends the reader's read and the writer's write; the tasks
        # themselves are not cancelled, so that no grpc operation of the call is still
        # outstanding when they end (its completion could otherwise reach a closed loop).
        self._call.cancel()
        self._outbox.put_nowait(None)
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error())
        subscriptions, self._subscriptions = self._subscriptions, {}
        for subscription in subscriptions.values():
            subscription._deliver(error())
        if self.greeted is not None and not self.greeted.done():
            self.greeted.set_exception(error())
        self._on_end(self, error())

    async def _write(self) -> None:
        error: ErrorFactory = functools.partial(
            _unavailable, f"the Exchange stream to {self._target} stopped writing"
        )
        try:
            if self._batched:
                await self._write_batches()
            else:
                while (envelope := await self._outbox.get()) is not None:
                    if self._writable(envelope):
                        await self._call.write(envelope)  # type: ignore[arg-type]
        except grpc.aio.AioRpcError as exc:
            error = self._failure(exc)
        except asyncio.InvalidStateError:
            pass  # the call has ended: the reader sees how and ends the stream
        finally:
            self._end(error)

    async def _write_batches(self) -> None:
        """Write the outbox as ExchangeRequests, the requests in the order they were made.

        Each message carries every request queued while the last one was written (at most
        MAX_BATCH, and BATCH_BYTES unless one alone is larger).
        """
        assert self.greeted is not None
        try:
            # Nothing is written before the broker greets: a write racing an older broker's
            # refusal fails the call with INTERNAL in grpc.aio, the UNIMPLEMENTED lost, and
            # the requests would not go on Exchange. Requests made meanwhile wait queued.
            await asyncio.shield(self.greeted)
        except Exception:
            return  # not served: the reader ended the stream, with the reason
        outbox = self._outbox
        carried: bytes | None = None
        while True:
            if carried is None:
                self._writer_idle = outbox.empty()
                envelope = await outbox.get()
                self._writer_idle = False
                if envelope is None:
                    return
                if not self._writable(envelope):
                    continue
                carried = envelope.SerializeToString()
            if not outbox.empty():
                # Others are queued: callers are active, more may be about to come. A lone
                # request is written at once (its callers' wakeups ran before this task's).
                await settled(outbox)
            batch, size, carried = [carried], len(carried), None
            ended = False
            while len(batch) < MAX_BATCH and not outbox.empty():
                envelope = outbox.get_nowait()
                if envelope is None:
                    ended = True
                    break
                if not self._writable(envelope):
                    continue
                serialized = envelope.SerializeToString()
                if size + len(serialized) > BATCH_BYTES:
                    carried = serialized
                    break
                batch.append(serialized)
                size += len(serialized)
            await self._call.write(join_repeated(batch))  # type: ignore[arg-type]
            if ended:
                return

    def _writable(self, envelope: pb.ExchangeRequest) -> bool:
        """False for a request abandoned before it was written; it is written now."""
        if envelope.WhichOneof("body") in ("cancel", "credit", "subscribe"):
            return True
        if envelope.id not in self._unwritten:
            return False
        self._unwritten.discard(envelope.id)
        return True

    async def _read(self) -> None:
        # Whatever stops the reader ends the stream, so that no request waits forever.
        error: ErrorFactory = functools.partial(
            _unavailable, f"the Exchange stream to {self._target} closed before answering"
        )
        call = self._call
        try:
            if self.greeted is not None:
                if isinstance(await call.read(), pb.ExchangeResponses):
                    self.greeted.set_result(None)
                while isinstance(message := await call.read(), pb.ExchangeResponses):
                    for answer in message.responses:
                        self._take(answer)
            else:
                while isinstance(single := await call.read(), pb.ExchangeResponse):
                    self._take(single)
        except grpc.aio.AioRpcError as exc:
            error = self._failure(exc)
        finally:
            self._end(error)

    def _take(self, answer: pb.ExchangeResponse) -> None:
        """Hand `answer` to its subscription or to the request awaiting it."""
        subscription = self._subscriptions.get(answer.id)
        if subscription is not None:
            if not answer.HasField("pull"):
                del self._subscriptions[answer.id]  # its last answer
                self._end_if_idle()
            subscription._deliver(answer)
            return
        future = self._pending.pop(answer.id, None)
        if self._retired:
            self._end_if_idle()
        if future is None or future.done():
            return  # abandoned by its caller
        if answer.HasField("error"):
            e = answer.error
            future.set_exception(error_from_status(e.code, e.reason or None, e.message or e.code))
        else:
            future.set_result(answer)

    def _failure(self, exc: grpc.aio.AioRpcError) -> ErrorFactory:
        if self._port and self.greeted is not None and not self.greeted.done():
            return functools.partial(
                _PortUnavailableError, f"the Exchange port is not reachable: {exc.details()}"
            )
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED and self._batched:
            return functools.partial(
                _BatchingUnsupportedError,
                f"the broker does not serve ExchangeBatched: {exc.details()}",
            )
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
            return functools.partial(
                ExchangeUnsupportedError, f"the broker does not serve Exchange: {exc.details()}"
            )
        # Whatever ended the stream, the requests on it were not refused one by one: they
        # may be resent, as after a dropped connection.
        return functools.partial(
            _unavailable,
            f"the Exchange stream to {self._target} ended: {exc.code().name} {exc.details()}",
        )


class _Expired(TimeoutError):
    """A request's deadline passed before its answer came (`_expire`)."""


def _expire(future: asyncio.Future[pb.ExchangeResponse]) -> None:
    if not future.done():
        future.set_exception(_Expired())


def _retrieved(future: asyncio.Future[None]) -> None:
    """Mark a future's exception as seen (nobody may await it)."""
    if not future.cancelled():
        future.exception()


def _unavailable(message: str) -> Exception:
    return error_from_status("UNAVAILABLE", None, message)


def _describe(envelope: pb.ExchangeRequest) -> str:
    if envelope.HasField("send"):
        return f"send to {envelope.send.topic} queue {envelope.send.queue_id}"
    if envelope.HasField("subscribe"):
        sub = envelope.subscribe
        return f"subscription to {sub.topic} queue {sub.queue_id} at offset {sub.offset}"
    pull = envelope.pull
    return f"pull of {pull.topic} queue {pull.queue_id} at offset {pull.offset}"
