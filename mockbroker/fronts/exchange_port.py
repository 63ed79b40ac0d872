"""The Exchange port: ordermq's Exchange stream over plain TCP (or TLS) frames, no gRPC.

The same requests and answers as the ExchangeBatched RPC (Send, Pull, Subscribe, Credit,
Cancel), served by the same core (ExchangeStreams), each connection being one stream.
gRPC costs both sides most of a small request's round trip; framed TCP is what Kafka,
NATS and Redis speak. The wire (docs/wire-format.md, "The Exchange port"):

- the client opens with PREAMBLE (b"OMQX" and the version, 1, as 4 bytes big-endian);
- then each side sends frames: a 4-byte big-endian length, then that many bytes; the
  client's frames are ExchangeRequests, the broker's ExchangeResponses;
- the broker's first frame carries no answer, only the broker's id (its greeting: the
  preamble was taken; clients check the id against their route's);
- the client's end of input (a half-close) ends its requests: the broker answers those
  in flight, then closes;
- an error of the whole connection (a wrong preamble, a frame over the size limit or that
  does not parse) is the broker's last frame: one answer of id 0 (no request's) with an
  ExchangeError, after the answers to the requests before it; then the broker closes.

A client's first frame carries its hello (ExchangeRequests.hello): the account it signs
for, as an ExchangeBatched call's metadata would. With an ACL the broker checks it (its
first frame must come within `peer_wait_seconds`) and then each request as the RPC it
carries, as the gRPC front does; a refused hello ends the connection with
UNAUTHENTICATED or PERMISSION_DENIED (an answer of id 0), a refused request is answered
with its error. Without an ACL the hello is ignored. As on the other fronts, no wait on
a peer is unbounded: a client that connects and sends no preamble, or stops reading what
it is sent, is dropped after `peer_wait_seconds`; past `max_connections` open
connections, or `max_connections_per_host` from one address, a new connection is closed
as soon as it is accepted. A connection the broker has read nothing on for
`keepalive_seconds` is pinged (a frame of ExchangeResponses.ping), and closed if nothing
comes within `keepalive_seconds` more: a peer gone silent (a cable cut, a NAT that forgot
the connection, a proxy that stopped passing it) ends its streams and push
subscriptions, as the gRPC front's pings end its connections. A client's ping is
answered with a pong at once; clients ping the broker the same way.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from google.protobuf.message import Message
from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid
from mockbroker.fronts.grpc.exchange import ExchangeStreams, RequestCheck
from mockbroker.fronts.grpc.service import EXCHANGE_BATCHED_PATH, each_request
from mockbroker.fronts.grpc_errors import MalformedRequest, deserializer
from mockbroker.fronts.remoting.server import (
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_HOST,
    PEER_WAIT_SECONDS,
    STOP_FLUSH_SECONDS,
)
from mockbroker.tls import closed_quietly, listen
from sdk._batching import join_repeated
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._wire import (
    EXCHANGE_PORT_PREAMBLE,
    GRPC_MAX_MESSAGE_BYTES,
    set_tcp_keepalive,
    until_silent,
)
from sdk.clock import Clock, SystemClock, wait_within
from sdk.credentials import ACCESS_KEY_HEADER, DATE_HEADER, SIGNATURE_HEADER

if TYPE_CHECKING:
    from mockbroker.fronts.grpc.auth import GrpcAuth

log = logging.getLogger("ordermq.broker.exchange_port")

#: What a client sends first: the protocol's magic and its version.
PREAMBLE = EXCHANGE_PORT_PREAMBLE
_LENGTH = struct.Struct(">I")
#: The largest frame either side may send: the gRPC front's message limit.
MAX_FRAME_BYTES = GRPC_MAX_MESSAGE_BYTES


def frame(body: bytes) -> bytes:
    """`body` with its length in front, as it goes on the wire."""
    return _LENGTH.pack(len(body)) + body


#: The broker's keepalive frames (ExchangeResponses.ping and .pong).
PING = frame(pb.ExchangeResponses(ping=True).SerializeToString())
PONG = frame(pb.ExchangeResponses(pong=True).SerializeToString())


class _LastRead:
    """When a frame was last read from a connection (the loop's time, as keepalive's)."""

    __slots__ = ("at",)

    def __init__(self, at: float) -> None:
        self.at = at


def connection_error(exc: BrokerError) -> bytes:
    """The frame that ends a connection with `exc` (an answer of id 0)."""
    answer = pb.ExchangeResponse(
        id=0, error=pb.ExchangeError(code=exc.status.name, reason=exc.reason, message=exc.message)
    )
    return frame(pb.ExchangeResponses(responses=[answer]).SerializeToString())


def hello_headers(hello: pb.ExchangeHello) -> dict[str, str]:
    """A hello's values as the gRPC metadata headers they stand for (the unset left out)."""
    headers = {
        ACCESS_KEY_HEADER: hello.access_key,
        DATE_HEADER: str(hello.date_ms) if hello.date_ms else "",
        SIGNATURE_HEADER: hello.signature,
    }
    return {key: value for key, value in headers.items() if value}


