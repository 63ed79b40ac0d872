"""A fault-injecting TCP proxy for the network fault tests (tests/system/test_network_faults_*.py).

The machine's kernel may lack netem (`tc qdisc ... netem`), and CI may lack iptables, so
the faults are made in user space: a client's connections pass through a FaultProxy, which
forwards the bytes of each direction of each connection while it

- delays them (`LinkFaults.delay`, plus or minus `jitter`, drawn per chunk read);
- limits their rate (`rate`, bytes per second);
- blackholes them (`blackhole`; `partition()` and `heal()`): nothing is read or forwarded,
  and the sockets stay open, as when a network drops every packet. The senders' kernels
  buffer what they write until their windows fill; on heal the proxy forwards everything
  that waited, as TCP's retransmissions would after a partition shorter than its
  retransmission timeout. A connection opened during a partition gets no answer to its
  CONNECT until the heal (a SYN that is dropped);
- silences the connections open now (`silence()`), both ways and for good, while new ones
  pass: a cable cut on one path, a NAT or a middlebox that forgot them, a peer's host
  gone without a reset. Only a keepalive tells such a connection from an idle one;
- resets them (`reset()`): both sockets are closed with an RST, the loss TCP cannot hide.

What a proxy cannot do: reorder or drop packets. TCP delivers a byte stream, so a chunk is
never forwarded before the chunk read before it: jitter shows as varying latency, never
as reordering at the application's level, and loss that TCP repairs is only a delay.
Packet-level reordering and loss need netem; the tests run a variant under netem where
the kernel has it.

Clients reach the proxy as their HTTP CONNECT proxy: gRPC sends every channel of a process
through the proxy named by its `grpc_proxy` environment variable (`proxy_environment()`),
including the channels to the broker addresses that topic routes name. So one proxy per
client process carries all of that client's traffic, and a fault can hit one client only.

A FaultProxy runs on its own event loop in a thread; its methods may be called from any
thread. Inside, `Link` holds one direction's faults and `Pipe` moves one direction of one
connection: both work on any StreamReader and writer, and the unit tests drive them on a
fake clock, without sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import struct
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol

from sdk._loop import LoopThread
from sdk.clock import Clock, SystemClock

Direction = Literal["up", "down", "both"]
_Change = Callable[["LinkFaults"], "LinkFaults"]
#: Bytes read at once from a socket.
CHUNK = 64 * 1024
#: Bytes one pipe holds back (delayed or blackholed) before it stops reading: then the
#: sender's kernel buffers the rest, and its writes stall, as on a slow network.
MAX_HELD = 4 * 1024 * 1024
#: The environment variables that would exempt a host from the proxy.
NO_PROXY_VARIABLES = ("no_grpc_proxy", "no_proxy", "NO_PROXY")


@dataclass(frozen=True)
class LinkFaults:
    """The faults of one direction of a link; every duration is in seconds.

    Attributes:
        delay: Added to every chunk's trip.
        jitter: Each chunk's delay varies by up to this much either way (never below 0).
        rate: Bytes per second forwarded at most (None: no limit).
        blackhole: Forward nothing, read nothing, keep the sockets open.
    """

    delay: float = 0.0
    jitter: float = 0.0
    rate: float | None = None
    blackhole: bool = False

    def __post_init__(self) -> None:
        if self.delay < 0 or self.jitter < 0:
            raise ValueError("delay and jitter must not be negative")
        if self.rate is not None and self.rate <= 0:
            raise ValueError("rate must be positive (or None for no limit)")


class Link:
    """One direction's faults, shared by the pipes of every connection in that direction."""

    def __init__(self, faults: LinkFaults | None = None) -> None:
        self.faults = faults or LinkFaults()
        self._changed = asyncio.Event()

    def set(self, faults: LinkFaults) -> None:
        """Change the faults; pipes waiting on a blackhole see the change at once."""
        self.faults = faults
        self._changed.set()
        self._changed = asyncio.Event()

    async def open(self) -> None:
        """Return once the link is not blackholed."""
        while self.faults.blackhole:
            await self._changed.wait()


class Sink(Protocol):
    """Where a pipe writes (an asyncio.StreamWriter, or a fake in the unit tests)."""

    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def can_write_eof(self) -> bool: ...

    def write_eof(self) -> None: ...


@dataclass
class PipeStats:
    """What one pipe forwarded."""

    chunks: int = 0
    bytes: int = 0


