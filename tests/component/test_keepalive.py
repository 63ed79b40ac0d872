"""A client whose connection goes silent finds out by its keepalive and connects again.

A silent connection (a cable cut, a NAT or a firewall that forgot it, a peer's host gone
without a reset) looks idle: no error comes, and TCP gives up only after many minutes.
Without a keepalive, every request on its Exchange stream failed by its deadline until
then; with it, the ping that is not answered closes the connection, its calls fail as
retriable, and the next ones connect again (sdk/_wire.py GRPC_KEEPALIVE_MS).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from mockbroker import EmbeddedBroker
from sdk import Message, Producer, ProducerConfig, _wire
from sdk.errors import OrderMQError
from tests.faultproxy import NO_PROXY_VARIABLES, FaultProxy

KEEPALIVE_MS = 500
#: Sends are tried this long after the silence: without the keepalive, all of them fail.
PATIENCE = 15.0


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault proxy this process's next gRPC channels go through (grpc_proxy)."""
    with FaultProxy(seed=11) as p:
        monkeypatch.setenv("grpc_proxy", p.url)
        for name in NO_PROXY_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        yield p


def test_sends_go_on_over_a_new_connection_once_the_old_one_went_silent(
    broker: EmbeddedBroker, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wire, "GRPC_KEEPALIVE_MS", KEEPALIVE_MS)
    config = ProducerConfig(send_timeout=1.0, retry_times=0, accumulator=None)
    with Producer(broker.address, config=config) as producer:
        producer.send(Message("orders", b"before", sharding_key="k"))
        assert proxy.stats().connections == 1
        assert proxy.silence() == 1
        failures: list[OrderMQError] = []
        given_up = time.monotonic() + PATIENCE
        while True:
            try:
                producer.send(Message("orders", b"after", sharding_key="k"))
                break
            except OrderMQError as exc:  # the ones sent on the silent connection
                failures.append(exc)
                assert time.monotonic() < given_up, (
                    f"still failing {PATIENCE:g}s after the connection went silent: "
                    f"{failures[-1]!r} (and {len(failures) - 1} before)"
                )
        assert proxy.stats().connections == 2, "the send went on a new connection"
