"""A small asyncio RocketMQ remoting client for tests: requests matched by opaque."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from sdk._remoting.codec import FrameError, encode, read_command
from sdk._remoting.command import FLAG_ONEWAY, RemotingCommand


class RemotingClient:
    """One connection; `requests` collects what the server sends on its own (oneway)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._opaques = itertools.count(1)
        self._pending: dict[int, asyncio.Future[RemotingCommand]] = {}
        self.requests: asyncio.Queue[RemotingCommand] = asyncio.Queue()
        self.closed = asyncio.Event()
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, address: str) -> RemotingClient:
        """Connect to "host:port"."""
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer)

    async def request(self, command: RemotingCommand, timeout: float = 30.0) -> RemotingCommand:
        """Send `command` as a request and return its response."""
        if self.closed.is_set():
            raise ConnectionError("the connection is closed")
        command.opaque = next(self._opaques)
        future: asyncio.Future[RemotingCommand] = asyncio.get_running_loop().create_future()
        self._pending[command.opaque] = future
        self._writer.write(encode(command))
        await self._writer.drain()
        return await asyncio.wait_for(future, timeout)

    async def oneway(self, command: RemotingCommand) -> None:
        """Send `command` as a oneway request."""
        command.opaque = next(self._opaques)
        command.flag |= FLAG_ONEWAY
        self._writer.write(encode(command))
        await self._writer.drain()

    async def send_raw(self, data: bytes) -> None:
        """Write bytes as they are (bad input)."""
        self._writer.write(data)
        await self._writer.drain()

    async def close(self) -> None:
        """Close the connection."""
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    async def _read(self) -> None:
        try:
            while (command := await read_command(self._reader)) is not None:
                if command.is_response:
                    future = self._pending.pop(command.opaque, None)
                    if future is not None and not future.done():
                        future.set_result(command)
                else:
                    self.requests.put_nowait(command)
        except (FrameError, ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for future in self._pending.values():  # nothing will answer them now
                if not future.done():
                    future.set_exception(ConnectionError("the connection closed"))
            self._pending.clear()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError("the server closed the connection"))
