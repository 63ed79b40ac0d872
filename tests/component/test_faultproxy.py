"""The fault proxy (tests/faultproxy.py) on real sockets: CONNECT, partitions, resets, gRPC.

An echo server stands behind the proxy; the pipe's timing rules are unit-tested in
tests/unit/test_faultproxy.py.
"""

from __future__ import annotations

import contextlib
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import EmbeddedBroker
from sdk import Message, Producer
from tests.faultproxy import FaultProxy, LinkFaults, proxy_environment
from tests.support import ROOT, wait_until


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        with contextlib.suppress(ConnectionResetError):  # the reset test's
            while data := self.request.recv(65536):
                self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[str]:
    """An echo server's address."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    with FaultProxy(seed=3) as p:
        yield p


def connect(proxy: FaultProxy, target: str) -> socket.socket:
    """A socket tunnelled to `target` through the proxy (the CONNECT answered)."""
    host, port = proxy.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert read_until(sock, b"\r\n\r\n").startswith(b"HTTP/1.1 200 ")
    return sock


def read_until(sock: socket.socket, end: bytes) -> bytes:
    data = b""
    while not data.endswith(end):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data!r}"
        data += chunk
    return data


def test_it_tunnels_bytes_both_ways_and_counts_them(proxy: FaultProxy, echo: str) -> None:
    with connect(proxy, echo) as sock:
        sock.sendall(b"hello\n")
        assert read_until(sock, b"\n") == b"hello\n"
        stats = proxy.stats()
        assert (stats.connections, stats.open, stats.targets) == (1, 1, {echo})
        assert (stats.bytes_up, stats.bytes_down) == (6, 6)


def test_anything_but_connect_is_refused(proxy: FaultProxy) -> None:
    host, port = proxy.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 400 ")


def test_a_partition_holds_the_bytes_until_it_heals(proxy: FaultProxy, echo: str) -> None:
    with connect(proxy, echo) as sock:
        sock.sendall(b"ping\n")  # once answered, both pipes wait in a read
        read_until(sock, b"\n")
        proxy.partition()
        sock.sendall(b"during the partition\n")
        wait_until(lambda: proxy.stats().held == 21, 10, "the proxy to hold the bytes")
        assert proxy.stats().bytes_up == 5
        proxy.heal()
        assert read_until(sock, b"\n") == b"during the partition\n"


def test_a_connection_opened_during_a_partition_is_answered_after_the_heal(
    proxy: FaultProxy, echo: str
) -> None:
    proxy.partition("up")
    result: list[socket.socket] = []
    opener = threading.Thread(target=lambda: result.append(connect(proxy, echo)))
    opener.start()
    wait_until(lambda: proxy.stats().open == 1, 10, "the connection to reach the proxy")
    assert proxy.stats().connections == 0, "a CONNECT was answered during the partition"
    proxy.heal()
    opener.join(10)
    with result[0] as sock:
        sock.sendall(b"x\n")
        assert read_until(sock, b"\n") == b"x\n"


def test_a_one_way_partition_lets_requests_through_and_holds_the_answers(
    proxy: FaultProxy, echo: str
) -> None:
    with connect(proxy, echo) as sock:
        proxy.partition("down")
        sock.sendall(b"request\n")
        wait_until(lambda: proxy.stats().bytes_up == 8, 10, "the request to go through")
        assert proxy.stats().bytes_down == 0
        proxy.heal()
        assert read_until(sock, b"\n") == b"request\n"


def test_silence_blackholes_the_open_connections_for_good_and_lets_new_ones_pass(
    proxy: FaultProxy, echo: str
) -> None:
    with connect(proxy, echo) as old:
        old.sendall(b"before\n")
        read_until(old, b"\n")
        assert proxy.silence() == 1
        old.sendall(b"after\n")
        wait_until(lambda: proxy.stats().held == 6, 10, "the proxy to hold the bytes")
        with connect(proxy, echo) as new:
            new.sendall(b"new\n")
            assert read_until(new, b"\n") == b"new\n"
        proxy.heal()  # a heal of the links does not reach a silenced connection
        old.settimeout(0.3)
        with pytest.raises(TimeoutError):
            old.recv(1024)
        assert proxy.stats().bytes_up == 7 + 4


def test_a_reset_closes_both_sides_with_an_rst(proxy: FaultProxy, echo: str) -> None:
    with connect(proxy, echo) as sock:
        assert proxy.reset() == 1
        with pytest.raises(ConnectionResetError):
            sock.recv(1024)
        wait_until(lambda: proxy.stats().open == 0, 10, "the proxy to forget the connection")
        assert proxy.stats().resets == 1


def test_a_busy_reset_picks_a_connection_that_carries_something(
    proxy: FaultProxy, echo: str
) -> None:
    with connect(proxy, echo) as idle, connect(proxy, echo) as busy:
        assert proxy.reset(busy=True) == 0, "an idle connection was reset"
        busy.sendall(b"ping\n")  # once answered, both its pipes wait in a read
        read_until(busy, b"\n")
        proxy.partition()
        busy.sendall(b"held\n")
        wait_until(lambda: proxy.stats().held == 5, 10, "the proxy to hold the bytes")
        assert proxy.reset(busy=True) == 1
        with pytest.raises(ConnectionResetError):
            busy.recv(1024)
        proxy.heal()
        idle.sendall(b"still here\n")
        assert read_until(idle, b"\n") == b"still here\n"


def test_a_slow_link_still_delivers_everything_in_order(proxy: FaultProxy, echo: str) -> None:
    proxy.set(LinkFaults(delay=0.005, jitter=0.005, rate=2_000_000))
    payload = bytes(range(256)) * 4000 + b"\n"  # 1 MB: many chunks, all delayed
    with connect(proxy, echo) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()
        assert read_until(sock, b"\n") == payload
        sender.join()


def test_grpc_clients_of_a_process_go_through_the_proxy_named_by_grpc_proxy(
    proxy: FaultProxy, broker: EmbeddedBroker, tmp_path: Path
) -> None:
    # In another process: the variable is read when a channel is made.
    script = tmp_path / "send.py"
    script.write_text(
        "import sys\n"
        "from sdk import Message, Producer\n"
        "with Producer(sys.argv[1]) as p:\n"
        "    print(p.send(Message('via-proxy', b'x')).queue_offset)\n"
    )
    done = subprocess.run(
        [sys.executable, str(script), broker.address],
        env={**proxy_environment(proxy), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
    stats = proxy.stats()
    # The Exchange port's connection takes the same proxy, if it was made before the end.
    assert broker.address in stats.targets <= {broker.address, broker.exchange_address}
    assert stats.bytes_up > 0 and stats.bytes_down > 0
    # And a client of this process, without the variable, does not.
    before = proxy.stats().connections
    with Producer(broker.address) as producer:
        producer.send(Message("direct", b"x"))
    assert proxy.stats().connections == before
