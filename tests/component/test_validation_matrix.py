"""Every bad input gets its own status and reason on the wire, and changes nothing.

The requests go through raw gRPC stubs, not the SDK: the broker must refuse bad input
from any client, including one that skips the SDK's own checks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.store.checkpoint import read_checkpoint
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import (
    GRPC_CHANNEL_OPTIONS,
    MAX_BODY_BYTES,
    MAX_PROPERTIES_BYTES,
    MAX_SEND_BYTES,
    encode_frame,
)
from tests.support import wait_until


def frame(body: bytes = b"ok", **kw: Any) -> bytes:
    return encode_frame(msg_id=b"\x01" * 16, born_timestamp_ms=1, body=body, **kw)


class Wire:
    def __init__(self, address: str) -> None:
        self.channel = grpc.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS)
        self.msg = pb_grpc.MessagingServiceStub(self.channel)
        self.admin = pb_grpc.AdminServiceStub(self.channel)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedBroker, Wire]]:
    data = tmp_path_factory.mktemp("matrix")
    config = BrokerConfig(data_dir=data, auto_create_topics=False)
    with EmbeddedBroker(config) as broker:
        wire = Wire(broker.address)
        wire.admin.CreateTopic(pb.CreateTopicRequest(topic="orders", queue_count=4))
        wire.msg.Heartbeat(
            pb.HeartbeatRequest(
                client_id="matrix",
                consumer_groups=[
                    pb.ConsumerGroupState(
                        group="g", consume_type=pb.CONSUME_POLL, message_model=pb.CLUSTERING
                    )
                ],
            )
        )
        wire.msg.Send(pb.SendRequest(topic="orders", queue_id=0, frames=frame() + frame()))
        lock("g", "matrix", ("orders", 1))(wire)
        wire.msg.CommitConsumerOffsets(
            pb.CommitConsumerOffsetsRequest(
                group="g", offsets=[pb.OffsetCommit(topic="orders", queue_id=0, offset=1)]
            )
        )
        # A checkpoint taken before the send (at position 0) is not the last: wait for the
        # one that covers the commit log's end; after that an idle broker writes nothing.
        end = broker.broker.store.commitlog.end
        wait_until(
            lambda: read_checkpoint(data / "checkpoint").position == end,
            what="the checkpoint of the commit log's end",
        )
        yield broker, wire
        wire.channel.close()


def snapshot(data_dir: Path) -> dict[str, str]:
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file() and not p.name.endswith(".tmp")
    }


def send(topic: str = "orders", queue_id: int = 0, frames: bytes = b"") -> Callable[[Wire], Any]:
    return lambda w: w.msg.Send(pb.SendRequest(topic=topic, queue_id=queue_id, frames=frames))


def pull(**kw: Any) -> Callable[[Wire], Any]:
    args = {"group": "g", "topic": "orders", "queue_id": 0, "offset": 0, "max_messages": 10,
            "max_bytes": 1 << 20, **kw}  # fmt: skip
    return lambda w: w.msg.Pull(pb.PullRequest(**args))


def commit(group: str = "g", *items: tuple[str, int, int]) -> Callable[[Wire], Any]:
    offsets = [pb.OffsetCommit(topic=t, queue_id=q, offset=o) for t, q, o in items]
    return lambda w: w.msg.CommitConsumerOffsets(
        pb.CommitConsumerOffsetsRequest(group=group, offsets=offsets)
    )


def lock(
    group: str = "g", client: str = "matrix", *queues: tuple[str, int]
) -> Callable[[Wire], Any]:
    mqs = [pb.MessageQueue(topic=t, broker_name="broker-a", queue_id=q) for t, q in queues]
    return lambda w: w.msg.LockBatch(pb.LockBatchRequest(group=group, client_id=client, queues=mqs))


def unlock(client: str, *queues: tuple[str, int]) -> Callable[[Wire], Any]:
    mqs = [pb.MessageQueue(topic=t, broker_name="broker-a", queue_id=q) for t, q in queues]
    return lambda w: w.msg.UnlockBatch(
        pb.UnlockBatchRequest(group="g", client_id=client, queues=mqs)
    )


def heartbeat(**group: Any) -> Callable[[Wire], Any]:
    state = {"group": "g2", "consume_type": pb.CONSUME_ORDERLY, "message_model": pb.CLUSTERING,
             **group}  # fmt: skip
    return lambda w: w.msg.Heartbeat(
        pb.HeartbeatRequest(client_id="hb", consumer_groups=[pb.ConsumerGroupState(**state)])
    )


def send_back(group: str = "g", offset: int = 0, **kw: Any) -> Callable[[Wire], Any]:
    queue = pb.MessageQueue(topic="orders", broker_name="broker-a", queue_id=0)
    return lambda w: w.msg.SendBack(
        pb.SendBackRequest(group=group, queue=queue, queue_offset=offset, **kw)
    )


def cancel(msg_id: str, topic: str = "") -> Callable[[Wire], Any]:
    return lambda w: w.msg.CancelScheduled(pb.CancelScheduledRequest(topic=topic, msg_id=msg_id))


def create(topic: str, queues: int) -> Callable[[Wire], Any]:
    return lambda w: w.admin.CreateTopic(pb.CreateTopicRequest(topic=topic, queue_count=queues))


CASES: list[tuple[str, Callable[[Wire], Any], grpc.StatusCode, str, str]] = [
    ("topic with a space", send("bad topic", frames=frame()), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_TOPIC", "must match"),
    ("topic too long", send("t" * 128, frames=frame()), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_TOPIC", "1-127"),
    ("reserved prefix", send("rmq_sys_x", frames=frame()), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_TOPIC", "reserved"),
    ("send to a retry topic", send("%RETRY%g", frames=frame()),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOPIC", "must match"),
    ("unknown topic, no auto-create", send("nosuch", frames=frame()), grpc.StatusCode.NOT_FOUND,
     "TOPIC_NOT_FOUND", "does not exist"),
    ("queue id too high", send(queue_id=4, frames=frame()), grpc.StatusCode.OUT_OF_RANGE,
     "INVALID_QUEUE", "queues 0..3"),
    ("negative queue id", send(queue_id=-1, frames=frame()), grpc.StatusCode.OUT_OF_RANGE,
     "INVALID_QUEUE", "out of range"),
    ("no frames", send(frames=b""), grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_FRAME",
     "no message frames"),
    ("truncated frame", send(frames=frame()[:-1]), grpc.StatusCode.INVALID_ARGUMENT,
     "MALFORMED_FRAME", "lengths"),
    ("empty body", send(frames=frame(b"")), grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_BODY",
     "empty"),
    ("body over 4 MiB", send(frames=frame(b"x" * (MAX_BODY_BYTES + 1))),
     grpc.StatusCode.INVALID_ARGUMENT, "BODY_TOO_LARGE", str(MAX_BODY_BYTES)),
    ("properties over 16 KiB", send(frames=frame(properties=b"\x00" * (MAX_PROPERTIES_BYTES + 2))),
     grpc.StatusCode.INVALID_ARGUMENT, "PROPERTIES_TOO_LARGE", str(MAX_PROPERTIES_BYTES)),
    ("tags not UTF-8", send(frames=frame(tags=b"\xff")), grpc.StatusCode.INVALID_ARGUMENT,
     "MALFORMED_FRAME", "UTF-8"),
    ("good frames then a bad one", send(frames=frame() + frame() + frame(b"")),
     grpc.StatusCode.INVALID_ARGUMENT, "EMPTY_BODY", "frame 2"),
    ("batch over 32 MiB", send(frames=frame(b"x" * MAX_BODY_BYTES) * 8 + frame()),
     grpc.StatusCode.RESOURCE_EXHAUSTED, "BATCH_TOO_LARGE", str(MAX_SEND_BYTES)),
    ("deliver-at in the past", send(frames=frame(deliver_at_ms=2**40)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DELIVERY_TIME", "in the past"),
    ("deliver-at beyond 40 days", send(frames=frame(deliver_at_ms=2**50)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DELIVERY_TIME", "40 days"),
    ("delay level 19", send(frames=frame(delay_level=19)), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_DELIVERY_TIME", "1..18"),
    ("delay level and deliver-at", send(frames=frame(delay_level=2, deliver_at_ms=2**41)),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DELIVERY_TIME", "or a delay level"),
    ("scheduled mixed with immediate", send(frames=frame(delay_level=2) + frame()),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DELIVERY_TIME", "all scheduled"),
    ("pull: suspend too long", pull(suspend_timeout_ms=60_001), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "suspend_timeout_ms"),
    ("pull: bad group", pull(group="g g"), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GROUP",
     "group"),
    ("pull: unknown topic", pull(topic="nosuch"), grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND",
     "nosuch"),
    ("pull: queue out of range", pull(queue_id=9), grpc.StatusCode.OUT_OF_RANGE, "INVALID_QUEUE",
     "queue id 9"),
    ("pull: zero messages", pull(max_messages=0), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "max_messages"),
    ("pull: zero bytes", pull(max_bytes=0), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT",
     "max_bytes"),
    ("pull: negative suspend", pull(suspend_timeout_ms=-1), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "suspend"),
    ("pull: malformed tags", pull(tag_expression="A ||"), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_TAG_EXPRESSION", "A ||"),
    ("pull: tags joined by a single |", pull(tag_expression="TagA | TagB"),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TAG_EXPRESSION", "contains '|'"),
    ("pull: tags joined by a comma", pull(tag_expression="TagA,TagB"),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TAG_EXPRESSION", "contains ','"),
    ("commit beyond max", commit("g", ("orders", 0, 3)), grpc.StatusCode.OUT_OF_RANGE,
     "INVALID_OFFSET", "[0, 2]"),
    ("commit negative", commit("g", ("orders", 0, -1)), grpc.StatusCode.OUT_OF_RANGE,
     "INVALID_OFFSET", "outside"),
    ("commit: one good, one bad", commit("g", ("orders", 0, 2), ("orders", 1, 5)),
     grpc.StatusCode.OUT_OF_RANGE, "INVALID_OFFSET", "queue 1"),
    ("commit: unknown topic", commit("g", ("nosuch", 0, 0)), grpc.StatusCode.NOT_FOUND,
     "TOPIC_NOT_FOUND", "nosuch"),
    ("commit: bad group", commit("", ("orders", 0, 0)), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_GROUP", "group"),
    ("commit: unknown group", commit("nobody", ("orders", 0, 0)), grpc.StatusCode.NOT_FOUND,
     "GROUP_NOT_FOUND", "heartbeat first"),
    ("create: zero queues", create("fresh", 0), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "1..1024"),
    ("create: too many queues", create("fresh", 1025), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "1..1024"),
    ("create: other queue count", create("orders", 8), grpc.StatusCode.ALREADY_EXISTS,
     "TOPIC_EXISTS", "4 queues"),
    ("create: bad name", create("a/b", 1), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOPIC",
     "a/b"),
    ("create: name ending in a newline", create("fresh\n", 1), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_TOPIC", "must match"),
    ("lock: unknown group", lock("nobody", "matrix", ("orders", 0)), grpc.StatusCode.NOT_FOUND,
     "GROUP_NOT_FOUND", "heartbeat first"),
    ("lock: queue out of range", lock("g", "matrix", ("orders", 4)),
     grpc.StatusCode.OUT_OF_RANGE, "INVALID_QUEUE", "queue id 4"),
    ("lock: unknown topic", lock("g", "matrix", ("nosuch", 0)), grpc.StatusCode.NOT_FOUND,
     "TOPIC_NOT_FOUND", "nosuch"),
    ("lock: empty client id", lock("g", "", ("orders", 0)), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "client_id"),
    ("heartbeat: no consume type", heartbeat(consume_type=pb.CONSUME_TYPE_UNSPECIFIED),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", "consume_type"),
    ("heartbeat: bad group", heartbeat(group="a b"), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_GROUP", "a b"),
    ("heartbeat: bad tag expression",
     heartbeat(subscriptions=[pb.Subscription(topic="orders", expression="A ||")]),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TAG_EXPRESSION", "A ||"),
    ("heartbeat: tags joined by a comma",
     heartbeat(subscriptions=[pb.Subscription(topic="orders", expression="TagA,TagB")]),
     grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TAG_EXPRESSION", "contains ','"),
    ("send back: unknown group", send_back("nobody"), grpc.StatusCode.NOT_FOUND,
     "GROUP_NOT_FOUND", "nobody"),
    ("send back: offset past the end", send_back(offset=2), grpc.StatusCode.OUT_OF_RANGE,
     "INVALID_OFFSET", "[0, 2)"),
    ("send back: delay level 19", send_back(delay_level=19), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "delay level"),
    ("cancel: malformed id", cancel("xyz"), grpc.StatusCode.INVALID_ARGUMENT,
     "INVALID_ARGUMENT", "hexadecimal"),
    ("cancel: unknown id", cancel("AB" * 16), grpc.StatusCode.NOT_FOUND, "MESSAGE_NOT_FOUND",
     "AB" * 16),
    ("route of an unknown topic", lambda w: w.msg.QueryRoute(pb.QueryRouteRequest(topic="nosuch")),
     grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND", "nosuch"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "status", "reason", "words"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_bad_input_is_refused_specifically_and_changes_nothing(
    served: tuple[EmbeddedBroker, Wire],
    call: Callable[[Wire], Any],
    status: grpc.StatusCode,
    reason: str,
    words: str,
) -> None:
    broker, wire = served
    before = snapshot(broker.config.data_dir)
    with pytest.raises(grpc.RpcError) as info:
        call(wire)
    err: Any = info.value
    assert err.code() == status, err.details()
    assert dict(err.trailing_metadata())["ordermq-reason"] == reason
    assert words in err.details()
    assert snapshot(broker.config.data_dir) == before
    # and the offsets table still says what was committed before
    answer = wire.msg.QueryConsumerOffset(
        pb.QueryConsumerOffsetRequest(group="g", topic="orders", queue_id=0)
    )
    assert (answer.found, answer.offset) == (True, 1)
    # and the locks are as they were
    state = broker.broker.state
    assert state is not None
    assert {q: (v.client_id, v.live) for q, v in state.locks.locks("g").items()} == {
        ("orders", 1): ("matrix", True)
    }


def test_an_unlock_of_another_clients_lock_leaves_it_and_says_so(
    served: tuple[EmbeddedBroker, Wire],
) -> None:
    broker, wire = served
    before = snapshot(broker.config.data_dir)
    answer = unlock("intruder", ("orders", 1))(wire)
    assert [(q.topic, q.queue_id) for q in answer.not_held] == [("orders", 1)]
    assert snapshot(broker.config.data_dir) == before
    state = broker.broker.state
    assert state is not None and state.locks.is_locked_by("g", ("orders", 1), "matrix")


def test_an_unknown_offset_is_not_found_never_zero(served: tuple[EmbeddedBroker, Wire]) -> None:
    _, wire = served
    answer = wire.msg.QueryConsumerOffset(
        pb.QueryConsumerOffsetRequest(group="never", topic="orders", queue_id=0)
    )
    assert (answer.found, answer.offset) == (False, -1)