class ExchangePort:
    """A listener serving the Exchange stream over frames, one stream per connection."""

    def __init__(
        self,
        exchanges: ExchangeStreams,
        *,
        broker_id: str = "",
        keepalive_seconds: float,
        clock: Clock | None = None,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        peer_wait_seconds: float = PEER_WAIT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
        max_connections_per_host: int = MAX_CONNECTIONS_PER_HOST,
        auth: GrpcAuth | None = None,
        refused: Callable[[str, BrokerError], None] = lambda _method, _exc: None,
    ) -> None:
        self._exchanges = exchanges
        #: The greeting: a frame of ExchangeResponses carrying only the broker's id.
        self._greeting = frame(pb.ExchangeResponses(broker_id=broker_id).SerializeToString())
        self._auth = auth
        self._refused = refused
        self._keepalive = keepalive_seconds
        self._clock = clock or SystemClock()
        self.max_frame_bytes = max_frame_bytes
        self.peer_wait_seconds = peer_wait_seconds
        self.max_connections = max_connections
        self.max_connections_per_host = max_connections_per_host
        #: Connections closed on accept, for being past a limit.
        self.refused_connections = 0
        #: Connections whose preamble was taken (streams served), since the start.
        self.accepted_connections = 0
        #: Connections whose stream is being served (their opening done), of those open.
        self.streams = 0
        self.port = 0
        self._per_host: dict[str, int] = {}
        self._connections: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._stopping = False

    @property
    def connections(self) -> int:
        """How many connections are open."""
        return len(self._connections)

    async def start(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> int:
        """Listen on host:port (0: a free port), over TLS with `tls`; the port bound."""
        self._server, self.port = await listen(self._accept, host, port, tls)
        return self.port

    async def stop(self, grace_seconds: float = 0.0) -> None:
        """Stop listening; connections get `grace_seconds` to finish, then are dropped.

        The broker has already closed its Exchange streams (ExchangeStreams.close): each
        answers what is in flight and ends, and its connection closes after it, with
        STOP_FLUSH_SECONDS for its last answers to go out.
        """
        self._stopping = True
        if self._server is not None:
            self._server.close()
        if self._connections:
            await asyncio.wait(set(self._connections), timeout=grace_seconds)
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) else str(peer)
        client = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        if (
            len(self._connections) >= self.max_connections
            or self._per_host.get(host, 0) >= self.max_connections_per_host
        ):
            self.refused_connections += 1
            refused = self.refused_connections
            if refused & (refused - 1) == 0:  # 1, 2, 4, ...: a storm does not flood the log
                log.warning(
                    "Exchange port: connection from %s closed: %d open, %d from that host "
                    "(limits %d and %d per host); %d refused so far",
                    client, len(self._connections), self._per_host.get(host, 0),
                    self.max_connections, self.max_connections_per_host, refused,
                )  # fmt: skip
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._per_host[host] = self._per_host.get(host, 0) + 1
        try:
            set_tcp_keepalive(writer.get_extra_info("socket"), self._keepalive)
            await self._serve(reader, writer, host, client)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass  # the peer went away: its stream has ended with it
        finally:
            self._per_host[host] -= 1
            if not self._per_host[host]:
                del self._per_host[host]
            try:
                await self._close(writer, client)
            finally:
                self._connections.discard(task)  # stop() awaits it until here

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, client: str
    ) -> None:
        opening = asyncio.ensure_future(reader.readexactly(len(PREAMBLE)))
        if not await wait_within(self._clock, opening, self.peer_wait_seconds):
            log.info("Exchange port: %s sent no preamble within %g s", client,
                     self.peer_wait_seconds)  # fmt: skip
            return
        if opening.result() != PREAMBLE:
            await self._write(writer, connection_error(BrokerError(
                StatusCode.FAILED_PRECONDITION, "NOT_EXCHANGE_PROTOCOL",
                f"not ordermq's Exchange protocol: a connection opens with {PREAMBLE!r} "
                "(this port serves ordermq clients' Exchange streams, not gRPC nor "
                "RocketMQ remoting)",
            )))  # fmt: skip
            return
        self.accepted_connections += 1
        await self._write(writer, self._greeting)
        last_read = _LastRead(asyncio.get_running_loop().time())
        connection = asyncio.current_task()
        assert connection is not None
        keepalive = asyncio.ensure_future(self._keep_alive(writer, last_read, client, connection))
        frames = self._frames(reader, writer, last_read)
        served = False
        try:
            check, first = await self._opening(frames, host)
            # The first frame was read already only with an ACL (its hello).
            requests = each_request(frames if first is None else self._after(first, frames))
            self.streams += 1
            served = True

            def write_now(body: bytes) -> bool:
                transport = writer.transport
                if transport.is_closing() or transport.get_write_buffer_size():
                    return False
                writer.write(frame(body))
                return True

            async for batch in self._exchanges.serve_batches(requests, client, check, write_now):
                body = join_repeated([answer.SerializeToString() for answer in batch])
                await self._write(writer, frame(body))
        except BrokerError as exc:  # a refused hello or a frame that did not parse
            await self._write(writer, connection_error(exc))
        finally:
            keepalive.cancel()
            if served:
                self.streams -= 1

    async def _keep_alive(
        self,
        writer: asyncio.StreamWriter,
        last_read: _LastRead,
        client: str,
        connection: asyncio.Task[None],
    ) -> None:
        """Ping the peer after `keepalive_seconds` of silence; drop it if it stays silent."""
        await until_silent(lambda: writer.write(PING), lambda: last_read.at, self._keepalive)
        log.info("Exchange port: %s answered no ping within %g s; closing", client,
                 self._keepalive)  # fmt: skip
        writer.transport.abort()
        connection.cancel()  # its stream ends, push subscriptions and all

    async def _opening(
        self, frames: AsyncIterator[pb.ExchangeRequests | MalformedRequest], host: str
    ) -> tuple[RequestCheck | None, pb.ExchangeRequests | MalformedRequest | None]:
        """With an ACL: the first frame's hello checked, each request's check and that frame.

        Raises BrokerError for a hello that is refused or that does not come in time.
        """
        auth = self._auth
        if auth is None:
            return None, None
        first = asyncio.ensure_future(anext(frames, None))
        if not await wait_within(self._clock, first, self.peer_wait_seconds):
            raise BrokerError(StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED",
                              f"no hello within {self.peer_wait_seconds:g} s")  # fmt: skip
        message = first.result()
        if not isinstance(message, pb.ExchangeRequests):
            return None, message  # a malformed frame or none: ends the stream as it is
        try:
            caller = auth.signed_caller(
                EXCHANGE_BATCHED_PATH, hello_headers(message.hello), host, None
            )
        except BrokerError as exc:
            self._refused("ExchangePort", exc)
            raise

        def check(method: str, request: Message) -> None:
            auth.authorize(caller, method, request)

        return check, message

    @staticmethod
    async def _after(
        first: pb.ExchangeRequests | MalformedRequest | None,
        frames: AsyncIterator[pb.ExchangeRequests | MalformedRequest],
    ) -> AsyncIterator[pb.ExchangeRequests | MalformedRequest]:
        """`first` (read already, if any), then the frames after it."""
        if first is not None:
            yield first
        async for message in frames:
            yield message

    async def _frames(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, last_read: _LastRead
    ) -> AsyncIterator[pb.ExchangeRequests | MalformedRequest]:
        """The client's frames, parsed, until its end of input; pings answered, not given.

        A frame over the limit, that does not parse, or with a request of id 0 (which
        names the connection's errors) is the last thing read: it comes as a
        MalformedRequest, which ends the stream once what came before is answered.
        """
        limit, parse = self.max_frame_bytes, deserializer(pb.ExchangeRequests)
        now = asyncio.get_running_loop().time
        cut_off = MalformedRequest(invalid("FRAME_CUT_OFF", "the input ended in a frame"))
        id_zero = MalformedRequest(invalid(
            "REQUEST_ID_ZERO",
            "a request of id 0: request ids start at 1 (id 0 names the connection's errors)",
        ))  # fmt: skip
        while True:
            try:
                length = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))[0]
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    yield cut_off
                return  # the client half-closed
            if length > limit:
                yield MalformedRequest(BrokerError(
                    StatusCode.RESOURCE_EXHAUSTED, "FRAME_TOO_LARGE",
                    f"a frame of {length} bytes, over the limit of {limit}",
                ))  # fmt: skip
                return
            try:
                message = parse(await reader.readexactly(length))
            except asyncio.IncompleteReadError:
                yield cut_off
                return
            last_read.at = now()
            assert isinstance(message, (pb.ExchangeRequests, MalformedRequest))
            if isinstance(message, pb.ExchangeRequests):
                if message.ping or message.pong:
                    if message.ping:
                        await self._write(writer, PONG)
                    continue
                if any(request.id == 0 for request in message.requests):
                    message = id_zero
            yield message
            if isinstance(message, MalformedRequest):
                return

    async def _write(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        """Write `data`; a peer that does not read it within peer_wait_seconds is dropped."""
        writer.write(data)
        transport = writer.transport
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
            return  # not held back: drain() would return at once
        if not await wait_within(self._clock, writer.drain(), self.peer_wait_seconds):
            raise ConnectionError(f"the peer read nothing for {self.peer_wait_seconds:g} s")

    async def _close(self, writer: asyncio.StreamWriter, client: str) -> None:
        writer.close()
        closed = asyncio.ensure_future(closed_quietly(writer))
        if self._stopping:
            flushed = await wait_within(SystemClock(), closed, STOP_FLUSH_SECONDS)
        else:
            flushed = await wait_within(self._clock, closed, self.peer_wait_seconds)
        if not flushed:
            log.warning("Exchange port: %s reads nothing; dropping what it was sent", client)
            writer.transport.abort()
