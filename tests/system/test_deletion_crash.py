"""A broker killed in the middle of a topic's deletion: after the restart the topic is
gone for good, its queue files and offsets with it, and every other message is there."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from sdk import Message, MessageQueue, Producer
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import OrderMQError
from tests.component.pulling import read_topic
from tests.support import BrokerProcess

pytestmark = [pytest.mark.system, pytest.mark.chaos]


def call(address: str, body: Any) -> Any:
    async def main() -> Any:
        c = BrokerClient(address)
        try:
            return await body(c)
        finally:
            await c.close()

    return asyncio.run(main())


async def commit(c: BrokerClient) -> None:
    await c.heartbeat("committer", [GroupInfo("billing", "CONSUME_ORDERLY")])
    q = MessageQueue("orders", "broker-a", 0)
    epoch = (await c.lock_batch("billing", "committer", [q]))[q]
    await c.commit_offsets("billing", "committer", [(q, 0, epoch)])
    await c.unlock_batch("billing", "committer", [q])
    await c.unregister("committer")


def test_kill_9_once_the_deletion_is_registered_leaves_it_whole_after_the_restart(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path, env={"ORDERMQ_FAULT_POINT": "topic-delete-registered"})
    address = broker.start()
    with Producer(address) as p:
        p.fetch_publish_message_queues("orders")
        p.send_batch([Message("orders", b"old-%d" % i, sharding_key="a") for i in range(20)])
        kept = {p.send(Message("kept", b"kept-%d" % i)).msg_id for i in range(20)}
    call(address, commit)
    assert (tmp_path / "consumequeue" / "orders").exists()
    with pytest.raises(OrderMQError):
        call(address, lambda c: c.delete_topic("orders"))
    assert broker.proc is not None and broker.proc.wait(30) == -9
    assert (tmp_path / "consumequeue" / "orders").exists(), "killed before the files went"
    (tmp_path / "checkpoint").unlink(missing_ok=True)  # recovery replays the whole log

    restarted = BrokerProcess(tmp_path)
    address = restarted.start()
    try:
        assert not (tmp_path / "consumequeue" / "orders").exists()
        assert {m.msg_id for m in read_topic(address, "kept")} == kept
        listed = call(address, lambda c: c.admin("ListTopics"))
        assert "orders" not in [t["topic"] for t in listed["topics"]]
        call(address, lambda c: c.create_topic("orders", 8))
        assert read_topic(address, "orders") == [], "created again: empty"
        progress = call(address, lambda c: c.admin("ListGroups"))["groups"]
        assert "billing" not in [g["group"] for g in progress], "its only offsets went"
    finally:
        assert restarted.terminate() == 0, restarted.stderr()
