"""The RocketMQ fronts fuzzed over real connections: the v2 gRPC front (RocketMQ 5's
clients) and the remoting front (RocketMQ 4's), each on an EmbeddedBroker.

v2: every RPC of apache.rocketmq.v2.MessagingService gets requests generated from its
descriptor, a valid request with one field changed, and a valid request's bytes mutated
(tests/fuzzing.py), sent as raw bytes. Each call must end within its deadline, never with
UNKNOWN or INTERNAL (a handler that raised) nor with the status INTERNAL_SERVER_ERROR in
its answer, and with no traceback logged; a refused call (a gRPC error, or answers whose
statuses all say no), or one that only reads, changes nothing.

Remoting: requests of every code RocketMQ names (and codes it does not), with header
fields drawn from the names the handlers read and values that are not what they expect
(not numbers, out of range, empty, control characters), and bodies that are not what
they expect. Each must be answered on the same connection within its deadline (a held
pull aside), with no traceback logged: bad input is a refusal with words, as RocketMQ's
own broker gives (SYSTEM_ERROR naming the missing field, among others), and a refusal
(any answer but SUCCESS, a pull's "nothing new" aside), or a request that only reads,
changes nothing.

"Changes nothing" compares tests.fuzzing.broker_state before and after the call, the
broker on a FakeClock that never moves (as in test_fuzz_rpc.py, the ordermq gRPC API's
fuzz): any change is the call's.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import given
from hypothesis import strategies as st

from mockbroker import EmbeddedBroker
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from sdk import Message as OrderMQMessage
from sdk import Producer
from sdk._remoting.codec import decode, encode
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from tests.chaos_report import ChaosRecorder
from tests.component.pulling import read_topic
from tests.fuzzing import (
    EDGE_STRINGS,
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

SERVICE = svc.DESCRIPTOR.services_by_name["MessagingService"]
#: Longest any call may take to be answered (a held receive or pull answers before it).
DEADLINE = 10.0
TOPIC, GROUP, CLIENT = "orders", "g1", "fuzz-client-1"
#: v2 gRPC statuses that mean a handler raised.
CRASHES = {"UNKNOWN", "INTERNAL"}
#: v2 statuses that say a call was (at least partly) carried out.
V2_ACCEPTED = {v2.OK, v2.MULTIPLE_RESULTS}
#: v2 RPCs that only read: they change nothing even when they succeed. (Not QueryRoute:
#: it creates the topic it names when the broker auto-creates topics, as a send would.)
V2_READ_ONLY = {"QueryAssignment", "GetOffset", "QueryOffset", "PullMessage"}
#: Remoting requests that only read, and answers other than SUCCESS that are not refusals.
REMOTING_READ_ONLY = {
    RequestCode.QUERY_MESSAGE, RequestCode.QUERY_CONSUMER_OFFSET,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, RequestCode.GET_MAX_OFFSET,
    RequestCode.GET_MIN_OFFSET, RequestCode.GET_EARLIEST_MSG_STORETIME,
    RequestCode.VIEW_MESSAGE_BY_ID, RequestCode.GET_CONSUMER_LIST_BY_GROUP,
    RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_BROKER_CLUSTER_INFO,
}  # fmt: skip
#: A pull found nothing new, or was told where to go: it may still commit the offset it carried.
PULL_ANSWERS = {
    ResponseCode.PULL_NOT_FOUND, ResponseCode.PULL_RETRY_IMMEDIATELY,
    ResponseCode.PULL_OFFSET_MOVED,
}  # fmt: skip


@dataclass
class Fronts:
    """The broker under test and what was stored before the fuzzing."""

    embedded: EmbeddedBroker
    channel: grpc.Channel
    seeds: dict[str, Message]
    pools: Pools


@pytest.fixture(scope="module")
def fronts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fronts]:
    data_dir = tmp_path_factory.mktemp("fuzz-fronts") / "broker"
    broker, _clock = still_broker(data_dir, v2_port=0, remoting_port=0, namesrv_port=0)
    with (
        broker as embedded,
        grpc.insecure_channel(embedded.v2_address) as ch,
    ):
        with Producer(embedded.address) as producer:
            for i in range(16):
                producer.send(
                    OrderMQMessage(
                        TOPIC, b"m%d" % i, sharding_key=f"k{i}", keys=["key1"], tags="TagA"
                    )
                )
        seeds = v2_seeds(embedded, ch)
        ack = seeds["AckMessage"]
        assert isinstance(ack, svc.AckMessageRequest)
        entry = ack.entries[0]
        pools = Pools(
            strings=(TOPIC, GROUP, CLIENT, "TagA", "%RETRY%g1", entry.message_id,
                     entry.receipt_handle),
            ints=(0, 1, 7, 8, 16, 32),
        )  # fmt: skip
        yield Fronts(embedded, ch, seeds, pools)


def changed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The parts of the broker's state that differ: (before, after) each."""
    return {k: (before[k], after[k]) for k in before if before[k] != after[k]}


