"""Every RPC of the broker's gRPC API fuzzed over a real connection to an EmbeddedBroker.

Each RPC of each service descriptor gets three kinds of input, all sent as raw bytes
through a generic `channel.unary_unary` (or `unary_stream` / `stream_stream`) so that the
broker also sees what no stub would send:
- requests generated field by field from the request's descriptor (tests/fuzzing.py);
- a valid request (SEEDS) with one field, possibly nested, given another value;
- a valid request's bytes mutated: bit flips, truncation, lengths set huge (malformed
  protobuf, strings that are not UTF-8).
The Exchange stream gets sequences of such requests (sends, pulls, push subscriptions and
their credit grants, cancels, ids reused); a subscription is answered once per batch.

Every call must end within its deadline (a pull the broker holds is the one call that may
wait: the broker reports it held, and cancelling it frees it); never with UNKNOWN or
INTERNAL (a handler that raised) nor with a traceback logged; a refusal carries a status
with words and an `ordermq-reason` from the protocol's ErrorReason; and a refused call,
or one that only reads, changes nothing (topics, queue sizes, the commit log, offsets,
locks and epochs, group members, the group registry, scheduled messages, receiving
groups' held messages).

The broker runs on a FakeClock that never moves: nothing changes by itself between two
calls (no scheduled delivery, lease expiry or client timeout), so any change is the
call's. One row per service in the fault suite's table.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import example, given
from hypothesis import strategies as st

from mockbroker import EmbeddedBroker
from mockbroker.__main__ import main as mockbroker_main
from mockbroker.fronts.grpc_errors import REASON_KEY
from mockbroker.server import Broker
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._wire import GRPC_CLIENT_CHANNEL_OPTIONS, encode_frame, encode_properties
from sdk.testing import FakeClock
from tests.chaos_report import ChaosRecorder
from tests.fuzzing import (
    Pools,
    Tracebacks,
    broker_state,
    fuzz_settings,
    held_pulls,
    messages,
    mutated,
    one_field_changed,
    still_broker,
)
from tests.support import wait_until

pytestmark = pytest.mark.chaos

SERVICES = [pb.DESCRIPTOR.services_by_name[name] for name in sorted(pb.DESCRIPTOR.services_by_name)]
METHODS = [m for service in SERVICES for m in service.methods]
#: Longest any call may take to be answered (generous: the machine may be busy).
DEADLINE = 60.0
#: Statuses a refusal may carry (UNAVAILABLE: DISK_FULL on a machine whose disk is nearly
#: full); UNKNOWN or INTERNAL mean a handler raised.
#: UNIMPLEMENTED: an Exchange request whose body this broker does not know (an unknown
#: field: a later protocol version's request).
REFUSALS = {"INVALID_ARGUMENT", "NOT_FOUND", "OUT_OF_RANGE", "ALREADY_EXISTS",
            "FAILED_PRECONDITION", "RESOURCE_EXHAUSTED", "UNAVAILABLE",
            "UNIMPLEMENTED"}  # fmt: skip
REASONS = set(pb.ErrorReason.keys()) - {"ERROR_REASON_UNSPECIFIED"}
#: RPCs that only read: they change nothing even when they succeed.
READ_ONLY = {"Pull", "QueryQueueOffsets", "GetConsumerList", "WatchMembership",
             "QueryConsumerOffset", "ListTopics", "ListGroups", "DescribeTopic",
             "ConsumerProgress", "QueryMessageById", "QueryMessagesByKey",
             "BrowseQueue", "BrokerStatus"}  # fmt: skip
#: RPCs that delete the topics and groups the others are fuzzed on: fuzzed after them all.
DELETIONS = {"DeleteTopic", "DeleteGroup"}
TOPIC, SMALL, G1, G2, G3, C1, KEY = "fz", "fz1", "g1", "g2", "g3", "c1", "k1"


def rpc_path(method: MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def request_class(method: MethodDescriptor) -> type[Message]:
    return GetMessageClass(method.input_type)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- the broker
@dataclass
class Fuzzed:
    """The broker under test, a channel to it, and what it holds."""

    embedded: EmbeddedBroker
    clock: FakeClock
    channel: grpc.Channel
    pools: Pools = field(default_factory=Pools)
    seeds: dict[str, Message] = field(default_factory=dict)
    #: More valid requests of a method, mutated as its seed is (Exchange's other bodies).
    more_seeds: dict[str, list[Message]] = field(default_factory=dict)
    #: Valid inputs of a method always tried (Exchange: a subscription and its credit).
    examples: dict[str, list[Any]] = field(default_factory=dict)

    @property
    def broker(self) -> Broker:
        return self.embedded.broker

    def call(self, name: str, request: Message) -> Any:
        """A typed unary call, for seeding."""
        method = next(m for m in METHODS if m.name == name)
        out_cls = GetMessageClass(method.output_type)
        fn = self.channel.unary_unary(
            rpc_path(method),
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=out_cls.FromString,
        )
        return fn(request, timeout=DEADLINE)


def frames(*bodies: bytes, now_ms: int, tags: bytes = b"TagA", at_ms: int = 0) -> bytes:
    return b"".join(
        encode_frame(
            msg_id=(now_ms + i).to_bytes(16, "big"), born_timestamp_ms=now_ms, body=body,
            tags=tags, sharding_key=b"order-%d" % i, keys=[KEY.encode(), b"other"],
            properties=encode_properties({"p": str(i)}), deliver_at_ms=at_ms,
        )
        for i, body in enumerate(bodies)
    )  # fmt: skip


def seed(f: Fuzzed) -> None:
    """Topics with messages, two groups (one orderly with locks), committed offsets, a
    scheduled message, a retry and a receiving group holding messages; and the valid
    request of every RPC."""
    now_ms = int(f.clock.now() * 1000)
    f.call("CreateTopic", pb.CreateTopicRequest(topic=TOPIC, queue_count=4))
    f.call("CreateTopic", pb.CreateTopicRequest(topic=SMALL, queue_count=1))
    batch = frames(b"one", b"two", b"three", now_ms=now_ms)
    for qid in range(4):
        f.call("Send", pb.SendRequest(topic=TOPIC, queue_id=qid, frames=batch))
    later = frames(b"later", now_ms=now_ms + 99, at_ms=now_ms + 30 * 24 * 3600 * 1000)
    f.call("Send", pb.SendRequest(topic=SMALL, frames=later))
    groups = [
        pb.ConsumerGroupState(
            group=G1, consume_type=pb.CONSUME_ORDERLY, message_model=pb.CLUSTERING,
            subscriptions=[pb.Subscription(topic=TOPIC, expression="*")],
        ),
        pb.ConsumerGroupState(
            group=G2, consume_type=pb.CONSUME_CONCURRENTLY, message_model=pb.CLUSTERING,
            subscriptions=[pb.Subscription(topic=TOPIC, expression="TagA || TagB")],
        ),
    ]  # fmt: skip
    heartbeat = pb.HeartbeatRequest(client_id=C1, consumer_groups=groups)
    f.call("Heartbeat", heartbeat)
    q0, q1, q2 = (
        pb.MessageQueue(topic=TOPIC, broker_name="broker-a", queue_id=q) for q in range(3)
    )
    locked = f.call("LockBatch", pb.LockBatchRequest(group=G1, client_id=C1, queues=[q0, q1]))
    epochs = [lq.epoch for lq in locked.locked]
    commit = pb.CommitConsumerOffsetsRequest(
        group=G1,
        client_id=C1,
        offsets=[pb.OffsetCommit(topic=TOPIC, offset=2, lock_epoch=epochs[0])],
    )
    f.call("CommitConsumerOffsets", commit)
    f.call("SendBack", pb.SendBackRequest(group=G2, queue=q2, queue_offset=0))
    receive = pb.ReceiveRequest(
        group=G3, topic=TOPIC, queue_ids=[3], max_messages=2, invisible_duration_ms=60_000,
        tag_expression="*",
    )  # fmt: skip
    held = f.call("Receive", receive)
    handles = [lease.receipt_handle for lease in held.leases]
    first_id = now_ms.to_bytes(16, "big").hex().upper()
    scheduled_id = (now_ms + 99).to_bytes(16, "big").hex().upper()
    pull = pb.PullRequest(
        group=G1, topic=TOPIC, queue_id=0, offset=0, max_messages=16, max_bytes=1 << 20,
        tag_expression="*",
    )  # fmt: skip
    half = pb.SendHalfMessageRequest(
        topic=TOPIC, queue_id=0, frame=frames(b"half", now_ms=now_ms + 50), producer_group="pg"
    )
    pending = f.call("SendHalfMessage", half)
    park = pb.ParkKeyRequest(
        group=G1, client_id=C1, queue=q1, sharding_key="order-1", from_offset=1,
        lock_epoch=epochs[1], reason="fuzz",
    )  # fmt: skip
    f.call("ParkKey", park)
    # Push delivery of q1, whose lock c1 holds: one record a batch, two of credit (then
    # it waits for a grant), and a grant of the same id for the third and later ones.
    subscribe = pb.ExchangeRequest(
        id=1,
        subscribe=pb.Subscribe(
            group=G1, topic=TOPIC, queue_id=1, offset=0, tag_expression="*", max_messages=1,
            max_bytes=1 << 20, client_id=C1, lock_epoch=epochs[1], credit_messages=2,
            credit_bytes=0,
        ),
    )  # fmt: skip
    credit = pb.ExchangeRequest(id=1, credit=pb.Credit(messages=8, bytes=4096))
    f.more_seeds = {
        "Exchange": [subscribe, credit],
        "ExchangeBatched": [pb.ExchangeRequests(requests=[subscribe, credit])],
    }
    f.examples = {
        "ExchangeBatched": [
            [
                pb.ExchangeRequests(requests=[subscribe]).SerializeToString(),
                pb.ExchangeRequests(requests=[credit]).SerializeToString(),
            ],
        ],
        "Exchange": [
            [subscribe.SerializeToString(), credit.SerializeToString()],
            [
                subscribe.SerializeToString(),
                pb.ExchangeRequest(id=1, cancel={}).SerializeToString(),
            ],
            # Past the queue's end: an OFFSET_ILLEGAL batch, then the error that ends the
            # subscription (it carried no ErrorReason).
            [
                pb.ExchangeRequest(
                    id=1,
                    subscribe=pb.Subscribe(
                        group=G1,
                        topic=TOPIC,
                        queue_id=2,
                        offset=99,
                        max_messages=1,
                        max_bytes=1 << 20,
                        credit_messages=2,
                    ),
                ).SerializeToString()
            ],
        ],
    }
    f.seeds = {
        "SendHalfMessage": half,
        "EndTransaction": pb.EndTransactionRequest(
            group="pg", transaction_id=pending.transaction_id, resolution=pb.TRANSACTION_ROLLBACK
        ),
        "WatchTransactionChecks": pb.WatchTransactionChecksRequest(group="pg", client_id=C1),
        "ParkKey": park,
        "ListParkedKeys": pb.ListParkedKeysRequest(group=G1),
        "ReleaseParkedKey": pb.ReleaseParkedKeyRequest(group=G1, queue=q1, sharding_key="order-1"),
        "QueryRoute": pb.QueryRouteRequest(topic=TOPIC),
        "Send": pb.SendRequest(topic=TOPIC, queue_id=1, frames=frames(b"x", now_ms=now_ms + 7)),
        "Pull": pull,
        "QueryQueueOffsets": pb.QueryQueueOffsetsRequest(topic=TOPIC, timestamp_ms=now_ms),
        "LockBatch": pb.LockBatchRequest(group=G1, client_id=C1, queues=[q0]),
        "UnlockBatch": pb.UnlockBatchRequest(group=G1, client_id="c2", queues=[q0]),
        "Heartbeat": heartbeat,
        "UnregisterClient": pb.UnregisterClientRequest(client_id="c9"),
        "GetConsumerList": pb.GetConsumerListRequest(group=G1),
        "WatchMembership": pb.WatchMembershipRequest(group=G1, known_version=0),
        "QueryConsumerOffset": pb.QueryConsumerOffsetRequest(group=G1, topic=TOPIC),
        "CommitConsumerOffsets": commit,
        "SendBack": pb.SendBackRequest(group=G2, queue=q2, queue_offset=1),
        "CancelScheduled": pb.CancelScheduledRequest(topic=SMALL, msg_id=scheduled_id),
        "Receive": receive,
        "Ack": pb.AckRequest(group=G3, receipt_handle=handles[0]),
        "ChangeInvisibleDuration": pb.ChangeInvisibleDurationRequest(
            group=G3, receipt_handle=handles[1], invisible_duration_ms=30_000
        ),
        "Exchange": pb.ExchangeRequest(id=1, pull=pull),
        "ExchangeBatched": pb.ExchangeRequests(
            requests=[
                pb.ExchangeRequest(id=1, pull=pull),
                pb.ExchangeRequest(
                    id=2,
                    send=pb.SendRequest(
                        topic=TOPIC, queue_id=1, frames=frames(b"b", now_ms=now_ms)
                    ),
                ),
            ]
        ),
        "CreateTopic": pb.CreateTopicRequest(topic=TOPIC, queue_count=4),
        "SetTopicRetention": pb.SetTopicRetentionRequest(
            topic=TOPIC, retention=pb.RetentionSettings(hours=24, bytes_per_queue=1 << 20)
        ),
        "ListTopics": pb.ListTopicsRequest(include_system=True),
        "ListGroups": pb.ListGroupsRequest(),
        "DescribeTopic": pb.DescribeTopicRequest(topic=TOPIC),
        "ConsumerProgress": pb.ConsumerProgressRequest(group=G1),
        "ResetOffset": pb.ResetOffsetRequest(group=G2, topic=TOPIC, queue_id=2, offset=1),
        "QueryMessageById": pb.QueryMessageByIdRequest(msg_id=first_id),
        "QueryMessagesByKey": pb.QueryMessagesByKeyRequest(topic=TOPIC, key=KEY, max_messages=3),
        "BrowseQueue": pb.BrowseQueueRequest(topic=TOPIC, queue_id=1, offset=0, max_messages=3),
        "BrokerStatus": pb.BrokerStatusRequest(),
        "DeleteTopic": pb.DeleteTopicRequest(topic=SMALL),
        "DeleteGroup": pb.DeleteGroupRequest(group=G2, force=True),
        # Succeeds once (a new directory beside the data directory), then is refused.
        "Backup": pb.BackupRequest(directory=str(f.embedded.config.data_dir.parent / "backup")),
    }
    f.pools = Pools(
        strings=(TOPIC, SMALL, G1, G2, G3, C1, "c2", KEY, "TagA", "TagA || TagB", "%RETRY%g2",
                 "%DLQ%g2", "broker-a", first_id, scheduled_id, first_id.lower(), *handles),
        binaries=(batch, later, frames(b"y", now_ms=now_ms, tags=b""),
                  encode_frame(msg_id=b"d" * 16, born_timestamp_ms=now_ms, body=b"d",
                               delay_level=2)),
        ints=(*epochs, now_ms, now_ms + 1, 3, 4),
        by_field={"id": (1, 2, 3)},
    )  # fmt: skip


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    broker, clock = still_broker(tmp_path_factory.mktemp("fuzz") / "broker")
    with (
        broker as embedded,
        grpc.insecure_channel(embedded.address, options=GRPC_CLIENT_CHANNEL_OPTIONS) as channel,
    ):
        f = Fuzzed(embedded, clock, channel)
        seed(f)
        yield f


# ---------------------------------------------------------------------------- checks
def check_refusal(code: grpc.StatusCode, details: str, reason: str | None, what: str) -> None:
    assert code.name in REFUSALS, f"{what}: answered {code.name}: {details}"
    assert details, f"{what}: {code.name} without words"
    if code is not grpc.StatusCode.RESOURCE_EXHAUSTED or reason is not None:
        assert reason in REASONS, f"{what}: {code.name} {details!r} with reason {reason!r}"


def reason_of(call: grpc.Call) -> str | None:
    return dict(call.trailing_metadata() or ()).get(REASON_KEY)  # type: ignore[arg-type]


def parsed(method: MethodDescriptor, data: bytes) -> Message | None:
    try:
        return request_class(method).FromString(data)
    except DecodeError:
        return None


@dataclass
class Outcome:
    """How a call ended: OK, or a refusal; or held (a pull the broker held, cancelled)."""

    ok: bool
    held: bool = False


class Waiter:
    """Wait for a call to end, or for the broker to report a pull it holds."""

    def __init__(self) -> None:
        self.done = threading.Event()

    def wait(self, f: Fuzzed, what: str) -> bool:
        """True when the call ended; False when the broker holds a pull for it."""
        deadline = time.monotonic() + DEADLINE
        while not self.done.wait(0.02):
            if held_pulls(f.broker):
                return False
            assert time.monotonic() < deadline, f"{what}: no answer within {DEADLINE} s"
        return True


def unary(f: Fuzzed, method: MethodDescriptor, data: bytes) -> Outcome:
    what = f"{method.name}({data!r})"
    future = f.channel.unary_unary(rpc_path(method)).future(data, timeout=DEADLINE)
    waiter = Waiter()
    future.add_done_callback(lambda _: waiter.done.set())
    if not waiter.wait(f, what):
        future.cancel()
        wait_until(lambda: held_pulls(f.broker) == 0, DEADLINE, "the cancelled pull to be released")
        return Outcome(ok=True, held=True)
    code = future.code()
    if code is grpc.StatusCode.OK:
        return Outcome(ok=True)
    check_refusal(code, future.details(), reason_of(future), what)
    return Outcome(ok=False)


def watch(f: Fuzzed, method: MethodDescriptor, data: bytes) -> Outcome:
    """A server stream: WatchMembership's first event comes at once when known_version is
    behind; WatchTransactionChecks sends nothing until a check-back is due."""
    what = f"{method.name}({data!r})"
    request = parsed(method, data)
    call = f.channel.unary_stream(rpc_path(method))(data, timeout=DEADLINE)
    got: list[Any] = []
    waiter = Waiter()

    def read() -> None:
        try:
            got.extend(call)
        except grpc.RpcError:
            pass
        finally:
            waiter.done.set()

    reader = threading.Thread(target=read)
    reader.start()
    state = f.broker.state
    assert state is not None
    groups = state.groups
    expect_event = (
        method.name == "WatchMembership"
        and request is not None
        and groups.version(request.group) != request.known_version  # type: ignore[attr-defined]
    )
    try:
        if expect_event:
            wait_until(lambda: bool(got) or waiter.done.is_set(), DEADLINE, f"{what} to answer")
        else:
            wait_until(
                lambda: waiter.done.is_set() or bool(groups._streams),
                DEADLINE,
                f"{what} to end or watch",
            )
    finally:
        call.cancel()
        reader.join(DEADLINE)
        # The broker's side ends (and forgets a group only watched) after the client's.
        wait_until(lambda: not groups._streams, DEADLINE, "the watch to end at the broker")
    code = call.code()
    if got or code is grpc.StatusCode.CANCELLED:
        return Outcome(ok=True, held=not got)
    check_refusal(code, call.details(), reason_of(call), what)
    return Outcome(ok=False)


def exchange(f: Fuzzed, method: MethodDescriptor, requests: list[bytes]) -> Outcome:
    """Exchange: every request answered by id (or refused), then the stream ends."""
    what = f"{method.name}({requests!r})"
    call = f.channel.stream_stream(rpc_path(method))(iter(requests), timeout=DEADLINE)
    got: list[pb.ExchangeResponse] = []
    waiter = Waiter()
    # ExchangeBatched carries several of Exchange's requests and answers to a message.
    batched = method.name == "ExchangeBatched"

    def read() -> None:
        try:
            for r in call:
                if batched:
                    got.extend(pb.ExchangeResponses.FromString(r).responses)
                else:
                    got.append(pb.ExchangeResponse.FromString(r))
        except grpc.RpcError:
            pass
        finally:
            waiter.done.set()

    reader = threading.Thread(target=read)
    reader.start()
    ended = waiter.wait(f, what)
    if not ended:
        call.cancel()
        wait_until(lambda: held_pulls(f.broker) == 0, DEADLINE, "the cancelled pull to be released")
    reader.join(DEADLINE)
    wait_until(lambda: f.broker.exchange_streams == 0, DEADLINE, "the stream to close")
    bodies: list[Any] = [parsed(method, r) for r in requests]
    if batched:
        bodies = [request for b in bodies for request in (b.requests if b else [None])]
    code = call.code()
    if not ended:
        assert code is grpc.StatusCode.CANCELLED, (what, code, call.details())
    elif any(b is None for b in bodies):
        check_refusal(code, call.details(), reason_of(call), what)
    else:
        assert code is grpc.StatusCode.OK, (what, code, call.details())
    sent_ids = {b.id for b in bodies if b is not None}  # type: ignore[attr-defined]
    # Cancels and credit grants are never answered.
    answerable = [
        b for b in bodies if b is not None and b.WhichOneof("body") not in ("cancel", "credit")
    ]
    # A subscription is answered once per batch, then once more if an error ends it.
    subscribed = any(b.WhichOneof("body") == "subscribe" for b in answerable)
    assert {a.id for a in got} <= sent_ids, what
    if subscribed:
        assert {b.id for b in answerable} >= {a.id for a in got}, what  # type: ignore[attr-defined]
    else:
        assert len(got) <= len(answerable), what
    for answer in got:
        if answer.HasField("error"):
            e = answer.error
            assert e.code in REFUSALS, f"{what}: answered {e}"
            assert e.reason in REASONS and e.message, f"{what}: answered {e}"
    kinds = {b.WhichOneof("body") for b in bodies if b is not None}
    if ended and code is grpc.StatusCode.OK and "cancel" not in kinds:
        if subscribed:  # each request answered (a subscription ended: by an error)
            assert {a.id for a in got} == {b.id for b in answerable}, what  # type: ignore[attr-defined]
        else:
            assert len(got) == len(answerable), f"{what}: {len(got)} answers"
    # A send cancelled after it was appended stays appended, unanswered.
    unanswered_send = {"send", "cancel"} <= kinds
    sent = any(a.HasField("send") for a in got)
    return Outcome(ok=sent or unanswered_send or not ended, held=not ended)


# ---------------------------------------------------------------------------- the tests
def inputs(f: Fuzzed, method: MethodDescriptor) -> st.SearchStrategy[bytes]:
    """Generated, one-field-changed and byte-mutated requests of `method`, serialized."""
    seed_requests = [f.seeds[method.name], *f.more_seeds.get(method.name, ())]
    return st.one_of(
        messages(method.input_type, f.pools).map(lambda m: m.SerializeToString()),
        *(
            one_field_changed(seed_request, f.pools).map(lambda m: m.SerializeToString())
            for seed_request in seed_requests
        ),
        *(
            st.just(seed_request.SerializeToString()).flatmap(mutated)
            for seed_request in seed_requests
        ),
    )


def drive(f: Fuzzed, method: MethodDescriptor, data: Any) -> Outcome:
    if method.client_streaming:
        return exchange(f, method, data)
    if method.server_streaming:
        return watch(f, method, data)
    return unary(f, method, data)


SEND_FRAME = encode_frame(msg_id=b"r" * 16, born_timestamp_ms=0, body=b"r")
#: Inputs that crashed a handler or changed state when refused, kept as regressions.
REGRESSIONS: dict[str, list[Any]] = {
    # Malformed protobuf, and a string field that is not UTF-8: answered UNKNOWN with a
    # DecodeError traceback logged (the generated deserializer raised).
    "QueryRoute": [b"\xff\xff\xff", b"\x0a\x02\xc3\x28"],
    "Exchange": [[b"\x0a\x02\xc3\x28"]],
    "WatchMembership": [
        b"\x0a\x02\xc3\x28",
        # Watching a group nobody joined added it to the group registry for good.
        pb.WatchMembershipRequest(group="only-watched", known_version=0).SerializeToString(),
    ],
    # An enum value the protocol does not define: pb.ConsumeType.Name raised ValueError.
    "Heartbeat": [
        pb.HeartbeatRequest(
            client_id=C1,
            consumer_groups=[pb.ConsumerGroupState(group=G1, consume_type=7, message_model=1)],
        ).SerializeToString()
    ],
    # A refused send created the topic it named (auto-creation ran before the checks).
    "Send": [
        pb.SendRequest(topic="new-topic", frames=b"\x00").SerializeToString(),
        pb.SendRequest(topic="new-topic-2", queue_id=99, frames=SEND_FRAME).SerializeToString(),
    ],
    # Asking for an unknown group's members added it to the group registry for good.
    "GetConsumerList": [pb.GetConsumerListRequest(group="never-seen").SerializeToString()],
}


def fuzz_method(
    f: Fuzzed, method: MethodDescriptor, tracebacks: Tracebacks, counts: Counter[str]
) -> None:
    strategy: st.SearchStrategy[Any] = inputs(f, method)
    if method.client_streaming:
        strategy = st.lists(strategy, min_size=1, max_size=6)

    @fuzz_settings(80, 2000)
    @given(strategy)
    def run(data: Any) -> None:
        counts["examples"] += 1
        tracebacks.records.clear()
        before = broker_state(f.broker)
        outcome = drive(f, method, data)
        counts["held" if outcome.held else "ok" if outcome.ok else "refused"] += 1
        assert not tracebacks.records, [r.getMessage() for r in tracebacks.records]
        if not outcome.ok or method.name in READ_ONLY:
            assert broker_state(f.broker) == before, f"{method.name} changed the broker's state"

    for data in [*REGRESSIONS.get(method.name, ()), *f.examples.get(method.name, ())]:
        run = example(data)(run)
    run()


@pytest.mark.parametrize("service", SERVICES, ids=lambda s: s.name)
def test_every_rpc_answers_fuzzed_requests_with_a_status_and_refusals_change_nothing(
    service: Any, fuzzed: Fuzzed, tracebacks: Tracebacks, chaos_report: ChaosRecorder
) -> None:
    counts: Counter[str] = Counter()
    for method in service.methods:
        if method.name not in DELETIONS:
            fuzz_method(fuzzed, method, tracebacks, counts)
    note = (
        f"{len(service.methods)} RPCs; {counts['refused']} refused, {counts['ok']} accepted, "
        f"{counts['held']} held; no crash"
    )
    chaos_report.record(
        fault=f"fuzz: gRPC {service.name}", rounds=counts["examples"], acked=0, lost=0,
        order_violations=0, duplicates=0, note=note,
    )  # fmt: skip


def test_every_rpc_of_every_service_is_fuzzed(fuzzed: Fuzzed) -> None:
    """A new RPC is fuzzed by the generic strategies; it needs a valid seed request (for
    the one-field mutations) and, if it streams both ways, a driver."""
    names = {m.name for m in METHODS}
    assert set(fuzzed.seeds) == names, f"seed requests missing for {names - set(fuzzed.seeds)}"
    for method in METHODS:
        assert fuzzed.seeds[method.name].DESCRIPTOR is method.input_type
        if method.client_streaming:
            assert method.full_name in (
                "ordermq.v1.MessagingService.Exchange",
                "ordermq.v1.MessagingService.ExchangeBatched",
            ), f"{method.full_name}: write a driver for this stream (see exchange())"
    assert set(REGRESSIONS) <= names


def test_a_request_over_the_message_size_limit_is_refused_and_changes_nothing(
    fuzzed: Fuzzed, tracebacks: Tracebacks
) -> None:
    """100 MB in one field: gRPC refuses it by its size before a handler sees it."""
    huge = pb.SendRequest(topic=TOPIC, frames=b"\x00" * 100_000_000).SerializeToString()
    send = next(m for m in METHODS if m.name == "Send")
    ex = next(m for m in METHODS if m.name == "Exchange")
    before = broker_state(fuzzed.broker)
    with pytest.raises(grpc.RpcError) as refused:
        fuzzed.channel.unary_unary(rpc_path(send))(huge, timeout=DEADLINE)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    request = pb.ExchangeRequest(id=1, send=pb.SendRequest.FromString(huge)).SerializeToString()
    call = fuzzed.channel.stream_stream(rpc_path(ex))(iter([request]), timeout=DEADLINE)
    with pytest.raises(grpc.RpcError) as refused:
        list(call)
    assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert broker_state(fuzzed.broker) == before
    assert not tracebacks.records


@pytest.mark.parametrize("name", ["offsets.json", "topics.json"])
def test_a_broker_whose_data_file_is_unreadable_refuses_to_start_and_says_which(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Committed offsets and topics are not guessed: the broker names the file and stops."""
    data = tmp_path / "broker"
    data.mkdir()
    (data / name).write_bytes(b'{"offsets": {"g": [1]}, "topics": {"t": "8"}}')
    with pytest.raises(SystemExit) as stopped:
        mockbroker_main(["--data-dir", str(data), "--port", "0"])
    assert stopped.value.code == 1
    assert f"{data / name} is unreadable" in capsys.readouterr().err


def test_deletions_answer_fuzzed_requests_with_a_status_and_refusals_change_nothing(
    fuzzed: Fuzzed, tracebacks: Tracebacks
) -> None:
    """Last in this file: an accepted deletion takes what the other RPCs are fuzzed on."""
    counts: Counter[str] = Counter()
    for method in METHODS:
        if method.name in DELETIONS:
            fuzz_method(fuzzed, method, tracebacks, counts)
    assert counts["examples"] > 0
