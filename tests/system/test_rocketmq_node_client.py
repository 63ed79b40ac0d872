"""npm ali-ons 3.12 (RocketMQ's remoting protocol in plain JavaScript) against mockbroker.

ali-ons is installed into ~/.cache/ordermq/interop by tests/interop/provision.py (when Node.js and
npm are there) and run by tests/interop/ons_driver.js in processes of its own; the tests
skip with the reason when it cannot be installed, or when this mockbroker has no remoting
front. It speaks differently from the C++ client: SEND_MESSAGE_V2 with numbers and
booleans in extFields, language JAVA and version 121, offsets committed with "oneway"
UPDATE_CONSUMER_OFFSET and in PULL's commitOffset, heartbeat enums as names.

The scenario: a consumer (CONSUME_FROM_FIRST_OFFSET, 1 s heartbeats and offset persists)
joins its group (its member id visible over gRPC), a producer sends keyed messages with
sharding keys and the ordermq SDK sends some more; the consumer gets every one, each of
ali-ons' keys from one queue and in order (ali-ons places a key by md5, the SDK by
murmur3); once it is stopped, its offsets (read over gRPC) are the queues' ends and it has
left the group.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import Message, Producer
from tests.interop.harness import (
    Driver,
    GrpcView,
    RemotingBroker,
    brokers,
    drivers,
    wait_across,
)
from tests.interop.provision import Client, require
from tests.support import free_port, wait_until

pytestmark = [pytest.mark.system, pytest.mark.interop]

QUEUES = 8
KEYS, ROUNDS = 10, 20
TIMEOUT = 120.0


@pytest.fixture(scope="module")
def ons() -> Client:
    return require("node")


@pytest.fixture
def run(ons: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    """`run(name, *args)` starts ons_driver.js; whatever still runs is killed at the end."""
    with drivers(ons, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., RemotingBroker]]:
    """`broker(*args)` starts a remoting broker (skips when this build has none)."""
    with brokers(tmp_path) as start:
        yield start


def test_the_driver_refuses_bad_arguments(ons: Client) -> None:
    cases = [
        (["produce", "--namesrv", "localhost", "--topic", "t", "--group", "g"], "HOST:PORT"),
        (["produce", "--topic", "t", "--group", "g"], "--namesrv is required"),
        (["consume", "--namesrv", "127.0.0.1:1", "--topic", "t", "--group", "g", "--from",
          "middle"], "--from must be first or last"),
        (["produce", "--namesrv", "127.0.0.1:1", "--topic", "t", "--group", "g", "--keys",
          "many"], "--keys must be a number"),
        (["subscribe"], "unknown command"),
    ]  # fmt: skip
    for args, expected in cases:
        proc = subprocess.run(
            ons.command(*args), capture_output=True, text=True, timeout=60, env=ons.environment()
        )
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert expected in proc.stderr, (args, proc.stderr)
        assert proc.stdout == ""


def test_without_a_name_server_each_driver_ends_with_a_clear_error(
    run: Callable[..., Driver],
) -> None:
    namesrv = f"127.0.0.1:{free_port()}"  # nothing listens there
    common = ["--namesrv", namesrv, "--topic", "nowhere", "--group", "g", "--deadline", "60"]
    producer = run("producer", "produce", *common)
    consumer = run("consumer", "consume", *common, "--route-timeout", "2")
    assert producer.finish(60) == 2, producer.describe()
    assert "ECONNREFUSED" in producer.of("error")[0]["message"]
    assert consumer.finish(60) == 2, consumer.describe()
    error = consumer.of("error")[0]["message"]
    assert f"no route for topic nowhere from the name server at {namesrv} within 2 s" in error
    assert not consumer.of("started")


def test_ali_ons_sends_consumes_commits_offsets_and_heartbeats(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker]
) -> None:
    b = broker()
    topic, group = "ons-topic", "ons-group"
    grpc = GrpcView(b.address)
    grpc.create_topic(topic, QUEUES)
    consumer = run(
        "consumer", "consume", "--namesrv", b.namesrv, "--topic", topic, "--group", group,
        "--from", "first", "--heartbeat-ms", "1000", "--persist-ms", "1000",
        "--rebalance-ms", "2000", "--poll-ms", "2000", "--deadline", str(4 * TIMEOUT),
    )  # fmt: skip
    client_id = consumer.wait_event("started")["client_id"]
    wait_until(lambda: client_id in grpc.members(group), TIMEOUT, "its heartbeat, seen over gRPC")

    producer = run(
        "producer", "produce", "--namesrv", b.namesrv, "--topic", topic, "--group", "ons-p",
        "--keys", str(KEYS), "--rounds", str(ROUNDS), "--sharding", "--tags", "FromOns",
    )  # fmt: skip
    assert producer.finish(TIMEOUT) == 0, producer.describe()
    sent = {(e["key"], e["seq"]): e for e in producer.of("sent")}
    assert len(sent) == KEYS * ROUNDS
    assert {e["status"] for e in sent.values()} == {"SEND_OK"}
    queue_of = {key: {e["queue"] for (k, _), e in sent.items() if k == key} for key, _ in sent}
    # ali-ons 3.12 drops a sharding key whose md5 picks queue index 0 (`queueIds[i] || ''`
    # reads queue 0 as "no queue") and sends those messages round robin: the others are
    # placed by their key, one queue each.
    spread = {key for key, queues in queue_of.items() if len(queues) > 1}
    assert all(ali_ons_queue_index(key, QUEUES) == 0 for key in spread), queue_of

    with Producer(b.address) as sdk_producer:  # one truth: the SDK's messages too
        for key in sorted(queue_of):
            sdk_producer.send(Message(topic, f"{key}:{ROUNDS}".encode(), tags="FromSdk",
                                      keys=key, sharding_key=key))  # fmt: skip
    total = KEYS * (ROUNDS + 1)
    wait_across(
        [consumer],
        lambda: len({(e["key"], e["seq"]) for e in consumer.of("message")}) >= total,
        TIMEOUT,
        "every message consumed",
    )
    got = consumer.of("message")
    assert len(got) == total, "a message was delivered twice"
    top: dict[str, int] = {}
    for e in got:
        if e["seq"] < ROUNDS and e["key"] in spread:  # no order across queues
            assert e["tags"] == "FromOns", e
        elif e["seq"] < ROUNDS:  # the SDK placed its messages by its own hash: other queues
            assert e["seq"] == top.get(e["key"], -1) + 1, f"{e['key']} out of order: {e}"
            top[e["key"]] = e["seq"]
            told = sent[(e["key"], e["seq"])]
            assert (e["queue"], e["offset"], e["tags"]) == (told["queue"], told["offset"],
                                                            "FromOns"), (e, told)  # fmt: skip
        else:
            assert (e["tags"], e["keys"]) == ("FromSdk", e["key"]), e

    assert consumer.terminate() == 0, consumer.describe()
    assert consumer.of("stopped")
    ends, committed = grpc.max_offsets(topic), grpc.committed(group, topic)
    for q, end in ends.items():
        # ali-ons persists a queue still at offset 0 as -1 (`offset || -1`): a broker must
        # not store that; such a queue has no commit, or 0.
        expected = (end,) if end else (None, 0)
        assert committed[q] in expected, f"queue {q}: committed {committed[q]}, end {end}"
    wait_until(lambda: client_id not in grpc.members(group), TIMEOUT, "it left the group")


def ali_ons_queue_index(key: str, queues: int) -> int:
    """The queue index ali-ons picks for a sharding key: md5's first 4 bytes modulo."""
    return int.from_bytes(hashlib.md5(key.encode()).digest()[:4], "big") % queues
