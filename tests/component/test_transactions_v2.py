"""Transactional messages over the RocketMQ 5 front (apache.rocketmq.v2), spoken raw.

SendMessage with a TRANSACTION message stores a half message of the producer group named
as its topic; EndTransaction commits or rolls it back; a producer publishing the topic
gets its check-backs as RecoverOrphanedTransactionCommand on its Telemetry stream. What is
committed is read back over ordermq's gRPC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from mockbroker.transactions import Transactions
from sdk.testing import FakeClock
from tests.component.pulling import read_topic
from tests.component.test_v2_front import CLIENT, call, send, v2_message

ID = "0A0102030FA01B6D35860ABCDEF000{:02X}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "data", v2_port=0), clock=clock) as b:
        yield b


def transactions(broker: EmbeddedBroker) -> Transactions:
    state = broker.broker.state
    assert state is not None
    return state.transactions


def half(broker: EmbeddedBroker, body: bytes, n: int) -> svc.SendResultEntry:
    answer = send(broker, v2_message(body, ID.format(n), message_type=v2.TRANSACTION))
    assert answer.status.code == v2.OK, answer.status
    [entry] = answer.entries
    assert entry.message_id == ID.format(n) and entry.transaction_id
    return entry


def end(
    broker: EmbeddedBroker,
    entry: svc.SendResultEntry,
    resolution: int,
    *,
    topic: str = "orders",
    message_id: str | None = None,
) -> v2.Status:
    request = svc.EndTransactionRequest(
        topic=v2.Resource(name=topic), message_id=message_id or entry.message_id,
        transaction_id=entry.transaction_id, resolution=resolution,  # type: ignore[arg-type]
        source=v2.SOURCE_CLIENT,
    )  # fmt: skip
    status: v2.Status = call(broker, "EndTransaction", request).status
    return status


def bodies(broker: EmbeddedBroker) -> list[bytes]:
    return sorted(m.body for m in read_topic(broker.address, "orders"))


def test_a_transaction_message_is_unseen_until_committed_and_a_rollback_never_shows(
    broker: EmbeddedBroker,
) -> None:
    yes, no = half(broker, b"yes", 1), half(broker, b"no", 2)
    assert bodies(broker) == [] and transactions(broker).pending == 2
    assert end(broker, yes, v2.COMMIT).code == v2.OK
    assert end(broker, no, v2.ROLLBACK).code == v2.OK
    assert end(broker, yes, v2.COMMIT).code == v2.OK, "again the same way"
    other_way = end(broker, no, v2.COMMIT)
    assert other_way.code == v2.NOT_FOUND and "rolled back" in other_way.message
    [committed] = read_topic(broker.address, "orders")
    assert committed.body == b"yes" and committed.msg_id == ID.format(1)
    assert committed.properties["PGROUP"] == "orders"
    assert transactions(broker).outcomes == {"committed": 1, "rolled back": 1, "dropped": 0}


def test_bad_ends_and_batches_are_refused_and_change_nothing(broker: EmbeddedBroker) -> None:
    entry = half(broker, b"x", 1)
    unspecified = end(broker, entry, v2.TRANSACTION_RESOLUTION_UNSPECIFIED)
    assert unspecified.code == v2.BAD_REQUEST
    assert end(broker, entry, v2.COMMIT, message_id=ID.format(9)).code == v2.INVALID_TRANSACTION_ID
    elsewhere = end(broker, entry, v2.COMMIT, topic="elsewhere")
    assert elsewhere.code != v2.OK and "producer group 'orders'" in elsewhere.message
    two = send(
        broker,
        v2_message(b"a", ID.format(2), message_type=v2.TRANSACTION),
        v2_message(b"b", ID.format(3), message_type=v2.TRANSACTION),
    )
    assert two.status.code == v2.BAD_REQUEST and "alone" in two.status.message
    assert transactions(broker).pending == 1 and bodies(broker) == []


def test_a_producer_publishing_the_topic_is_checked_back_on_its_telemetry_stream(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    settings = svc.TelemetryCommand(
        settings=v2.Settings(
            client_type=v2.PRODUCER,
            publishing=v2.Publishing(topics=[v2.Resource(name="orders")]),
        )
    )

    async def main() -> svc.TelemetryCommand:
        async with grpc.aio.insecure_channel(broker.v2_address) as channel:
            stub = svc_grpc.MessagingServiceStub(channel)
            stream = stub.Telemetry(metadata=CLIENT)
            await stream.write(settings)
            answer = await stream.read()
            assert answer.status.code == v2.OK
            entry = await asyncio.to_thread(half, broker, b"later", 4)
            clock.advance(6.1)
            async with asyncio.timeout(30):
                check = await stream.read()
            assert check.recover_orphaned_transaction_command.transaction_id == (
                entry.transaction_id
            )
            ended = await stub.EndTransaction(
                svc.EndTransactionRequest(
                    topic=v2.Resource(name="orders"),
                    message_id=entry.message_id,
                    transaction_id=entry.transaction_id,
                    resolution=v2.COMMIT,
                    source=v2.SOURCE_SERVER_CHECK,
                ),
                metadata=CLIENT,
            )
            assert ended.status.code == v2.OK
            await stream.done_writing()
            return check

    check = asyncio.run(main())
    message = check.recover_orphaned_transaction_command.message
    assert message.topic.name == "orders" and message.body == b"later"
    assert message.system_properties.message_id == ID.format(4)
    assert message.system_properties.message_type == v2.TRANSACTION
    assert bodies(broker) == [b"later"]
    assert transactions(broker).checks_sent == 1
