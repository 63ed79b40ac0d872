"""Helpers the tests import: broker processes and waiting for conditions."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import random
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from mockbroker import BrokerConfig, EmbeddedBroker

ROOT = Path(__file__).resolve().parent.parent


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "") -> None:
    """Poll `condition` until it holds; fail the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(0.01)


def written_lines(path: Path) -> list[str]:
    """The lines another process has written to `path` so far, whole ones only.

    A reader can catch a writer's write() half done: a last line without its newline is
    still being written, and is read with the next look. No file: no lines.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return text[: text.rfind("\n") + 1].splitlines()


class LineReader:
    """Lines a child process prints, read from its stdout's descriptor with a timeout.

    Reads the descriptor itself: a file object's readline may buffer the lines after the
    one asked for, and select() then never reports them.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = b""
        self._passed: list[str] = []

    def readline(self, timeout: float) -> str:
        """The next line ("" if none came within `timeout` seconds or the stream ended)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._fd], [], [], max(left, 0.0))
            chunk = os.read(self._fd, 65536) if ready else b""
            if not chunk:
                return ""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode() + "\n"

    def find(self, prefix: str, timeout: float) -> str:
        """The first line starting with `prefix`, among those `find` passed over before and
        those still to come ("" if none came within `timeout` seconds)."""
        deadline = time.monotonic() + timeout
        while not (found := [line for line in self._passed if line.startswith(prefix)]):
            line = self.readline(deadline - time.monotonic())
            if not line:
                return ""
            self._passed.append(line)
        return found[0]


def _given(args: tuple[str, ...] | list[str], option: str) -> bool:
    """Whether `args` turn a front's `option` on (a port, not 'off')."""
    return option in args and args[args.index(option) + 1] != "off"


