"""A client whose connection closes leaves its group and its locks after the grace.

Over the wire, on a fake clock: the broker learns a client's connection from its
heartbeats and sees it close when the client's last stream on it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Producer
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.broker_client import BrokerClient
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run
from tests.support import wait_until

GRACE = 5.0
#: Channel option: a connection of its own, as another process would have. (Channels of
#: one process to one broker otherwise share a connection.)
OWN_CONNECTION = (("grpc.use_local_subchannel_pool", 1),)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path, disconnect_grace_seconds=GRACE)
    with EmbeddedBroker(config, clock=clock) as b:
        with Producer(b.address, clock=clock) as p:
            p.fetch_publish_message_queues("t")
        yield b


async def consumer_on_own_connection(address: str, client_id: str) -> None:
    """Join, lock queue 0, open the membership watch; then close the connection."""
    async with grpc.aio.insecure_channel(address, options=OWN_CONNECTION) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)
        group = pb.ConsumerGroupState(
            group="g", consume_type=pb.CONSUME_ORDERLY, message_model=pb.CLUSTERING
        )
        await stub.Heartbeat(pb.HeartbeatRequest(client_id=client_id, consumer_groups=[group]))
        queue = pb.MessageQueue(topic="t", broker_name="broker-a", queue_id=0)
        await stub.LockBatch(pb.LockBatchRequest(group="g", client_id=client_id, queues=[queue]))
        watch = stub.WatchMembership(pb.WatchMembershipRequest(group="g"))
        await watch.read()  # the stream is open


def test_a_client_whose_connection_closed_leaves_and_unlocks_after_the_grace(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    state = broker.broker.state
    assert state is not None

    async def body(b: BrokerClient) -> None:
        await join(b, "b")
        await consumer_on_own_connection(broker.address, "a")
        await asyncio.to_thread(
            wait_until, lambda: state.groups.disconnected_since("a") is not None
        )
        assert await b.lock_batch("g", "b", [mq("t", 0)]) == {}  # a's lock lives on
        clock.advance(GRACE)
        assert (await b.consumer_list("g"))[0] == ["a", "b"]
        clock.advance(1)
        await asyncio.to_thread(wait_until, lambda: state.groups.members("g") == ["b"])
        assert set(await b.lock_batch("g", "b", [mq("t", 0)])) == {mq("t", 0)}

    run(broker.address, body)


def test_an_owner_back_on_a_new_connection_keeps_its_renewed_lock_past_the_grace(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    # a's connection closed, it came back on another and renewed its lock before its next
    # heartbeat: the grace no longer runs. c, gone at the same moment, shows the sweep.
    state = broker.broker.state
    assert state is not None

    async def body(b: BrokerClient) -> None:
        await join(b, "b")
        await consumer_on_own_connection(broker.address, "a")
        await consumer_on_own_connection(broker.address, "c")
        await asyncio.to_thread(
            wait_until, lambda: all(state.groups.disconnected_since(n) is not None for n in "ac")
        )
        async with grpc.aio.insecure_channel(broker.address, options=OWN_CONNECTION) as back:
            stub = pb_grpc.MessagingServiceStub(back)
            queue = pb.MessageQueue(topic="t", broker_name="broker-a", queue_id=0)
            clock.advance(GRACE - 1)
            await stub.LockBatch(pb.LockBatchRequest(group="g", client_id="a", queues=[queue]))
            clock.advance(2)  # past the grace after the close, within a's renewed lease
            await asyncio.to_thread(wait_until, lambda: "c" not in state.groups.members("g"))
            assert state.groups.members("g") == ["a", "b"], "a spoke again: it is back"
            assert await b.lock_batch("g", "b", [mq("t", 0)]) == {}, "the queue is a's"

    run(broker.address, body)
