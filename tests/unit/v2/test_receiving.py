"""ReceiveMessage, AckMessage, ChangeInvisibleDuration, Forward...: v2 <-> pop core calls.

Against a small in-memory pop core: what the front asks of the core for each request, and
the v2 answer it builds from what the core says (the stream shape the clients need, the
receipt fields, the codes of refusals), and that bad requests never reach the core.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from typing import Any

import pytest
from google.protobuf.duration_pb2 import Duration
from grpc import StatusCode

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker.errors import BrokerError, invalid, not_found
from mockbroker.fronts.v2.messages import timestamp_ms
from mockbroker.fronts.v2.pop import GroupPolicy, PopCore, Popped
from mockbroker.fronts.v2.receiving import (
    AUTO_RENEW_INVISIBLE_SECONDS,
    MAX_LONG_POLLING_SECONDS,
    Receiving,
)
from sdk._wire import StoredRecord

NOW_MS = 1_700_000_000_000
STORE_HOST = "127.0.0.1:8090"


def record(offset: int, body: bytes = b"job") -> StoredRecord:
    return StoredRecord(
        topic="jobs", queue_id=1, queue_offset=offset, store_timestamp_ms=NOW_MS - 10,
        reconsume_times=0, msg_id=bytes([offset]) * 16, born_timestamp_ms=NOW_MS - 20,
        deliver_at_ms=0, delay_level=0, tags=b"TagA", sharding_key=b"", keys=b"",
        properties=b"", body=body,
    )  # fmt: skip


class FakeCore:
    """A pop core in a few lines: ready messages, in flight by handle."""

    def __init__(self, ready: Sequence[StoredRecord] = ()) -> None:
        self.ready = list(ready)
        self.in_flight: dict[str, StoredRecord] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self._handles = 0

    def _handle(self) -> str:
        self._handles += 1
        return f"handle-{self._handles}"

    def group_policy(self, group: str) -> GroupPolicy:
        return GroupPolicy(fifo=group.startswith("fifo"))

    async def receive(self, **call: Any) -> Sequence[Popped]:
        self.calls.append(("receive", call))
        out = []
        while self.ready and len(out) < call["max_messages"]:
            handle = self._handle()
            self.in_flight[handle] = self.ready.pop(0)
            out.append(Popped(self.in_flight[handle], handle, 2, call["invisible_seconds"]))
        return out

    def _take(self, handle: str) -> StoredRecord:
        found = self.in_flight.pop(handle, None)
        if found is None:
            raise invalid("RECEIPT_EXPIRED", f"receipt handle {handle} is not in flight")
        return found

    async def ack(self, **call: Any) -> None:
        self.calls.append(("ack", call))
        self._take(call["receipt_handle"])

    async def change_invisible(self, **call: Any) -> str:
        self.calls.append(("change_invisible", call))
        if call["invisible_seconds"] > 3600:
            raise invalid("INVALID_INVISIBLE_TIME", "invisible time over 1 h")
        handle = self._handle()
        self.in_flight[handle] = self._take(call["receipt_handle"])
        return handle

    async def forward_to_dead_letter(self, **call: Any) -> None:
        self.calls.append(("forward", call))
        self._take(call["receipt_handle"])


def receiving(core: PopCore | None) -> Receiving:
    return Receiving(core, store_host=lambda: STORE_HOST, now_ms=lambda: NOW_MS)


def receive_request(**fields: Any) -> svc.ReceiveMessageRequest:
    base: dict[str, Any] = {
        "group": v2.Resource(name="workers"),
        "message_queue": v2.MessageQueue(topic=v2.Resource(name="jobs"), id=0),
        "filter_expression": v2.FilterExpression(type=v2.TAG, expression="*"),
        "batch_size": 10,
        "invisible_duration": Duration(seconds=15),
        "long_polling_timeout": Duration(seconds=20),
        "attempt_id": "attempt-1",
    }
    base.update(fields)
    return svc.ReceiveMessageRequest(**{k: v for k, v in base.items() if v is not None})


def receive(
    core: PopCore | None, request: svc.ReceiveMessageRequest, remaining: float | None = None
) -> list[svc.ReceiveMessageResponse]:
    return asyncio.run(receiving(core).receive(request, time_remaining=remaining))


def only_status(answer: list[svc.ReceiveMessageResponse]) -> v2.Status:
    """The answer's status, checked to be one status element and one timestamp."""
    kinds = [r.WhichOneof("content") for r in answer]
    assert kinds == ["status", "delivery_timestamp"], kinds
    return answer[0].status


