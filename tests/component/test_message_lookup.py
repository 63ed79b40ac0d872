"""`ordermq messages get` takes every id the clients print; `find` by key or sharding key.

ordermq's ids (SendResult.msg_id), RocketMQ 4.x's UNIQ_KEY (what its clients print as
msgId) and offsetMsgId, RocketMQ 5's message ids; lookups say what they searched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageQueue, Producer
from sdk._remoting.message_ids import SocketAddress, create_offset_msg_id
from tests.component.pulling import read_queue
from tests.component.test_cli import run, run_json
from tests.component.test_v2_front import send, v2_message

#: A RocketMQ 5 message id as the official clients make it ("01", MAC, pid, time, counter).
ROCKETMQ5_ID = "0102FC0000000104DB0B1A37D400000000"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path / "data", v2_port=0, remoting_port=0, namesrv_port=0)
    with EmbeddedBroker(config) as b:
        yield b


def bodies(found: list[dict[str, Any]]) -> list[str]:
    return [m["body"] for m in found]


def test_get_takes_ordermq_ids_in_either_case(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        sent = p.send(Message("orders", b"ordermq", keys="k"))
    assert bodies(run_json(broker, "messages", "get", sent.msg_id)) == ["ordermq"]
    assert bodies(run_json(broker, "messages", "get", sent.msg_id.lower())) == ["ordermq"]


def test_get_takes_a_rocketmq4_uniq_key_and_offset_msg_id(broker: EmbeddedBroker) -> None:
    assert broker.remoting_address is not None
    with Producer(f"rocketmq://{broker.namesrv_address}") as p:
        sent = p.send(Message("orders", b"over remoting", keys="k"))
    assert bodies(run_json(broker, "messages", "get", sent.msg_id)) == ["over remoting"]
    # Read over remoting: the commit-log offset is RocketMQ's to give.
    queue = MessageQueue("orders", sent.queue.broker_name, sent.queue.queue_id)
    [stored] = read_queue(f"rocketmq://{broker.namesrv_address}", queue)
    store_host = SocketAddress.parse(broker.remoting_address)
    offset_msg_id = create_offset_msg_id(store_host, stored.commit_log_offset)
    assert offset_msg_id != sent.msg_id
    assert bodies(run_json(broker, "messages", "get", offset_msg_id)) == ["over remoting"]


def test_get_takes_a_rocketmq5_message_id(broker: EmbeddedBroker) -> None:
    assert send(broker, v2_message(b"from a 5.x client", ROCKETMQ5_ID)).status.code == 20000
    [got] = run_json(broker, "messages", "get", ROCKETMQ5_ID)
    assert (got["body"], got["properties"]["UNIQ_KEY"]) == ("from a 5.x client", ROCKETMQ5_ID)
    assert "from a 5.x client" in run(broker, "messages", "get", ROCKETMQ5_ID).output


@pytest.mark.parametrize("text", ["xyz", "AB" * 8, "01" + "G" * 32, "AB" * 17 + "A"])
def test_an_id_of_no_known_form_is_refused_naming_the_forms(
    broker: EmbeddedBroker, text: str
) -> None:
    refused = run(broker, "messages", "get", text)
    assert refused.exit_code == 1
    for form in ("32 hex digits", "offsetMsgId", "RocketMQ 5 message id (34 hex digits"):
        assert form in refused.output


def test_an_unknown_id_of_a_known_form_is_not_found(broker: EmbeddedBroker) -> None:
    for text in ("AB" * 16, "01" + "CD" * 16, "AB" * 28):
        missing = run(broker, "messages", "get", text)
        assert missing.exit_code == 1 and "MESSAGE_NOT_FOUND" in missing.output, missing.output


def test_find_by_sharding_key_reads_the_keys_queue_newest_first(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        p.send_batch([Message("orders", f"{k}:{n}".encode(), sharding_key=k, keys=f"step-{n}")
                      for n in range(3) for k in ("order-42", "order-7")])  # fmt: skip
    found = run_json(broker, "messages", "find", "orders", "order-42", "--sharding-key")
    assert bodies(found) == ["order-42:2", "order-42:1", "order-42:0"]
    assert {m["sharding_key"] for m in found} == {"order-42"}
    assert bodies(run_json(broker, "messages", "find", "orders", "order-42", "--sharding-key",
                           "--limit", "1")) == ["order-42:2"]  # fmt: skip
    limited = run_json(broker, "messages", "find", "orders", "order-42", "--sharding-key",
                       "--scan", "1")  # fmt: skip
    assert len(limited) <= 1


def test_find_says_what_it_searched_when_nothing_matches(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        p.send(Message("orders", b"x", sharding_key="order-42", keys="cust-1"))
    by_key = run(broker, "messages", "find", "orders", "order-42").output
    assert "searched keys=" in by_key and "--sharding-key" in by_key
    by_sharding = run(broker, "messages", "find", "orders", "cust-1", "--sharding-key").output
    assert re.search(r"none of the \d+ newest messages of orders queue \d+", by_sharding)
    assert "sharding key 'cust-1'" in by_sharding


def test_every_message_line_shows_its_stored_time_and_id(broker: EmbeddedBroker) -> None:
    with Producer(broker.address) as p:
        sent = p.send(Message("orders", b"body", sharding_key="s", keys="k"))
    for args in (["messages", "get", sent.msg_id], ["messages", "tail", "orders"],
                 ["messages", "find", "orders", "k"]):  # fmt: skip
        [line] = run(broker, *args).output.splitlines()
        assert re.search(r" stored=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d ", line), line
        assert f" id={sent.msg_id} " in line, line


@pytest.mark.parametrize("width", [80, 200])
def test_tables_keep_long_values_whole_at_any_width(
    broker: EmbeddedBroker, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    group = "svc-even-longer-group-name-for-the-shipping-service-" + "x" * 30
    monkeypatch.setitem(os.environ, "COLUMNS", str(width))
    with Producer(broker.address) as p:
        p.send(Message("orders", b"x", sharding_key="s"))
    run(broker, "offsets", "reset", group, "--topic", "orders", "--earliest")
    out = run(broker, "groups", "list").output
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= width
    first_cells = [line.split("│")[1].strip() for line in out.splitlines() if line[0] == "│"]
    assert "".join(first_cells) == group, out
