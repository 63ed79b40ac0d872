"""The tests' broker process (tests/support.py BrokerProcess): where it serves, so that a
restart after a long outage finds its ports free."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import tests.support
from tests.support import BrokerProcess, ephemeral_ports


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_a_broker_given_port_0_serves_below_the_ephemeral_range_and_restarts_there(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data", "--metrics-port", "0")
    address = broker.start()
    try:
        metrics = broker.fronts["metrics"]
        # An outgoing connection may take any port of the ephemeral range while the
        # broker is down; none is given a port below it.
        assert port_of(address) < ephemeral_ports().start
        assert port_of(metrics) < ephemeral_ports().start
        broker.terminate()
        assert broker.restart() == address
        assert broker.fronts["metrics"] == metrics
    finally:
        broker.kill9()


def test_a_start_meeting_a_taken_port_chooses_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = int(taken.getsockname()[1])
        choices = [taken_port]
        choose = tests.support.stable_ports

        def taken_first(count: int) -> list[int]:  # the broker's port, then its fronts'
            return [choices.pop(), *choose(count - 1)] if choices else choose(count)

        monkeypatch.setattr(tests.support, "stable_ports", taken_first)
        broker = BrokerProcess(tmp_path / "data")
        try:
            address = broker.start()
            assert not choices, "the taken port was not chosen first"
            assert port_of(address) != taken_port
            assert "Address already in use" in broker.stderr()
        finally:
            broker.kill9()


def test_a_restart_waits_for_its_port_to_be_let_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = BrokerProcess(tmp_path / "data")
    address = broker.start()
    broker.terminate()
    holder = socket.socket()
    holder.bind(("127.0.0.1", port_of(address)))
    holder.listen()
    released = threading.Timer(1.0, holder.close)
    released.start()
    try:
        assert broker.restart() == address
        assert "a port was taken" in capsys.readouterr().out
    finally:
        released.cancel()
        holder.close()
        broker.kill9()


def test_a_broker_a_test_left_running_is_killed_when_the_test_process_exits(
    tmp_path: Path,
) -> None:
    """A test that fails before stopping its broker leaves no broker process behind the
    run (one outlived fresh CI run 54 on its test's tmpfs)."""
    code = (
        "import sys; from pathlib import Path; from tests.support import BrokerProcess; "
        "b = BrokerProcess(Path(sys.argv[1])); b.start(); print(b.proc.pid)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "data")],
        cwd=tests.support.ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pid = int(out.stdout.split()[-1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return  # gone, as it should be
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the broker (pid {pid}) outlived the process that started it")
