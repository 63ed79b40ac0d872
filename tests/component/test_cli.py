"""The `ordermq` admin command against an embedded broker, text and --json."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from click.testing import CliRunner, Result

from mockbroker import EmbeddedBroker
from sdk import Message, MessageQueue, Producer
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.cli import cli
from tests.component.pulling import read_queue


def run(broker: EmbeddedBroker, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--broker", broker.address, *args], catch_exceptions=False)


def run_json(broker: EmbeddedBroker, *args: str) -> Any:
    result = run(broker, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def client(broker: EmbeddedBroker, body: Any) -> Any:
    async def main() -> Any:
        c = BrokerClient(broker.address)
        try:
            return await body(c)
        finally:
            await c.close()

    return asyncio.run(main())


@pytest.fixture
def loaded(broker: EmbeddedBroker) -> EmbeddedBroker:
    with Producer(broker.address) as p:
        p.send_batch([Message("orders", b"order %d" % i, tags="paid", sharding_key=f"k{i % 4}")
                      for i in range(40)])  # fmt: skip
    return broker


def test_topics_create_list_describe(broker: EmbeddedBroker) -> None:
    created = run(broker, "topics", "create", "payments", "--queues", "4")
    assert created.exit_code == 0 and "created payments with 4 queues" in created.output
    assert run_json(broker, "topics", "create", "payments", "--queues", "4")["created"] is False
    listing = run(broker, "topics", "list")
    assert "payments" in listing.output and "4" in listing.output
    assert [t["topic"] for t in run_json(broker, "topics", "list")] == ["payments"]
    described = run_json(broker, "topics", "describe", "payments")
    assert [q["max_offset"] for q in described["queues"]] == [0, 0, 0, 0]
    assert "queue" in run(broker, "topics", "describe", "payments").output


def test_groups_list_and_describe_show_members_locks_and_lag(loaded: EmbeddedBroker) -> None:
    queues = run_json(loaded, "topics", "describe", "orders")["queues"]
    busy = next(q["queue_id"] for q in queues if q["max_offset"] > 0)

    async def consume(c: BrokerClient) -> None:
        await c.heartbeat("worker-1", [GroupInfo("billing", "CONSUME_ORDERLY",
                                                 subscriptions=(("orders", "*"),))])  # fmt: skip
        q = MessageQueue("orders", "broker-a", busy)
        epoch = (await c.lock_batch("billing", "worker-1", [q]))[q]
        await c.commit_offsets("billing", "worker-1", [(q, 1, epoch)])

    client(loaded, consume)
    groups = run_json(loaded, "groups", "list")
    assert groups == [{"group": "billing", "members": 1, "consume_type": "CONSUME_ORDERLY",
                       "message_model": "CLUSTERING", "topics": ["orders"]}]  # fmt: skip
    progress = run_json(loaded, "groups", "describe", "billing")
    row = next(q for q in progress["queues"] if q["queue"]["queue_id"] == busy)
    assert (row["consumer_offset"], row["lock_owner"]) == (1, "worker-1")
    assert row["lag"] == row["broker_max_offset"] - 1 and row["lock_epoch"] > 0
    text = run(loaded, "groups", "describe", "billing").output
    assert "worker-1" in text and "lock owner" in text


def test_offsets_reset_refuses_a_live_group_unless_forced(loaded: EmbeddedBroker) -> None:
    client(loaded, lambda c: c.heartbeat("w", [GroupInfo("billing", "CONSUME_POLL")]))
    refused = run(loaded, "offsets", "reset", "billing", "--topic", "orders", "--earliest")
    assert refused.exit_code == 1 and "live member" in refused.output
    forced = run_json(loaded, "offsets", "reset", "billing", "--topic", "orders", "--latest",
                      "--force")  # fmt: skip
    described = run_json(loaded, "topics", "describe", "orders")["queues"]
    assert [o["offset"] for o in forced["offsets"]] == [q["max_offset"] for q in described]
    by_time = run_json(loaded, "offsets", "reset", "billing", "--topic", "orders",
                       "--timestamp", "2000-01-01T00:00:00", "--force")  # fmt: skip
    assert all(o["offset"] == 0 for o in by_time["offsets"])
    usage = run(loaded, "offsets", "reset", "billing", "--topic", "orders")
    assert usage.exit_code == 2 and "exactly one" in usage.output


def test_messages_tail_prints_the_newest(loaded: EmbeddedBroker) -> None:
    out = run(loaded, "--json", "messages", "tail", "orders", "-n", "2").output
    rows = [json.loads(line) for line in out.splitlines()]
    assert rows and all(r["tags"] == "paid" for r in rows)
    per_queue: dict[int, list[int]] = {}
    for r in rows:
        per_queue.setdefault(r["queue"], []).append(r["offset"])
    assert all(len(v) <= 2 and v == sorted(v) for v in per_queue.values())
    assert "order" in run(loaded, "messages", "tail", "orders", "-n", "1").output


def test_dlq_list_and_resend_each_message_once(loaded: EmbeddedBroker) -> None:
    async def dead_letter(c: BrokerClient) -> None:
        await c.heartbeat("w", [GroupInfo("billing", "CONSUME_ORDERLY")])
        for q in range(8):
            mq = MessageQueue("orders", "broker-a", q)
            _low, high, _ = await c.queue_offsets(mq)
            if high:
                await c.send_back("billing", mq, 0, max_reconsume_times=1, reconsume_times=1)
                return

    client(loaded, dead_letter)
    [dead] = run_json(loaded, "dlq", "list", "billing")
    assert dead["properties"]["ORIGIN_TOPIC"] == "orders"
    assert "orders" in run(loaded, "dlq", "list", "billing").output
    assert run_json(loaded, "dlq", "resend", "billing") == {"resent": 1}
    assert run_json(loaded, "dlq", "list", "billing") == [], "resent ones are not listed again"
    assert run_json(loaded, "dlq", "resend", "billing") == {"resent": 0}
    copies = [
        m
        for q in range(8)
        for m in read_queue(loaded.address, MessageQueue("orders", "broker-a", q))
        if m.body == dead["body"].encode()
    ]
    assert len(copies) == 2, "the original and its resent copy"


def test_broker_status_and_errors(loaded: EmbeddedBroker) -> None:
    status = run_json(loaded, "broker", "status")
    assert status["messages_stored"] == 40 and status["flush_mode"] == "async"
    assert {"messages_in_per_second", "messages_out_per_second", "uptime_ms"} <= set(status)
    assert "messages_stored" in run(loaded, "broker", "status").output
    missing = run(loaded, "topics", "describe", "nosuch")
    assert missing.exit_code == 1
    assert missing.output.strip().splitlines() == [
        "Error: TOPIC_NOT_FOUND: topic 'nosuch' does not exist"
    ]


def test_messages_get_by_id_and_find_by_key(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        first = p.send(Message("orders", b"first", keys=["order-7", "cust-1"]))
        p.send(Message("orders", b"second", keys="order-7"))
        p.send(Message("orders", b"other", keys="order-8"))
        p.send(Message("audit", b"same key, other topic", keys="order-7"))
    [got] = run_json(broker, "messages", "get", first.msg_id)
    assert (got["body"], got["msg_id"], got["keys"]) == (
        "first",
        first.msg_id,
        ["order-7", "cust-1"],
    )
    assert "first" in run(broker, "messages", "get", first.msg_id).output
    found = run_json(broker, "messages", "find", "orders", "order-7")
    assert [m["body"] for m in found] == ["second", "first"], "newest first, this topic only"
    assert [m["body"] for m in run_json(broker, "messages", "find", "orders", "cust-1")] == [
        "first"
    ]
    assert run_json(broker, "messages", "find", "orders", "nobody") == []
    missing = run(broker, "messages", "get", "AB" * 16)
    assert missing.exit_code == 1 and "MESSAGE_NOT_FOUND" in missing.output
    bad = run(broker, "messages", "get", "xyz")
    assert bad.exit_code == 1 and "hexadecimal" in bad.output


def test_get_by_id_shows_a_message_and_its_dead_letter_copy(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        sent = p.send(Message("orders", b"poison", keys="k"))

    async def dead_letter(c: BrokerClient) -> None:
        await c.heartbeat("w", [GroupInfo("g", "CONSUME_ORDERLY")])
        await c.send_back("g", sent.queue, sent.queue_offset, max_reconsume_times=1,
                          reconsume_times=1)  # fmt: skip

    client(broker, dead_letter)
    copies = run_json(broker, "messages", "get", sent.msg_id)
    assert [m["topic"] for m in copies] == ["%DLQ%g", "orders"]
