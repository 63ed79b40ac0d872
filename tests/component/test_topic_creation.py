"""Topics are created in one place, with the same checks, whichever front asks.

ordermq's gRPC (QueryRoute, Heartbeat), RocketMQ remoting (HEART_BEAT's retry topics) and
RocketMQ 5's gRPC (QueryRoute) all create through mockbroker/topic_creation.py: on a full
disk nothing is created and each wire answers its DISK_FULL-style refusal with words (not
UNKNOWN with a raw OSError); a topic whose `topics.json` could not be saved does not exist,
then or after a restart; and one request cannot have the broker create more topics than
`client_max_topics` (a heartbeat naming a thousand groups took every file descriptor).
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker import topics as topics_module
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from mockbroker.state import BrokerState
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from tests.remoting_client import RemotingClient

LIMIT = 3


def full_disk(path: Path, data: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def broker_config(tmp_path: Path, **overrides: Any) -> BrokerConfig:
    return BrokerConfig(
        data_dir=tmp_path / "broker", remoting_port=0, v2_port=0, client_max_topics=LIMIT,
        **overrides,
    )  # fmt: skip


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(broker_config(tmp_path)) as b:
        yield b


@pytest.fixture
def full(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker whose (simulated) disk is past the refuse ratio: sends get DISK_FULL."""
    usage = tmp_path / "disk.json"
    usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 95 * 10**7}))
    with EmbeddedBroker(broker_config(tmp_path, disk_usage_file=usage)) as b:
        yield b


def state_of(broker: EmbeddedBroker) -> BrokerState:
    state = broker.broker.state
    assert state is not None
    return state


def user_topics(broker: EmbeddedBroker) -> list[str]:
    return [t.name for t in state_of(broker).store.topics.all() if not t.name.startswith("rmq_")]


def grpc_error(broker: EmbeddedBroker, method: str, request: Any) -> grpc.RpcError:
    with grpc.insecure_channel(broker.address) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            getattr(stub, method)(request, timeout=30)
    return refused.value


def reason(error: grpc.RpcError) -> str:
    return str(dict(error.trailing_metadata() or ()).get("ordermq-reason", ""))  # type: ignore[attr-defined]


def v2_route(broker: EmbeddedBroker, topic: str) -> svc.QueryRouteResponse:
    async def call() -> svc.QueryRouteResponse:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            answer: svc.QueryRouteResponse = await stub.QueryRoute(
                svc.QueryRouteRequest(topic=v2.Resource(name=topic)),
                metadata=(("x-mq-client-id", "v2-client-1"),),
                timeout=30,
            )
            return answer

    return asyncio.run(call())


def remoting_heartbeat(broker: EmbeddedBroker, client_id: str, *groups: str) -> RemotingCommand:
    body = json.dumps({
        "clientID": client_id,
        "consumerDataSet": [
            {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
             "subscriptionDataSet": [{"topic": "orders", "subString": "*", "tagsSet": [],
                                      "codeSet": [], "subVersion": 1, "expressionType": "TAG",
                                      "classFilterMode": False}]}
            for g in groups
        ],
    }).encode()  # fmt: skip

    async def call() -> RemotingCommand:
        assert broker.remoting_address is not None
        client = await RemotingClient.connect(broker.remoting_address)
        try:
            return await client.request(RemotingCommand(RequestCode.HEART_BEAT, body=body))
        finally:
            await client.close()

    return asyncio.run(call())


def grpc_heartbeat(*groups: str) -> pb.HeartbeatRequest:
    return pb.HeartbeatRequest(
        client_id="c@1",
        consumer_groups=[
            pb.ConsumerGroupState(
                group=g, consume_type=pb.CONSUME_CONCURRENTLY, message_model=pb.CLUSTERING
            )
            for g in groups
        ],
    )


