"""Accounts and permissions on the RocketMQ 5 front (--v2-port with --acl-file).

A raw apache.rocketmq.v2 stub signs as RocketMQ 5's clients do (MQv2-HMAC-SHA1 over
x-mq-date-time; the signature is computed here with hmac, not with the front's code).
Each refusal is checked for its status code (UNAUTHORIZED, as the Apache proxy answers
both authentication and authorization failures) and for what it left alone: nothing
stored, no member joined, no offset moved (`Snapshot`).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from tests.component.test_acl_grpc import GROUP, TOPIC, acl_file
from tests.component.test_acl_grpc import Snapshot as StoreSnapshot

PRODUCER = ("producer-key", "producer-secret")  # PUB on orders only
CONSUMER = ("consumer-key", "consumer-secret")  # SUB on orders, SUB on billing


def signed(
    account: tuple[str, str] | None, *, age: float = 0.0, client: str = "v2-client-1"
) -> tuple[tuple[str, str], ...]:
    """The metadata of a RocketMQ 5 client: its id, the date and the authorization."""
    metadata: tuple[tuple[str, str], ...] = (("x-mq-client-id", client),)
    if account is None:
        return metadata
    key, secret = account
    date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() - age))
    signature = hmac.new(secret.encode(), date.encode(), hashlib.sha1).hexdigest()
    authorization = (
        f"MQv2-HMAC-SHA1 Credential={key}, SignedHeaders=x-mq-date-time, Signature={signature}"
    )
    return (*metadata, ("x-mq-date-time", date), ("authorization", authorization))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    acl = acl_file(tmp_path / "plain_acl.yml")
    config = BrokerConfig(data_dir=tmp_path / "data", v2_port=0, acl_file=acl)
    with EmbeddedBroker(config) as b:
        route = call(b, "QueryRoute", route_request(), signed(PRODUCER))
        assert route.status.code == v2.OK  # creates the topic
        yield b


def call(broker: EmbeddedBroker, method: str, request: Any, metadata: Any) -> Any:
    async def run() -> Any:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            return await getattr(stub, method)(request, metadata=metadata, timeout=30)

    return asyncio.run(run())


def receive(broker: EmbeddedBroker, metadata: Any, group: str = GROUP) -> list[Any]:
    request = svc.ReceiveMessageRequest(
        group=v2.Resource(name=group),
        message_queue=v2.MessageQueue(topic=v2.Resource(name=TOPIC), id=-1),
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
        batch_size=4, invisible_duration=Duration(seconds=30),
        long_polling_timeout=Duration(seconds=1),
    )  # fmt: skip

    async def run() -> list[Any]:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            return [r async for r in stub.ReceiveMessage(request, metadata=metadata, timeout=30)]

    return asyncio.run(run())


def telemetry(broker: EmbeddedBroker, command: Any, metadata: Any) -> Any:
    async def run() -> Any:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stream = svc_grpc.MessagingServiceStub(channel).Telemetry(metadata=metadata)
            await stream.write(command)
            answer = await stream.read()
            await stream.done_writing()
            return answer

    return asyncio.run(run())


def route_request() -> svc.QueryRouteRequest:
    return svc.QueryRouteRequest(topic=v2.Resource(name=TOPIC))


def send_request(body: bytes = b"payload") -> svc.SendMessageRequest:
    sp = v2.SystemProperties(
        message_id="01AB", message_type=v2.NORMAL, body_encoding=v2.IDENTITY, born_host="h"
    )
    sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    message = v2.Message(topic=v2.Resource(name=TOPIC), system_properties=sp, body=body)
    return svc.SendMessageRequest(messages=[message])


def subscription(group: str) -> svc.TelemetryCommand:
    return svc.TelemetryCommand(
        settings=v2.Settings(
            client_type=v2.SIMPLE_CONSUMER,
            subscription=v2.Subscription(
                group=v2.Resource(name=group),
                subscriptions=[v2.SubscriptionEntry(
                    topic=v2.Resource(name=TOPIC),
                    expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                )],
            ),
        )
    )  # fmt: skip


class Snapshot(StoreSnapshot):
    """StoreSnapshot, and the groups with members: a refused receive or heartbeat joins none."""

    def __init__(self, b: EmbeddedBroker) -> None:
        super().__init__(b)
        state = b.broker.state
        assert state is not None
        self.groups = sorted(state.groups.active_groups())


# Signed when the test runs, not when it is collected: minutes may pass in between, and
# the broker refuses a date outside its window.
@pytest.mark.parametrize(
    ("account", "age", "says"),
    [
        (None, 0, "no accessKey"),
        (("nobody-key", "producer-secret"), 0, "no account has accessKey 'nobody-key'"),
        (("producer-key", "wrong-secret"), 0, "does not match"),
        (PRODUCER, 900, "outside its window"),
    ],
    ids=["no-authorization", "unknown-key", "wrong-secret", "stale-date"],
)
def test_an_unsigned_or_badly_signed_send_is_unauthorized_and_stores_nothing(
    broker: EmbeddedBroker, account: tuple[str, str] | None, age: float, says: str
) -> None:
    metadata = signed(account, age=age)
    before = Snapshot(broker)
    answer = call(broker, "SendMessage", send_request(), metadata)
    assert answer.status.code == v2.UNAUTHORIZED
    assert says in answer.status.message
    assert "secret" not in answer.status.message.replace("secret key", "")
    assert Snapshot(broker) == before
    route = call(broker, "QueryRoute", route_request(), metadata)
    assert route.status.code == v2.UNAUTHORIZED
    assert not route.message_queues


def test_a_publish_only_account_may_not_receive(broker: EmbeddedBroker) -> None:
    assert call(broker, "SendMessage", send_request(), signed(PRODUCER)).status.code == v2.OK
    before = Snapshot(broker)
    answer = receive(broker, signed(PRODUCER))
    assert [r.WhichOneof("content") for r in answer] == ["status"]
    assert answer[0].status.code == v2.UNAUTHORIZED
    assert "may not SUB topic 'orders'" in answer[0].status.message
    refused = telemetry(broker, subscription(GROUP), signed(PRODUCER))
    assert refused.status.code == v2.UNAUTHORIZED
    assert not refused.HasField("settings")
    assert Snapshot(broker) == before
    # The message is still there for the consumer: nothing was popped.
    [status, *messages] = [r for r in receive(broker, signed(CONSUMER)) if r.HasField("status")
                           or r.HasField("message")]  # fmt: skip
    assert status.status.code == v2.OK
    assert [m.message.body for m in messages] == [b"payload"]


def test_a_subscribe_only_account_may_not_send(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    answer = call(broker, "SendMessage", send_request(), signed(CONSUMER))
    assert answer.status.code == v2.UNAUTHORIZED
    assert "may not PUB topic 'orders'" in answer.status.message
    publishing = svc.TelemetryCommand(
        settings=v2.Settings(
            client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[v2.Resource(name=TOPIC)])
        )
    )
    assert telemetry(broker, publishing, signed(CONSUMER)).status.code == v2.UNAUTHORIZED
    assert telemetry(broker, publishing, signed(PRODUCER)).status.code == v2.OK
    assert Snapshot(broker) == before


def test_a_group_without_permission_is_refused_everywhere(broker: EmbeddedBroker) -> None:
    assert call(broker, "SendMessage", send_request(), signed(PRODUCER)).status.code == v2.OK
    before = Snapshot(broker)
    consumer = signed(CONSUMER)
    answer = receive(broker, consumer, group="audit")
    assert answer[0].status.code == v2.UNAUTHORIZED
    assert "may not SUB group 'audit'" in answer[0].status.message
    assert telemetry(broker, subscription("audit"), consumer).status.code == v2.UNAUTHORIZED
    beat = svc.HeartbeatRequest(client_type=v2.SIMPLE_CONSUMER, group=v2.Resource(name="audit"))
    assert call(broker, "Heartbeat", beat, consumer).status.code == v2.UNAUTHORIZED
    assignment = svc.QueryAssignmentRequest(
        topic=v2.Resource(name=TOPIC), group=v2.Resource(name="audit")
    )
    assert call(broker, "QueryAssignment", assignment, consumer).status.code == v2.UNAUTHORIZED
    assert Snapshot(broker) == before


def test_allowed_accounts_send_receive_and_ack(broker: EmbeddedBroker) -> None:
    assert call(broker, "SendMessage", send_request(b"one"), signed(PRODUCER)).status.code == v2.OK
    consumer = signed(CONSUMER)
    settled = telemetry(broker, subscription(GROUP), consumer)
    assert settled.status.code == v2.OK
    beat = svc.HeartbeatRequest(client_type=v2.SIMPLE_CONSUMER, group=v2.Resource(name=GROUP))
    assert call(broker, "Heartbeat", beat, consumer).status.code == v2.OK
    answer = receive(broker, consumer)
    assert answer[0].status.code == v2.OK
    [message] = [r.message for r in answer if r.HasField("message")]
    assert message.body == b"one"
    ack = svc.AckMessageRequest(
        group=v2.Resource(name=GROUP), topic=v2.Resource(name=TOPIC),
        entries=[svc.AckMessageEntry(
            message_id=message.system_properties.message_id,
            receipt_handle=message.system_properties.receipt_handle,
        )],
    )  # fmt: skip
    # The producer may not ack the consumer's message; the consumer may.
    assert call(broker, "AckMessage", ack, signed(PRODUCER)).status.code == v2.UNAUTHORIZED
    acked = call(broker, "AckMessage", ack, consumer)
    assert acked.status.code == v2.OK
    ended = svc.NotifyClientTerminationRequest(group=v2.Resource(name=GROUP))
    assert call(broker, "NotifyClientTermination", ended, consumer).status.code == v2.OK


def test_without_an_acl_file_the_v2_front_serves_unsigned_calls(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data", v2_port=0)) as b:
        assert call(b, "QueryRoute", route_request(), signed(None)).status.code == v2.OK
