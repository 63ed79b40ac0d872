"""ordermq's clients over `rocketmq://` and RocketMQ's C++ client, both ways (issue 33).

The C++ client (PyPI `rocketmq` 0.4.4) runs in processes of its own, as in
test_rocketmq_cpp_client.py, against `python -m mockbroker` with its name server; the
ordermq clients are given "rocketmq://<name server>", so both sides speak only RocketMQ
remoting:

- ordermq's Producer sends keyed messages (some over 4 KiB, sent compressed), the C++
  orderly PushConsumer reads each key in order, with bodies, tags and keys intact;
- the C++ producer sends keyed messages (over 4 KiB: it compresses them), ordermq's orderly
  PushConsumer reads each key in order, bodies, tags and keys intact, each key from the
  queue ordermq's shard_index gives it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
    shard_index,
)
from tests.interop.harness import Driver, GrpcView, RemotingBroker, brokers, drivers, wait_across
from tests.interop.provision import Client, require
from tests.support import wait_until
from tests.system.orderly_history import verify
from tests.system.test_rocketmq_cpp_client import (
    CONSUME_TIMEOUT,
    PRODUCE_TIMEOUT,
    QUEUES,
    distinct,
    entries,
    placement,
    produce_args,
    push_args,
)

pytestmark = [pytest.mark.system, pytest.mark.interop]

KEYS = [f"k{i:03d}" for i in range(20)]
#: 20 keys x 100 rounds: 2 000 messages each way.
ROUNDS = 100
#: Every tenth message of ordermq's is this big (compressed on the wire: over 4 KiB).
BIG_BODY = 6000


@pytest.fixture(scope="module")
def cpp() -> Client:
    return require("cpp")


@pytest.fixture
def run(cpp: Client, tmp_path: Path) -> Iterator[Callable[..., Driver]]:
    with drivers(cpp, tmp_path / "drivers") as start:
        yield start


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[..., RemotingBroker]]:
    with brokers(tmp_path) as start:
        yield start


def body_of(key: str, seq: int, size: int) -> bytes:
    """cpp_driver.py's body layout: "key:seq", padded with a space and x's to `size`."""
    text = f"{key}:{seq}"
    return (text if len(text) >= size else f"{text} " + "x" * (size - len(text) - 1)).encode()


def test_what_ordermq_sends_over_remoting_the_cpp_orderly_consumer_reads_in_order(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker]
) -> None:
    b = broker()
    topic, group = "sdk-to-cpp", "sdk-to-cpp-group"
    GrpcView(b.address).create_topic(topic, QUEUES)
    consumer = run("cpp-orderly", *push_args(b, topic, group, "--orderly",
                                             "--property-names", "origin,seq"))  # fmt: skip
    consumer.wait_event("started")
    sizes = {}
    with Producer(f"rocketmq://{b.namesrv}") as producer:
        for seq in range(ROUNDS):
            batch = []
            for key in KEYS:
                size = BIG_BODY if (seq + int(key[1:])) % 10 == 0 else 0
                sizes[(key, seq)] = len(body_of(key, seq, size))
                batch.append(Message(topic, body_of(key, seq, size), tags="FromSdk", keys=key,
                                     properties={"origin": "ordermq", "seq": str(seq)},
                                     sharding_key=key))  # fmt: skip
            for message in batch:  # one by one: a big body goes compressed only alone
                producer.send(message)
    total = len(KEYS) * ROUNDS
    wait_across([consumer], lambda: distinct([consumer]) >= total, CONSUME_TIMEOUT,
                "the C++ orderly consumer reading everything ordermq sent")  # fmt: skip
    assert consumer.terminate() == 0, consumer.describe()
    report = verify(entries([consumer]), ROUNDS, {}, KEYS, QUEUES)
    assert not report.errors, "\n".join(report.errors[:20])
    for e in consumer.of("message"):
        key, seq = e["key"], e["seq"]
        assert (e["topic"], e["tags"], e["keys"]) == (topic, "FromSdk", key), e
        assert e["queue"] == shard_index(key, QUEUES), e
        assert e["size"] == sizes[(key, seq)], e
        assert e["properties"] == {"origin": "ordermq", "seq": str(seq)}, e
        assert e["body"].encode() == body_of(key, seq, sizes[(key, seq)])[:200], e


class Recorder(MessageListenerOrderly):
    """Every message an orderly listener was given, in call order."""

    def __init__(self) -> None:
        self.seen: list[MessageExt] = []
        self._lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self._lock:
            self.seen.extend(msgs)
        return ConsumeOrderlyStatus.SUCCESS


def test_what_the_cpp_producer_sends_ordermqs_orderly_consumer_reads_over_remoting_in_order(
    run: Callable[..., Driver], broker: Callable[..., RemotingBroker], tmp_path: Path
) -> None:
    b = broker()
    topic, group = "cpp-to-sdk", "cpp-to-sdk-group"
    GrpcView(b.address).create_topic(topic, QUEUES)
    producer = run("producer", *produce_args(
        b, topic, "--key-queues", str(placement(tmp_path, KEYS)), "--rounds", str(ROUNDS),
        "--tags", "FromCpp", "--body-bytes", str(BIG_BODY), "--report", "summary",
        "--property", "origin=cpp", "--property", "note=zwei wörter",
    ))  # fmt: skip
    assert producer.finish(PRODUCE_TIMEOUT) == 0, producer.describe()
    listener = Recorder()
    consumer = PushConsumer(group, f"rocketmq://{b.namesrv}",
                            consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe(topic)
    consumer.register_message_listener(listener)
    total = len(KEYS) * ROUNDS
    started = time.monotonic()
    with consumer:
        wait_until(lambda: len(listener.seen) >= total, CONSUME_TIMEOUT,
                   "ordermq's orderly consumer reading everything the C++ client sent")  # fmt: skip
    assert time.monotonic() - started < CONSUME_TIMEOUT
    by_key: dict[str, list[int]] = {}
    for m in listener.seen:
        key, _, seq = m.body.split(b" ", 1)[0].decode().partition(":")
        by_key.setdefault(key, []).append(int(seq))
        assert m.body == body_of(key, int(seq), BIG_BODY), m.msg_id
        assert (m.topic, m.tags, m.keys) == (topic, "FromCpp", (key,)), m
        assert m.properties == {"origin": "cpp", "note": "zwei wörter"}, m
        assert m.queue.queue_id == shard_index(key, QUEUES), m
    assert by_key == {key: list(range(ROUNDS)) for key in KEYS}, "each key once, in order"
