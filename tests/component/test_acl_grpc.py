"""Accounts and permissions on ordermq's gRPC and admin service (the broker's --acl-file).

Each refusal is checked for its error type and for what it left alone: nothing stored,
no lock taken, no offset moved (`Snapshot`). The ACL file is written by each test.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner, Result

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.__main__ import main as broker_main
from mockbroker.acl import AclFileError
from sdk import (
    ConsumeOrderlyStatus,
    Credentials,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageListenerOrderly,
    MessageQueue,
    Producer,
    PushConsumer,
    aio,
)
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.broker_client import BrokerClient
from sdk.cli import cli
from sdk.credentials import signed_metadata
from sdk.errors import (
    AuthenticationError,
    InvalidArgumentError,
    PermissionDeniedError,
)
from sdk.testing import FakeClock
from tests.support import wait_until

TOPIC = "orders"
GROUP = "billing"

PRODUCER = Credentials("producer-key", "producer-secret")  # PUB on orders only
CONSUMER = Credentials("consumer-key", "consumer-secret")  # SUB on orders, SUB on billing
ADMIN = Credentials("admin-key01", "admin-secret")
LOCAL = Credentials("local-key", "local-secret")  # white from 127.0.0.1, DENY everything

ACL = """\
accounts:
  - accessKey: producer-key
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - orders=PUB
  - accessKey: consumer-key
    secretKey: consumer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - orders=SUB
    groupPerms:
      - billing=SUB
  - accessKey: admin-key01
    secretKey: admin-secret
    admin: true
  - accessKey: local-key
    secretKey: local-secret
    whiteRemoteAddress: 127.0.0.1
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
"""


def acl_file(path: Path, text: str = ACL) -> Path:
    path.write_text(text)
    return path


def start(tmp_path: Path, text: str = ACL, clock: FakeClock | None = None) -> EmbeddedBroker:
    config = BrokerConfig(
        data_dir=tmp_path / "data", acl_file=acl_file(tmp_path / "plain_acl.yml", text),
        acl_reload_seconds=0.1,
    )  # fmt: skip
    broker = EmbeddedBroker(config, clock=clock)
    broker.start()
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    b = start(tmp_path)
    try:
        with Producer(b.address, credentials=ADMIN) as p:  # 4 messages to consume
            p.send_batch([Message(TOPIC, b"m%d" % i, sharding_key=f"k{i}") for i in range(4)])
        yield b
    finally:
        b.stop()


class Snapshot:
    """What a refused request must not change: stored messages, locks, offsets, topics."""

    def __init__(self, b: EmbeddedBroker) -> None:
        broker = b.broker
        state = broker.state
        assert state is not None
        self.topics = sorted((t.name, t.queue_count) for t in broker.store.topics.all())
        self.stored = broker.store.commitlog.total_bytes()
        self.offsets = {k: broker.offsets.get(*k) for k in broker.offsets.committed()}
        self.locks = {g: state.locks.locks(g) for g in (GROUP, "other")}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Snapshot) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return repr(vars(self))


def message() -> Message:
    return Message(TOPIC, b"payload", sharding_key="k1")


def cli_run(b: EmbeddedBroker, creds: Credentials | None, *args: str) -> Result:
    keys = ["--access-key", creds.access_key, "--secret-key", creds.secret_key] if creds else []
    return CliRunner().invoke(cli, ["--broker", b.address, *keys, *args], catch_exceptions=False)


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
    with Producer(broker.address, credentials=creds) as p, pytest.raises(AuthenticationError) as e:
        p.send(message())
    assert e.value.reason == "UNAUTHENTICATED" and not e.value.retriable
    assert "secret" not in str(e.value).replace("secret key", "")  # no secret in the message
    assert Snapshot(broker) == before


@pytest.mark.parametrize("skew", [+400.0, -400.0], ids=["expired", "from-the-future"])
def test_a_date_outside_the_window_is_refused(tmp_path: Path, skew: float) -> None:
    clock = FakeClock(start=time.time() + skew)
    b = start(tmp_path, clock=clock)
    try:
        before = Snapshot(b)
        with (
            Producer(b.address, credentials=PRODUCER) as p,
            pytest.raises(AuthenticationError, match="outside its window of 300s"),
        ):
            p.send(message())
        assert Snapshot(b) == before
    finally:
        b.stop()


def test_a_replayed_request_is_refused_once_its_date_is_past_the_window(tmp_path: Path) -> None:
    clock = FakeClock(start=time.time())
    b = start(tmp_path, clock=clock)
    try:
        request = pb.CreateTopicRequest(topic="replayed", queue_count=2)
        path = "/ordermq.v1.AdminService/CreateTopic"
        metadata = signed_metadata(
            ADMIN, path, int(clock.now() * 1000), request.SerializeToString(deterministic=True)
        )
        with grpc.insecure_channel(b.address) as channel:
            stub = pb_grpc.AdminServiceStub(channel)
            stub.CreateTopic(request, metadata=metadata, timeout=5)  # signed now: served
            other = pb.CreateTopicRequest(topic="tampered", queue_count=2)
            with pytest.raises(grpc.RpcError) as e:  # same signature, another request
                stub.CreateTopic(other, metadata=metadata, timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "signature does not match" in (e.value.details() or "")
            clock.advance(301)
            with pytest.raises(grpc.RpcError) as e:
                stub.CreateTopic(request, metadata=metadata, timeout=5)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "replayed" in (e.value.details() or "")
        assert b.broker.store.topics.find("tampered") is None
    finally:
        b.stop()


# ---------------------------------------------------------------- what: permissions
def test_a_publisher_sends_to_its_topic(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    with Producer(broker.address, credentials=PRODUCER) as p:
        p.send(message())
    assert Snapshot(broker).stored > before.stored


def test_a_sub_only_account_cannot_send_on_the_exchange_stream(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    # Its route lookup (unary) passes; the send, on the Exchange stream, is refused.
    with (
        Producer(broker.address, credentials=CONSUMER) as p,
        pytest.raises(PermissionDeniedError) as e,
    ):
        p.send(message())
    assert "'consumer-key'" in str(e.value) and "PUB" in str(e.value)
    assert "topic 'orders'" in str(e.value) and not e.value.retriable
    assert Snapshot(broker) == before


def test_a_pub_only_account_cannot_pull(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    consumer = LitePullConsumer(GROUP, broker.address, credentials=PRODUCER, auto_commit=False)
    consumer.subscribe(TOPIC)
    with pytest.raises(PermissionDeniedError, match="group 'billing'"):
        consumer.start()
    consumer.shutdown()
    assert Snapshot(broker) == before


def test_a_push_subscription_needs_pull_permissions(broker: EmbeddedBroker) -> None:
    queue = MessageQueue(TOPIC, "broker-a", 0)
    messaging = broker.broker._messaging
    assert messaging is not None

    async def subscribe(credentials: Credentials) -> None:
        client = BrokerClient(broker.address, credentials=credentials)
        try:
            sub = await client.subscribe(
                GROUP, queue, 0, client_id="c", lock_epoch=0, credit_messages=10,
                credit_bytes=1 << 20,
            )  # fmt: skip
            if credentials is PRODUCER:
                async with asyncio.timeout(10):
                    await sub.next()  # its refusal
            await asyncio.to_thread(
                wait_until, lambda: len(messaging.exchanges.subscriptions) == 1, 10, "served"
            )
            sub.close()
        finally:
            await client.close()

    with pytest.raises(PermissionDeniedError, match="may not SUB topic 'orders'"):
        asyncio.run(subscribe(PRODUCER))
    asyncio.run(subscribe(CONSUMER))


def test_a_consumer_consumes_and_commits_in_its_group(broker: EmbeddedBroker) -> None:
    c = LitePullConsumer(GROUP, broker.address, credentials=CONSUMER, auto_commit=False)
    c.subscribe(TOPIC)
    with c:
        got: list[MessageExt] = []
        wait_until(lambda: bool(got.extend(c.poll(0.2))) or len(got) >= 4, what="4 messages")
        c.commit()
    assert broker.broker.offsets.groups() == {GROUP}


def test_a_group_without_permission_locks_and_commits_nothing(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    consumer = LitePullConsumer("other", broker.address, credentials=CONSUMER, orderly=True)
    consumer.subscribe(TOPIC)
    with pytest.raises(PermissionDeniedError, match="group 'other'"):
        consumer.start()
    consumer.shutdown()
    assert Snapshot(broker) == before


def test_a_push_consumer_in_a_group_it_may_not_use_fails_to_start(
    broker: EmbeddedBroker,
) -> None:
    class Listener(MessageListenerOrderly):
        def consume_message(self, msgs: list[MessageExt], context: object) -> ConsumeOrderlyStatus:
            raise AssertionError("nothing is delivered to a refused group")

    before = Snapshot(broker)
    consumer = PushConsumer("other", broker.address, credentials=CONSUMER)
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(Listener())
    with pytest.raises(PermissionDeniedError, match="group 'other'"):
        consumer.start()
    consumer.shutdown()
    assert Snapshot(broker) == before


def test_a_push_consumer_whose_permission_is_revoked_logs_it_and_backs_off(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Listener(MessageListenerOrderly):
        def consume_message(self, msgs: list[MessageExt], context: object) -> ConsumeOrderlyStatus:
            return ConsumeOrderlyStatus.SUCCESS

    b = start(tmp_path)
    try:
        with Producer(b.address, credentials=ADMIN) as p:
            p.send(message())
        consumer = PushConsumer(GROUP, b.address, credentials=CONSUMER)
        consumer.subscribe(TOPIC)
        consumer.register_message_listener(Listener())
        with caplog.at_level(logging.WARNING, logger="ordermq.consumer"), consumer:
            state = b.broker.state
            assert state is not None
            wait_until(lambda: bool(state.locks.locks(GROUP)), what="the consumer's locks")
            acl_file(tmp_path / "plain_acl.yml", ACL.replace("orders=SUB", "orders=DENY"))

            def refused() -> int:
                by_code = state.requests.by_code
                return sum(n for (_, code), n in by_code.items() if code == "PERMISSION_DENIED")

            wait_until(lambda: refused() > 0, what="a refused request")
            first = refused()
            time.sleep(2)
            assert refused() - first < 40, "the consumer retries refusals without backing off"
        assert "may not SUB topic 'orders'" in caplog.text
    finally:
        b.stop()


# ---------------------------------------------------------------- admin
def test_a_non_admin_cannot_create_topics_or_reset_offsets(broker: EmbeddedBroker) -> None:
    before = Snapshot(broker)
    created = cli_run(broker, CONSUMER, "topics", "create", "payments", "--queues", "2")
    assert created.exit_code != 0 and "PERMISSION_DENIED" in created.output
    assert "not an admin account" in created.output
    reset = cli_run(broker, CONSUMER, "offsets", "reset", GROUP, "--topic", TOPIC, "--latest")
    assert reset.exit_code != 0 and "PERMISSION_DENIED" in reset.output
    for kind, name in (("topics", TOPIC), ("groups", GROUP)):
        deleted = cli_run(broker, CONSUMER, kind, "delete", name, "--force", "--yes")
        assert deleted.exit_code != 0 and "not an admin account" in deleted.output
    assert Snapshot(broker) == before


def test_the_cli_without_credentials_is_unauthenticated(broker: EmbeddedBroker) -> None:
    listed = cli_run(broker, None, "topics", "list")
    assert listed.exit_code != 0 and "UNAUTHENTICATED" in listed.output


def test_an_admin_creates_topics_and_resets_offsets(broker: EmbeddedBroker) -> None:
    created = cli_run(broker, ADMIN, "topics", "create", "payments", "--queues", "2")
    assert created.exit_code == 0, created.output
    assert broker.broker.store.topics.find("payments") is not None
    reset = cli_run(broker, ADMIN, "offsets", "reset", GROUP, "--topic", TOPIC, "--latest")
    assert reset.exit_code == 0, reset.output
    assert broker.broker.offsets.groups() == {GROUP}


def test_a_known_non_admin_account_may_list_and_describe(broker: EmbeddedBroker) -> None:
    described = cli_run(broker, PRODUCER, "topics", "describe", TOPIC)
    assert described.exit_code == 0, described.output


def test_the_cli_takes_credentials_from_the_environment(broker: EmbeddedBroker) -> None:
    env = {"ORDERMQ_ACCESS_KEY": ADMIN.access_key, "ORDERMQ_SECRET_KEY": ADMIN.secret_key}
    result = CliRunner().invoke(cli, ["--broker", broker.address, "topics", "list"], env=env)
    assert result.exit_code == 0, result.output
    half = CliRunner().invoke(
        cli, ["--broker", broker.address, "--access-key", "a" * 8, "topics", "list"], env={}
    )
    assert half.exit_code == 2 and "go together" in half.output


# ---------------------------------------------------------------- white addresses
def test_a_global_white_address_needs_no_credentials(tmp_path: Path) -> None:
    b = start(tmp_path, "globalWhiteRemoteAddresses:\n  - 127.0.0.*\n" + ACL)
    try:
        with Producer(b.address) as p:
            p.send(message())
        assert b.broker.store.topics.find(TOPIC) is not None
    finally:
        b.stop()


def test_an_account_white_address_passes_without_checking_signature_or_permissions(
    broker: EmbeddedBroker,
) -> None:
    before = Snapshot(broker)
    with Producer(broker.address, credentials=Credentials("local-key", "not-its-secret")) as p:
        p.send(message())  # RocketMQ: the account's white address is a way in
    assert Snapshot(broker).stored > before.stored


# ---------------------------------------------------------------- the file
def test_a_changed_file_puts_its_new_rules_in_force(tmp_path: Path) -> None:
    b = start(tmp_path)
    try:
        with Producer(b.address, credentials=CONSUMER) as p:
            with pytest.raises(PermissionDeniedError):
                p.send(message())
            acl_file(tmp_path / "plain_acl.yml", ACL.replace("orders=SUB", "orders=PUB|SUB"))
            sent: list[object] = []

            def sends() -> bool:
                try:
                    sent.append(p.send(message()))
                except PermissionDeniedError:
                    return False
                return True

            wait_until(sends, what="the reloaded rules")
            assert b.broker.acl is not None and b.broker.acl.rules.accounts
    finally:
        b.stop()


def test_a_bad_file_refuses_to_start_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = ACL.replace("orders=PUB\n", "orders=PUBLISH\n")
    with pytest.raises(AclFileError, match=r"plain_acl\.yml:7: .*PUBLISH"):
        start(tmp_path, bad)
    assert not (tmp_path / "data" / "commitlog").exists()  # refused before the store opened
    with pytest.raises(SystemExit) as exited:
        broker_main(["--data-dir", str(tmp_path / "cli"), "--port", "0",
                     "--acl-file", str(tmp_path / "plain_acl.yml")])  # fmt: skip
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "plain_acl.yml:7:" in err[0] and "PUBLISH" in err[0], err


def test_without_an_acl_file_nothing_is_asked(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data")) as b, Producer(b.address) as p:
        p.send(message())


# ---------------------------------------------------------------- the client side
def test_credentials_hide_the_secret_and_refuse_bad_input() -> None:
    creds = Credentials("access-key", "the-secret-key")
    assert "the-secret-key" not in repr(creds) and "access-key" in repr(creds)
    with pytest.raises(InvalidArgumentError, match="access_key must be non-empty"):
        Credentials("", "the-secret-key")
    with pytest.raises(InvalidArgumentError, match="secret_key must be a str"):
        Credentials("access-key", None)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match=r"credentials must be an sdk\.Credentials"):
        Producer("127.0.0.1:1", credentials=("a", "b"))  # type: ignore[arg-type]


def test_the_asyncio_clients_sign_too(broker: EmbeddedBroker) -> None:
    async def main() -> None:
        async with aio.Producer(broker.address, credentials=PRODUCER) as p:
            await p.send(message())
        async with aio.Producer(broker.address, credentials=CONSUMER) as p:
            with pytest.raises(PermissionDeniedError):
                await p.send(message())
        consumer = aio.LitePullConsumer(GROUP, broker.address, credentials=PRODUCER)
        consumer.subscribe(TOPIC)
        with pytest.raises(PermissionDeniedError):
            await consumer.start()
        await consumer.shutdown()

    before = Snapshot(broker)
    asyncio.run(main())
    assert Snapshot(broker).stored > before.stored
