"""Connections that go silent are found out by keepalive pings, on both sides.

A silent connection (a cable cut, a NAT or a firewall that forgot it, a peer's host gone
without a reset) looks idle: no error comes, and TCP gives up only after many minutes.
Without a keepalive, every request on a client's Exchange stream failed by its deadline
until then, and the broker kept the connection's streams and push subscriptions. With
it, the client's ping that is not answered closes its end: its calls fail as retriable
and the next ones connect again (sdk/_wire.py GRPC_KEEPALIVE_MS); the broker's closes
its end, and what the connection held goes (BrokerConfig.keepalive_seconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer, ProducerConfig, _wire
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk.errors import OrderMQError
from tests.component.test_exchange_port_client import only_on_the_port, port_of, streams_served
from tests.component.test_push_delivery import Recorder, consumer, send, subscriptions
from tests.faultproxy import FaultProxy
from tests.support import wait_until

KEEPALIVE_MS = 500
#: Sends are tried this long after the silence: without the keepalive, all of them fail.
PATIENCE = 15.0


FRONTS = ["grpc", "exchange-port"]


def keepalive_broker(tmp_path: Path, front: str, **config: Any) -> EmbeddedBroker:
    """A broker whose clients use gRPC, or its Exchange port."""
    port = 0 if front == "exchange-port" else None
    return EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker", exchange_port=port,
                                       **config))  # fmt: skip


@pytest.mark.parametrize("front", FRONTS)
def test_sends_go_on_over_a_new_connection_once_the_old_one_went_silent(
    tmp_path: Path,
    front: str,
    process_proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """On the Exchange port, the client's own pings find the silence (TCP's keepalive
    would not: the proxy's end of the connection still answers it)."""
    monkeypatch.setattr(_wire, "GRPC_KEEPALIVE_MS", KEEPALIVE_MS)
    caplog.set_level(logging.INFO, logger="ordermq.transport")
    config = ProducerConfig(send_timeout=1.0, retry_times=0, accumulator=None)
    with (
        keepalive_broker(tmp_path, front) as broker,
        Producer(broker.address, config=config) as producer,
    ):
        producer.send(Message("orders", b"before", sharding_key="k"))
        connections = 1
        if front == "exchange-port":
            assert only_on_the_port(broker)
            connections = 2  # gRPC's and the port's
        assert process_proxy.stats().connections == connections
        assert process_proxy.silence() == connections
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
        if front == "exchange-port":
            assert only_on_the_port(broker), (
                f"the sends went on a new port connection: {streams_served(broker)} after "
                f"{len(failures)} failed send(s): {failures!r}; the transport logged "
                f"{[r.getMessage() for r in caplog.records if r.name == 'ordermq.transport']}"
            )
            assert port_of(broker).accepted_connections == 2, (
                f"{streams_served(broker)} after {len(failures)} failed send(s): {failures!r}; "
                f"the transport logged "
                f"{[r.getMessage() for r in caplog.records if r.name == 'ordermq.transport']}"
            )
        else:
            assert process_proxy.stats().connections == 2, "the send went on a new connection"


@pytest.mark.parametrize("front", FRONTS)
def test_the_broker_drops_the_push_subscriptions_of_a_connection_gone_silent(
    tmp_path: Path, front: str, process_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_wire, "GRPC_KEEPALIVE_MS", KEEPALIVE_MS)
    with keepalive_broker(tmp_path, front, keepalive_seconds=KEEPALIVE_MS / 1000) as broker:
        send(broker.address, 100)
        listener = Recorder()
        c = consumer(broker.address, listener)
        c.start()
        try:
            wait_until(lambda: len(listener.bodies()) == 100, 30, "the first 100")
            assert len(subscriptions(broker)) == 8  # one per queue held
            if front == "exchange-port":
                assert only_on_the_port(broker)
            process_proxy.silence()
            send(broker.address, 100, start=100)  # on a connection of its own
            wait_until(lambda: len(listener.bodies()) == 200, PATIENCE, "the next 100")
            # The client subscribed again on a new connection; without the broker's
            # keepalive, the old subscriptions stayed as long as the client did.
            wait_until(
                lambda: len(subscriptions(broker)) == 8, PATIENCE, "the old subscriptions to go"
            )
        finally:
            c.shutdown()
        # At least once: what was consumed before the silence may come again.
        assert set(listener.bodies()) == {f"{i:05d}".encode() for i in range(200)}


def test_the_broker_takes_pings_as_often_as_it_says_without_a_goaway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client pinging every second on a stream the broker sends nothing on, against a
    # broker that takes pings every half second. Without the broker's setting (gRPC's
    # default is 5 min), its third bad ping got GOAWAY too_many_pings, and the stream
    # failed ("Too many pings": seen in make bench, with the clients' 10 s keepalive).
    monkeypatch.setattr(_wire, "GRPC_SERVER_MIN_PING_INTERVAL_MS", 500)
    pinging = (
        ("grpc.keepalive_time_ms", 1000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    )
    pull = pb.ExchangeRequest(id=1, pull=pb.PullRequest(
        group="g", topic="orders", queue_id=0, offset=0, max_messages=1))  # fmt: skip

    async def main() -> None:
        async with grpc.aio.insecure_channel(broker.address, options=pinging) as channel:
            stream = pb_grpc.MessagingServiceStub(channel).Exchange()
            await stream.write(pull)
            assert (await stream.read()).id == 1
            await asyncio.sleep(5)  # 5 pings, and nothing from the broker
            pull.id = 2
            await stream.write(pull)
            assert (await stream.read()).id == 2, "the stream outlived the pings"
            stream.cancel()

    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker")) as broker:
        send(broker.address, 1)
        asyncio.run(main())
