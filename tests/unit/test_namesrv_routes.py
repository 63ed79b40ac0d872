"""The name server's route table and the checks on REGISTER_BROKER, on a fake clock."""

from __future__ import annotations

import json
import re
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from mockbroker.config import BrokerConfig
from mockbroker.namesrv.registration import (
    Registration,
    TopicQueues,
    Unregistration,
    parse_registration,
    parse_unregistration,
    register_request,
    unregister_request,
)
from mockbroker.namesrv.routes import RouteTable
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingCommand, RemotingError
from sdk.testing import FakeClock


def registration(
    name: str, address: str, topics: dict[str, int], version: int = 1, broker_id: int = 0
) -> Registration:
    request = register_request(
        cluster="c1", broker_name=name, address=address, data_version=(version, 7),
        topics={t: TopicQueues(n, n) for t, n in topics.items()},
    )  # fmt: skip
    if broker_id:
        assert request.ext_fields is not None
        request.ext_fields["brokerId"] = str(broker_id)
    return parse_registration(request)


def test_routes_merge_the_brokers_of_a_topic_sorted_by_broker_name() -> None:
    table = RouteTable(FakeClock())
    table.register(registration("broker-b", "10.0.0.2:10911", {"orders": 8, "b-only": 2}))
    table.register(registration("broker-a", "10.0.0.1:10911", {"orders": 4}))
    route = table.route("orders")
    assert route is not None
    assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-a", "broker-b"]
    assert [(q["readQueueNums"], q["writeQueueNums"], q["perm"]) for q in route["queueDatas"]] == [
        (4, 4, 6), (8, 8, 6),
    ]  # fmt: skip
    assert route["brokerDatas"] == [
        {"brokerAddrs": {"0": "10.0.0.1:10911"}, "brokerName": "broker-a", "cluster": "c1"},
        {"brokerAddrs": {"0": "10.0.0.2:10911"}, "brokerName": "broker-b", "cluster": "c1"},
    ]
    assert route["orderTopicConf"] == "broker-a:4;broker-b:8"
    assert [q["brokerName"] for q in table.route("b-only")["queueDatas"]] == ["broker-b"]  # type: ignore[index]
    assert table.route("nosuch") is None
    assert table.cluster_info()["clusterAddrTable"] == {"c1": ["broker-a", "broker-b"]}


def test_a_new_data_version_replaces_a_brokers_topics_and_a_slave_changes_none() -> None:
    table = RouteTable(FakeClock())
    table.register(registration("broker-a", "h:1", {"orders": 4, "gone": 1}, version=1))
    table.register(registration("broker-a", "h:1", {"orders": 4}, version=1))
    assert table.route("gone") is not None, "the same version: topics are not re-read"
    table.register(registration("broker-a", "h:1", {"orders": 8}, version=2))
    assert table.route("gone") is None
    assert table.route("orders")["queueDatas"][0]["writeQueueNums"] == 8  # type: ignore[index]
    table.register(registration("broker-a", "h:2", {"other": 1}, version=3, broker_id=1))
    assert table.route("other") is None, "a slave's registration carries no queues"
    assert table.route("orders")["brokerDatas"][0]["brokerAddrs"] == {"0": "h:1", "1": "h:2"}  # type: ignore[index]


def test_silent_brokers_expire_and_unregistered_ones_go_at_once() -> None:
    clock = FakeClock()
    table = RouteTable(clock)
    table.register(registration("broker-a", "h:1", {"orders": 4}))
    table.register(registration("broker-b", "h:2", {"orders": 4}))
    clock.advance(100)
    table.register(registration("broker-b", "h:2", {"orders": 4}))
    clock.advance(20.5)  # broker-a: 120.5 s of silence
    assert table.expire() == ["h:1"]
    assert [q["brokerName"] for q in table.route("orders")["queueDatas"]] == ["broker-b"]  # type: ignore[index]
    assert not table.unregister(Unregistration("c1", "broker-b", 0, "h:9")), "another address"
    assert table.unregister(Unregistration("c1", "broker-b", 0, "h:2"))
    assert table.route("orders") is None and table.broker_addresses() == []


def test_a_registration_is_read_back_from_its_request() -> None:
    request = register_request(
        cluster="c1", broker_name="broker-a", address="127.0.0.1:10911", data_version=(3, 9),
        topics={"orders": TopicQueues(8, 8)}, timeout_seconds=30,
    )  # fmt: skip
    reg = parse_registration(request)
    assert (reg.cluster, reg.broker_name, reg.broker_id, reg.address) == (
        "c1", "broker-a", 0, "127.0.0.1:10911",
    )  # fmt: skip
    assert reg.data_version == (3, 9) and reg.timeout_seconds == 30
    assert reg.topics == {"orders": TopicQueues(8, 8)}
    unreg = parse_unregistration(unregister_request(cluster="c1", broker_name="broker-a",
                                                    address="127.0.0.1:10911"))  # fmt: skip
    assert unreg == Unregistration("c1", "broker-a", 0, "127.0.0.1:10911")