def test_a_receive_streams_one_status_the_messages_and_a_delivery_timestamp() -> None:
    core = FakeCore([record(5), record(6, b"second")])
    answer = receive(core, receive_request())
    kinds = [r.WhichOneof("content") for r in answer]
    assert kinds == ["status", "message", "message", "delivery_timestamp"]
    assert answer[0].status.code == v2.OK
    assert timestamp_ms(answer[-1].delivery_timestamp) == NOW_MS
    first, second = answer[1].message, answer[2].message
    sp = first.system_properties
    assert (first.topic.name, first.body, sp.tag) == ("jobs", b"job", "TagA")
    assert (sp.receipt_handle, sp.delivery_attempt) == ("handle-1", 2)
    assert sp.invisible_duration == Duration(seconds=15)
    assert (sp.queue_id, sp.queue_offset, sp.store_host) == (1, 5, STORE_HOST)
    assert sp.body_digest.checksum == hashlib.md5(b"job").hexdigest().upper()
    assert second.system_properties.receipt_handle == "handle-2"
    [(name, call)] = core.calls
    assert name == "receive"
    assert call == {
        "group": "workers", "topic": "jobs", "tags": None, "max_messages": 10,
        "invisible_seconds": 15.0, "wait_seconds": 20.0, "attempt_id": "attempt-1",
        "client": None,
    }  # fmt: skip


def test_nothing_to_hand_out_is_message_not_found_which_clients_read_as_empty() -> None:
    status = only_status(receive(FakeCore(), receive_request()))
    assert (status.code, status.message) == (v2.MESSAGE_NOT_FOUND, "no new message")


def test_a_push_consumers_auto_renew_receive_is_invisible_for_the_renewal_slice() -> None:
    core = FakeCore([record(1)])
    answer = receive(core, receive_request(auto_renew=True, invisible_duration=None))
    assert core.calls[0][1]["invisible_seconds"] == AUTO_RENEW_INVISIBLE_SECONDS
    assert answer[1].message.system_properties.invisible_duration.seconds == 60


@pytest.mark.parametrize(
    ("polling", "remaining", "wait"),
    [
        (Duration(seconds=100), None, MAX_LONG_POLLING_SECONDS),
        (Duration(seconds=20), 5.0, 4.5),
        (Duration(seconds=20), 0.2, 0.0),
        (None, None, MAX_LONG_POLLING_SECONDS),
        (Duration(seconds=2, nanos=500_000_000), 60.0, 2.5),
    ],
)
def test_the_long_poll_never_outlasts_the_limit_or_the_calls_deadline(
    polling: Duration | None, remaining: float | None, wait: float
) -> None:
    core = FakeCore()
    receive(core, receive_request(long_polling_timeout=polling), remaining)
    assert core.calls[0][1]["wait_seconds"] == pytest.approx(wait)


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        ("*", None),
        ("", None),
        ("TagA||TagB", {b"TagA", b"TagB"}),
        (" TagA || TagB ", {b"TagA", b"TagB"}),
    ],
)
def test_tag_expressions_are_read_as_rocketmq_reads_them(expression: str, tags: object) -> None:
    core = FakeCore()
    receive(
        core,
        receive_request(filter_expression=v2.FilterExpression(type=v2.TAG, expression=expression)),
    )
    assert core.calls[0][1]["tags"] == (None if tags is None else frozenset(tags))


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"batch_size": 0}, v2.BAD_REQUEST, "batch_size 0 is outside 1..32"),
        ({"batch_size": 33}, v2.BAD_REQUEST, "batch_size 33"),
        ({"invisible_duration": None}, v2.ILLEGAL_INVISIBLE_TIME, "needs an invisible_duration"),
        ({"invisible_duration": Duration(seconds=-1)}, v2.ILLEGAL_INVISIBLE_TIME, "not a valid"),
        ({"long_polling_timeout": Duration(nanos=-5)}, v2.ILLEGAL_POLLING_TIME, "not a valid"),
        ({"group": v2.Resource(name="bad group")}, v2.ILLEGAL_CONSUMER_GROUP, "'bad group'"),
        ({"group": v2.Resource(name="g", resource_namespace="ns")}, v2.BAD_REQUEST, "namespace"),
        (
            {"message_queue": v2.MessageQueue(topic=v2.Resource(name="a/b"))},
            v2.ILLEGAL_TOPIC,
            "'a/b'",
        ),
        (
            {"filter_expression": v2.FilterExpression(type=v2.SQL, expression="a > 1")},
            v2.ILLEGAL_FILTER_EXPRESSION,
            "SQL92",
        ),
        (
            {"filter_expression": v2.FilterExpression(type=v2.TAG, expression="||")},
            v2.ILLEGAL_FILTER_EXPRESSION,
            "names no tag",
        ),
    ],
)
def test_a_bad_receive_is_refused_before_the_core_is_asked(
    fields: dict[str, Any], code: int, words: str
) -> None:
    core = FakeCore([record(1)])
    status = only_status(receive(core, receive_request(**fields)))
    assert status.code == code, (v2.Code.Name(status.code), status.message)
    assert words in status.message
    assert core.calls == [] and len(core.ready) == 1


