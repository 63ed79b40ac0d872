"""Receive, Ack and ChangeInvisibleDuration over gRPC against an EmbeddedBroker on a
FakeClock: time-to-run, extension, expiry, errors with their reasons, long polling, and a
receiving group's offsets next to other groups'."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.fronts.grpc_errors import REASON_KEY
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import encode_frame, iter_records
from sdk.errors import InvalidReceiptError, ReceiptExpiredError, error_from_status
from sdk.testing import FakeClock
from tests.support import wait_until

T = TypeVar("T")
TOPIC = "jobs"
Stubs = tuple[pb_grpc.MessagingServiceStub, pb_grpc.AdminServiceStub]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(start=1_800_000_000.0)


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b"), clock=clock) as b:
        rpc(b, lambda m, a: a.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, queue_count=2)))
        yield b


def rpc(broker: EmbeddedBroker, body: Callable[[Any, Any], Awaitable[T]]) -> T:
    """Run `body(messaging stub, admin stub)` on a fresh channel."""

    async def main() -> T:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            stubs = pb_grpc.MessagingServiceStub(channel), pb_grpc.AdminServiceStub(channel)
            return await body(*stubs)

    return asyncio.run(main())


def send(broker: EmbeddedBroker, queue_id: int, *bodies: bytes, key: bytes = b"") -> None:
    frames = b"".join(
        encode_frame(msg_id=b.ljust(16, b"."), born_timestamp_ms=1, body=b, sharding_key=key)
        for b in bodies
    )
    rpc(broker, lambda m, a: m.Send(pb.SendRequest(topic=TOPIC, queue_id=queue_id, frames=frames)))


def receive(broker: EmbeddedBroker, **kw: Any) -> pb.ReceiveResponse:
    fields: dict[str, Any] = {"group": "g", "topic": TOPIC, "max_messages": 10,
                              "invisible_duration_ms": 10_000} | kw  # fmt: skip
    request = pb.ReceiveRequest(**fields)
    return rpc(broker, lambda m, a: m.Receive(request))


def bodies(answer: pb.ReceiveResponse) -> list[bytes]:
    return [r.body for r in iter_records(answer.records)]


def ack(broker: EmbeddedBroker, handle: str, group: str = "g") -> pb.AckResponse:
    return rpc(broker, lambda m, a: m.Ack(pb.AckRequest(group=group, receipt_handle=handle)))


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str | None, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        call()
    error = caught.value
    reason = dict(error.trailing_metadata() or ()).get(REASON_KEY)  # type: ignore[arg-type]
    return error.code(), reason, error.details() or ""  # type: ignore[return-value]


def pop_state(broker: EmbeddedBroker) -> dict[str, Any]:
    state = broker.broker.state
    assert state is not None
    return state.pop.describe()


def test_a_job_is_hidden_for_its_time_to_run_extended_then_acked(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, 0, b"job-1", b"job-2")
    got = receive(broker, invisible_duration_ms=30_000)
    assert bodies(got) == [b"job-1", b"job-2"] and got.record_count == 2
    assert [lease.delivery_attempt for lease in got.leases] == [1, 1]
    assert got.leases[0].invisible_until_ms == int(clock.now() * 1000) + 30_000
    assert receive(broker).record_count == 0
    first, second = (lease.receipt_handle for lease in got.leases)

    clock.advance(20)
    changed = rpc(broker, lambda m, a: m.ChangeInvisibleDuration(
        pb.ChangeInvisibleDurationRequest(group="g", receipt_handle=first,
                                          invisible_duration_ms=60_000)))  # fmt: skip
    assert changed.lease.delivery_attempt == 1
    assert changed.lease.receipt_handle != first
    code, reason, details = refusal(lambda: ack(broker, first))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_RECEIPT_HANDLE")
    assert isinstance(error_from_status(code.name, reason, details), InvalidReceiptError)

    clock.advance(10)  # job-2's time ran out; job-1 was extended
    again = receive(broker)
    assert bodies(again) == [b"job-2"] and again.leases[0].delivery_attempt == 2
    code, reason, details = refusal(lambda: ack(broker, second))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "RECEIPT_EXPIRED")
    assert isinstance(error_from_status(code.name, reason, details), ReceiptExpiredError)
    ack(broker, changed.lease.receipt_handle)
    ack(broker, again.leases[0].receipt_handle)
    ack(broker, again.leases[0].receipt_handle)  # a repeat is answered OK
    clock.advance(3600)
    assert receive(broker).record_count == 0


def test_a_message_delivered_too_often_goes_to_the_dead_letter_topic(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, 1, b"poison")
    for attempt in (1, 2):
        got = receive(broker, max_delivery_attempts=2, invisible_duration_ms=1000)
        assert [lease.delivery_attempt for lease in got.leases] == [attempt]
        clock.advance(1)
    state = broker.broker.state
    assert state is not None
    wait_until(lambda: state.pop.dead_lettered == 1, 30, "the dead-letter copy")
    pull = pb.PullRequest(
        group="x", topic="%DLQ%g", queue_id=0, offset=0, max_messages=10, max_bytes=1 << 20
    )
    dlq = rpc(broker, lambda m, a: m.Pull(pull))
    assert [r.body for r in iter_records(dlq.records)] == [b"poison"]
    assert receive(broker, max_delivery_attempts=2).record_count == 0


def test_a_waiting_receive_is_answered_by_a_send(broker: EmbeddedBroker) -> None:
    async def body(m: Any, a: Any) -> pb.ReceiveResponse:
        waiting = asyncio.ensure_future(m.Receive(pb.ReceiveRequest(
            group="g", topic=TOPIC, max_messages=4, invisible_duration_ms=5000,
            wait_ms=60_000)))  # fmt: skip
        state = broker.broker.state
        assert state is not None
        while not state.holder.held:
            await asyncio.sleep(0.01)
        frame = encode_frame(msg_id=b"w" * 16, born_timestamp_ms=1, body=b"wake")
        await m.Send(pb.SendRequest(topic=TOPIC, queue_id=1, frames=frame))
        return await waiting  # type: ignore[no-any-return]

    assert bodies(rpc(broker, body)) == [b"wake"]


def test_a_fifo_group_gets_one_message_of_a_message_group_at_a_time(
    broker: EmbeddedBroker,
) -> None:
    send(broker, 0, b"a1", b"a2", key=b"order-a")
    first = receive(broker, fifo=True)
    assert bodies(first) == [b"a1"]
    assert receive(broker, fifo=True).record_count == 0
    ack(broker, first.leases[0].receipt_handle)
    assert bodies(receive(broker, fifo=True)) == [b"a2"]
    code, reason, _ = refusal(lambda: receive(broker))
    assert (code, reason) == (grpc.StatusCode.FAILED_PRECONDITION, "INVALID_ARGUMENT")


@pytest.mark.parametrize(
    ("fields", "code", "reason"),
    [
        ({"group": ""}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_GROUP"),
        ({"topic": "missing"}, grpc.StatusCode.NOT_FOUND, "TOPIC_NOT_FOUND"),
        ({"max_messages": 0}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ({"invisible_duration_ms": 0}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_INVISIBLE_TIME"),
        ({"wait_ms": 60_001}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
        ({"queue_ids": [5]}, grpc.StatusCode.OUT_OF_RANGE, "INVALID_QUEUE"),
        ({"tag_expression": "a ||"}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TAG_EXPRESSION"),
        ({"max_delivery_attempts": -3}, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT"),
    ],
)
def test_a_bad_receive_is_refused_with_its_reason_and_changes_nothing(
    broker: EmbeddedBroker, fields: dict[str, Any], code: grpc.StatusCode, reason: str
) -> None:
    send(broker, 0, b"x")
    assert refusal(lambda: receive(broker, **fields))[:2] == (code, reason)
    assert pop_state(broker) == {}


@pytest.mark.parametrize(
    "handle", ["", "garbage", "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB", "x" * 10_000]
)
def test_a_handle_that_is_not_a_receipt_is_refused_and_changes_nothing(
    broker: EmbeddedBroker, handle: str
) -> None:
    send(broker, 0, b"x")
    receive(broker)
    before = pop_state(broker)
    code, reason, details = refusal(lambda: ack(broker, handle))
    assert (code, reason) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_RECEIPT_HANDLE",
    ) and details
    code, reason, _ = refusal(lambda: rpc(broker, lambda m, a: m.ChangeInvisibleDuration(
        pb.ChangeInvisibleDurationRequest(group="g", receipt_handle=handle,
                                          invisible_duration_ms=1000))))  # fmt: skip
    assert (code, reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_RECEIPT_HANDLE")
    assert pop_state(broker) == before


def test_a_receiving_groups_progress_is_its_committed_offset_and_other_groups_keep_theirs(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, 0, b"a", b"b", b"c")
    got = receive(broker, queue_ids=[0])
    for lease in got.leases[:2]:
        ack(broker, lease.receipt_handle)

    def committed(group: str) -> pb.QueryConsumerOffsetResponse:
        return rpc(broker, lambda m, a: m.QueryConsumerOffset(
            pb.QueryConsumerOffsetRequest(group=group, topic=TOPIC, queue_id=0)))  # fmt: skip

    clock.advance(1)  # the broker mirrors a receiving group's base every flush interval
    wait_until(lambda: committed("g").offset == 2, 30, "the receiving group's offset")
    progress = rpc(broker, lambda m, a: a.ConsumerProgress(
        pb.ConsumerProgressRequest(group="g", topic=TOPIC)))  # fmt: skip
    queue0 = progress.queues[0]
    assert (queue0.consumer_offset, queue0.lag) == (2, 1)
    assert not committed("other").found, "a receive touches no other group's offsets"
    other = receive(broker, group="other", queue_ids=[0])
    assert bodies(other) == [b"a", b"b", b"c"], "another group gets every message"
    groups = rpc(broker, lambda m, a: a.ListGroups(pb.ListGroupsRequest()))
    assert "g" in [g.group for g in groups.groups]


def test_an_offset_reset_starts_a_receiving_group_over(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    send(broker, 0, b"a", b"b")
    for lease in receive(broker, queue_ids=[0]).leases:
        ack(broker, lease.receipt_handle)
    rpc(broker, lambda m, a: a.ResetOffset(pb.ResetOffsetRequest(
        group="g", topic=TOPIC, queue_id=0, earliest=True)))  # fmt: skip
    again = receive(broker, queue_ids=[0])
    assert bodies(again) == [b"a", b"b"]
    assert [lease.delivery_attempt for lease in again.leases] == [1, 1]
