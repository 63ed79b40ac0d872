"""An embedded broker's start: a port it cannot take is one clear OSError, nothing else."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker


def test_a_busy_port_is_one_clear_error_and_grpc_prints_nothing(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        capfd.readouterr()
        broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path, port=port))
        with pytest.raises(OSError) as raised:
            broker.start()
    assert str(raised.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"
    assert raised.value.errno == errno.EADDRINUSE
    # gRPC's C core writes its own line to the process's stderr when a bind fails.
    assert capfd.readouterr().err == ""
    # Nothing was left behind: the data directory can be used at once.
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path)) as again:
        assert again.address.startswith("127.0.0.1:")
