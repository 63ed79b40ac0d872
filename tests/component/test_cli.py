"""The `ordermq` admin command against an embedded broker, text and --json."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageQueue, Producer
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.testing import FakeClock
from tests.component.admin_cli import client, run, run_json
from tests.component.pulling import read_queue
from tests.support import ROOT, wait_until


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
    never = [q for q in progress["queues"] if q["queue"]["queue_id"] != busy]
    assert never and all(q["consumer_offset"] == -1 for q in never), "--json keeps raw values"
    assert text.count("never") == len(never)
    assert not re.search(r"│\s*-1\s*│", text)


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


def test_a_group_with_no_dead_letters_lists_and_resends_none(loaded: EmbeddedBroker) -> None:
    assert run_json(loaded, "dlq", "list", "billing") == []
    listed = run(loaded, "dlq", "list", "billing")
    assert listed.exit_code == 0 and "dead letters of billing" in listed.output
    assert run_json(loaded, "dlq", "resend", "billing") == {"resent": 0}


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
    assert "messages stored since start" in run(loaded, "broker", "status").output
    missing = run(loaded, "topics", "describe", "nosuch")
    assert missing.exit_code == 1
    assert missing.output.strip().splitlines() == [
        "Error: TOPIC_NOT_FOUND: topic 'nosuch' does not exist"
    ]


def test_broker_status_speaks_in_words_and_units_and_json_keeps_raw_values(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock) as broker:
        with Producer(broker.address) as p:
            sent = p.send(Message("orders", b"x", sharding_key="k"))

        async def dead_letter(c: BrokerClient) -> None:  # creates %RETRY%g and %DLQ%g
            await c.heartbeat("w", [GroupInfo("g", "CONSUME_ORDERLY")])
            await c.send_back("g", sent.queue, 0, max_reconsume_times=1, reconsume_times=1)

        client(broker, dead_letter)
        clock.advance(218.141)
        text = run(broker, "broker", "status").output
        status = run_json(broker, "broker", "status")
        user_topics = run_json(broker, "topics", "list")
        all_topics = run_json(broker, "topics", "list", "--system")
    assert re.search(r"uptime\s+│ 3m 38s", text), text
    assert re.search(r"version\s+│ " + re.escape(sdk.__version__), text), text
    assert re.search(r"topics\s+│ 1\b", text), text
    assert re.search(r"recovered from a crash\s+│ no", text), text
    assert not re.search(r"\d\.\d{3,}", text), "rates and sizes are rounded"
    assert "_" not in text.split("\n", 1)[1], "words, not field names"
    assert not re.search(r"^[┃│](\s+[┃│])+\s*$", text, re.MULTILINE), "an empty header row"
    # The same count as `topics list`: the broker's own topics are not counted.
    assert status["topic_count"] == len(user_topics) == 1 < len(all_topics)
    assert status["uptime_ms"] == 218141
    assert isinstance(status["messages_in_per_second"], float)
    assert status["version"] == sdk.__version__


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
    assert bad.exit_code == 1 and "32 hex digits" in bad.output


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


def test_message_lines_name_the_sharding_key_and_the_keys_differently(
    broker: EmbeddedBroker,
) -> None:
    with Producer(broker.address) as p:
        p.send(Message("orders", b"body", sharding_key="order-7", keys=["cust-1", "inv-9"]))
    for args in (["messages", "tail", "orders"], ["messages", "find", "orders", "cust-1"]):
        [line] = run(broker, *args).output.splitlines()
        assert " sharding_key=order-7 keys=cust-1,inv-9 " in line, line
        assert " key=" not in line
    found = run_json(broker, "messages", "find", "orders", "cust-1")
    assert [(m["sharding_key"], m["keys"]) for m in found] == [("order-7", ["cust-1", "inv-9"])]
    assert run_json(broker, "messages", "find", "orders", "order-7") == [], (
        "find searches keys, not the sharding key"
    )


@pytest.fixture
def fake_clock_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """A broker whose clock never moves: a held pull ends only when a message arrives."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=FakeClock()) as broker:
        yield broker


