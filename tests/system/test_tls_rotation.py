"""Certificate rotation in a broker process: SIGHUP, and clients are not dropped."""

from __future__ import annotations

import datetime
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sdk import Message, Producer, TLSConfig
from sdk.errors import TLSError
from tests.support import ROOT, BrokerProcess, wait_until
from tests.tls_certs import issue


def send(producer: Producer) -> None:
    producer.send(Message("orders", b"paid", sharding_key="order-42"))


def refused(ca: Path, address: str) -> bool:
    try:
        with Producer(address, tls=TLSConfig(ca)) as producer:
            send(producer)
    except TLSError:
        return True
    return False


def test_sighup_serves_new_connections_the_new_certificate_and_keeps_open_ones(
    tmp_path: Path,
) -> None:
    old, new = issue(tmp_path / "old", "old"), issue(tmp_path / "new", "new")
    cert, key = tmp_path / "broker.pem", tmp_path / "broker.key"
    shutil.copy(old.cert, cert)
    shutil.copy(old.key, key)
    broker = BrokerProcess(tmp_path / "data", "--tls-cert", str(cert), "--tls-key", str(key),
                           "--log-level", "INFO")  # fmt: skip
    address = broker.start()
    assert broker.proc is not None
    try:
        with Producer(address, tls=TLSConfig(old.ca)) as before:
            send(before)
            shutil.copy(new.cert, cert)
            shutil.copy(new.key, key)
            broker.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: "TLS certificate reloaded" in broker.stderr(), what="the reload")
            assert refused(old.ca, address)  # new connections: the new certificate
            with Producer(address, tls=TLSConfig(new.ca)) as after:
                send(after)
            send(before)  # connected before the reload: kept

            key.write_text("not a key\n")  # a bad set: refused whole, the process lives on
            broker.proc.send_signal(signal.SIGHUP)
            wait_until(lambda: "TLS files not reloaded" in broker.stderr(), what="the refusal")
            assert "holds no PEM private key" in broker.stderr()
            with Producer(address, tls=TLSConfig(new.ca)) as after:
                send(after)
        assert broker.proc.poll() is None
    finally:
        assert broker.terminate() == 0, broker.stderr()


def test_sighup_without_tls_changes_nothing(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", "--log-level", "INFO")
    address = broker.start()
    assert broker.proc is not None
    try:
        broker.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP ignored" in broker.stderr(), what="the log line")
        with Producer(address) as producer:
            send(producer)
    finally:
        assert broker.terminate() == 0, broker.stderr()


@pytest.mark.parametrize("problem", ["missing-key", "expired"])
def test_a_broker_process_with_a_bad_tls_file_exits_with_one_line(
    tmp_path: Path, problem: str
) -> None:
    if problem == "missing-key":
        good = issue(tmp_path / "certs", "good")
        cert, key, says = good.cert, tmp_path / "nope.key", "nope.key: no such file"
    else:
        now = datetime.datetime.now(datetime.UTC)
        dated = issue(tmp_path / "certs", "dated", not_before=now - datetime.timedelta(days=9),
                      not_after=now - datetime.timedelta(days=1))  # fmt: skip
        cert, key, says = dated.cert, dated.key, "expired on"
    done = subprocess.run(
        [sys.executable, "-m", "mockbroker", "--data-dir", str(tmp_path / "data"), "--port", "0",
         "--tls-cert", str(cert), "--tls-key", str(key)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert done.stdout == ""
