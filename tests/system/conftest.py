"""Fixtures of the system tier: broker processes that never outlive their test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import BrokerProcess

StartBroker = Callable[..., BrokerProcess]

#: A broker that has not printed its ready line by then is killed, so that the test fails
#: with the broker's stderr instead of hanging until the test timeout.
START_TIMEOUT_SECONDS = 30.0


@pytest.fixture
def start_broker() -> Iterator[StartBroker]:
    """`start_broker(data_dir, *args, env=None)` starts `python -m mockbroker`, waits until ready.

    Whatever is still running when the test ends is killed, so a failing test leaves no
    broker process (and no data directory lock) behind.
    """
    started: list[BrokerProcess] = []

    def start(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> BrokerProcess:
        broker = BrokerProcess(data_dir, *args, env=env)
        started.append(broker)

        def give_up() -> None:
            # The ready line never came (recovery hangs, or a full stderr pipe blocks the
            # broker): end it, so that BrokerProcess.start reads EOF and reports stderr.
            if broker.proc is not None and broker.proc.poll() is None:
                broker.proc.kill()

        watchdog = threading.Timer(START_TIMEOUT_SECONDS, give_up)
        watchdog.start()
        try:
            broker.start()
        finally:
            watchdog.cancel()
        return broker

    yield start
    for broker in started:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.kill9()
