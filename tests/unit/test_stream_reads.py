"""Stream connections read at most STREAM_READ_BYTES from their socket a call.

asyncio's 256 KiB reads map and unmap their buffer on every read in a process whose
allocator never raised its mapping threshold (sdk/_wire.py, STREAM_READ_BYTES): the
Exchange port's and the remoting clients' connections, and the broker's stream ports,
read less at a time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from mockbroker.tls import listen
from sdk._remoting.connection import RemotingConnection
from sdk._transport.exchange_port import _connect
from sdk._wire import STREAM_READ_BYTES

#: Written at once by the peer: enough for reads of 256 KiB where nothing caps them.
PAYLOAD = b"x" * (1 << 20)


def recording_reads(reader: asyncio.StreamReader) -> list[int]:
    """The size of each chunk `reader` is fed from here on (one socket read each)."""
    sizes: list[int] = []
    feed = reader.feed_data

    def fed(data: bytes) -> None:
        sizes.append(len(data))
        feed(data)

    reader.feed_data = fed  # type: ignore[method-assign]
    return sizes


async def serving(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, int(server.sockets[0].getsockname()[1])


async def payload_on_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Write PAYLOAD once the peer asks (by a byte): it then reads with its sizes recorded."""
    await reader.readexactly(1)
    writer.write(PAYLOAD)
    await writer.drain()
    await reader.read()  # until the peer closes
    writer.close()


def test_the_exchange_port_clients_connection_reads_in_chunks() -> None:
    async def main() -> list[int]:
        server, port = await serving(payload_on_request)
        async with server:
            reader, writer = await _connect("127.0.0.1", port, None, None)
            sizes = recording_reads(reader)
            writer.write(b"?")
            assert await reader.readexactly(len(PAYLOAD)) == PAYLOAD
            writer.close()
            return sizes

    sizes = asyncio.run(main())
    assert sum(sizes) == len(PAYLOAD) and max(sizes) <= STREAM_READ_BYTES


def test_the_brokers_stream_ports_read_in_chunks() -> None:
    async def main() -> list[int]:
        recorded: list[list[int]] = []
        received = asyncio.get_running_loop().create_future()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            recorded.append(recording_reads(reader))
            writer.write(b"!")
            received.set_result(await reader.readexactly(len(PAYLOAD)))
            writer.close()

        server, port = await listen(accept, "127.0.0.1", 0, None)
        async with server:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            await reader.readexactly(1)  # the broker's side records its reads now
            writer.write(PAYLOAD)
            assert await received == PAYLOAD
            writer.close()
        return recorded[0]

    sizes = asyncio.run(main())
    assert sum(sizes) == len(PAYLOAD) and max(sizes) <= STREAM_READ_BYTES


def test_the_remoting_clients_connection_reads_in_chunks() -> None:
    async def main() -> object:
        async def idle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()
            writer.close()

        server, port = await serving(idle)
        async with server:
            connection = await RemotingConnection.open(f"127.0.0.1:{port}")
            try:
                # Its reads are those of a command reader started at once: the size
                # they take is the transport's.
                return connection._writer.transport.max_size  # type: ignore[attr-defined]
            finally:
                await connection.close()

    assert asyncio.run(main()) == STREAM_READ_BYTES
