"""A remoting connection that goes silent is closed by the request that times out on it.

The remoting protocol has no ping, and TCP tells a connection gone silent (a cable cut,
a NAT or a firewall that forgot it, a host gone without a reset) only after many
minutes: without this, every request on it timed out, and the next ones too, while the
client kept it. A server here answers on a socket as scripted; `silent` makes it stop
reading and writing, keeping the socket open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from sdk._remoting.codec import encode, read_command
from sdk._remoting.command import RemotingCommand
from sdk._remoting.connection import RemotingConnection
from sdk.errors import BrokerUnavailableError, RequestTimeoutError

ANSWERED = 10
NEVER_ANSWERED = 99


class ScriptedServer:
    """Answers every request but NEVER_ANSWERED ones; once `silent` is set, nothing at all."""

    def __init__(self) -> None:
        self.silent = asyncio.Event()
        self.address = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while not self.silent.is_set():
                read = asyncio.ensure_future(read_command(reader))
                silent = asyncio.ensure_future(self.silent.wait())
                await asyncio.wait({read, silent}, return_when=asyncio.FIRST_COMPLETED)
                silent.cancel()
                if self.silent.is_set():  # the socket stays open, unread and unanswered
                    read.cancel()
                    await asyncio.Event().wait()
                command = read.result()
                if command is None:
                    return
                if command.code != NEVER_ANSWERED:
                    writer.write(encode(command.response()))


@contextlib.asynccontextmanager
async def scripted_server() -> AsyncIterator[ScriptedServer]:
    script = ScriptedServer()
    server = await asyncio.start_server(script.serve, "127.0.0.1", 0)
    script.address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield script
    finally:
        server.close()


def request(code: int) -> RemotingCommand:
    return RemotingCommand(code=code, ext_fields={})


def test_a_request_timing_out_on_a_connection_that_sent_nothing_closes_it() -> None:
    async def main() -> None:
        async with scripted_server() as server:
            connection = await RemotingConnection.open(server.address)
            try:
                assert (await connection.request(request(ANSWERED), 5)).is_response
                server.silent.set()
                with pytest.raises(RequestTimeoutError, match="closed as silent"):
                    await connection.request(request(ANSWERED), 0.3)
                assert connection.closed, "a silent connection is kept"
                with pytest.raises(BrokerUnavailableError, match="nothing came in on it"):
                    await connection.request(request(ANSWERED), 5)  # at once: a new one is due
            finally:
                await connection.close()

    asyncio.run(main())


def test_a_request_timing_out_on_a_connection_that_still_answers_others_keeps_it() -> None:
    async def main() -> None:
        async with scripted_server() as server:
            connection = await RemotingConnection.open(server.address)
            try:
                slow = asyncio.ensure_future(connection.request(request(NEVER_ANSWERED), 0.5))
                await asyncio.sleep(0.1)
                assert (await connection.request(request(ANSWERED), 5)).is_response
                with pytest.raises(RequestTimeoutError) as timed_out:
                    await slow
                assert "silent" not in str(timed_out.value)
                assert not connection.closed, "a connection that answers was closed"
                assert (await connection.request(request(ANSWERED), 5)).is_response
            finally:
                await connection.close()

    asyncio.run(main())
