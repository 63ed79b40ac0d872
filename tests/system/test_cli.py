"""`python -m mockbroker` as the contract describes it: ready line, clean stop, clear errors."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import sdk
from mockbroker.__main__ import main as broker_main
from sdk import Message, Producer
from sdk._transport.broker_client import BrokerClient
from tests.support import ROOT, BrokerProcess

StartBroker = Callable[..., BrokerProcess]


pytestmark = pytest.mark.system


def status(address: str) -> tuple[bool, int]:
    async def run() -> tuple[bool, int]:
        client = BrokerClient(address)
        try:
            s = await client.broker_status()
            return s.recovered_from_crash, s.messages_stored
        finally:
            await client.close()

    return asyncio.run(run())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_until_signalled_then_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    broker = BrokerProcess(tmp_path, "--flush-mode", "sync")
    address = broker.start()
    with Producer(address) as producer:
        producer.send(Message("orders", b"kept", sharding_key="k"))
    assert broker.proc is not None
    broker.proc.send_signal(sig)
    assert broker.proc.wait(30) == 0, broker.stderr()
    assert not (tmp_path / "running").exists(), "a clean stop removes the crash marker"

    again = BrokerProcess(tmp_path)
    address = again.start()
    try:
        assert status(address) == (False, 0)  # no recovery needed, nothing new stored
        with Producer(address) as producer:
            result = producer.send(Message("orders", b"next", sharding_key="k"))
        assert result.queue_offset == 1
    finally:
        again.terminate()


#: Runs the broker's entry point with a SIGTERM sent to itself the moment it is ready: the
#: signal a supervisor sends right after the ready line (or during a long recovery).
SIGTERM_WHEN_READY = """
import os, signal, sys
import mockbroker.__main__ as entry
from mockbroker.server import Broker

started = Broker.start

async def start_then_sigterm(self):
    await started(self)
    os.kill(os.getpid(), signal.SIGTERM)

Broker.start = start_then_sigterm
entry.main(sys.argv[1:])
"""


def test_a_sigterm_as_soon_as_it_is_ready_stops_it_cleanly(tmp_path: Path) -> None:
    args = ["--data-dir", str(tmp_path), "--port", "0"]
    done = subprocess.run(
        [sys.executable, "-c", SIGTERM_WHEN_READY, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "listening on" in done.stdout
    assert not (tmp_path / "running").exists(), "a clean stop removes the crash marker"


def test_a_port_in_use_is_a_clear_error_and_nothing_else(tmp_path: Path) -> None:
    first = BrokerProcess(tmp_path / "a")
    address = first.start()
    try:
        port = address.rsplit(":", 1)[1]
        proc = subprocess.run(
            [sys.executable, "-m", "mockbroker", "--port", port, "--data-dir", str(tmp_path / "b")],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 1
        # Only this: gRPC's own "E... add_port.cc ... Failed to add port" line used to
        # come first.
        assert (
            proc.stderr
            == f"mockbroker: cannot listen on 127.0.0.1:{port}: Address already in use\n"
        )
        assert proc.stdout == ""
    finally:
        first.terminate()


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_the_broker_listens_where_the_ordermq_command_looks_by_default(tmp_path: Path) -> None:
    if not port_is_free(8081):
        pytest.skip("port 8081 is in use on this machine")
    broker = BrokerProcess(tmp_path)
    address = broker.start(port=None)  # no --port
    try:
        assert address == "127.0.0.1:8081"
        env = {k: v for k, v in os.environ.items() if k != "ORDERMQ_BROKER"}
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "ordermq"), "--json", "broker", "status"],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["version"] == sdk.__version__
    finally:
        broker.terminate()


def test_a_data_directory_in_use_is_a_clear_error(tmp_path: Path) -> None:
    first = BrokerProcess(tmp_path)
    first.start()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "mockbroker", "--port", "0", "--data-dir", str(tmp_path)],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 1
        assert "is in use by another broker" in proc.stderr
        assert proc.stdout == ""
    finally:
        first.terminate()


def test_a_data_directory_in_a_newer_format_is_a_one_line_error(tmp_path: Path) -> None:
    (tmp_path / "FORMAT").write_text('{"format": 2, "written_by": "9.0.0"}')
    proc = subprocess.run(
        [sys.executable, "-m", "mockbroker", "--port", "0", "--data-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.startswith("mockbroker: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "data format 2" in proc.stderr and proc.stdout == ""


def test_the_ready_line_and_routes_carry_the_advertised_host(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    broker = start_broker(tmp_path / "b", "--advertised-host", "localhost")
    assert broker.address.startswith("localhost:")
    with Producer(broker.address) as producer:  # routes say localhost; it resolves here
        assert producer.send(Message("t", b"hello")).queue_offset == 0
    assert broker.terminate() == 0, broker.stderr()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "--data-dir"),
        (["--data-dir", "x", "--flush-mode", "sometimes"], "invalid choice"),
        (["--data-dir", "x", "--default-queues", "0"], "default_queues"),
        (["--data-dir", "x", "--port", "70000"], "port"),
        (["--data-dir", "x", "--lock-lease-seconds", "-1"], "lock_lease_seconds"),
        (["--data-dir", "x", "--advertised-host", "0.0.0.0"], "advertised_host"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    words: str,
) -> None:
    # The command's own entry point in this process: a new interpreter for each would
    # only import the broker again (the process itself is tested above and below).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        broker_main(args)
    assert exited.value.code == 2
    assert words in capsys.readouterr().err


def test_the_broker_prints_its_version_and_logs_it_when_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        broker_main(["--version"])
    assert (exited.value.code, capsys.readouterr().out) == (0, f"mockbroker {sdk.__version__}\n")
    broker = BrokerProcess(tmp_path, "--log-level", "INFO")
    broker.start()
    try:
        assert f"broker broker-a (ordermq {sdk.__version__}) serving on" in broker.stderr()
    finally:
        broker.terminate()


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "mockbroker"
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--flush-mode" in proc.stdout


def test_the_broker_raises_its_open_files_limit_to_the_hard_limit(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip(f"the hard open-files limit ({hard}) leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the child starts with 256
    try:
        broker = BrokerProcess(tmp_path)
        broker.start()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        assert broker.proc is not None
        limits = Path(f"/proc/{broker.proc.pid}/limits").read_text()
        line = next(x for x in limits.splitlines() if x.startswith("Max open files"))
        assert line.split()[3:5] == [str(hard), str(hard)], line
    finally:
        broker.terminate()