def test_the_compressed_body_rocketmq_brokers_send_is_read() -> None:
    def part(data: bytes) -> bytes:
        return struct.pack(">i", len(data)) + data

    raw = part(json.dumps({"counter": 5, "timestamp": 11}).encode()) + struct.pack(">i", 2)
    raw += part(b"orders 8 8 6 SINGLE_TAG") + part(b"%RETRY%g1 1 1 6 SINGLE_TAG") + part(b"[]")
    request = RemotingCommand(
        code=103,
        ext_fields={**good_fields(), "haServerAddr": "h:2", "compressed": "true"},
        body=zlib.compress(raw, 9),
    )
    reg = parse_registration(request)
    assert reg.data_version == (5, 11)
    assert reg.topics == {"orders": TopicQueues(8, 8), "%RETRY%g1": TopicQueues(1, 1)}


def good_fields() -> dict[str, str]:
    return {"brokerName": "broker-a", "brokerAddr": "h:1", "clusterName": "c", "brokerId": "0"}


def body(table: object, version: object = None) -> bytes:
    wrapper = {"dataVersion": version or {"counter": 1, "timestamp": 1}, "topicConfigTable": table}
    return json.dumps({"topicConfigSerializeWrapper": wrapper}).encode()


GOOD = {"orders": {"readQueueNums": 4, "writeQueueNums": 4, "perm": 6, "topicName": "orders"}}


@pytest.mark.parametrize(
    ("fields", "payload", "why"),
    [
        ({"brokerName": ""}, body(GOOD), "brokerName '' must match"),
        ({"brokerAddr": "nohost"}, body(GOOD), "brokerAddr 'nohost' is not host:port"),
        ({"brokerAddr": "h:70000"}, body(GOOD), "is not host:port"),
        ({"brokerId": "-1"}, body(GOOD), "brokerId -1 is negative"),
        ({"brokerId": "x"}, body(GOOD), "'brokerId' is not an integer"),
        ({}, b"{not json", "the body is not JSON"),
        ({}, b"[]", "body is not a JSON object"),
        ({}, body([]), "topicConfigTable is not a JSON object"),
        ({}, body(GOOD, {"counter": "1"}), "needs integer counter and timestamp"),
        ({}, body({"bad topic": GOOD["orders"]}), "topic 'bad topic' must match"),
        ({}, body({"t": {**GOOD["orders"], "readQueueNums": -1}}), "readQueueNums -1"),
        ({}, body({"t": {**GOOD["orders"], "writeQueueNums": 10**6}}), "writeQueueNums 1000000"),
        ({}, body({"t": {**GOOD["orders"], "perm": "6"}}), "perm '6'"),
        ({"bodyCrc32": "12345"}, body(GOOD), "crc32 not match"),
        ({"compressed": "true"}, b"not zlib", "does not inflate"),
        ({"compressed": "true"}, zlib.compress(b"\x00\x00\x00\x09{}"), "does not parse"),
    ],
)
def test_a_bad_registration_is_refused_naming_what_is_wrong(
    fields: dict[str, str], payload: bytes, why: str
) -> None:
    request = RemotingCommand(code=103, ext_fields={**good_fields(), **fields}, body=payload)
    with pytest.raises(RemotingError) as refused:
        parse_registration(request)
    assert refused.value.code == ResponseCode.SYSTEM_ERROR
    assert why in refused.value.remark, refused.value.remark


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"namesrv_addr": "127.0.0.1:9876"}, "namesrv_addr needs remoting_port"),
        ({"namesrv_addr": " ; ", "remoting_port": 0}, "names no name server"),
        ({"namesrv_addr": "a:1;nohost", "remoting_port": 0}, "'nohost' is not host:port"),
        ({"namesrv_addr": "a:1", "remoting_port": 0, "register_seconds": 90},
         "register_seconds 90 must be within 0..60"),
        ({"namesrv_addr": "a:1", "remoting_port": 0, "cluster_name": "a b"},
         "cluster_name 'a b' must match"),
    ],
)  # fmt: skip
def test_a_broker_config_with_bad_name_server_settings_is_refused(
    tmp_path: Path, settings: dict[str, Any], why: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(why)):
        BrokerConfig(data_dir=tmp_path, **settings)
    ok = BrokerConfig(data_dir=tmp_path, remoting_port=0, namesrv_addr=" a:1 ; b:2 ")
    assert ok.name_servers() == ["a:1", "b:2"]
