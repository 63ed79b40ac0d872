"""Child processes of the benchmark: the broker and the bare-gRPC floor server.

Each server runs in its own Python process (so it gets its own interpreter and GIL, and
on a 2-core machine client and server each get a core, as in production). A server is
ready once it prints its "... listening on HOST:PORT" line; it is stopped with SIGTERM
(and only if it ignores that, SIGKILL), always by the pid this module started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import LineReader  # noqa: E402 (needs ROOT on the path)

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ServerProcess:
    """A server child process, started and waited for by its ready line."""

    def __init__(self, name: str, cmd: list[str], ready_prefix: str) -> None:
        self.name = name
        self.cmd = cmd
        self.ready_prefix = ready_prefix
        self.proc: subprocess.Popen[str] | None = None
        self.address = ""
        #: What the process prints on stdout, its ready line first.
        self.lines: LineReader | None = None
        # stderr goes to a file: a chatty server must never block on a full pipe.
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed by stop)

    def start(self, timeout: float = 30.0) -> str:
        """Start the process; return its address once it printed its ready line."""
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert self.proc.stdout is not None
        self.lines = LineReader(self.proc.stdout.fileno())
        line = self.lines.readline(timeout)
        if not line.startswith(self.ready_prefix):
            err = self.stderr()
            self.stop(grace=2.0)
            raise RuntimeError(f"{self.name} did not start: {line!r}\n{err[-2000:]}")
        self.address = line.split()[-1]
        return self.address

    def cpu_seconds(self) -> float | None:
        """User + system CPU time the process used so far (None where /proc is missing)."""
        if self.proc is None:
            return None
        try:
            stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime

    def peak_rss_mb(self) -> float | None:
        """Peak resident set size of the process so far (VmHWM), in MB (10^6 bytes).

        None where /proc is missing or the process is gone. Measured as bench/peers does
        for the peer servers, so the two are comparable.
        """
        if self.proc is None:
            return None
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return None
        for line in status.splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6  # kB
        return None

    def stop(self, grace: float = 30.0) -> int | None:
        """SIGTERM the process (SIGKILL after `grace` seconds) and reap it."""
        proc = self.proc
        if proc is None or self._stderr.closed:
            return None if proc is None else proc.returncode
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.returncode not in (0, -signal.SIGTERM):
            print(f"warning: {self.name} exited with {proc.returncode}: {self.stderr()[-500:]}")
        self._close()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL the process and reap it (a crash, as recovery must survive one)."""
        proc = self.proc
        if proc is None or self._stderr.closed:
            return
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        self._close()

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()

    def stderr(self) -> str:
        """What the process wrote to stderr so far."""
        if self._stderr.closed:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine used so far, summed over the cores.

    From the first line of /proc/stat: user, nice, system, irq, softirq and steal (time
    the hypervisor gave to other machines); None where /proc is missing.
    """
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICKS


def exchange_port_option(args: object) -> tuple[str, ...]:
    """The broker option a run's `--no-exchange-port` asks for: the port off, or none (on)."""
    return ("--exchange-port", "off") if getattr(args, "no_exchange_port", False) else ()


def busy_poll_option(args: object) -> tuple[str, ...]:
    """The broker option a run's `--broker-busy-poll-us` asks for (none: the default)."""
    spin = getattr(args, "broker_busy_poll_us", None)
    return () if spin is None else ("--busy-poll-us", str(spin))


def broker_process(
    data_dir: Path, flush_mode: str, profile: Path | None = None, extra: Sequence[str] = ()
) -> ServerProcess:
    """`python -m mockbroker` on a free loopback port with its data in `data_dir`.

    `extra`: more command-line arguments (the flood figures compare configurations).
    """
    runner = ["-m", "cProfile", "-o", str(profile)] if profile is not None else []
    cmd = [
        sys.executable, *runner, "-m", "mockbroker",
        "--host", "127.0.0.1", "--port", "0",
        "--data-dir", str(data_dir),
        "--flush-mode", flush_mode,
        "--log-level", "WARNING",
        *extra,
    ]  # fmt: skip
    return ServerProcess(f"mockbroker ({flush_mode} flush)", cmd, "mockbroker listening on ")


def floor_process() -> ServerProcess:
    """The bare grpc.aio server of bench/floor_server.py on a free loopback port."""
    cmd = [sys.executable, str(BENCH / "floor_server.py"), "--host", "127.0.0.1", "--port", "0"]
    return ServerProcess("floor server", cmd, "floor listening on ")
