"""Starting the peers' servers on 127.0.0.1, with their data in a temporary directory.

Every server runs as the current user, in its own process group, from a fresh data
directory. Stopping one signals only the processes this module started (by pid, plus the
children they started, found through /proc), never anything found by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
START_TIMEOUT = 90.0
STOP_TIMEOUT = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
        except OSError:
            continue
        out.extend(int(c) for c in text.split())
    return out


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, parents first."""
    seen = [pid]
    i = 0
    while i < len(seen):
        seen.extend(c for c in _children(seen[i]) if c not in seen)
        i += 1
    return seen


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Server:
    """One started server process (and whatever it starts), its log and its data directory."""

    def __init__(self, name: str, argv: list[str], workdir: Path, env: dict[str, str]) -> None:
        self.name = name
        self.workdir = workdir
        self.log_path = workdir / f"{name}.out"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            argv,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.proc.pid
        self._known: set[int] = {self.pid}

    def pids(self) -> list[int]:
        """The started process and its live descendants (remembered for stop())."""
        found = descendants(self.pid) if self.proc.poll() is None else []
        self._known.update(found)
        return found

    def peak_rss_mb(self) -> float:
        """VmHWM summed over the server's processes, in MB (10^6 bytes)."""
        return sum(_status_kb(p, "VmHWM") for p in self.pids()) * 1024 / 1e6

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def wait_ready(self, probe: Callable[[], bool], timeout: float = START_TIMEOUT) -> None:
        """Call `probe` until it returns True; raise with the server's log if it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited ({self.proc.returncode}) while starting:\n"
                    + self.log_tail()
                )
            try:
                if probe():
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n" + self.log_tail())

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Signal the started process, wait, then kill whatever of its tree is left."""
        self.pids()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Children that outlived their parent (only ones this server started).
        deadline = time.monotonic() + 10
        for pid in sorted(self._known - {self.pid}):
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._log.close()


def _can_connect(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------------- redis
def start_redis(workdir: Path, appendfsync: str) -> tuple[Server, int]:
    port = free_port()
    data = workdir / "redis"
    data.mkdir()
    argv = [
        "redis-server",
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--dir",
        str(data),
        "--appendonly",
        "yes",
        "--appendfsync",
        appendfsync,
        "--save",
        "",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
    ]
    server = Server("redis", argv, workdir, dict(os.environ))

    def probe() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")

    server.wait_ready(probe)
    return server, port


# ---------------------------------------------------------------------- nats
def start_nats(workdir: Path) -> tuple[Server, int]:
    port = free_port()
    data = workdir / "nats"
    data.mkdir()
    argv = ["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", str(data)]
    server = Server("nats", argv, workdir, dict(os.environ))
    server.wait_ready(lambda: _can_connect(port))
    return server, port


# ---------------------------------------------------------------------- rabbitmq
class RabbitServers:
    """A RabbitMQ node plus the epmd it registers with, both started here."""

    def __init__(self, node: Server, epmd: Server) -> None:
        self.node = node
        self.epmd = epmd

    def peak_rss_mb(self) -> float:
        return self.node.peak_rss_mb()

    def stop(self) -> None:
        try:
            self.node.stop()
        finally:
            self.epmd.stop()


def start_rabbitmq(workdir: Path) -> tuple[RabbitServers, int]:
    port, dist_port, epmd_port = free_port(), free_port(), free_port()
    base = workdir / "rabbitmq"
    for sub in ("mnesia", "log", "home", "plugins-expand"):
        (base / sub).mkdir(parents=True)
    config = base / "rabbitmq.conf"
    config.write_text(
        f"listeners.tcp.1 = 127.0.0.1:{port}\n"
        "log.console = false\n"
        "log.file.level = warning\n"
        "disk_free_limit.absolute = 50MB\n"
    )
    (base / "enabled_plugins").write_text("[].\n")
    (base / "rabbitmq-env.conf").write_text("")
    env = dict(os.environ)
    env.update(
        HOME=str(base / "home"),  # the Erlang cookie goes here
        ERL_EPMD_PORT=str(epmd_port),
        ERL_EPMD_ADDRESS="127.0.0.1",
        RABBITMQ_NODENAME=f"peerbench{port}@localhost",
        RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
        RABBITMQ_NODE_PORT=str(port),
        RABBITMQ_DIST_PORT=str(dist_port),
        RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
        RABBITMQ_LOG_BASE=str(base / "log"),
        RABBITMQ_CONFIG_FILE=str(config),
        RABBITMQ_CONF_ENV_FILE=str(base / "rabbitmq-env.conf"),
        RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
        RABBITMQ_PLUGINS_EXPAND_DIR=str(base / "plugins-expand"),
        RABBITMQ_ADVANCED_CONFIG_FILE=str(base / "advanced.config"),
    )
    # Our own epmd, in the foreground, so that stopping it is stopping a pid we know (the
    # Erlang VM would otherwise start a daemonised one that outlives the benchmark).
    epmd = Server("epmd", ["epmd", "-port", str(epmd_port), "-address", "127.0.0.1"], workdir, env)
    try:
        epmd.wait_ready(lambda: _can_connect(epmd_port), timeout=20)
        node = Server("rabbitmq", [RABBITMQ_SERVER], workdir, env)
    except BaseException:
        epmd.stop()
        raise
    servers = RabbitServers(node, epmd)
    try:
        node.wait_ready(lambda: _amqp_ready(port))
    except BaseException:
        servers.stop()
        raise
    return servers, port


def _amqp_ready(port: int) -> bool:
    import pika

    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1)
    conn = pika.BlockingConnection(params)
    conn.close()
    return True
