"""The RocketMQ 5 front (apache.rocketmq.v2) of an embedded broker, over real gRPC.

A stub generated from the same protos plays the RocketMQ 5 client; the messages it sends
are read back with ordermq's own client (one truth), and the other way round where the
front can serve them without the pop core.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from mockbroker.fronts.v2.messages import from_ms
from sdk import Message, MessageQueue, Producer
from sdk.selector import shard_index
from tests.component.pulling import read_queue, read_topic

CLIENT = (("x-mq-client-id", "v2-client-1"),)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data", v2_port=0)) as b:
        yield b


def call(broker: EmbeddedBroker, method: str, request: Any, metadata: Any = CLIENT) -> Any:
    """One unary call of the v2 service."""

    async def run() -> Any:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            return await getattr(stub, method)(request, metadata=metadata, timeout=30)

    return asyncio.run(run())


def v2_message(body: bytes, message_id: str, **system: Any) -> v2.Message:
    system = {"message_type": v2.NORMAL, **system}
    sp = v2.SystemProperties(
        message_id=message_id, born_host="10.0.0.9", body_encoding=v2.IDENTITY, **system
    )
    sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    return v2.Message(
        topic=v2.Resource(name="orders"), system_properties=sp, body=body,
        user_properties={"color": "red"},
    )  # fmt: skip


def send(broker: EmbeddedBroker, *messages: v2.Message) -> svc.SendMessageResponse:
    return call(broker, "SendMessage", svc.SendMessageRequest(messages=messages))


def test_the_route_names_every_queue_read_write_on_the_v2_port(broker: EmbeddedBroker) -> None:
    answer = call(broker, "QueryRoute", svc.QueryRouteRequest(topic=v2.Resource(name="orders")))
    assert answer.status.code == v2.OK
    host, port = broker.v2_address.rsplit(":", 1)
    assert [q.id for q in answer.message_queues] == list(range(8))  # created, default queues
    for q in answer.message_queues:
        assert (q.topic.name, q.permission, q.broker.name, q.broker.id) == (
            "orders", v2.READ_WRITE, "broker-a", 0,
        )  # fmt: skip
        assert q.broker.endpoints == v2.Endpoints(
            scheme=v2.IPv4, addresses=[v2.Address(host=host, port=int(port))]
        )
        assert list(q.accept_message_types) == [v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION]
    assert broker.v2_address != broker.address


@pytest.mark.parametrize(
    ("resource", "code", "words"),
    [
        (v2.Resource(name="bad topic"), v2.ILLEGAL_TOPIC, "'bad topic'"),
        (v2.Resource(name="orders", resource_namespace="ns1"), v2.BAD_REQUEST, "namespace"),
        (v2.Resource(name="%DLQ%nobody"), v2.TOPIC_NOT_FOUND, "does not exist"),
    ],
)
def test_a_bad_route_request_is_answered_with_its_code(
    broker: EmbeddedBroker, resource: v2.Resource, code: int, words: str
) -> None:
    answer = call(broker, "QueryRoute", svc.QueryRouteRequest(topic=resource))
    assert answer.status.code == code and words in answer.status.message
    assert not answer.message_queues
    assert broker.broker.store.topics.find(resource.name) is None


def test_without_auto_creation_a_missing_topic_is_not_found(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "d", v2_port=0, auto_create_topics=False)
    with EmbeddedBroker(config) as b:
        answer = call(b, "QueryRoute", svc.QueryRouteRequest(topic=v2.Resource(name="orders")))
        assert answer.status.code == v2.TOPIC_NOT_FOUND


def test_a_v2_send_is_read_over_ordermqs_grpc_with_its_fields(broker: EmbeddedBroker) -> None:
    message = v2_message(b"hello", "0102FC0000000126DF0B16580600000001", tag="TagA", keys=["k1"])
    answer = send(broker, message)
    assert answer.status.code == v2.OK
    [entry] = answer.entries
    assert (entry.status.code, entry.message_id, entry.recall_handle) == (
        v2.OK, "0102FC0000000126DF0B16580600000001", "",
    )  # fmt: skip
    [read] = read_topic(broker.address, "orders")
    assert (read.body, read.tags, read.keys, read.sharding_key) == (b"hello", "TagA", ("k1",), None)
    assert read.properties["color"] == "red"
    assert read.properties["UNIQ_KEY"] == entry.message_id
    assert read.queue_offset == entry.offset
    state = broker.broker.state
    assert state is not None and state.requests.by_code[("v2.SendMessage", "OK")] == 1


def test_normal_sends_take_the_queues_in_turn(broker: EmbeddedBroker) -> None:
    for i in range(8):
        assert send(broker, v2_message(b"x", f"id-{i}")).status.code == v2.OK
    for q in range(8):
        assert len(read_queue(broker.address, MessageQueue("orders", "broker-a", q))) == 1


def test_a_message_group_and_an_ordermq_sharding_key_of_the_same_value_share_a_queue(
    broker: EmbeddedBroker,
) -> None:
    groups = [f"order-{i}" for i in range(20)]
    with Producer(broker.address) as producer:
        for group in groups:
            producer.send(Message("orders", b"sdk", sharding_key=group))
    for group in groups:
        fifo = v2_message(b"v2", f"v2-{group}", message_group=group, message_type=v2.FIFO)
        assert send(broker, fifo).status.code == v2.OK
    for q in range(8):
        messages = read_queue(broker.address, MessageQueue("orders", "broker-a", q))
        for m in messages:
            assert shard_index(m.sharding_key or "", 8) == q
        by_group: dict[str, list[bytes]] = {}
        for m in messages:
            by_group.setdefault(m.sharding_key or "", []).append(m.body)
        assert all(bodies == [b"sdk", b"v2"] for bodies in by_group.values()), by_group
    assert sum(len(read_queue(broker.address, MessageQueue("orders", "broker-a", q)))
               for q in range(8)) == 40  # fmt: skip


def test_a_delay_message_waits_in_the_scheduler_and_can_be_recalled(
    broker: EmbeddedBroker,
) -> None:
    due = int(time.time() * 1000) + 3_600_000
    delayed = v2_message(
        b"later", "delayed-1", message_type=v2.DELAY, delivery_timestamp=from_ms(due)
    )
    answer = send(broker, delayed)
    assert answer.status.code == v2.OK
    assert answer.entries[0].recall_handle == "delayed-1"
    assert broker.broker.state is not None and broker.broker.state.scheduler.pending == 1
    assert read_topic(broker.address, "orders") == []
    recall = svc.RecallMessageRequest(topic=v2.Resource(name="orders"), recall_handle="delayed-1")
    recalled = call(broker, "RecallMessage", recall)
    assert (recalled.status.code, recalled.message_id) == (v2.OK, "delayed-1")
    assert broker.broker.state.scheduler.pending == 0
    again = call(broker, "RecallMessage", svc.RecallMessageRequest(
        topic=v2.Resource(name="orders"), recall_handle="never-sent"))  # fmt: skip
    assert again.status.code == v2.NOT_FOUND and "no scheduled message" in again.status.message


@pytest.mark.parametrize(
    ("system", "code"),
    [
        ({"tag": "a|b"}, v2.ILLEGAL_MESSAGE_TAG),
        ({"message_type": v2.PRIORITY}, v2.UNSUPPORTED),
        (  # a transactional message cannot be delayed
            {"message_type": v2.TRANSACTION, "delivery_timestamp": from_ms(2**41)},
            v2.ILLEGAL_DELIVERY_TIME,
        ),
        ({"message_type": v2.FIFO}, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
        ({"delivery_timestamp": from_ms(1000), "message_type": v2.DELAY}, v2.ILLEGAL_DELIVERY_TIME),
    ],
)
def test_a_refused_send_stores_nothing(
    broker: EmbeddedBroker, system: dict[str, Any], code: int
) -> None:
    answer = send(broker, v2_message(b"x", "refused-1", **system))
    assert answer.status.code == code, answer.status
    assert [e.status.code for e in answer.entries] == [code]
    assert broker.broker.store.topics.find("orders") is None
    name = v2.Code.Name(code)  # counted apart from ordermq's RPCs
    state = broker.broker.state
    assert state is not None
    assert state.requests.errors[("v2.SendMessage", name, name)] == 1


def test_an_empty_body_and_a_mixed_batch_are_refused(broker: EmbeddedBroker) -> None:
    assert send(broker, v2_message(b"", "e")).status.code == v2.MESSAGE_BODY_EMPTY
    other = v2_message(b"x", "o")
    other.topic.name = "elsewhere"
    mixed = send(broker, v2_message(b"x", "m"), other)
    assert mixed.status.code == v2.BAD_REQUEST and "one topic" in mixed.status.message
    assert call(broker, "SendMessage", svc.SendMessageRequest()).status.code == v2.BAD_REQUEST
    assert broker.broker.store.topics.find("orders") is None


# ---------------------------------------------------------------------- clients
def consumer_settings(group: str) -> svc.TelemetryCommand:
    return svc.TelemetryCommand(
        settings=v2.Settings(
            client_type=v2.SIMPLE_CONSUMER,
            subscription=v2.Subscription(
                group=v2.Resource(name=group),
                subscriptions=[v2.SubscriptionEntry(
                    topic=v2.Resource(name="orders"),
                    expression=v2.FilterExpression(type=v2.TAG, expression="TagA"),
                )],
            ),
        )
    )  # fmt: skip


async def telemetry(
    broker: EmbeddedBroker, commands: list[svc.TelemetryCommand], then: Any = None
) -> list[svc.TelemetryCommand]:
    """Write `commands` on a Telemetry stream, read one answer each, run `then`, close."""
    async with grpc.aio.insecure_channel(broker.v2_address) as channel:
        stub = svc_grpc.MessagingServiceStub(channel)
        stream = stub.Telemetry(metadata=CLIENT)
        answers = []
        for command in commands:
            await stream.write(command)
            answers.append(await stream.read())
        if then is not None:
            await then(stub)
        await stream.done_writing()
        return answers


def test_telemetry_answers_the_servers_settings_and_heartbeats_join_the_group(
    broker: EmbeddedBroker,
) -> None:
    async def heartbeat(stub: svc_grpc.MessagingServiceStub) -> None:
        beat = svc.HeartbeatRequest(
            client_type=v2.SIMPLE_CONSUMER, group=v2.Resource(name="workers")
        )
        assert (await stub.Heartbeat(beat, metadata=CLIENT)).status.code == v2.OK

    [answer] = asyncio.run(telemetry(broker, [consumer_settings("workers")], heartbeat))
    assert answer.status.code == v2.OK
    assert answer.settings.subscription.fifo is False
    assert answer.settings.backoff_policy.max_attempts == 17
    state = broker.broker.state
    assert state is not None
    membership = state.groups.membership("workers")["v2-client-1"]
    assert (membership.consume_type, membership.subscriptions) == (
        "CONSUME_POP",
        (("orders", "TagA"),),
    )
    ended = call(broker, "NotifyClientTermination", svc.NotifyClientTerminationRequest(
        group=v2.Resource(name="workers")))  # fmt: skip
    assert ended.status.code == v2.OK
    assert state.groups.members("workers") == []


def test_a_producer_heartbeat_changes_no_group_and_a_missing_client_id_is_refused(
    broker: EmbeddedBroker,
) -> None:
    beat = svc.HeartbeatRequest(client_type=v2.PRODUCER)
    assert call(broker, "Heartbeat", beat).status.code == v2.OK
    refused = call(broker, "Heartbeat", beat, metadata=())
    assert refused.status.code == v2.CLIENT_ID_REQUIRED
    consumer = svc.HeartbeatRequest(client_type=v2.PUSH_CONSUMER)
    assert call(broker, "Heartbeat", consumer).status.code == v2.ILLEGAL_CONSUMER_GROUP
    assert broker.broker.state is not None and not broker.broker.state.groups.active_groups()


def test_stopping_the_broker_ends_open_telemetry_streams(tmp_path: Path) -> None:
    b = EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "d", v2_port=0))
    b.start()
    opened = asyncio.Event()

    async def hold() -> list[Any]:
        async with grpc.aio.insecure_channel(b.v2_address) as channel:
            stream = svc_grpc.MessagingServiceStub(channel).Telemetry(metadata=CLIENT)
            await stream.write(consumer_settings("workers"))
            await stream.read()
            opened.set()
            rest = [m async for m in _read_all(stream)]
            return [rest, await stream.code()]

    async def run() -> list[Any]:
        task = asyncio.create_task(hold())
        await opened.wait()
        await asyncio.to_thread(b.stop)  # returns only once the broker has stopped
        return await asyncio.wait_for(task, 60)

    rest, code = asyncio.run(run())
    assert (rest, code) == ([], grpc.StatusCode.OK)


async def _read_all(stream: Any) -> AsyncIterator[Any]:
    while (message := await stream.read()) is not grpc.aio.EOF:
        yield message


def test_query_assignment_gives_ordinary_groups_the_whole_broker(broker: EmbeddedBroker) -> None:
    call(broker, "QueryRoute", svc.QueryRouteRequest(topic=v2.Resource(name="orders")))
    answer = call(broker, "QueryAssignment", svc.QueryAssignmentRequest(
        topic=v2.Resource(name="orders"), group=v2.Resource(name="workers")))  # fmt: skip
    assert answer.status.code == v2.OK
    assert [a.message_queue.id for a in answer.assignments] == [-1]
    missing = call(broker, "QueryAssignment", svc.QueryAssignmentRequest(
        topic=v2.Resource(name="nowhere"), group=v2.Resource(name="workers")))  # fmt: skip
    assert missing.status.code == v2.TOPIC_NOT_FOUND


def test_a_refused_receive_says_so_in_exactly_one_status(broker: EmbeddedBroker) -> None:
    request = svc.ReceiveMessageRequest(
        group=v2.Resource(name="workers"),
        message_queue=v2.MessageQueue(topic=v2.Resource(name="orders"), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=4, invisible_duration=Duration(seconds=10),
        long_polling_timeout=Duration(seconds=1),
    )  # fmt: skip

    async def run() -> list[svc.ReceiveMessageResponse]:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            return [r async for r in stub.ReceiveMessage(request, metadata=CLIENT, timeout=30)]

    answer = asyncio.run(run())
    assert [r.WhichOneof("content") for r in answer] == ["status", "delivery_timestamp"]
    assert answer[0].status.code == v2.TOPIC_NOT_FOUND


@pytest.mark.parametrize("method", ["UpdateOffset", "GetOffset", "QueryOffset", "PullMessage"])
def test_the_offset_rpcs_are_unimplemented_as_on_the_apache_proxy(
    broker: EmbeddedBroker, method: str
) -> None:
    requests = {
        "UpdateOffset": svc.UpdateOffsetRequest(), "GetOffset": svc.GetOffsetRequest(),
        "QueryOffset": svc.QueryOffsetRequest(), "PullMessage": svc.PullMessageRequest(),
    }  # fmt: skip

    async def run() -> None:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            if method == "PullMessage":
                [_ async for _ in stub.PullMessage(requests[method], timeout=30)]
            else:
                await getattr(stub, method)(requests[method], timeout=30)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(run())
    assert caught.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "apache/rocketmq#10434" in (caught.value.details() or "")


def test_a_request_that_does_not_parse_is_a_bad_request(broker: EmbeddedBroker) -> None:
    async def run() -> bytes:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            raw = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute")
            return await raw(b"\xff\xff\xff", timeout=30)  # type: ignore[no-any-return]

    answer = svc.QueryRouteResponse.FromString(asyncio.run(run()))
    assert answer.status.code == v2.BAD_REQUEST and "does not parse" in answer.status.message


def test_the_v2_front_is_off_unless_asked_for(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "d")) as b:
        assert b.broker.v2_address is None
        with pytest.raises(RuntimeError, match="v2_port is None"):
            _ = b.v2_address