# ---------------------------------------------------------------------------- v2
def rpc_path(method: MethodDescriptor) -> str:
    return f"/{SERVICE.full_name}/{method.name}"


METADATA = (("x-mq-client-id", CLIENT),)


def v2_call(
    embedded: EmbeddedBroker, channel: grpc.Channel, method: MethodDescriptor, data: bytes
) -> list[bytes] | None:
    """One call of `method` with raw request bytes; the raw answers (several for a stream).

    None: a receive the broker held for messages to come; it is cancelled (the broker's
    clock never moves, so it would wait for good) and the broker lets it go.
    """
    identity: Any = lambda b: b  # noqa: E731  # the bytes as they go and come
    path = rpc_path(method)
    answers: list[bytes] = []
    failed: list[grpc.RpcError] = []
    done = threading.Event()
    call: Any
    if method.client_streaming or method.server_streaming:
        if method.client_streaming:
            stream = channel.stream_stream(path, identity, identity)
            call = stream(iter([data]), metadata=METADATA, timeout=DEADLINE)
        else:
            served = channel.unary_stream(path, identity, identity)
            call = served(data, metadata=METADATA, timeout=DEADLINE)

        def read() -> None:
            try:
                answers.extend(call)
            except grpc.RpcError as exc:
                failed.append(exc)
            finally:
                done.set()

        threading.Thread(target=read, daemon=True).start()
    else:
        call = channel.unary_unary(path, identity, identity).future(
            data, metadata=METADATA, timeout=DEADLINE
        )
        call.add_done_callback(lambda _: done.set())
    while not done.wait(0.02):
        if held_pulls(embedded.broker):
            call.cancel()
            wait_until(lambda: not held_pulls(embedded.broker), DEADLINE, "the receive let go")
            return None
    if not (method.client_streaming or method.server_streaming):
        return [call.result()]  # raises the call's RpcError
    if failed:
        raise failed[0]
    return answers


def v2_message(body: bytes, message_id: str) -> v2.Message:
    sp = v2.SystemProperties(
        message_id=message_id, born_host="10.0.0.9", body_encoding=v2.IDENTITY,
        message_type=v2.NORMAL, tag="TagA", keys=["key1"],
    )  # fmt: skip
    sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    return v2.Message(topic=v2.Resource(name=TOPIC), system_properties=sp, body=body)


