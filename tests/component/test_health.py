"""The broker's health checks: /healthz (liveness), /readyz (readiness), / and 404."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.store import message_store
from mockbroker.store.recovery import RecoveryReport
from sdk import Message, Producer
from sdk.errors import OrderMQError
from tests.component.scraping import get, scrape


def port_of(broker: EmbeddedBroker) -> int:
    port = broker.broker.metrics_port
    assert port
    return port


def test_each_path_answers_its_own_page(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path, metrics_port=0)) as broker:
        port = port_of(broker)
        assert get(port, "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
        assert get(port, "/readyz") == (200, "text/plain; charset=utf-8", "ready\n")
        status, _, index = get(port, "/")
        assert status == 200 and "/readyz" in index and "ordermq_" not in index
        status, _, missing = get(port, "/nothing-here")
        assert status == 404 and "ordermq_" not in missing
        status, content_type, metrics = get(port, "/metrics")
        assert status == 200 and content_type.startswith("text/plain; version=")
        assert "ordermq_build_info" in metrics


def fail_fsyncs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fdatasync fails from now on (until monkeypatch.undo())."""

    def failing_fdatasync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing_fdatasync)


def test_not_ready_once_a_failed_fsync_makes_the_store_refuse_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = BrokerConfig(data_dir=tmp_path, metrics_port=0, flush_mode="sync")
    with EmbeddedBroker(config) as broker:
        port = port_of(broker)
        with Producer(broker.address) as producer:
            producer.send(Message("orders", b"durable"))
            assert get(port, "/readyz")[0] == 200
            fail_fsyncs(monkeypatch)
            with pytest.raises(OrderMQError):
                producer.send(Message("orders", b"not acknowledged"))
        monkeypatch.undo()  # the store stays read-only all the same
        status, _, why = get(port, "/readyz")
        m = scrape(port)
        assert get(port, "/healthz")[0] == 200, "still alive: it answers reads"
    assert status == 503
    assert "refuses writes after a failed write or fsync" in why and "Input/output" in why
    assert m[("ordermq_ready", ())] == 0
    flush_failed = ("code", "DATA_LOSS"), ("method", "Send"), ("reason", "FLUSH_FAILED")
    assert m[("ordermq_rpc_errors_total", flush_failed)] == 1


def crash_with_a_failed_fsync(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Leave `data_dir` as after an unclean shutdown: a failed store claims no clean one."""
    broker = EmbeddedBroker(BrokerConfig(data_dir=data_dir, flush_mode="sync"))
    with broker, Producer(broker.address) as producer:
        producer.send(Message("orders", b"durable"))
        fail_fsyncs(monkeypatch)
        with pytest.raises(OrderMQError):
            producer.send(Message("orders", b"not acknowledged"))
    monkeypatch.undo()


def test_alive_but_not_ready_while_the_store_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_with_a_failed_fsync(tmp_path, monkeypatch)
    in_recovery, finish_recovery = threading.Event(), threading.Event()
    real_recover = message_store.recover

    def held_recover(*args: Any, **kwargs: Any) -> RecoveryReport:
        in_recovery.set()
        assert finish_recovery.wait(timeout=60), "the test never let recovery finish"
        return real_recover(*args, **kwargs)

    monkeypatch.setattr(message_store, "recover", held_recover)
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path, metrics_port=0))
    starting = threading.Thread(target=broker.start, name="test-broker-start")
    starting.start()
    try:
        assert in_recovery.wait(timeout=30), "the broker did not start recovering"
        port = port_of(broker)  # served from before the store is opened
        recovering = get(port, "/readyz")
        alive = get(port, "/healthz")
        during = scrape(port)
    finally:
        finish_recovery.set()
        starting.join()
    try:
        assert recovering == (
            503, "text/plain; charset=utf-8",
            "not ready: recovering the store after an unclean shutdown\n",
        )  # fmt: skip
        assert alive[0] == 200
        assert during[("ordermq_ready", ())] == 0
        assert any(name == "ordermq_build_info" for name, _ in during)
        assert get(port, "/readyz")[0] == 200
        assert scrape(port)[("ordermq_ready", ())] == 1
    finally:
        broker.stop()


def test_a_metrics_port_in_use_is_refused_before_the_store_is_opened(tmp_path: Path) -> None:
    first = BrokerConfig(data_dir=tmp_path / "first", metrics_port=0)
    with EmbeddedBroker(first) as running:
        taken = port_of(running)
        second = EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "second", metrics_port=taken))
        with pytest.raises(OSError, match=f"cannot serve metrics and health checks on "
                           f"127.0.0.1:{taken}: Address already in use"):  # fmt: skip
            second.start()
    assert not (tmp_path / "second").exists()