def test_a_refusal_of_the_core_is_answered_with_its_code() -> None:
    class Missing(FakeCore):
        async def receive(self, **call: Any) -> Sequence[Popped]:
            raise not_found("TOPIC_NOT_FOUND", "topic 'jobs' does not exist")

    status = only_status(receive(Missing(), receive_request()))
    assert (status.code, status.message) == (v2.TOPIC_NOT_FOUND, "topic 'jobs' does not exist")


def test_without_a_pop_core_requests_are_checked_then_answered_not_implemented() -> None:
    status = only_status(receive(None, receive_request()))
    assert status.code == v2.NOT_IMPLEMENTED and "pop core" in status.message
    assert only_status(receive(None, receive_request(batch_size=0))).code == v2.BAD_REQUEST
    front = receiving(None)
    ack = asyncio.run(front.ack(ack_request("h")))
    change = asyncio.run(front.change_invisible(change_request("h", 30)))
    forward = asyncio.run(front.forward_to_dead_letter(forward_request("h")))
    for response in (ack, change, forward):
        assert response.status.code == v2.NOT_IMPLEMENTED, response


# ---------------------------------------------------------------------- ack
def ack_request(*handles: str) -> svc.AckMessageRequest:
    return svc.AckMessageRequest(
        group=v2.Resource(name="workers"),
        topic=v2.Resource(name="jobs"),
        entries=[svc.AckMessageEntry(message_id=f"id-{h}", receipt_handle=h) for h in handles],
    )


def popped_handles(core: FakeCore, count: int) -> list[str]:
    answer = receive(core, receive_request(batch_size=count))
    return [r.message.system_properties.receipt_handle for r in answer if r.HasField("message")]


def test_an_ack_goes_to_the_core_by_receipt_handle() -> None:
    core = FakeCore([record(1)])
    [handle] = popped_handles(core, 1)
    response = asyncio.run(receiving(core).ack(ack_request(handle)))
    assert response.status.code == v2.OK
    [entry] = response.entries
    assert (entry.message_id, entry.receipt_handle, entry.status.code) == (
        f"id-{handle}", handle, v2.OK,
    )  # fmt: skip
    assert core.calls[-1] == (
        "ack",
        {"group": "workers", "topic": "jobs", "receipt_handle": handle},
    )
    assert core.in_flight == {}


def test_an_ack_of_an_expired_receipt_is_invalid_receipt_handle() -> None:
    response = asyncio.run(receiving(FakeCore()).ack(ack_request("gone")))
    assert response.status.code == v2.INVALID_RECEIPT_HANDLE
    assert "not in flight" in response.status.message
    assert response.entries[0].status.code == v2.INVALID_RECEIPT_HANDLE


def test_a_batch_of_acks_with_mixed_outcomes_is_multiple_results() -> None:
    core = FakeCore([record(1)])
    [handle] = popped_handles(core, 1)
    response = asyncio.run(receiving(core).ack(ack_request(handle, "gone")))
    assert response.status.code == v2.MULTIPLE_RESULTS
    assert "1 of 2 acks failed" in response.status.message
    assert [e.status.code for e in response.entries] == [v2.OK, v2.INVALID_RECEIPT_HANDLE]


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (
            svc.AckMessageRequest(group=v2.Resource(name="g"), topic=v2.Resource(name="t")),
            v2.BAD_REQUEST,
        ),
        (ack_request(""), v2.INVALID_RECEIPT_HANDLE),
    ],
)
def test_an_ack_naming_nothing_is_refused(request_: svc.AckMessageRequest, code: int) -> None:
    core = FakeCore()
    response = asyncio.run(receiving(core).ack(request_))
    assert response.status.code == code
    assert core.calls == []