def v2_seeds(embedded: EmbeddedBroker, channel: grpc.Channel) -> dict[str, Message]:
    """A valid request of every RPC; ack and the like name a message received just now."""
    topic, group = v2.Resource(name=TOPIC), v2.Resource(name=GROUP)
    queue = v2.MessageQueue(topic=topic, id=0)
    endpoints = v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host="127.0.0.1", port=1)])
    receive = svc.ReceiveMessageRequest(
        group=group, message_queue=queue, batch_size=4, auto_renew=False,
        filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
    )  # fmt: skip
    receive.invisible_duration.FromSeconds(30)
    receive.long_polling_timeout.FromSeconds(1)
    method = SERVICE.methods_by_name["ReceiveMessage"]
    answers = [svc.ReceiveMessageResponse.FromString(b) for b in
               v2_call(embedded, channel, method, receive.SerializeToString()) or ()]  # fmt: skip
    received = [a.message for a in answers if a.HasField("message")]
    assert received, f"the seed receive got no message: {answers}"
    sp = received[0].system_properties
    handle, message_id = sp.receipt_handle, sp.message_id
    change = svc.ChangeInvisibleDurationRequest(
        group=group, topic=topic, receipt_handle=handle, message_id=message_id
    )
    change.invisible_duration.FromSeconds(60)
    return {
        "QueryRoute": svc.QueryRouteRequest(topic=topic, endpoints=endpoints),
        "Heartbeat": svc.HeartbeatRequest(group=group, client_type=v2.SIMPLE_CONSUMER),
        "SendMessage": svc.SendMessageRequest(
            messages=[v2_message(b"seed", "01ABCDEF0123456789ABCDEF01")]
        ),
        "QueryAssignment": svc.QueryAssignmentRequest(
            topic=topic, group=group, endpoints=endpoints
        ),
        "ReceiveMessage": receive,
        "AckMessage": svc.AckMessageRequest(
            group=group,
            topic=topic,
            entries=[svc.AckMessageEntry(message_id=message_id, receipt_handle=handle)],
        ),
        "ForwardMessageToDeadLetterQueue": svc.ForwardMessageToDeadLetterQueueRequest(
            group=group,
            topic=topic,
            receipt_handle=handle,
            message_id=message_id,
            delivery_attempt=1,
            max_delivery_attempts=3,
        ),
        "PullMessage": svc.PullMessageRequest(
            group=group, message_queue=queue, offset=0, batch_size=4
        ),
        "UpdateOffset": svc.UpdateOffsetRequest(group=group, message_queue=queue, offset=1),
        "GetOffset": svc.GetOffsetRequest(group=group, message_queue=queue),
        "QueryOffset": svc.QueryOffsetRequest(message_queue=queue),
        "EndTransaction": svc.EndTransactionRequest(
            topic=topic, message_id=message_id, transaction_id="t1", resolution=v2.COMMIT
        ),
        "Telemetry": svc.TelemetryCommand(settings=v2.Settings(client_type=v2.PRODUCER)),
        "NotifyClientTermination": svc.NotifyClientTerminationRequest(group=group),
        "ChangeInvisibleDuration": change,
        "RecallMessage": svc.RecallMessageRequest(topic=topic, recall_handle=handle),
        "SyncLiteSubscription": svc.SyncLiteSubscriptionRequest(topic=topic, group=group),
    }


def v2_inputs(f: Fronts, method: MethodDescriptor) -> st.SearchStrategy[bytes]:
    seed = f.seeds[method.name]
    return st.one_of(
        messages(method.input_type, f.pools).map(lambda m: m.SerializeToString()),
        one_field_changed(seed, f.pools).map(lambda m: m.SerializeToString()),
        mutated(seed.SerializeToString()),
    )


def v2_status(method: MethodDescriptor, answer: bytes) -> int | None:
    """The v2 status code an answer carries (None: it has none, or is not readable)."""
    try:
        parsed = GetMessageClass(method.output_type).FromString(answer)
    except DecodeError:
        return None
    if not any(f.name == "status" for f in parsed.DESCRIPTOR.fields):
        return None
    return int(parsed.status.code) if parsed.HasField("status") else None


def fuzz_v2_method(
    f: Fronts, method: MethodDescriptor, tracebacks: Tracebacks, counts: Counter[str]
) -> None:
    @fuzz_settings(15, 400)
    @given(v2_inputs(f, method))
    def run(data: bytes) -> None:
        counts["examples"] += 1
        tracebacks.records.clear()
        what = f"{method.name}({data!r})"
        before = broker_state(f.embedded.broker)
        try:
            answers = v2_call(f.embedded, f.channel, method, data)
        except grpc.RpcError as exc:
            code = exc.code()
            assert code.name not in CRASHES, f"{what}: {code.name}: {exc.details()}"
            assert code is not grpc.StatusCode.DEADLINE_EXCEEDED, f"{what}: no answer"
            refused = True
        else:
            if answers is None:
                counts["held"] += 1
                return
            statuses = [s for s in (v2_status(method, a) for a in answers) if s is not None]
            assert v2.INTERNAL_SERVER_ERROR not in statuses, f"{what}: {statuses}"
            refused = bool(statuses) and not V2_ACCEPTED.intersection(statuses)
        counts["refused" if refused else "answered"] += 1
        assert not tracebacks.records, [r.getMessage() for r in tracebacks.records]
        if refused or method.name in V2_READ_ONLY:
            after = broker_state(f.embedded.broker)
            assert after == before, f"{what} changed the broker's state: {changed(before, after)}"

    run()