def test_tail_follow_prints_a_message_while_the_other_queues_polls_are_held(
    fake_clock_broker: EmbeddedBroker,
) -> None:
    broker = fake_clock_broker
    assert run(broker, "topics", "create", "orders", "--queues", "4").exit_code == 0
    state = broker.broker.state
    assert state is not None
    tail = subprocess.Popen(
        [sys.executable, "-m", "sdk.cli", "--broker", broker.address,
         "messages", "tail", "orders", "-n", "0", "-f"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    printed: list[str] = []
    assert tail.stdout is not None
    reader = threading.Thread(target=lambda: printed.extend(tail.stdout or []), daemon=True)
    reader.start()
    try:
        wait_until(lambda: state.holder.held == 4 or tail.poll() is not None, 60,
                   "tail -f to hold a pull on each queue")  # fmt: skip
        assert tail.poll() is None, tail.stderr.read() if tail.stderr else ""
        with Producer(broker.address) as p:
            p.send(Message("orders", b"arrived", sharding_key="k"))
        # The broker's clock never moves: the other three polls end only with a message
        # of their own (or their 30 s deadline, which ends the command with an error).
        wait_until(lambda: bool(printed) or tail.poll() is not None, 60, "the message")
        assert [line.split()[-1] for line in printed] == ["arrived"]
        wait_until(lambda: state.holder.held == 4, 60, "tail -f to poll that queue again")
    finally:
        tail.terminate()
        tail.wait(30)


def test_topic_retention_is_set_at_creation_changed_and_expires_messages(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock) as broker:
        retention = ["--retention-hours", "1.5", "--retention-bytes-per-queue", "1048576"]
        created = run(broker, "topics", "create", "audit", "--queues", "1", *retention)
        assert created.exit_code == 0, created.output
        assert "created audit with 1 queues; retention: 1.5 h, 1.0 MiB/queue" in created.output
        run(broker, "topics", "create", "plain", "--queues", "1")
        listed = {t["topic"]: t["retention"] for t in run_json(broker, "topics", "list")}
        assert listed == {"audit": {"hours": 1.5, "bytes_per_queue": 1048576},
                          "plain": {"hours": 0.0, "bytes_per_queue": 0}}  # fmt: skip
        assert "1.5 h, 1.0 MiB/queue" in run(broker, "topics", "list").output
        again = run(broker, "topics", "create", "audit", "--queues", "1", "--retention-hours", "2")
        assert again.exit_code == 1 and "exists with retention 1.5 h" in again.output

        with Producer(broker.address) as p:
            for i in range(4):
                p.send(Message("audit", b"m%d" % i, sharding_key="k"))
                p.send(Message("plain", b"m%d" % i, sharding_key="k"))
        clock.advance(1.5 * 3600 + 2)  # past audit's own time; the broker keeps 72 h

        def min_offsets() -> dict[str, int]:
            return {t: run_json(broker, "topics", "describe", t)["queues"][0]["min_offset"]
                    for t in ("audit", "plain")}  # fmt: skip

        wait_until(lambda: min_offsets() == {"audit": 4, "plain": 0}, what="audit's expiry")
        assert run_json(broker, "broker", "status")["retention_expired_messages"] == 4
        described = run(broker, "topics", "describe", "audit").output
        assert "(retention: 1.5 h, 1.0 MiB/queue)" in described

        changed = run(
            broker, "topics", "set-retention", "plain", "--retention-bytes-per-queue", "1"
        )
        assert changed.exit_code == 0
        assert "plain retention: default time, 1 B/queue" in changed.output
        clock.advance(2)  # the next retention check
        wait_until(lambda: min_offsets()["plain"] == 3, what="plain's size cap")
        reset = run_json(broker, "topics", "set-retention", "plain")
        assert reset["topic"]["retention"] == {"hours": 0.0, "bytes_per_queue": 0}
        missing = run(broker, "topics", "set-retention", "nosuch", "--retention-hours", "1")
        assert missing.exit_code == 1 and "TOPIC_NOT_FOUND" in missing.output
        bad = run(broker, "topics", "set-retention", "plain", "--retention-hours", "-1")
        assert bad.exit_code == 2 and "-1" in bad.output
