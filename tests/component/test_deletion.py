"""Deleting topics and groups: `ordermq topics delete` / `groups delete` (AdminService)
and RocketMQ's DELETE_TOPIC_IN_BROKER / DELETE_SUBSCRIPTIONGROUP on the remoting front."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageQueue, Producer
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import (
    GroupHasMembersError,
    InvalidTopicError,
    SystemTopicError,
    TopicNotFoundError,
)
from sdk.testing import FakeClock
from tests.component.admin_cli import client, run, run_json
from tests.component.pulling import read_queue
from tests.remoting_client import RemotingClient
from tests.support import wait_until


def join(broker: EmbeddedBroker, member: str, group: str, topic: str = "orders") -> None:
    info = GroupInfo(group, "CONSUME_ORDERLY", subscriptions=((topic, "*"),))
    client(broker, lambda c: c.heartbeat(member, [info]))


def leave(broker: EmbeddedBroker, member: str) -> None:
    client(broker, lambda c: c.unregister(member))


def commit(broker: EmbeddedBroker, group: str, queue_id: int, offset: int) -> None:
    async def body(c: BrokerClient) -> None:
        await c.heartbeat("committer", [GroupInfo(group, "CONSUME_ORDERLY")])
        q = MessageQueue("orders", "broker-a", queue_id)
        epoch = (await c.lock_batch(group, "committer", [q]))[q]
        await c.commit_offsets(group, "committer", [(q, offset, epoch)])
        await c.unlock_batch(group, "committer", [q])
        await c.unregister("committer")

    client(broker, body)


def fail(broker: EmbeddedBroker, group: str) -> None:
    """A message of `group` retried, another dead-lettered: its own two topics exist."""
    q = MessageQueue("orders", "broker-a", 0)

    async def body(c: BrokerClient) -> None:
        await c.heartbeat("failer", [GroupInfo(group, "CONSUME_CONCURRENTLY")])
        retried = await c.send_back(group, q, 0, max_reconsume_times=16)
        dead = await c.send_back(group, q, 1, max_reconsume_times=1, reconsume_times=1)
        assert (retried.dead_letter, dead.dead_letter) == (False, True)
        await c.unregister("failer")

    client(broker, body)


def send(broker: EmbeddedBroker, *bodies: bytes) -> list[str]:
    with Producer(broker.address) as p:
        return [p.send(Message("orders", b, keys=["k"], sharding_key="s")).msg_id for b in bodies]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "broker"


@pytest.fixture
def loaded(data_dir: Path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=data_dir, remoting_port=0)) as b:
        assert run(b, "topics", "create", "orders", "--queues", "1").exit_code == 0
        send(b, b"old-0", b"old-1", b"old-2")
        yield b


def described(broker: EmbeddedBroker) -> list[tuple[int, int]]:
    queues = run_json(broker, "topics", "describe", "orders")["queues"]
    return [(q["min_offset"], q["max_offset"]) for q in queues]


def test_a_topic_with_live_subscribers_is_kept_unless_forced(loaded: EmbeddedBroker) -> None:
    commit(loaded, "billing", 0, 2)
    join(loaded, "worker-1", "billing")
    refused = run(loaded, "topics", "delete", "orders", "--yes")
    assert refused.exit_code == 1
    assert "GROUP_HAS_MEMBERS" in refused.output and "billing (1 member)" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    with pytest.raises(GroupHasMembersError):
        client(loaded, lambda c: c.delete_topic("orders"))
    assert described(loaded) == [(0, 3)], "nothing changed"
    progress = run_json(loaded, "groups", "describe", "billing", "--topic", "orders")
    assert [q["consumer_offset"] for q in progress["queues"]] == [2]

    forced = run_json(loaded, "topics", "delete", "orders", "--force", "--yes")
    assert forced == {"topic": "orders", "queue_count": 1, "groups": ["billing"]}
    assert run_json(loaded, "topics", "list") == []


def test_a_deleted_topics_messages_are_never_served_again_even_to_one_created_again(
    loaded: EmbeddedBroker,
) -> None:
    [old_id] = send(loaded, b"old-3")
    commit(loaded, "billing", 0, 4)
    text = run(loaded, "topics", "delete", "orders", "--yes")
    assert text.exit_code == 0, text.output
    assert "deleted orders (1 queues; offsets of groups: billing)" in text.output
    missing = run(loaded, "topics", "describe", "orders")
    assert missing.exit_code == 1 and "TOPIC_NOT_FOUND" in missing.output

    assert run(loaded, "topics", "create", "orders", "--queues", "1").exit_code == 0
    assert described(loaded) == [(0, 0)], "created again: empty, from offset 0"
    send(loaded, b"new-0")
    got = read_queue(loaded.address, MessageQueue("orders", "broker-a", 0), 0)
    assert [m.body for m in got] == [b"new-0"]
    gone = run(loaded, "messages", "get", old_id)
    assert gone.exit_code == 1 and "MESSAGE_NOT_FOUND" in gone.output
    found = run_json(loaded, "messages", "find", "orders", "k")
    assert [m["body"] for m in found] == ["new-0"]
    no_offsets = run(loaded, "groups", "describe", "billing")
    assert "GROUP_NOT_FOUND" in no_offsets.output, "its only offsets were the topic's"


def test_deletion_asks_first_and_a_no_changes_nothing(loaded: EmbeddedBroker) -> None:
    declined = run(loaded, "topics", "delete", "orders", answer="n\n")
    assert declined.exit_code == 1 and "Delete topic orders" in declined.output
    assert described(loaded) == [(0, 3)]
    accepted = run(loaded, "topics", "delete", "orders", answer="y\n")
    assert accepted.exit_code == 0 and "deleted orders" in accepted.output


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("%RETRY%billing", "SYSTEM_TOPIC"),
        ("%DLQ%billing", "SYSTEM_TOPIC"),
        ("rmq_sys_SCHEDULE", "SYSTEM_TOPIC"),
        ("TBW102", "SYSTEM_TOPIC"),
        ("bad name", "INVALID_TOPIC"),
        ("missing", "TOPIC_NOT_FOUND"),
    ],
)
def test_system_topics_bad_names_and_missing_topics_are_refused(
    loaded: EmbeddedBroker, name: str, reason: str
) -> None:
    fail(loaded, "billing")  # its retry and dead-letter topics exist
    before = run_json(loaded, "topics", "list", "--system")
    refused = run(loaded, "topics", "delete", name, "--yes", "--force")
    assert refused.exit_code == 1 and reason in refused.output
    raised = {"SYSTEM_TOPIC": SystemTopicError, "INVALID_TOPIC": InvalidTopicError,
              "TOPIC_NOT_FOUND": TopicNotFoundError}[reason]  # fmt: skip
    with pytest.raises(raised):
        client(loaded, lambda c: c.delete_topic(name, force=True))
    assert run_json(loaded, "topics", "list", "--system") == before


def test_a_group_with_members_is_kept_unless_forced_then_goes_with_its_own_topics(
    loaded: EmbeddedBroker,
) -> None:
    commit(loaded, "billing", 0, 2)
    commit(loaded, "audit", 0, 1)
    join(loaded, "worker-1", "billing")
    fail(loaded, "billing")
    topics = {t["topic"] for t in run_json(loaded, "topics", "list", "--system")}
    assert {"%RETRY%billing", "%DLQ%billing"} <= topics

    refused = run(loaded, "groups", "delete", "billing", "--yes")
    assert refused.exit_code == 1 and "GROUP_HAS_MEMBERS" in refused.output
    assert "worker-1" in refused.output
    with pytest.raises(GroupHasMembersError):
        client(loaded, lambda c: c.delete_group("billing"))
    progress = run_json(loaded, "groups", "describe", "billing", "--topic", "orders")
    assert [q["consumer_offset"] for q in progress["queues"]] == [2]

    forced = run_json(loaded, "groups", "delete", "billing", "--force", "--yes")
    own = ["%RETRY%billing", "%DLQ%billing"]
    assert forced == {"group": "billing", "topics": ["orders"], "deleted_topics": own, "members": 1}
    leave(loaded, "worker-1")
    gone = run(loaded, "groups", "describe", "billing")
    assert gone.exit_code == 1 and "GROUP_NOT_FOUND" in gone.output
    topics = {t["topic"] for t in run_json(loaded, "topics", "list", "--system")}
    assert "%RETRY%billing" not in topics and "%DLQ%billing" not in topics
    assert "orders" in topics
    kept = run_json(loaded, "groups", "describe", "audit", "--topic", "orders")
    assert [q["consumer_offset"] for q in kept["queues"]] == [1], "other groups untouched"
    assert described(loaded) == [(0, 3)], "its topics' messages untouched"


@pytest.mark.parametrize(("name", "reason"), [("bad name", "INVALID_GROUP"),
                                              ("nobody", "GROUP_NOT_FOUND")])  # fmt: skip
def test_bad_and_unknown_groups_are_refused(loaded: EmbeddedBroker, name: str, reason: str) -> None:
    refused = run(loaded, "groups", "delete", name, "--yes")
    assert refused.exit_code == 1 and reason in refused.output


def test_deletion_survives_a_restart(data_dir: Path) -> None:
    config = BrokerConfig(data_dir=data_dir)
    with EmbeddedBroker(config) as broker:
        run(broker, "topics", "create", "orders", "--queues", "1")
        send(broker, b"old-0", b"old-1")
        commit(broker, "billing", 0, 2)
        fail(broker, "billing")
        assert run(broker, "topics", "delete", "orders", "--yes").exit_code == 0
        assert run(broker, "groups", "delete", "billing", "--yes").exit_code == 0
    with EmbeddedBroker(config) as broker:
        topics = {t["topic"] for t in run_json(broker, "topics", "list", "--system")}
        assert "orders" not in topics and "%RETRY%billing" not in topics
        assert "GROUP_NOT_FOUND" in run(broker, "groups", "describe", "billing").output
        run(broker, "topics", "create", "orders", "--queues", "1")
        assert described(broker) == [(0, 0)]


def remoting(broker: EmbeddedBroker, code: int, **fields: str) -> RemotingCommand:
    assert broker.remoting_address is not None

    async def ask() -> RemotingCommand:
        c = await RemotingClient.connect(broker.remoting_address or "")
        try:
            return await c.request(RemotingCommand(code, ext_fields=fields))
        finally:
            await c.close()

    return asyncio.run(ask())


def test_rocketmq_deletion_codes_on_the_remoting_front(loaded: EmbeddedBroker) -> None:
    commit(loaded, "billing", 0, 2)
    join(loaded, "worker-1", "billing")
    refused = remoting(loaded, RequestCode.DELETE_TOPIC_IN_BROKER, topic="orders")
    assert refused.code == ResponseCode.SYSTEM_ERROR and "live consumers" in refused.remark
    assert described(loaded) == [(0, 3)]
    system = remoting(loaded, RequestCode.DELETE_TOPIC_IN_BROKER, topic="%RETRY%billing")
    assert system.code == ResponseCode.SYSTEM_ERROR and "broker's own" in system.remark
    missing = remoting(loaded, RequestCode.DELETE_TOPIC_IN_BROKER, topic="nope")
    assert missing.code == ResponseCode.TOPIC_NOT_EXIST

    kept = remoting(loaded, RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="billing",
                    cleanOffset="true")  # fmt: skip
    assert kept.code == ResponseCode.SYSTEM_ERROR and "live member" in kept.remark
    group = remoting(loaded, RequestCode.DELETE_SUBSCRIPTIONGROUP, groupName="billing",
                     cleanOffset="true", force="true")  # fmt: skip
    assert group.code == ResponseCode.SUCCESS, group.remark
    leave(loaded, "worker-1")
    assert "GROUP_NOT_FOUND" in run(loaded, "groups", "describe", "billing").output
    deleted = remoting(loaded, RequestCode.DELETE_TOPIC_IN_BROKER, topic="orders")
    assert deleted.code == ResponseCode.SUCCESS, deleted.remark
    assert run_json(loaded, "topics", "list") == []


def test_messages_scheduled_for_a_deleted_topic_are_cancelled_and_others_still_delivered(
    data_dir: Path,
) -> None:
    clock = FakeClock()
    with EmbeddedBroker(BrokerConfig(data_dir=data_dir), clock=clock) as broker:
        run(broker, "topics", "create", "orders", "--queues", "1")
        run(broker, "topics", "create", "payments", "--queues", "1")
        with Producer(broker.address, clock=clock) as p:
            p.send(Message("orders", b"late order", delay_seconds=1))
            p.send(Message("payments", b"late payment", delay_seconds=1))
        assert run(broker, "topics", "delete", "orders", "--yes").exit_code == 0
        run(broker, "topics", "create", "orders", "--queues", "1")
        clock.advance(1.1)
        payments = MessageQueue("payments", "broker-a", 0)
        wait_until(lambda: [m.body for m in read_queue(broker.address, payments, 0)] != [])
        assert [m.body for m in read_queue(broker.address, payments, 0)] == [b"late payment"]
        assert described(broker) == [(0, 0)], "the deleted topic's never reaches the new one"


def test_a_receiving_groups_state_goes_with_the_topic_and_stays_gone_after_a_restart(
    data_dir: Path,
) -> None:
    config = BrokerConfig(data_dir=data_dir)
    with EmbeddedBroker(config) as broker:
        run(broker, "topics", "create", "orders", "--queues", "1")
        run(broker, "topics", "create", "payments", "--queues", "1")
        send(broker, b"order")
        with Producer(broker.address) as p:
            p.send(Message("payments", b"payment"))

        async def take(c: BrokerClient) -> int:
            total = 0
            for topic in ("orders", "payments"):
                got = await c.receive("poppers", topic, [0], "broker-a", max_messages=1,
                                      invisible_duration=60, await_duration=0)  # fmt: skip
                total += len(got)
            return total

        assert client(broker, take) == 2
        listed = [g["group"] for g in run_json(broker, "groups", "list")]
        assert "poppers" in listed, "its receives hold state on both topics"
        assert run(broker, "topics", "delete", "orders", "--yes").exit_code == 0
        assert run(broker, "topics", "delete", "payments", "--yes").exit_code == 0
        assert "poppers" not in [g["group"] for g in run_json(broker, "groups", "list")]
    with EmbeddedBroker(config) as broker:
        assert "poppers" not in [g["group"] for g in run_json(broker, "groups", "list")]
