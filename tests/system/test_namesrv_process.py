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
from tests.support import ROOT, BrokerProcess, free_port


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
    broker = BrokerProcess(tmp_path, "--remoting-port", str(free_port()),
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
