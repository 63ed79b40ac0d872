"""Accounts and permissions over RocketMQ remoting ("rocketmq://"), the broker's --acl-file.

The clients sign as RocketMQ's AclClientRPCHook does; the broker port checks the signature
and the permissions of every request before its handler, and answers a refusal as
RocketMQ's broker does: SYSTEM_ERROR with the AclException in the remark. Each refusal is
checked for its error and for what it left alone (`Snapshot`: nothing stored, locked,
committed or created). The name server port has no ACL, as RocketMQ's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeOrderlyStatus,
    Credentials,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)
from sdk._remoting.acl_signature import ACL_EXCEPTION, signed_fields
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk.errors import AuthenticationError, PermissionDeniedError
from tests.component.test_acl_grpc import ACL, ADMIN, CONSUMER, GROUP, PRODUCER, TOPIC, Snapshot
from tests.remoting_client import RemotingClient
from tests.support import wait_until

UPDATE_AND_CREATE_TOPIC = 17  # an admin request code (RocketMQ's Permission.ADMIN_CODE)


def start(tmp_path: Path, text: str = ACL) -> EmbeddedBroker:
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(text)
    config = BrokerConfig(data_dir=tmp_path / "data", acl_file=acl, remoting_port=0, namesrv_port=0)
    broker = EmbeddedBroker(config)
    broker.start()
    return broker


def endpoint(b: EmbeddedBroker) -> str:
    return f"rocketmq://{b.namesrv_address}"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path)
    try:
        with Producer(endpoint(b), credentials=ADMIN) as p:  # 4 messages to consume
            for i in range(4):
                p.send(Message(TOPIC, b"m%d" % i, sharding_key=f"k{i}"))
        yield b
    finally:
        b.stop()


def message() -> Message:
    return Message(TOPIC, b"payload", sharding_key="k1")


def raw(b: EmbeddedBroker, code: int, fields: dict[str, str], body: bytes = b"") -> RemotingCommand:
    """One request to the broker port, as given."""

    async def ask() -> RemotingCommand:
        assert b.remoting_address is not None
        client = await RemotingClient.connect(b.remoting_address)
        try:
            return await client.request(RemotingCommand(code, ext_fields=fields, body=body))
        finally:
            await client.close()

    return asyncio.run(ask())


# ---------------------------------------------------------------- who: authentication
@pytest.mark.parametrize(
    "creds",
    [None, Credentials("nobody-key", "producer-secret"), Credentials("producer-key", "wrong-one")],
    ids=["no-credentials", "unknown-key", "wrong-secret"],
)
def test_a_caller_the_acl_does_not_know_is_refused_and_nothing_is_stored(
    broker: EmbeddedBroker, creds: Credentials | None
) -> None:
    before = Snapshot(broker)
    with (
        Producer(endpoint(broker), credentials=creds) as p,
        pytest.raises(AuthenticationError) as e,
    ):
        p.send(message())
    assert e.value.reason == "UNAUTHENTICATED" and not e.value.retriable
    assert ACL_EXCEPTION in str(e.value)
    assert "wrong-one" not in str(e.value) and "producer-secret" not in str(e.value)
    assert Snapshot(broker) == before


def test_a_signed_request_changed_on_the_way_is_refused(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    fields = {"topic": "payments", "defaultTopic": "TBW102", "readQueueNums": "2",
              "writeQueueNums": "2", "perm": "6", "topicFilterType": "SINGLE_TAG"}  # fmt: skip
    signed = signed_fields(fields, b"", ADMIN.access_key, ADMIN.secret_key)
    tampered = raw(broker, UPDATE_AND_CREATE_TOPIC, {**signed, "topic": "other"})
    assert tampered.code == ResponseCode.SYSTEM_ERROR
    assert tampered.remark is not None and ACL_EXCEPTION in tampered.remark
    assert "signature does not match" in tampered.remark
    unsigned = {k: v for k, v in signed.items() if k != "Signature"}
    refused = raw(broker, UPDATE_AND_CREATE_TOPIC, unsigned)
    assert refused.remark is not None and "carries no Signature" in refused.remark
    # Signed right, the admin passes the ACL: the code itself is not served here.
    served = raw(broker, UPDATE_AND_CREATE_TOPIC, signed)
    assert served.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
    assert Snapshot(broker) == before


# ---------------------------------------------------------------- what: permissions
def test_a_publisher_sends_to_its_topic(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    with Producer(endpoint(broker), credentials=PRODUCER) as p:
        p.send(message())
    assert Snapshot(broker).stored > before.stored


def test_a_sub_only_account_cannot_send(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    with (
        Producer(endpoint(broker), credentials=CONSUMER) as p,
        pytest.raises(PermissionDeniedError) as e,
    ):
        p.send(message())
    assert "'consumer-key'" in str(e.value) and "PUB" in str(e.value)
    assert "topic 'orders'" in str(e.value) and not e.value.retriable
    assert Snapshot(broker) == before


def test_a_pub_only_account_cannot_pull(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    consumer = LitePullConsumer(GROUP, endpoint(broker), credentials=PRODUCER, auto_commit=False)
    consumer.subscribe(TOPIC)
    with pytest.raises(PermissionDeniedError, match="group 'billing'"):
        consumer.start()
    consumer.shutdown()
    assert Snapshot(broker) == before


def test_a_pub_only_account_cannot_pull_even_without_a_heartbeat(broker: EmbeddedBroker) -> None:
    fields = {"consumerGroup": GROUP, "topic": TOPIC, "queueId": "0", "queueOffset": "0",
              "maxMsgNums": "32", "sysFlag": "0", "commitOffset": "0",
              "suspendTimeoutMillis": "0", "subscription": "*", "subVersion": "0"}  # fmt: skip
    signed = signed_fields(fields, b"", PRODUCER.access_key, PRODUCER.secret_key)
    refused = raw(broker, RequestCode.PULL_MESSAGE, signed)
    assert refused.code == ResponseCode.SYSTEM_ERROR
    assert refused.remark is not None and "may not SUB topic 'orders'" in refused.remark
    allowed = signed_fields(fields, b"", CONSUMER.access_key, CONSUMER.secret_key)
    found = raw(broker, RequestCode.PULL_MESSAGE, allowed)
    assert found.code == ResponseCode.SUCCESS and found.body


def test_a_consumer_consumes_and_commits_in_its_group(broker: EmbeddedBroker) -> None:
    c = LitePullConsumer(GROUP, endpoint(broker), credentials=CONSUMER, auto_commit=False)
    c.subscribe(TOPIC)
    with c:
        got: list[MessageExt] = []
        wait_until(lambda: bool(got.extend(c.poll(0.2))) or len(got) >= 4, what="4 messages")
        c.commit()
    assert broker.broker.offsets.groups() == {GROUP}


def test_a_group_without_permission_locks_and_commits_nothing(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    consumer = LitePullConsumer("other", endpoint(broker), credentials=CONSUMER, orderly=True)
    consumer.subscribe(TOPIC)
    with pytest.raises(PermissionDeniedError, match="group 'other'"):
        consumer.start()
    consumer.shutdown()
    assert Snapshot(broker) == before


class _Orderly(MessageListenerOrderly):
    def __init__(self) -> None:
        self.got: list[bytes] = []

    def consume_message(self, msgs: list[MessageExt], context: object) -> ConsumeOrderlyStatus:
        self.got.extend(m.body for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS


def test_a_push_consumer_consumes_in_its_group(broker: EmbeddedBroker) -> None:
    listener = _Orderly()
    consumer = PushConsumer(GROUP, endpoint(broker), credentials=CONSUMER)
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    with consumer:
        wait_until(lambda: len(listener.got) >= 4, what="4 messages")
    assert sorted(listener.got) == [b"m0", b"m1", b"m2", b"m3"]


def test_a_push_consumer_in_a_group_it_may_not_use_fails_to_start(
    broker: EmbeddedBroker,
) -> None:
    before = Snapshot(broker)
    listener = _Orderly()
    consumer = PushConsumer("other", endpoint(broker), credentials=CONSUMER)
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    with pytest.raises(PermissionDeniedError, match="group 'other'"):
        consumer.start()
    consumer.shutdown()
    assert not listener.got
    assert Snapshot(broker) == before


# ---------------------------------------------------------------- admin
def test_a_non_admin_cannot_use_an_admin_request_code(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    fields = {"topic": "payments", "defaultTopic": "TBW102", "readQueueNums": "2",
              "writeQueueNums": "2", "perm": "6", "topicFilterType": "SINGLE_TAG"}  # fmt: skip
    signed = signed_fields(fields, b"", CONSUMER.access_key, CONSUMER.secret_key)
    refused = raw(broker, UPDATE_AND_CREATE_TOPIC, signed)
    assert refused.code == ResponseCode.SYSTEM_ERROR
    assert refused.remark is not None and refused.remark.startswith(ACL_EXCEPTION)
    assert "not an admin account" in refused.remark
    assert Snapshot(broker) == before


# ---------------------------------------------------------------- white addresses
def test_a_global_white_address_needs_no_credentials(tmp_path: Path) -> None:
    b = start(tmp_path, "globalWhiteRemoteAddresses:\n  - 127.0.0.*\n" + ACL)
    try:
        before = Snapshot(b)
        with Producer(endpoint(b)) as p:
            p.send(message())
        assert Snapshot(b).stored > before.stored
    finally:
        b.stop()


def test_a_global_white_address_elsewhere_lets_nobody_in(tmp_path: Path) -> None:
    b = start(tmp_path, "globalWhiteRemoteAddresses:\n  - 10.9.9.*\n" + ACL)
    try:
        before = Snapshot(b)
        with Producer(endpoint(b)) as p, pytest.raises(AuthenticationError):
            p.send(message())
        assert Snapshot(b) == before
    finally:
        b.stop()


def test_an_account_white_address_passes_without_checking_signature_or_permissions(
    broker: EmbeddedBroker,
) -> None:
    before = Snapshot(broker)
    local = Credentials("local-key", "not-its-secret")
    with Producer(endpoint(broker), credentials=local) as p:
        p.send(message())  # RocketMQ: the account's white address is a way in
    assert Snapshot(broker).stored > before.stored


# ---------------------------------------------------------------- the name server
def test_the_name_server_has_no_acl(broker: EmbeddedBroker) -> None:
    async def ask() -> RemotingCommand:
        assert broker.namesrv_address is not None
        client = await RemotingClient.connect(broker.namesrv_address)
        try:
            command = RemotingCommand(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, ext_fields={"topic": TOPIC}
            )
            return await client.request(command)
        finally:
            await client.close()

    assert asyncio.run(ask()).code == ResponseCode.SUCCESS


def test_only_an_admin_deletes_topics_and_groups(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    for code, fields in ((RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": TOPIC}),
                         (RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": GROUP}),
                         ):  # fmt: skip
        signed = signed_fields(fields, b"", CONSUMER.access_key, CONSUMER.secret_key)
        refused = raw(broker, code, signed)
        assert refused.code == ResponseCode.SYSTEM_ERROR
        assert refused.remark is not None and "not an admin account" in refused.remark
    assert Snapshot(broker) == before
    admin = {"topic": TOPIC}
    deleted = raw(broker, RequestCode.DELETE_TOPIC_IN_BROKER,
                  signed_fields(admin, b"", ADMIN.access_key, ADMIN.secret_key))  # fmt: skip
    assert deleted.code == ResponseCode.SUCCESS, deleted.remark
    assert broker.broker.store.topics.find(TOPIC) is None