# ------------------------------------------------------------------------- a full disk
def test_a_full_disk_refuses_a_new_topic_on_every_front_and_creates_nothing(
    full: EmbeddedBroker,
) -> None:
    route = grpc_error(
        full, "QueryRoute", pb.QueryRouteRequest(topic="new", create_if_missing=True)
    )
    assert (route.code(), reason(route)) == (grpc.StatusCode.UNAVAILABLE, "DISK_FULL")
    assert "'new' was not created" in (route.details() or "")
    joined = grpc_error(full, "Heartbeat", grpc_heartbeat("g"))
    assert (joined.code(), reason(joined)) == (grpc.StatusCode.UNAVAILABLE, "DISK_FULL")
    answer = remoting_heartbeat(full, "r@1", "readers")
    assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
    assert "'%RETRY%readers' was not created" in (answer.remark or "")
    routed = v2_route(full, "new5")
    assert routed.status.code == v2.INTERNAL_SERVER_ERROR
    assert "disk" in routed.status.message
    assert user_topics(full) == []
    state = state_of(full)
    assert state.groups.members("g") == [] and state.groups.members("readers") == []


def test_a_topic_whose_registry_save_fails_is_refused_clearly_and_absent_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = broker_config(tmp_path)
    with EmbeddedBroker(config) as broker:
        monkeypatch.setattr(topics_module, "write_atomically", full_disk)
        route = grpc_error(
            broker, "QueryRoute", pb.QueryRouteRequest(topic="lost", create_if_missing=True)
        )
        assert (route.code(), reason(route)) == (grpc.StatusCode.UNAVAILABLE, "DISK_FULL")
        assert "No space left on device" in (route.details() or "")
        answer = remoting_heartbeat(broker, "r@1", "readers")
        assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE, answer.remark
        routed = v2_route(broker, "lost5")
        assert routed.status.code == v2.INTERNAL_SERVER_ERROR
        assert "No space left on device" in routed.status.message
        assert user_topics(broker) == [], "nothing a send could be acknowledged into"
        monkeypatch.undo()
    with EmbeddedBroker(config) as broker:
        assert user_topics(broker) == []


# ------------------------------------------------------------------------- the limits
def test_a_remoting_heartbeat_naming_more_groups_than_the_limit_is_refused_whole(
    broker: EmbeddedBroker,
) -> None:
    groups = [f"g{i}" for i in range(LIMIT + 1)]
    answer = remoting_heartbeat(broker, "r@1", *groups)
    assert answer.code == ResponseCode.SYSTEM_ERROR
    assert "client_max_topics" in (answer.remark or "") and str(LIMIT) in (answer.remark or "")
    assert user_topics(broker) == [], "no retry topic, no descriptor taken"
    assert all(state_of(broker).groups.members(g) == [] for g in groups)
    ok = remoting_heartbeat(broker, "r@1", *groups[:LIMIT])
    assert ok.code == ResponseCode.SUCCESS, ok.remark
    assert user_topics(broker) == [f"%RETRY%{g}" for g in groups[:LIMIT]]


def test_a_grpc_heartbeat_naming_more_groups_than_the_limit_is_refused_whole(
    broker: EmbeddedBroker,
) -> None:
    groups = [f"g{i}" for i in range(LIMIT + 1)]
    refused = grpc_error(broker, "Heartbeat", grpc_heartbeat(*groups))
    assert (refused.code(), reason(refused)) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "TOO_MANY_TOPICS",
    )
    assert "client_max_topics" in (refused.details() or "")
    assert user_topics(broker) == []
    assert state_of(broker).groups.members("g0") == []
    assert state_of(broker).topic_creation.refused == {"client_max_topics": 1}


def test_route_queries_past_the_brokers_topic_limit_are_refused_naming_it(tmp_path: Path) -> None:
    with EmbeddedBroker(broker_config(tmp_path, max_topics=4)) as broker:
        present = len(state_of(broker).store.topics.all())  # the scheduler's own
        with grpc.insecure_channel(broker.address) as channel:
            stub = pb_grpc.MessagingServiceStub(channel)
            for i in range(4 - present):
                stub.QueryRoute(pb.QueryRouteRequest(topic=f"t{i}", create_if_missing=True))
        refused = grpc_error(
            broker, "QueryRoute", pb.QueryRouteRequest(topic="one-more", create_if_missing=True)
        )
        assert (refused.code(), reason(refused)) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            "TOO_MANY_TOPICS",
        )
        assert "max_topics" in (refused.details() or "")
        routed = v2_route(broker, "one-more")
        assert routed.status.code == v2.TOO_MANY_REQUESTS
        assert "max_topics" in routed.status.message
        assert len(state_of(broker).store.topics.all()) == 4
