"""`python -m mockbroker.namesrv` and a broker process registering with it by flag."""

from __future__ import annotations

import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.component.test_namesrv import brokers_of
from tests.interop.harness import accepts
from tests.support import ROOT, BrokerProcess


@pytest.fixture
def name_server() -> Iterator[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "mockbroker.namesrv", "--port", "0", "--log-level", "WARNING"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 30)
    line = proc.stdout.readline() if ready else ""
    assert line.startswith("mockbroker name server listening on "), line
    yield line.split()[-1]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, "stops cleanly on SIGTERM"


def test_a_broker_process_registers_by_flag_and_unregisters_on_sigterm(
    tmp_path: Path, name_server: str
) -> None:
    broker = BrokerProcess(tmp_path, "--remoting-port", "0",
                           "--namesrv-addr", name_server, "--cluster-name", "east")  # fmt: skip
    broker.start()
    try:
        assert brokers_of(name_server, "TBW102") == {"broker-a": 8}, "registered before ready"
        assert broker.terminate() == 0
        assert brokers_of(name_server, "TBW102") == {}, "unregistered as it stopped"
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill9()


def test_a_bad_namesrv_addr_is_refused_at_start(tmp_path: Path) -> None:
    refused = subprocess.run(
        [sys.executable, "-m", "mockbroker", "--data-dir", str(tmp_path), "--port", "0",
         "--namesrv-addr", "127.0.0.1:9876"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "namesrv_addr needs remoting_port" in refused.stderr


def test_fronts_on_port_0_are_announced_and_kept_across_a_restart(tmp_path: Path) -> None:
    """Each front given port 0 prints the address it bound after the ready line, accepting
    connections by then; a restart (after kill -9) takes the same ports."""
    broker = BrokerProcess(tmp_path, "--remoting-port", "0", "--namesrv-port", "0",
                           "--v2-port", "0", "--exchange-port", "0")  # fmt: skip
    broker.start()
    try:
        first = dict(broker.fronts)
        assert set(first) == {"remoting", "namesrv", "v2", "exchange"}
        ports = {int(address.rsplit(":", 1)[1]) for address in first.values()}
        assert len(ports) == 4 and 0 not in ports, first
        assert all(accepts(port) for port in ports), "accepting once announced"
        broker.kill9()
        broker.restart()
        assert broker.fronts == first
        assert all(accepts(port) for port in ports)
    finally:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill9()