def test_every_v2_rpc_answers_fuzzed_requests_without_a_crash_and_refusals_change_nothing(
    fronts: Fronts, tracebacks: Tracebacks, chaos_report: ChaosRecorder
) -> None:
    assert set(fronts.seeds) == {m.name for m in SERVICE.methods}, "a seed for every RPC"
    counts: Counter[str] = Counter()
    for method in SERVICE.methods:
        fuzz_v2_method(fronts, method, tracebacks, counts)
    chaos_report.record(
        fault="fuzz: RocketMQ 5 gRPC (v2) front", rounds=counts["examples"], acked=0, lost=0,
        order_violations=0, duplicates=0,
        note=f"{len(SERVICE.methods)} RPCs; {counts['refused']} refused by status, "
        f"{counts['answered']} answered; no crash, no refusal changed the broker",
    )  # fmt: skip


# ---------------------------------------------------------------------------- remoting
#: Header fields the remoting handlers read, and a few they do not.
FIELD_NAMES = (
    "batch", "beginTimestamp", "bornTimestamp", "brokerName", "clientID", "clientId",
    "commitLogOffset", "commitOffset", "commitOrRollback", "consumerGroup", "defaultTopic",
    "defaultTopicQueueNums", "delayLevel", "endTimestamp", "expressionType", "flag", "force",
    "fromTransactionCheck", "group", "groupName", "key", "maxMsgNums", "maxNum",
    "maxReconsumeTimes", "msgId", "offset", "offsetMsgId", "originMsgId", "originTopic",
    "perm", "producerGroup", "properties", "queueId", "queueOffset", "readQueueNums",
    "reconsumeTimes", "subscription", "subVersion", "suspendTimeoutMillis", "sysFlag",
    "timestamp", "topic", "topicSysFlag", "tranStateTableOffset", "transactionId", "unitMode",
    "writeQueueNums", "unknownField",
)  # fmt: skip
#: Values a field may get: what the handlers expect, and what they do not.
FIELD_VALUES = (
    "0", "1", "-1", "8", "16", "2147483647", "2147483648", "-2147483649",
    "9223372036854775807", "9223372036854775808", "1e3", "0x10", " 1", "1.5", "NaN",
    "true", "false", "abc", TOPIC, GROUP, CLIENT, "TagA", "TagA || TagB", "*", "TAG", "SQL92",
    "a > 1", "%RETRY%g1", "%DLQ%g1", "TBW102", "SCHEDULE_TOPIC_XXXX", "broker-a",
    "0A0A0A0A00002A9F0000000000000000", "7F000001000027100000000000000000",
    "UNIQ_KEY\u00010A0A\u0002", "DELAY\u00013\u0002", "TRAN_MSG\u0001true\u0002",
    "key1\u0001val1\u0002", "{", "[]", *EDGE_STRINGS,
)  # fmt: skip
MQ = {"topic": TOPIC, "brokerName": "broker-a", "queueId": 0}
BODIES = (
    b"", b"hello", b"[]", b"{}", b"null", b"1", b'"x"', b"{{{{", b"\xff\xfe",
    json.dumps({"mqSet": [MQ], "consumerGroup": GROUP, "clientId": CLIENT}).encode(),
    json.dumps({"mqSet": [{**MQ, "queueId": -1}], "consumerGroup": GROUP}).encode(),
    json.dumps({"clientID": CLIENT, "consumerDataSet": [{"groupName": GROUP}]}).encode(),
    json.dumps({"clientID": CLIENT,
                "consumerDataSet": [{"groupName": 1, "subscriptionDataSet": {}}]}).encode(),
    json.dumps({"offsetTable": {"x": 1}}).encode(),
)  # fmt: skip
#: Every code RocketMQ's remoting names here, and one it does not.
CODES = (*sorted({int(c) for c in RequestCode}), 9999)