class Pipe:
    """One direction of one connection: read chunks, forward each when its time has come.

    A chunk read at t is due at t + delay +- jitter (and, with a rate, once the chunks
    before it went through the bottleneck), and never before the chunk before it. The
    end of the stream is forwarded as a half-close once everything before it went.
    """

    def __init__(
        self, source: asyncio.StreamReader, sink: Sink, link: Link, clock: Clock, rng: random.Random
    ) -> None:
        self._source = source
        self._sink = sink
        self._link = link
        self._clock = clock
        self._rng = rng
        self._held: deque[tuple[float, bytes]] = deque()  # (due, chunk); b"" is the end
        self._held_bytes = 0
        self._moved = asyncio.Event()  # a chunk was held or forwarded
        self.stats = PipeStats()

    @property
    def held(self) -> int:
        """Bytes read and not forwarded yet (delayed, or waiting for a heal)."""
        return self._held_bytes

    async def run(self) -> None:
        """Forward until the source's end was forwarded; raises what the sockets raise."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._read())
            tasks.create_task(self._forward())

    async def _read(self) -> None:
        last_due = free_at = 0.0  # the previous chunk's due time; when the bottleneck frees
        while True:
            await self._link.open()
            while self._held_bytes >= MAX_HELD:
                await self._wait_moved()
            data = await self._source.read(CHUNK)
            f = self._link.faults
            now = self._clock.now()
            sent = now
            if f.rate is not None:
                sent = free_at = max(now, free_at) + len(data) / f.rate
            trip = max(0.0, f.delay + self._rng.uniform(-f.jitter, f.jitter))
            last_due = max(last_due, sent + trip)
            self._held.append((last_due, data))
            self._held_bytes += len(data)
            self._signal()
            if not data:
                return

    async def _forward(self) -> None:
        while True:
            while not self._held:
                await self._wait_moved()
            due, data = self._held[0]
            await self._clock.sleep_until(due)
            await self._link.open()
            self._held.popleft()
            self._held_bytes -= len(data)
            self._signal()
            if not data:
                if self._sink.can_write_eof():
                    self._sink.write_eof()
                return
            self._sink.write(data)
            await self._sink.drain()
            self.stats.chunks += 1
            self.stats.bytes += len(data)

    async def _wait_moved(self) -> None:
        await self._moved.wait()

    def silence(self) -> None:
        """Forward nothing more and read no more, for good, whatever the link's faults."""
        self._link = Link(LinkFaults(blackhole=True))

    def _signal(self) -> None:
        self._moved.set()
        self._moved = asyncio.Event()


@dataclass
class ProxyStats:
    """What a proxy carried so far."""

    connections: int = 0  # CONNECT requests answered
    open: int = 0  # connections open now
    resets: int = 0  # connections reset on purpose
    bytes_up: int = 0  # client to server
    bytes_down: int = 0  # server to client
    held: int = 0  # read and not forwarded yet (delayed, or waiting for a heal)
    targets: set[str] = field(default_factory=set)  # where the connections went


@dataclass(eq=False)
class _Connection:
    task: asyncio.Task[None]  # the one serving it
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    up: Pipe | None = None
    down: Pipe | None = None

    def held(self) -> int:
        """Bytes read and not forwarded yet, both ways."""
        return sum(p.held for p in (self.up, self.down) if p is not None)

    def forwarded(self) -> tuple[int, int]:
        """Bytes forwarded (up, down)."""
        return (
            self.up.stats.bytes if self.up is not None else 0,
            self.down.stats.bytes if self.down is not None else 0,
        )

    def silence(self) -> None:
        """Forward nothing more either way, keeping both sockets open."""
        for pipe in (self.up, self.down):
            if pipe is not None:
                pipe.silence()

    def reset(self) -> None:
        """Close both sockets with an RST (SO_LINGER 0), as a reset network does."""
        for w in (self.client, self.server):
            if w is None or w.transport.is_closing():
                continue
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()


class FaultProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 that injects faults into what it forwards.

    `with FaultProxy() as proxy:` starts it (on a free port) and stops it; start a client
    with `proxy_environment(proxy)`, then `set()`, `partition()`, `heal()` and `reset()`
    its links at any moment.
    """

    def __init__(self, *, seed: int = 0, name: str = "fault-proxy") -> None:
        self.name = name
        self._rng = random.Random(seed)
        self._loop = LoopThread(name)
        self._up = Link()
        self._down = Link()
        self._server: asyncio.Server | None = None
        self._connections: dict[_Connection, None] = {}  # in the order they came
        self._stats = ProxyStats()
        self.address = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Listen on a free port of 127.0.0.1; the address "127.0.0.1:PORT"."""
        self._loop.run(self._listen())
        return self.address

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.address = f"127.0.0.1:{port}"

    def stop(self) -> None:
        """Stop listening, reset every connection, stop the thread."""
        self._loop.run(self._close())
        self._loop.stop()

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._connections):
            conn.reset()
            conn.task.cancel()

    def __enter__(self) -> FaultProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        """The proxy as gRPC's `grpc_proxy` variable names it."""
        return f"http://{self.address}"

    # ------------------------------------------------------------------ faults
    def set(self, faults: LinkFaults, direction: Direction = "both") -> None:
        """Give `direction` ("up": client to server, "down", or "both") these faults."""
        self._loop.run(self._set(direction, lambda _old: faults))

    def partition(self, direction: Direction = "both") -> None:
        """Blackhole `direction` (keeping its other faults) until heal()."""
        self._loop.run(self._set(direction, lambda old: replace(old, blackhole=True)))

    def heal(self) -> None:
        """End the blackhole both ways: what waited is forwarded."""
        self._loop.run(self._set("both", lambda old: replace(old, blackhole=False)))

    def clear(self) -> None:
        """No faults any more, either way."""
        self.set(LinkFaults())

    async def _set(self, direction: Direction, change: _Change) -> None:
        for link in self._links(direction):
            link.set(change(link.faults))

    def _links(self, direction: Direction) -> Iterator[Link]:
        if direction in ("up", "both"):
            yield self._up
        if direction in ("down", "both"):
            yield self._down

    def silence(self) -> int:
        """Blackhole the connections open now, both ways and for good; how many.

        Their sockets stay open; connections made later pass as the links' faults say.
        """
        return self._loop.run(self._silence())

    async def _silence(self) -> int:
        conns = list(self._connections)
        for conn in conns:
            conn.silence()
        return len(conns)

    def reset(self, count: int | None = None, *, busy: bool = False) -> int:
        """Reset `count` connections picked at random (None: all); how many were reset.

        With `busy`, only connections with bytes on their way (so a request or an answer
        is cut off, not an idle connection) are picked.
        """
        return self._loop.run(self._reset(count, busy))

    async def _reset(self, count: int | None, busy: bool) -> int:
        conns = [c for c in self._connections if c.held() or not busy]
        if count is not None:
            conns = self._rng.sample(conns, min(count, len(conns)))
        for conn in conns:
            conn.reset()
            conn.task.cancel()  # even one waiting for a heal ends now
        self._stats.resets += len(conns)
        return len(conns)

    def stats(self) -> ProxyStats:
        """A copy of what the proxy carried so far."""
        return self._loop.run(self._snapshot())

    async def _snapshot(self) -> ProxyStats:
        s = self._stats
        live = [c.forwarded() for c in self._connections]
        return replace(
            s,
            open=len(self._connections),
            bytes_up=s.bytes_up + sum(up for up, _ in live),
            bytes_down=s.bytes_down + sum(down for _, down in live),
            held=sum(c.held() for c in self._connections),
            targets=set(s.targets),
        )

    # ------------------------------------------------------------------ connections
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        conn = _Connection(task, writer)
        self._connections[conn] = None
        try:
            await self._tunnel(conn, reader)
        except asyncio.CancelledError:
            pass  # reset on purpose, or the proxy stops: the sockets are closed below
        finally:
            self._connections.pop(conn, None)
            up, down = conn.forwarded()
            self._stats.bytes_up += up
            self._stats.bytes_down += down
            for w in (writer, conn.server):
                if w is not None:
                    w.close()

    async def _tunnel(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        """Answer the CONNECT, then forward both ways until both ends are closed."""
        writer = conn.client
        await self._up.open()  # during a partition, a CONNECT is not even read
        try:
            target = await _read_connect(reader, writer)
            if target is None:
                return
            host, port = target.rsplit(":", 1)
            try:
                server_reader, conn.server = await asyncio.open_connection(host, int(port))
            except OSError as exc:
                writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{exc}\n".encode())
                return
            await self._down.open()
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self._stats.connections += 1
            self._stats.targets.add(target)
            clock = SystemClock()
            conn.up = Pipe(reader, conn.server, self._up, clock, self._rng)
            conn.down = Pipe(server_reader, writer, self._down, clock, self._rng)
            async with asyncio.TaskGroup() as pipes:
                pipes.create_task(conn.up.run())
                pipes.create_task(conn.down.run())
        except* (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            conn.reset()  # one side failed (or was reset): the other side is reset too


async def _read_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
    """The target of an HTTP CONNECT request ("host:port"); None (answered 400) otherwise."""
    head = await reader.readuntil(b"\r\n\r\n")
    parts = head.split(b"\r\n", 1)[0].split()
    if len(parts) == 3 and parts[0] == b"CONNECT" and b":" in parts[1]:
        return parts[1].decode()
    writer.write(b"HTTP/1.1 400 Bad Request\r\n\r\nonly CONNECT host:port is served\n")
    return None


def proxy_environment(proxy: FaultProxy, base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with gRPC sent through `proxy`."""
    env = {k: v for k, v in (os.environ if base is None else base).items()}
    for name in NO_PROXY_VARIABLES:
        env.pop(name, None)
    env["grpc_proxy"] = proxy.url
    return env
