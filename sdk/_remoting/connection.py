"""One client connection speaking RocketMQ remoting: requests matched to responses by opaque.

What the server sends on its own (NOTIFY_CONSUMER_IDS_CHANGED) goes to `on_request`.
Every failure is an OrderMQError: BrokerUnavailableError when the server cannot be
reached or the connection ends (requests in flight fail with it), RequestTimeoutError
when an answer does not come in time, BrokerError (code MALFORMED_RESPONSE) when the
server sends bytes that are no remoting frame (the connection is closed: nothing after
them can be trusted). No call waits without a bound.

A request that times out while nothing at all came in on its connection closes the
connection: it may have gone silent (a cable cut, a NAT or a firewall that forgot it, a
host gone without a reset), which TCP tells only after many minutes, and the remoting
protocol has no ping. The next request opens a new one. RocketMQ's own client closes a
channel on any timeout; a connection that still carries other answers is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import ssl
from collections.abc import Callable

from sdk._remoting.codec import FrameError, encode, read_command
from sdk._remoting.command import FLAG_ONEWAY, RemotingCommand
from sdk._wire import read_in_chunks
from sdk.errors import BrokerError, BrokerUnavailableError, RequestTimeoutError, TLSError
from sdk.tls import TLSConfig, tls_hint

log = logging.getLogger("ordermq.remoting")

#: How long opening a connection may take.
CONNECT_SECONDS = 5.0


class RemotingConnection:
    """A connection to one remoting server ("host:port"); use it on one event loop."""

    def __init__(
        self,
        address: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_request: Callable[[RemotingCommand], None] | None = None,
        tls: TLSConfig | None = None,
    ) -> None:
        self.address = address
        self._tls = tls
        self._reader, self._writer = reader, writer
        self._on_request = on_request
        self._opaques = itertools.count(1)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self._failure: Exception | None = None
        self._frames_read = 0  # what came in so far: a timed-out request asks if anything did
        self._write_lock = asyncio.Lock()
        self._reading = asyncio.create_task(self._read(), name=f"remoting-read-{address}")

    @classmethod
    async def open(
        cls,
        address: str,
        on_request: Callable[[RemotingCommand], None] | None = None,
        *,
        timeout: float = CONNECT_SECONDS,
        tls: TLSConfig | None = None,
        tls_context: ssl.SSLContext | None = None,
    ) -> RemotingConnection:
        """Connect to `address`, over TLS with `tls` (and its `tls_context`, if made).

        BrokerUnavailableError when it cannot be reached in time, TLSError when the TLS
        handshake fails.
        """
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if tls is not None and tls_context is None:
            tls_context = tls.ssl_context()
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, int(port), ssl=tls_context,
                    server_hostname=(tls.server_name or host) if tls is not None else None,
                )  # fmt: skip
            read_in_chunks(writer)
        except ssl.SSLError as exc:
            assert tls is not None
            raise TLSError(
                f"TLS connection to {address} failed: {tls_hint(str(exc), tls)}"
            ) from None
        except (OSError, TimeoutError, ValueError) as exc:
            raise BrokerUnavailableError(
                f"cannot connect to {address} over RocketMQ remoting: "
                f"{str(exc) or type(exc).__name__}"
            ) from None
        return cls(address, reader, writer, on_request, tls)

    @property
    def closed(self) -> bool:
        """True once the connection ended (by either side, or for a bad frame)."""
        return self._failure is not None

    async def request(self, command: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send `command` and return its response, within `timeout` seconds."""
        self._raise_if_closed()
        command.opaque = next(self._opaques)
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[command.opaque] = future
        frames_read = self._frames_read
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancellation
            # that arrives as the answer does, and the cancelled caller would run on.
            async with asyncio.timeout(timeout):
                await self._write(encode(command))
                return await future
        except TimeoutError:
            message = (
                f"{self.address} did not answer request code {command.code} within {timeout:g} s"
            )
            if self._frames_read == frames_read and self._failure is None:
                message += " and sent nothing else meanwhile: the connection is closed as silent"
                self._close_silent(timeout)
            raise RequestTimeoutError(message) from None
        finally:
            self._pending.pop(command.opaque, None)

    def _close_silent(self, timeout: float) -> None:
        """Close a connection that sent nothing for `timeout`; requests in flight fail."""
        log.warning("remoting %s: nothing came in for %g s; closing the connection",
                    self.address, timeout)  # fmt: skip
        self._fail(
            BrokerUnavailableError(
                f"the connection to {self.address} was closed: nothing came in on it for "
                f"{timeout:g} s"
            )
        )
        self._reading.cancel()
        self._writer.close()

    async def oneway(self, command: RemotingCommand) -> None:
        """Send `command` expecting no answer."""
        self._raise_if_closed()
        command.opaque = next(self._opaques)
        command.flag |= FLAG_ONEWAY
        await self._write(encode(command))

    async def close(self) -> None:
        """Close; requests in flight fail with BrokerUnavailableError."""
        self._fail(BrokerUnavailableError(f"the connection to {self.address} was closed"))
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    async def _write(self, data: bytes) -> None:
        try:
            async with self._write_lock:
                self._writer.write(data)
                await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            self._fail(BrokerUnavailableError(f"the connection to {self.address} failed: {exc}"))
            self._raise_if_closed()

    def _raise_if_closed(self) -> None:
        if self._failure is not None:
            raise _copy(self._failure)

    def _fail(self, failure: Exception) -> None:
        if self._failure is None:
            self._failure = failure
        for future in self._pending.values():
            if not future.done():
                future.set_exception(_copy(failure))
        self._pending.clear()

    async def _read(self) -> None:
        failure: Exception = BrokerUnavailableError(f"{self.address} closed the connection")
        try:
            while (command := await read_command(self._reader)) is not None:
                self._frames_read += 1
                if command.is_response:
                    future = self._pending.get(command.opaque)
                    if future is not None and not future.done():
                        future.set_result(command)
                elif self._on_request is not None:
                    self._on_request(command)
        except FrameError as exc:
            failure = BrokerError(
                f"{self.address} sent a malformed frame: {exc}", code="MALFORMED_RESPONSE"
            )
            log.warning("remoting %s: %s", self.address, exc)
        except ssl.SSLError as exc:  # a TLS 1.3 broker refuses a client certificate so
            failure = TLSError(
                f"TLS connection to {self.address} failed: "
                f"{tls_hint(str(exc), self._tls or TLSConfig())}"
            )
        except (ConnectionError, OSError) as exc:
            failure = BrokerUnavailableError(f"the connection to {self.address} failed: {exc}")
        finally:
            self._fail(failure)
            self._writer.close()


def _copy(failure: Exception) -> Exception:
    """A fresh exception like `failure` (one instance raised in many places gathers tracebacks)."""
    if isinstance(failure, BrokerError):
        return type(failure)(failure.message, code=failure.code)
    return type(failure)(str(failure))
