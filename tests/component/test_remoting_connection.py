"""A remoting connection that goes silent is closed by the request that times out on it.

The remoting protocol has no ping, and TCP tells a connection gone silent (a cable cut,
a NAT or a firewall that forgot it, a host gone without a reset) only after many
minutes: without this, every request on it timed out, and the next ones too, while the
client kept it. A server here answers on a socket as scripted; `silent` makes it stop
reading and writing, keeping the socket open. The last test goes through the transport: a
producer reaching the broker through a forwarder that silences its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, ProducerConfig
from sdk._remoting.codec import encode, read_command
from sdk._remoting.command import RemotingCommand
from sdk._remoting.connection import RemotingConnection
from sdk.aio import Producer
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


class Forwarder:
    """Forwards 127.0.0.2:`port` to 127.0.0.1:`port`, as a NAT or a load balancer would.

    A broker advertising host 127.0.0.2 is reached through it with its own port number.
    `silence()` stops forwarding on the connections open now, both ways, keeping their
    sockets open (the NAT that forgot them); connections made later pass.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.accepted = 0
        self._silenced: list[asyncio.Event] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.2", self.port)

    def silence(self) -> None:
        for silenced in self._silenced:
            silenced.set()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        silenced = asyncio.Event()
        self._silenced.append(silenced)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError):
                while data := await source.read(65536):
                    if silenced.is_set():
                        await asyncio.Event().wait()  # held, never forwarded
                    sink.write(data)
                    await sink.drain()
            sink.close()

        pipes = [asyncio.ensure_future(pipe(reader, up_writer)),
                 asyncio.ensure_future(pipe(up_reader, writer))]  # fmt: skip
        self._tasks.update(pipes)
        await asyncio.gather(*pipes, return_exceptions=True)


def test_a_producer_over_rocketmq_sends_on_a_new_connection_once_its_old_one_went_silent(
    tmp_path: Path,
) -> None:
    """The transport opens a new connection for the next attempt once a request closed a
    silent one: the send succeeds on its retry (without: every attempt times out on the
    connection kept)."""
    config = BrokerConfig(
        data_dir=tmp_path, host="127.0.0.1", advertised_host="127.0.0.2",
        remoting_port=0, namesrv_port=0, default_queues=1,
    )  # fmt: skip
    broker = EmbeddedBroker(config)
    broker.start()

    async def main() -> None:
        assert broker.remoting_address is not None and broker.namesrv_address is not None
        namesrv_port = broker.namesrv_address.rsplit(":", 1)[1]  # reached directly
        forwarder = Forwarder(int(broker.remoting_address.rsplit(":", 1)[1]))
        await forwarder.start()
        producer = Producer(
            f"rocketmq://127.0.0.1:{namesrv_port}",
            config=ProducerConfig(send_timeout=1.0, retry_times=2, accumulator=None),
        )
        try:
            await producer.start()
            first = await producer.send(Message("t", b"before", sharding_key="k"))
            assert forwarder.accepted == 1
            forwarder.silence()
            second = await producer.send(Message("t", b"after", sharding_key="k"))
            assert forwarder.accepted == 2, "the retry did not connect again"
            # Stored once, right after the first: the silenced attempt never arrived.
            assert second.queue_offset == first.queue_offset + 1
        finally:
            await producer.shutdown()
            await forwarder.stop()

    try:
        asyncio.run(main())
    finally:
        broker.stop()
