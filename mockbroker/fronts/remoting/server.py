"""The remoting server: asyncio streams in the broker's event loop, one task per request.

Each connection reads frames in order and hands every request to its handler in a task of
its own, so a pull held by long polling does not hold up the heartbeats and sends behind
it on the same connection; answers go out as they are ready, matched by `opaque`. A code
with no handler is answered REQUEST_CODE_NOT_SUPPORTED, a RemotingError with its code,
any other failure SYSTEM_ERROR, as RocketMQ's NettyRemotingAbstract does (an answer that
cannot be encoded too). A frame that does not parse closes its connection only. A
connection with no traffic for `idle_seconds` (RocketMQ: 120 s) is closed. With `limits`,
a client past its bytes in flight (requests read and not yet answered, answers being
written) is not read from until some are answered, as gRPC clients are held. Stopping
cancels every request still being handled, those of connections already closed included,
and returns once they have all ended.

No wait on a peer is unbounded: a peer that stops reading holds neither the idle reaper,
nor stop(), nor the other members of its group. Closing a connection waits at most
`peer_wait_seconds` for what is still queued to go out, then drops it; a oneway request
(NOTIFY_CONSUMER_IDS_CHANGED) waits as long, then is dropped, as RocketMQ drops one it
cannot write. A connection leaves `connections` when its close begins, so nothing loops
on one already closing. Past `max_connections` open connections, or
`max_connections_per_host` from one address, a new connection is closed as soon as it is
accepted (counted in `refused_connections`): one host opening sockets without end takes
neither the broker's file descriptors nor the others' room.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine, Mapping

from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.channel import Handler
from mockbroker.fronts.remoting.errors import refusal
from mockbroker.limits import ClientLimits
from mockbroker.tls import closed_quietly, listen
from sdk._remoting.codec import MAX_FRAME_BYTES, FrameError, decode, encode, read_frame
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import FLAG_ONEWAY, RemotingCommand, RemotingError
from sdk.clock import Clock, SystemClock, wait_within

log = logging.getLogger("ordermq.broker.remoting")

#: RocketMQ closes a channel after this long without reads or writes.
IDLE_SECONDS = 120.0
#: The longest the broker waits on a peer: to flush a closing connection, to write a oneway.
PEER_WAIT_SECONDS = 10.0
#: At a stop, once the grace is over: how long a connection may take to flush its last
#: answers (the held pulls the stop just answered) before it is dropped.
STOP_FLUSH_SECONDS = 1.0
#: Connections one server keeps at once, in all and from one host; more are closed at once.
MAX_CONNECTIONS = 4096
MAX_CONNECTIONS_PER_HOST = 1024


class Connection:
    """One client connection: the ClientChannel handlers see."""

    def __init__(
        self,
        server: RemotingServer,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self._server = server
        self._reader = reader
        self._writer = writer
        peer = writer.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        #: The remote address without its port.
        self.host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        self._closed = False
        self._write_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.last_active = server.clock.now()

    @property
    def peer(self) -> str:
        """The remote address, "host:port"."""
        return self._peer

    @property
    def closed(self) -> bool:
        """True once the connection is gone."""
        return self._closed

    @property
    def unsent_bytes(self) -> int:
        """Bytes written to the connection that the peer has not yet taken."""
        return self._writer.transport.get_write_buffer_size()

    async def send_oneway(self, command: RemotingCommand) -> None:
        """Send a broker-to-client oneway request; dropped if the connection is gone."""
        command.opaque = next(self._server.opaques)
        command.flag |= FLAG_ONEWAY
        await wait_within(
            self._server.clock, self._write(encode(command)), self._server.peer_wait_seconds
        )

    async def serve(self) -> None:
        """Read and dispatch requests until the peer closes or sends a bad frame."""
        limits = self._server.limits
        try:
            while True:
                if limits is not None:
                    await limits.room(self)
                try:
                    frame = await read_frame(self._reader, self._server.max_frame_bytes)
                    command = None if frame is None else decode(frame)
                except FrameError as exc:
                    log.warning("remoting %s: closing the connection: %s", self._peer, exc)
                    self._server.malformed_frames += 1
                    return
                except (ConnectionError, OSError):
                    return
                if frame is None or command is None:
                    return
                self.last_active = self._server.clock.now()
                if command.is_response:
                    continue  # the broker's own requests are oneway: nothing waits for it
                task = self._server.handle(self._handle(command))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                if limits is not None:
                    self._hold(limits, task, 4 + len(frame))
        finally:
            # Requests already read finish (an offset commit sent just before the client
            # closed its end is still stored); their answers have nowhere to go.
            await self.close(cancel_requests=False)

    async def close(
        self, *, cancel_requests: bool = True, flush_seconds: float | None = None
    ) -> None:
        """Close the connection; cancel the requests still being handled unless told not to.

        What is queued for the peer gets `peer_wait_seconds` on the broker's clock to go
        out, or `flush_seconds` of real time (a stop: no test's fake clock holds it up);
        then the connection is dropped.
        """
        if self._closed:
            return
        self._closed = True
        self._server.closed(self)
        if cancel_requests:
            for task in list(self._tasks):
                task.cancel()
        self._writer.close()
        if flush_seconds is None:
            clock, bound = self._server.clock, self._server.peer_wait_seconds
        else:
            clock, bound = SystemClock(), flush_seconds
        flushed = await wait_within(clock, closed_quietly(self._writer), bound)
        if not flushed:
            log.warning("remoting %s: %s reads nothing; dropping what it was sent",
                        self._server.name, self._peer)  # fmt: skip
            self._writer.transport.abort()

    def _hold(self, limits: ClientLimits, task: asyncio.Task[None], size: int) -> None:
        # Released when the task ends, however it ends (even cancelled before it ran).
        limits.hold(self, size)
        task.add_done_callback(lambda _: limits.hold(self, -size))

    async def _handle(self, request: RemotingCommand) -> None:
        answer = await self._server.answer(request, self)
        if answer is None or request.is_oneway:
            return
        data = self._server.encoded(request, answer)
        limits = self._server.limits
        if limits is not None:
            limits.hold(self, len(data))
        try:
            await self._write(data)
        finally:
            if limits is not None:
                limits.hold(self, -len(data))

    async def _write(self, data: bytes) -> None:
        if self._closed:
            return
        try:
            async with self._write_lock:
                self.last_active = self._server.clock.now()  # before the peer can see it
                self._writer.write(data)
                await self._writer.drain()
        except (ConnectionError, OSError):
            await self.close(cancel_requests=False)


class RemotingServer:
    """A remoting listener serving one handler table."""

    def __init__(
        self,
        name: str,
        handlers: Mapping[int, Handler],
        clock: Clock,
        *,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        idle_seconds: float = IDLE_SECONDS,
        peer_wait_seconds: float = PEER_WAIT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        max_connections_per_host: int = MAX_CONNECTIONS_PER_HOST,
        on_close: Callable[[Connection], None] | None = None,
        limits: ClientLimits | None = None,
        guard: Callable[[RemotingCommand, str], None] | None = None,
    ) -> None:
        self.name = name
        #: Run before each request's handler with the request and the client's host; what
        #: it raises (a RemotingError) is the answer, and the handler does not run.
        self.guard = guard
        self.handlers = dict(handlers)
        self.clock = clock
        self.max_frame_bytes = max_frame_bytes
        self.idle_seconds = idle_seconds
        self.peer_wait_seconds = peer_wait_seconds
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        #: Connections closed on accept, for being past a limit.
        self.refused_connections = 0
        self._per_host: dict[str, int] = {}
        self._on_close = on_close
        #: Bytes in flight per connection, and the limit on them (None: no limit).
        self.limits = limits
        self.opaques = itertools.count(1)
        self.connections: set[Connection] = set()
        #: Every request being handled, of open and of closed connections.
        self.requests: set[asyncio.Task[None]] = set()
        self.malformed_frames = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._idle_task: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0: a free port), over TLS with `tls`; the port bound."""
        self._server, self.port = await listen(self._accept, host, port, tls)
        self._idle_task = asyncio.create_task(self._close_idle(), name=f"{self.name}-idle")
        return self.port

    async def stop(self, grace_seconds: float = 0.0) -> None:
        """Stop: requests in flight get up to `grace_seconds`, then connections close.

        What is still running after the grace is cancelled. Returns once every request has
        ended, those of connections already closed included: none touches the core after.
        """
        if self._idle_task is not None:
            self._idle_task.cancel()
        if self._server is not None:
            self._server.close()
        if self.requests and grace_seconds > 0:
            await asyncio.wait(list(self.requests), timeout=grace_seconds)
        closes = [c.close(flush_seconds=STOP_FLUSH_SECONDS) for c in list(self.connections)]
        await asyncio.gather(*closes, *self._closing)
        requests = list(self.requests)
        for task in requests:
            task.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def handle(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Run one request's `work` in a task of its own, tracked until it ends."""
        task = asyncio.create_task(work)
        self.requests.add(task)
        task.add_done_callback(self.requests.discard)
        return task

    async def answer(self, request: RemotingCommand, channel: Connection) -> RemotingCommand | None:
        """The response to `request` (None: a oneway request its handler did not answer).

        The guard sees every request first, those of codes not served too (RocketMQ's RPC
        hooks run before any processor, its default one included).
        """
        try:
            if self.guard is not None:
                self.guard(request, channel.host)
            handler = self.handlers.get(request.code)
            if handler is None:
                return request.response(
                    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                    remark=f" request type {request.code} not supported",
                )
            return await handler(request, channel)
        except RemotingError as exc:
            return request.response(exc.code, remark=exc.remark)
        except BrokerError as exc:
            refused = refusal(exc)
            return request.response(refused.code, remark=refused.remark)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("remoting %s: request code %d failed", self.name, request.code)
            return request.response(
                ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}"
            )

    def encoded(self, request: RemotingCommand, answer: RemotingCommand) -> bytes:
        """`answer`'s frame; SYSTEM_ERROR's if `answer` cannot be encoded (a handler's bug)."""
        try:
            return encode(answer)
        except Exception as exc:
            log.exception("remoting %s: the answer to request code %d cannot be encoded",
                          self.name, request.code)  # fmt: skip
            return encode(
                request.response(
                    ResponseCode.SYSTEM_ERROR, remark=f"the answer cannot be encoded: {exc}"
                )
            )

    def closed(self, connection: Connection) -> None:
        """A connection is ending (called once per connection, when its close begins)."""
        self.connections.discard(connection)
        left = self._per_host.get(connection.host, 0) - 1
        if left > 0:
            self._per_host[connection.host] = left
        else:
            self._per_host.pop(connection.host, None)
        if self._on_close is not None:
            self._on_close(connection)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = Connection(self, reader, writer)
        from_host = self._per_host.get(connection.host, 0)
        if (
            len(self.connections) >= self.max_connections
            or from_host >= self.max_connections_per_host
        ):
            self.refused_connections += 1
            if self.refused_connections & (self.refused_connections - 1) == 0:  # 1, 2, 4, ...
                log.warning(
                    "remoting %s: connection from %s closed: %d open, %d from that host "
                    "(limits %d and %d per host); %d refused so far",
                    self.name, connection.peer, len(self.connections), from_host,
                    self.max_connections, self.max_connections_per_host,
                    self.refused_connections,
                )  # fmt: skip
            writer.transport.abort()
            return
        self.connections.add(connection)
        self._per_host[connection.host] = from_host + 1
        await connection.serve()

    async def _close_idle(self) -> None:
        # On the wall clock, the one sleep_until takes: the deadline is read once, so a
        # clock that moves meanwhile cannot push it out of reach.
        while True:
            now = self.clock.now()
            oldest = min((c.last_active for c in self.connections), default=now)
            await self.clock.sleep_until(oldest + self.idle_seconds)
            await asyncio.sleep(0)  # a deadline already past must not starve the loop
            now = self.clock.now()
            for connection in list(self.connections):
                if now - connection.last_active >= self.idle_seconds:
                    log.info("remoting %s: closing idle connection %s", self.name, connection.peer)
                    # In a task of its own: one peer slow to close holds up no other.
                    task = asyncio.create_task(connection.close())
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
