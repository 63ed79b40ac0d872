"""The client side of a broker's Exchange port: one connection as one Exchange stream.

The broker's route names the port (QueueRoute.exchange_address); the client's Exchange
then opens its streams there instead of on ExchangeBatched (sdk/_transport/exchange.py).
A connection opens with the preamble and a hello frame: the client's account, signed (an
empty hello without credentials). A PortCall stands for the gRPC call the stream would
otherwise be: `write` takes an ExchangeRequests message serialized, `read` gives the
next ExchangeResponses, `cancel` ends it; what ends the connection is raised as the gRPC
status it stands for (an AioRpcError), so the stream ends its requests as it would on
gRPC. The wire: docs/wire-format.md, "The Exchange port". A connection goes through the
HTTP CONNECT proxy that gRPC's channels take to the same host, if any
(sdk/_transport/http_proxy.py). A connection the client has read nothing on for
GRPC_KEEPALIVE_MS is pinged, and dropped (UNAVAILABLE) if nothing comes within as long
again, as a gRPC channel's keepalive does: a silent peer does not hold its requests until
their deadlines, one after another.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import struct
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from sdk import _wire
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.http_proxy import open_tunnel, proxy_for
from sdk._wire import (
    EXCHANGE_PORT_PREAMBLE,
    GRPC_MAX_MESSAGE_BYTES,
    read_in_chunks,
    set_tcp_keepalive,
    until_silent,
)

_LENGTH = struct.Struct(">I")
#: How long a connection to the port may take (TLS handshake and greeting included)
#: before the stream is given up and the client goes back to gRPC.
CONNECT_SECONDS = 5.0


def _framed(message: pb.ExchangeRequests) -> bytes:
    body = message.SerializeToString()
    return _LENGTH.pack(len(body)) + body


_PING = _framed(pb.ExchangeRequests(ping=True))
_PONG = _framed(pb.ExchangeRequests(pong=True))
#: A greeting is a small frame: a larger first frame is not one.
_MAX_GREETING_BYTES = 1024


async def read_greeting(reader: asyncio.StreamReader) -> pb.ExchangeResponses | None:
    """The broker's greeting: its first frame, no answers, the broker's id.

    None if the first frame is not one.
    """
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > _MAX_GREETING_BYTES:
        return None
    try:
        greeting = pb.ExchangeResponses.FromString(await reader.readexactly(length))
    except DecodeError:
        return None
    return None if greeting.responses else greeting


def _status(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


class PortCall:
    """One connection to an Exchange port, as the Exchange stream uses a gRPC call.

    Connects at once (in a task), sending `hello()`'s account. Its first read gives the
    broker's greeting once the broker took the preamble, or raises UNAVAILABLE if the
    connection could not be made.
    """

    def __init__(
        self,
        address: str,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        hello: Callable[[], pb.ExchangeHello] = pb.ExchangeHello,
        broker_id: str = "",
    ) -> None:
        """`broker_id`: the id the route gives the port's broker ("": any broker's)."""
        self.address = address
        self._broker_id = broker_id
        self._cancelled = False
        self._greeting_read = False
        self._writer: asyncio.StreamWriter | None = None
        self._loop = asyncio.get_running_loop()
        #: When a frame was last read (the loop's time), and the keepalive's task.
        self._read_at = 0.0
        self._keepalive: asyncio.Task[None] | None = None
        #: The keepalive interval the peer stayed silent for, once it was dropped for it.
        self._silent_for: float | None = None
        self._open_connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._opened = asyncio.ensure_future(self._open(tls, server_name, hello))

    async def _open(
        self,
        tls: ssl.SSLContext | None,
        server_name: str | None,
        hello: Callable[[], pb.ExchangeHello],
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        host, _, port = self.address.rpartition(":")
        host = host.strip("[]")
        keepalive = _wire.GRPC_KEEPALIVE_MS / 1000  # read at each connection, as gRPC's
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                reader, writer = await _connect(host, int(port), tls, server_name)
                self._writer = writer
                set_tcp_keepalive(writer.get_extra_info("socket"), keepalive)
                writer.write(EXCHANGE_PORT_PREAMBLE + _framed(pb.ExchangeRequests(hello=hello())))
                greeting = await read_greeting(reader)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError) as exc:
            self._drop()
            raise _status(
                grpc.StatusCode.UNAVAILABLE,
                f"cannot open the Exchange port at {self.address}: "
                f"{str(exc) or type(exc).__name__}",
            ) from None
        if greeting is None:
            self._drop()
            raise _status(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.address} did not greet as an Exchange port",
            )
        if self._broker_id and greeting.broker_id != self._broker_id:
            self._drop()
            raise _status(
                grpc.StatusCode.UNAVAILABLE,
                f"{self.address} is the Exchange port of another broker (id "
                f"{greeting.broker_id or 'none'}, not {self._broker_id}): the route is older "
                "than a restart",
            )
        self._open_connection = reader, writer
        self._read_at = self._loop.time()
        self._keepalive = asyncio.ensure_future(self._keep_alive(writer, keepalive))
        return reader, writer

    async def _keep_alive(self, writer: asyncio.StreamWriter, interval: float) -> None:
        """Ping after `interval` without a frame read; drop the connection if it stays silent."""
        await until_silent(lambda: writer.write(_PING), lambda: self._read_at, interval)
        self._silent_for = interval
        writer.transport.abort()  # the read under way fails: the stream ends

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._open_connection is not None and not self._cancelled:
            return self._open_connection
        if self._cancelled:
            raise _status(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        try:
            return await asyncio.shield(self._opened)
        except asyncio.CancelledError:
            if self._cancelled:
                raise _status(grpc.StatusCode.CANCELLED, "the stream was cancelled") from None
            raise

    def writable_now(self) -> bool:
        """Whether the connection is open with nothing buffered: `write_now` then sends."""
        connection = self._open_connection
        if connection is None or self._cancelled:
            return False
        transport = connection[1].transport
        return not transport.is_closing() and transport.get_write_buffer_size() == 0

    def write_now(self, message: bytes) -> None:
        """`write` without waiting, for when `writable_now()` (nothing to drain)."""
        assert self._open_connection is not None
        self._open_connection[1].write(_LENGTH.pack(len(message)) + message)

    async def write(self, message: bytes) -> None:
        """Send one serialized ExchangeRequests."""
        _, writer = await self._connection()
        try:
            writer.write(_LENGTH.pack(len(message)) + message)
            await writer.drain()
        except (OSError, RuntimeError) as exc:
            raise self._lost(exc) from None

    async def read(self) -> pb.ExchangeResponses:
        """The next ExchangeResponses; what ended the connection, as a status.

        The first is the broker's greeting (no answers), read while connecting.
        """
        reader, writer = await self._connection()
        if not self._greeting_read:
            self._greeting_read = True
            return pb.ExchangeResponses()
        while True:
            try:
                (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
                if length > GRPC_MAX_MESSAGE_BYTES:
                    raise _status(
                        grpc.StatusCode.INTERNAL,
                        f"the Exchange port at {self.address} sent a frame of {length} bytes, "
                        f"over the limit of {GRPC_MAX_MESSAGE_BYTES}",
                    )
                message = pb.ExchangeResponses.FromString(await reader.readexactly(length))
            except (OSError, asyncio.IncompleteReadError) as exc:
                raise self._lost(exc) from None
            self._read_at = self._loop.time()
            if not (message.ping or message.pong):
                break
            if message.ping:
                writer.write(_PONG)
        if len(message.responses) == 1 and message.responses[0].id == 0:
            error = message.responses[0].error  # the connection's end, and why
            code = getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)
            raise _status(code, error.message or error.code)
        return message

    def _lost(self, exc: BaseException) -> grpc.aio.AioRpcError:
        if self._cancelled:
            return _status(grpc.StatusCode.CANCELLED, "the stream was cancelled")
        why = str(exc) or "the broker closed the connection"
        if self._silent_for is not None:
            why = f"no answer to a keepalive ping within {self._silent_for:g}s"
        self._drop()
        return _status(grpc.StatusCode.UNAVAILABLE, f"Exchange port {self.address}: {why}")

    def _drop(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._writer is not None:
            self._writer.transport.abort()

    def cancel(self) -> bool:
        """End the connection; reads and writes under way fail with CANCELLED."""
        if self._cancelled:
            return False
        self._cancelled = True
        if self._writer is not None:
            self._drop()
        else:
            self._opened.cancel()
        self._opened.add_done_callback(_retrieved)
        return True


async def _connect(
    host: str, port: int, tls: ssl.SSLContext | None, server_name: str | None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to host:port, through the HTTP proxy gRPC would take to it if any."""
    hostname = (server_name or host) if tls is not None else None
    proxy = proxy_for(host)
    if proxy is None:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=hostname
        )
    else:
        reader, writer = await open_tunnel(proxy, host, port)
        if tls is not None:
            try:
                await writer.start_tls(tls, server_hostname=hostname)
            except BaseException:
                writer.transport.abort()
                raise
    read_in_chunks(writer)
    return reader, writer


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        with contextlib.suppress(BaseException):
            future.exception()