class BrokerProcess:
    """`python -m mockbroker` in a child process, started and waited for by its ready line."""

    #: The options of the fronts besides gRPC: the front's name, the line the broker
    #: prints for it after its ready line.
    FRONTS: ClassVar[dict[str, tuple[str, str]]] = {
        "--v2-port": ("v2", "mockbroker serving RocketMQ 5 clients on "),
        "--remoting-port": ("remoting", "mockbroker serving RocketMQ remoting on "),
        "--namesrv-port": ("namesrv", "mockbroker serving a RocketMQ name server on "),
        "--metrics-port": ("metrics", "mockbroker serving metrics and health checks on "),
        "--console-port": ("console", "mockbroker serving the console on "),
        "--exchange-port": ("exchange", "mockbroker serving the Exchange port on "),
    }

    def __init__(self, data_dir: Path, *extra_args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        if "--exchange-port" not in extra_args:  # on by default: chosen, announced, pinned
            extra_args = (*extra_args, "--exchange-port", "0")
        self.extra_args = extra_args
        #: Variables added to this process's environment at every start.
        self.env = dict(env or {})
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        #: The address of each front in FRONTS that is on ("remoting", "namesrv", "v2",
        #: "metrics").
        self.fronts: dict[str, str] = {}
        # stderr goes to a file: a pipe nobody reads would block a chatty broker.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (lives as long as the process)

    def start(self, timeout: float = 30.0, port: int | None = 0) -> str:
        """Start the broker on `port` (0: a free one; None: the command's default port).

        Returns its address once it prints its ready line. A port given as 0 (this one or
        a front's in `extra_args`) is a free port below the kernel's ephemeral range
        (`stable_ports`), and `restart` serves on the same ports again.
        """
        zeros = [option for option in self.FRONTS if self._option(option) == "0"]
        if port != 0 and not zeros:
            return self._launch(timeout, port)
        attempts = _PORT_ATTEMPTS
        while True:
            ports = stable_ports(1 + len(zeros))
            args = list(self.extra_args)
            for option, chosen in zip(zeros, ports[1:], strict=True):
                args[args.index(option) + 1] = str(chosen)
            try:
                return self._launch(timeout, ports[0] if port == 0 else port, tuple(args))
            except PortTaken:
                # Another process bound a chosen port between its choice and our bind.
                attempts -= 1
                if not attempts:
                    raise

    def _option(self, option: str) -> str | None:
        """The value `extra_args` gives `option`, or None."""
        args = self.extra_args
        return args[args.index(option) + 1] if option in args else None

    def _launch(self, timeout: float, port: int | None, args: tuple[str, ...] | None = None) -> str:
        """Start the broker process with `args` (default: `extra_args`) and wait for it.

        On success `args` become `extra_args`, with each front's announced port pinned.
        Raises PortTaken if it exited because a port was taken.
        """
        args = self.extra_args if args is None else args
        cmd = [
            sys.executable, "-m", "mockbroker",
            "--host", "127.0.0.1", *(["--port", str(port)] if port is not None else []),
            "--data-dir", str(self.data_dir),
            "--log-level", "WARNING",
            *args,
        ]  # fmt: skip
        self._stderr.seek(0, os.SEEK_END)
        written_before = self._stderr.tell()
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )  # fmt: skip
        _LAUNCHED.add(self)
        assert self.proc.stdout is not None
        lines = LineReader(self.proc.stdout.fileno())
        line = lines.readline(timeout)
        if not line.startswith("mockbroker listening on "):
            self.proc.kill()
            self.proc.wait()
            said = self.stderr()[written_before:]
            error = PortTaken if "Address already in use" in said else AssertionError
            raise error(f"broker did not start within {timeout}s: {line!r}\n{said}")
        self.address = line.split()[-1]
        self.extra_args = args
        self.fronts = {}
        for option, (front, prefix) in self.FRONTS.items():
            if _given(args, option):
                announced = lines.find(prefix, timeout)
                assert announced, f"no {front} address announced: {self.stderr()[-2000:]}"
                self.fronts[front] = announced.split()[-1]
        self._pin_fronts()
        return self.address

    def _pin_fronts(self) -> None:
        """Later starts serve each front on the port it has now.

        So a front can be given port 0: the broker picks a free port and announces it, where
        a port chosen beforehand may be taken by another process before the broker binds it.
        """
        args = list(self.extra_args)
        for option, (front, _) in self.FRONTS.items():
            if _given(args, option):
                args[args.index(option) + 1] = self.fronts[front].rsplit(":", 1)[1]
        self.extra_args = tuple(args)

    def restart(self, timeout: float = 30.0) -> str:
        """Start the stopped broker again on its port and data dir, so clients reconnect.

        A port still taken is tried again for up to `timeout` seconds, and what held it
        (`ss`) is printed: a restart after a long outage met its port taken, with no
        known cause (stop 57; the ports are outside the ephemeral range).
        """
        assert self.proc is not None and self.proc.poll() is not None, "still running"
        port = int(self.address.rsplit(":", 1)[1])
        address = self.address
        deadline = time.monotonic() + timeout
        while True:
            try:
                assert self.start(timeout, port) == address, f"restarted at {self.address}"
                return address
            except PortTaken as exc:
                held = _sockets_on(
                    [port, *(int(a.rsplit(":", 1)[1]) for a in self.fronts.values())]
                )
                print(f"restart: a port was taken; sockets on the broker's ports:\n{held}")
                if time.monotonic() > deadline:
                    raise PortTaken(f"{exc}\nsockets on the broker's ports:\n{held}") from exc
                time.sleep(0.5)

    def kill9(self) -> None:
        """SIGKILL the broker and reap it."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM the broker and return its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stderr(self) -> str:
        """What the broker has written to stderr so far."""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()


#: Every BrokerProcess launched by this process (see `_kill_leftover_brokers`).
_LAUNCHED: weakref.WeakSet[BrokerProcess] = weakref.WeakSet()


@atexit.register
def _kill_leftover_brokers() -> None:
    """Kill the broker processes a test left running (one that failed before stopping its
    broker): they outlived the test run, holding a port and a data directory (fresh CI
    run 54's full-disk test left one on its tmpfs)."""
    for broker in list(_LAUNCHED):
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait()


def pinned(config: BrokerConfig, broker: EmbeddedBroker) -> BrokerConfig:
    """`config` with the ports the running `broker` bound: a broker started on it again
    serves where clients of the first still connect.

    Start the first with port 0 and restart on this, rather than choose free ports first:
    another process may take a port chosen beforehand before the broker binds it.
    """

    def port(address: str | None) -> int | None:
        return None if address is None else int(address.rsplit(":", 1)[1])

    return dataclasses.replace(
        config,
        port=port(broker.address),
        remoting_port=port(broker.remoting_address),
        namesrv_port=port(broker.namesrv_address),
        v2_port=port(broker.v2_address) if config.v2_port is not None else None,
        exchange_port=port(broker.exchange_address),
    )


#: How many sets of stable ports `BrokerProcess.start` tries before it gives up.
_PORT_ATTEMPTS = 5

#: Where `stable_ports` begins: above the ports of well-known services and of RocketMQ's
#: defaults (8080, 8081, 9876, 10909, 10911).
_STABLE_PORTS_FROM = 20000


class PortTaken(AssertionError):
    """A broker process exited at start because a port it was given was taken."""


def _sockets_on(ports: list[int]) -> str:
    """What `ss` shows of the TCP sockets on these local ports (for a failure's text)."""
    try:
        shown = subprocess.run(
            ["ss", "-tanpe"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"(ss: {exc})"
    ends = tuple(f":{port}" for port in ports)
    rows = (line.split() for line in shown.splitlines())
    return "\n".join(" ".join(row) for row in rows if len(row) > 3 and row[3].endswith(ends))


def ephemeral_ports() -> range:
    """The kernel's range of local ports for outgoing connections (Linux; else IANA's)."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    except (OSError, ValueError):
        return range(49152, 65536)
    return range(int(low), int(high) + 1)


def stable_ports(count: int) -> list[int]:
    """`count` distinct TCP ports nobody listens on now, on 127.0.0.1, below the kernel's
    ephemeral range.

    For a server stopped and started again on its ports: while it is down, a port of the
    ephemeral range may become an outgoing connection's local port; the kernel never gives
    a connection a port below that range. (This did not end the restart failures it was
    written for: one met a port below the range taken, cause unknown; `restart` retries.)
    Chosen at random, so that tests choosing at once seldom meet; a start that meets
    another's port chooses again.
    """
    below = range(_STABLE_PORTS_FROM, ephemeral_ports().start)
    with contextlib.ExitStack() as stack:
        chosen: list[int] = []
        for candidate in random.sample(below, min(len(below), 64 * count)):
            s = stack.enter_context(socket.socket())
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            chosen.append(candidate)
            if len(chosen) == count:
                return chosen
    raise AssertionError(f"no {count} free ports in {below}")


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports nobody listens on now, on 127.0.0.1.

    The sockets are held together while the ports are chosen: ports picked one after
    another may repeat (the kernel gave two of a broker's ports the same number once,
    and its config refused them).
    """
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def free_port() -> int:
    """A TCP port nobody listens on now, on 127.0.0.1."""
    return free_ports(1)[0]


def assert_decoders_agree(records: bytes) -> None:
    """decode_records (sdk._speedups' C where built) gives what the Python one gives.

    The same messages, every field compared, or a RecordFormatError with the same text.
    """
    from sdk._transport.codec import decode_records, decode_records_in_python
    from sdk._wire import RecordFormatError

    outcomes: list[object] = []
    for decode in (decode_records, decode_records_in_python):
        try:
            outcomes.append(decode(records, "broker-a"))
        except RecordFormatError as exc:
            outcomes.append((type(exc), str(exc)))
    assert outcomes[0] == outcomes[1]


class KeyedOnly(dict[str, Any]):
    """A table that may be read by key only: a walk over its entries fails the test.

    Put in place of a table whose every entry a lookup once looked at.
    """

    def items(self) -> Any:
        raise AssertionError("every entry of the table was looked at")

    def values(self) -> Any:
        raise AssertionError("every entry of the table was looked at")