@st.composite
def remoting_requests(draw: st.DrawFn, code: int) -> RemotingCommand:
    fields = draw(
        st.dictionaries(
            st.one_of(st.sampled_from(FIELD_NAMES), st.text(min_size=1, max_size=12)),
            st.one_of(st.sampled_from(FIELD_VALUES), st.text(max_size=40)),
            max_size=8,
        )
    )
    body = draw(st.one_of(st.sampled_from(BODIES), st.binary(max_size=120)))
    return RemotingCommand(code=code, ext_fields=fields, body=body, language="JAVA", version=401)


class RemotingPeer:
    """A blocking connection that sends one request and reads its answer."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self._address = (host, int(port))
        self._sock: socket.socket | None = None
        self._opaque = 0

    def _connected(self) -> socket.socket:
        if self._sock is None:
            self._sock = socket.create_connection(self._address, timeout=DEADLINE)
        return self._sock

    def _read(self, sock: socket.socket, n: int) -> bytes:
        got = b""
        while len(got) < n:
            chunk = sock.recv(n - len(got))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            got += chunk
        return got

    def ask(self, request: RemotingCommand) -> RemotingCommand | None:
        """The answer (None: a pull the broker held past the deadline; the connection is
        dropped then, as a client that gives up on it would)."""
        self._opaque += 1
        request.opaque = self._opaque
        sock = self._connected()
        sock.sendall(encode(request))
        try:
            (length,) = struct.unpack(">I", self._read(sock, 4))
            answer = decode(self._read(sock, length))
        except TimeoutError:
            self.close()
            if request.code == RequestCode.PULL_MESSAGE:
                return None
            raise AssertionError(f"no answer to {request} within {DEADLINE}s") from None
        assert answer.opaque == request.opaque, (answer, request)
        return answer

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def fuzz_remoting_code(
    f: Fronts, peer: RemotingPeer, code: int, tracebacks: Tracebacks, counts: Counter[str]
) -> None:
    @fuzz_settings(15, 300)
    @given(remoting_requests(code))
    def run(request: RemotingCommand) -> None:
        counts["examples"] += 1
        tracebacks.records.clear()
        try:
            encode(request)
        except ValueError:  # what the header cannot carry: no frame to send
            return
        before = broker_state(f.embedded.broker)
        answer = peer.ask(request)
        if answer is None:
            return
        refused = answer.code != ResponseCode.SUCCESS and not (
            code == RequestCode.PULL_MESSAGE and answer.code in PULL_ANSWERS
        )
        counts["refused" if refused else "ok"] += 1
        assert not tracebacks.records, [r.getMessage() for r in tracebacks.records]
        if refused or code in REMOTING_READ_ONLY:
            after = broker_state(f.embedded.broker)
            assert after == before, (
                f"{request} answered {answer.code} {answer.remark!r} and changed the broker's "
                f"state: {changed(before, after)}"
            )

    run()


def test_the_remoting_front_answers_fuzzed_requests_and_refusals_change_nothing(
    fronts: Fronts, tracebacks: Tracebacks, chaos_report: ChaosRecorder
) -> None:
    counts: Counter[str] = Counter()
    for address in (fronts.embedded.remoting_address, fronts.embedded.namesrv_address):
        assert address is not None
        peer = RemotingPeer(address)
        try:
            for code in CODES:
                fuzz_remoting_code(fronts, peer, code, tracebacks, counts)
        finally:
            peer.close()
    chaos_report.record(
        fault="fuzz: RocketMQ 4 remoting front", rounds=counts["examples"], acked=0, lost=0,
        order_violations=0, duplicates=0,
        note=f"{len(CODES)} request codes, broker port and name server; {counts['refused']} "
        f"refused, {counts['ok']} answered; no crash, no connection dropped, no refusal "
        "changed the broker",
    )  # fmt: skip


def test_the_fuzzed_broker_still_serves_what_was_stored(fronts: Fronts) -> None:
    """After the fuzzing the messages stored before it are still there to read."""
    bodies = {m.body for m in read_topic(fronts.embedded.address, TOPIC)}
    assert {b"m%d" % i for i in range(16)} <= bodies
