"""Brokers registering with standalone name servers, and the routes clients get from them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.namesrv import EmbeddedNameServer
from mockbroker.namesrv.registration import TopicQueues, register_request
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.connection import RemotingConnection
from sdk.testing import FakeClock
from tests.component.admin_cli import run
from tests.support import wait_until


def ask(address: str, request: RemotingCommand) -> RemotingCommand:
    """`request`'s answer from the remoting server at `address`."""

    async def main() -> RemotingCommand:
        connection = await RemotingConnection.open(address)
        try:
            return await connection.request(request, 5.0)
        finally:
            await connection.close()

    return asyncio.run(main())


def route(name_server: str, topic: str) -> dict[str, Any] | None:
    answer = ask(name_server, RemotingCommand(code=RequestCode.GET_ROUTEINFO_BY_TOPIC,
                                              ext_fields={"topic": topic}))  # fmt: skip
    if answer.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert answer.code == ResponseCode.SUCCESS, answer.remark
    return dict(json.loads(answer.body))


def brokers_of(name_server: str, topic: str) -> dict[str, int]:
    """Broker name -> write queues of `topic`, as the name server routes it."""
    found = route(name_server, topic)
    return {} if found is None else {q["brokerName"]: q["writeQueueNums"]
                                     for q in found["queueDatas"]}  # fmt: skip


@pytest.fixture
def name_servers() -> Iterator[tuple[EmbeddedNameServer, EmbeddedNameServer]]:
    with EmbeddedNameServer() as first, EmbeddedNameServer() as second:
        yield first, second


BOTH = {"broker-a": 8, "broker-b": 8}


def member(tmp_path: Path, name: str, name_servers: str, **extra: Any) -> EmbeddedBroker:
    return EmbeddedBroker(BrokerConfig(
        data_dir=tmp_path / name, broker_name=name, remoting_port=0, namesrv_addr=name_servers,
        **extra,
    ))  # fmt: skip


def test_two_brokers_register_with_two_name_servers_and_leave_at_shutdown(
    tmp_path: Path, name_servers: tuple[EmbeddedNameServer, EmbeddedNameServer]
) -> None:
    both = ";".join(ns.address for ns in name_servers)
    with member(tmp_path, "broker-a", both) as a, member(tmp_path, "broker-b", both) as b:
        run(a, "topics", "create", "orders", "--queues", "8")
        run(b, "topics", "create", "orders", "--queues", "8")
        for ns in name_servers:  # registered at once on the change, not 30 s later
            wait_until(lambda ns=ns: brokers_of(ns.address, "orders") == BOTH)
        found = route(name_servers[0].address, "orders")
        assert found is not None
        assert found["brokerDatas"] == [
            {"brokerAddrs": {"0": a.remoting_address}, "brokerName": "broker-a",
             "cluster": "DefaultCluster"},
            {"brokerAddrs": {"0": b.remoting_address}, "brokerName": "broker-b",
             "cluster": "DefaultCluster"},
        ]  # fmt: skip
        assert brokers_of(name_servers[1].address, "TBW102") == BOTH
        run(b, "topics", "delete", "orders", "--yes")
        wait_until(lambda: brokers_of(name_servers[0].address, "orders") == {"broker-a": 8})
        b.stop()  # unregisters: its routes go at once, not after 120 s
        assert brokers_of(name_servers[0].address, "TBW102") == {"broker-a": 8}
        assert brokers_of(name_servers[1].address, "TBW102") == {"broker-a": 8}
    assert route(name_servers[0].address, "TBW102") is None


def test_a_name_server_down_at_start_gets_the_registration_once_it_is_up(
    tmp_path: Path,
) -> None:
    with EmbeddedNameServer() as up:
        down = EmbeddedNameServer()
        down.start()
        down_address = down.address
        down.stop()
        config_servers = f"{up.address};{down_address}"
        with member(tmp_path, "broker-a", config_servers, register_seconds=0.2) as broker:
            assert brokers_of(up.address, "TBW102") == {"broker-a": 8}, "registered at start"
            host, port = down_address.rsplit(":", 1)
            with EmbeddedNameServer(host, int(port)) as back:
                wait_until(lambda: brokers_of(back.address, "TBW102") == {"broker-a": 8})
            assert broker.broker.registrar is not None
            assert broker.broker.registrar.registered[up.address] >= 1


def test_a_silent_broker_expires_and_a_bad_registration_changes_nothing() -> None:
    clock = FakeClock()
    with EmbeddedNameServer(clock=clock) as ns:

        def registration(version: int) -> RemotingCommand:
            return register_request(
                cluster="c", broker_name="broker-x", address="127.0.0.1:1",
                data_version=(version, 1), topics={"orders": TopicQueues(4, 4)},
            )  # fmt: skip

        assert ask(ns.address, registration(1)).code == ResponseCode.SUCCESS
        bad = registration(2)
        bad.body = bad.body.replace(b'"readQueueNums":4', b'"readQueueNums":"4"')
        refused = ask(ns.address, bad)
        assert refused.code == ResponseCode.SYSTEM_ERROR and "crc32 not match" in (
            refused.remark or ""
        )
        assert bad.ext_fields is not None
        del bad.ext_fields["bodyCrc32"]
        refused = ask(ns.address, bad)
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert "readQueueNums '4'" in (refused.remark or "")
        assert brokers_of(ns.address, "orders") == {"broker-x": 4}, "the routes are as they were"

        clock.advance(121)  # past the 120 s a broker may be silent; a scan is due
        wait_until(lambda: route(ns.address, "orders") is None, what="the expiry scan")
