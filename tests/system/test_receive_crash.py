"""Received messages across kill -9 of a broker process, on its real clock.

Messages are received (invisible for a few seconds), some acknowledged, then the broker is
killed at once and restarted on the same data directory. The messages received and not
acknowledged come back, each no earlier than its invisible time ends and with its
delivery attempt counted on; the acknowledged ones never come back; and the group's
committed offset follows once everything is acknowledged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import encode_frame, iter_records
from tests.chaos_report import ChaosRecorder
from tests.support import BrokerProcess, wait_until

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]
TOPIC, GROUP = "jobs", "workers"
INVISIBLE_MS = 3000
#: Generous: the machine may be busy; every wait ends as soon as its condition holds.
PATIENCE = 90.0


def stub(address: str) -> tuple[grpc.Channel, pb_grpc.MessagingServiceStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.MessagingServiceStub(channel)


def receive(m: pb_grpc.MessagingServiceStub, wait_ms: int = 0) -> list[tuple[bytes, pb.Lease]]:
    answer = m.Receive(
        pb.ReceiveRequest(group=GROUP, topic=TOPIC, max_messages=32,
                          invisible_duration_ms=INVISIBLE_MS, wait_ms=wait_ms),
        timeout=PATIENCE,
    )  # fmt: skip
    records = list(iter_records(answer.records))
    return [(r.body, lease) for r, lease in zip(records, answer.leases, strict=True)]


def test_received_messages_not_acked_come_back_after_kill_9_and_acked_ones_do_not(
    start_broker: StartBroker, tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    data = tmp_path / "broker"
    broker = start_broker(data)
    channel, m = stub(broker.address)
    with channel:
        admin = pb_grpc.AdminServiceStub(channel)
        admin.CreateTopic(pb.CreateTopicRequest(topic=TOPIC, queue_count=2), timeout=PATIENCE)
        bodies = [b"job-%d" % i for i in range(8)]
        for i, body in enumerate(bodies):
            frame = encode_frame(msg_id=body.ljust(16, b"."), born_timestamp_ms=1, body=body)
            m.Send(pb.SendRequest(topic=TOPIC, queue_id=i % 2, frames=frame), timeout=PATIENCE)
        got = receive(m)
        assert sorted(b for b, _ in got) == bodies
        acked = {b for b, _ in got[::2]}
        for _body, lease in got[::2]:
            m.Ack(pb.AckRequest(group=GROUP, receipt_handle=lease.receipt_handle),
                  timeout=PATIENCE)  # fmt: skip
        deadlines = {b: lease.invisible_until_ms for b, lease in got if b not in acked}
    broker.kill9()  # at once: every answered receive and ack is on disk

    broker = start_broker(data)
    channel, m = stub(broker.address)
    back: dict[bytes, pb.Lease] = {}
    with channel:
        deadline = time.monotonic() + PATIENCE
        while len(back) < len(deadlines) and time.monotonic() < deadline:
            for body, lease in receive(m, wait_ms=2000):
                assert body not in acked, f"{body!r} was acknowledged before the crash"
                assert body not in back, f"{body!r} came back twice"
                received_at = lease.invisible_until_ms - INVISIBLE_MS
                assert received_at >= deadlines[body], f"{body!r} came back before its time"
                assert lease.delivery_attempt == 2
                back[body] = lease
                m.Ack(pb.AckRequest(group=GROUP, receipt_handle=lease.receipt_handle),
                      timeout=PATIENCE)  # fmt: skip
        assert set(back) == set(deadlines), "received, unacknowledged messages were lost"
        assert receive(m, wait_ms=500) == []

        def committed() -> list[int]:
            return [
                m.QueryConsumerOffset(
                    pb.QueryConsumerOffsetRequest(group=GROUP, topic=TOPIC, queue_id=q),
                    timeout=PATIENCE,
                ).offset
                for q in (0, 1)
            ]

        wait_until(lambda: committed() == [4, 4], PATIENCE, "the group's offsets to follow")
    chaos_report.record(
        fault="kill -9 with received, unacked messages", rounds=1, acked=len(bodies),
        lost=len(deadlines) - len(back), order_violations=0, duplicates=0,
        note=f"{len(acked)} acked before the crash stayed settled; {len(back)} came back",
    )  # fmt: skip