# ---------------------------------------------------------------------- change, forward
def change_request(handle: str, seconds_: float | None) -> svc.ChangeInvisibleDurationRequest:
    request = svc.ChangeInvisibleDurationRequest(
        group=v2.Resource(name="workers"), topic=v2.Resource(name="jobs"),
        receipt_handle=handle, message_id="id",
    )  # fmt: skip
    if seconds_ is not None:
        request.invisible_duration.FromNanoseconds(int(seconds_ * 1e9))
    return request


def test_changing_the_invisible_time_answers_the_new_receipt_handle() -> None:
    core = FakeCore([record(1)])
    [handle] = popped_handles(core, 1)
    response = asyncio.run(receiving(core).change_invisible(change_request(handle, 42.5)))
    assert (response.status.code, response.receipt_handle) == (v2.OK, "handle-2")
    assert core.calls[-1] == (
        "change_invisible",
        {"group": "workers", "topic": "jobs", "receipt_handle": handle, "invisible_seconds": 42.5},
    )


@pytest.mark.parametrize(
    ("handle", "seconds_", "code"),
    [
        ("h", None, v2.ILLEGAL_INVISIBLE_TIME),
        ("", 30, v2.INVALID_RECEIPT_HANDLE),
        ("gone", 30, v2.INVALID_RECEIPT_HANDLE),
    ],
)
def test_a_bad_change_is_refused(handle: str, seconds_: float | None, code: int) -> None:
    response = asyncio.run(receiving(FakeCore()).change_invisible(change_request(handle, seconds_)))
    assert response.status.code == code
    assert response.receipt_handle == ""


def test_the_cores_refusal_of_an_invisible_time_is_illegal_invisible_time() -> None:
    core = FakeCore([record(1)])
    [handle] = popped_handles(core, 1)
    response = asyncio.run(receiving(core).change_invisible(change_request(handle, 7200)))
    assert response.status.code == v2.ILLEGAL_INVISIBLE_TIME
    assert handle in core.in_flight  # nothing changed


def forward_request(handle: str) -> svc.ForwardMessageToDeadLetterQueueRequest:
    return svc.ForwardMessageToDeadLetterQueueRequest(
        group=v2.Resource(name="fifo-workers"), topic=v2.Resource(name="jobs"),
        receipt_handle=handle, message_id="id", delivery_attempt=3, max_delivery_attempts=3,
    )  # fmt: skip


def test_forwarding_to_the_dead_letter_queue_goes_to_the_core() -> None:
    core = FakeCore([record(1)])
    [handle] = popped_handles(core, 1)
    response = asyncio.run(receiving(core).forward_to_dead_letter(forward_request(handle)))
    assert response.status.code == v2.OK
    assert core.calls[-1] == (
        "forward", {"group": "fifo-workers", "topic": "jobs", "receipt_handle": handle}
    )  # fmt: skip
    failed = asyncio.run(receiving(core).forward_to_dead_letter(forward_request(handle)))
    assert failed.status.code == v2.INVALID_RECEIPT_HANDLE


def test_an_unexpected_core_error_is_an_internal_error_with_its_message() -> None:
    class Broken(FakeCore):
        async def ack(self, **call: Any) -> None:
            raise BrokerError(
                StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "the store refuses writes"
            )

    response = asyncio.run(receiving(Broken()).ack(ack_request("h")))
    assert (response.status.code, response.status.message) == (
        v2.INTERNAL_SERVER_ERROR, "the store refuses writes",
    )  # fmt: skip


def test_a_receive_names_its_connection_to_the_core() -> None:
    """The core reads in fair turns and counts the answer against the client's limit."""
    core = FakeCore()
    request = receive_request()
    asyncio.run(receiving(core).receive(request, time_remaining=None, client="ipv4:10.0.0.1:1"))
    assert core.calls[0][1]["client"] == "ipv4:10.0.0.1:1"
