"""One hostile offset commit through every front that commits offsets, with one outcome.

The rule of committing an offset is the core's (mockbroker/offset_commits.py). Each case
runs it through gRPC CommitConsumerOffsets, remoting UPDATE_CONSUMER_OFFSET and the commit
bit of a remoting PULL_MESSAGE, each in a group of its own on one broker (fake clock):
a commit by a client that does not hold the queue, by a former owner fenced off since, or
out of the queue's range is refused by all three, and the committed offset stays where it
was. The pull is still served when its commit is refused, as RocketMQ's broker serves it.
A step back is the one designed difference: an explicit commit may rewind a group (that
is how tools reset one), a pull's piggybacked offset only moves it forward.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import OrderMQError
from sdk.message import MessageQueue
from sdk.testing import FakeClock
from tests.remoting_client import RemotingClient

MESSAGES = 12
PATHS = ("grpc", "update", "pull")


class Member(Protocol):
    """One client of a group, speaking one front."""

    async def lock(self) -> bool: ...

    async def commit(self, offset: int) -> None:
        """An explicit commit that must succeed (the case's set-up)."""
        ...

    async def hostile(self, offset: int) -> str:
        """The case's commit: "accepted", "refused", or "served" (a pull: no verdict)."""
        ...


class GrpcMember:
    def __init__(self, client: BrokerClient, client_id: str, group: str, queue: int) -> None:
        self.client, self.client_id, self.group = client, client_id, group
        self.queue = MessageQueue("orders", "broker-a", queue)
        self.epoch = 0

    async def lock(self) -> bool:
        await self.client.heartbeat(self.client_id, [GroupInfo(self.group, "CONSUME_ORDERLY")])
        held = await self.client.lock_batch(self.group, self.client_id, [self.queue])
        self.epoch = held.get(self.queue, self.epoch)
        return self.queue in held

    async def commit(self, offset: int) -> None:
        await self.client.commit_offsets(
            self.group, self.client_id, [(self.queue, offset, self.epoch)]
        )

    async def hostile(self, offset: int) -> str:
        try:
            await self.commit(offset)
        except OrderMQError:
            return "refused"
        return "accepted"


class RemotingMember:
    def __init__(
        self, connection: RemotingClient, client_id: str, group: str, queue: int, *, pull: bool
    ) -> None:
        self.connection, self.client_id, self.group = connection, client_id, group
        self.queue, self.pull = queue, pull

    async def call(self, code: int, body: bytes = b"", **fields: str) -> RemotingCommand:
        return await self.connection.request(RemotingCommand(code, ext_fields=fields, body=body))

    async def lock(self) -> bool:
        heartbeat = {"clientID": self.client_id, "consumerDataSet": [
            {"groupName": self.group, "consumeType": "CONSUME_PASSIVELY",
             "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
             "subscriptionDataSet": [{"topic": "orders", "subString": "*", "subVersion": 1}]}
        ]}  # fmt: skip
        await self.call(RequestCode.HEART_BEAT, json.dumps(heartbeat).encode())
        queue = {"topic": "orders", "brokerName": "broker-a", "queueId": self.queue}
        body = {"consumerGroup": self.group, "clientId": self.client_id, "mqSet": [queue]}
        answer = await self.call(RequestCode.LOCK_BATCH_MQ, json.dumps(body).encode())
        return bool(json.loads(answer.body)["lockOKMQSet"])

    async def update(self, offset: int) -> RemotingCommand:
        return await self.call(
            RequestCode.UPDATE_CONSUMER_OFFSET, consumerGroup=self.group, topic="orders",
            queueId=str(self.queue), commitOffset=str(offset),
        )  # fmt: skip

    async def commit(self, offset: int) -> None:
        answer = await self.update(offset)
        assert answer.code == ResponseCode.SUCCESS, answer.remark

    async def hostile(self, offset: int) -> str:
        if not self.pull:
            answer = await self.update(offset)
            return "accepted" if answer.code == ResponseCode.SUCCESS else "refused"
        answer = await self.call(
            RequestCode.PULL_MESSAGE, consumerGroup=self.group, topic="orders",
            queueId=str(self.queue), queueOffset="0", maxMsgNums="1", sysFlag=str(0x5),
            commitOffset=str(offset), suspendTimeoutMillis="0", subVersion="0",
            subscription="*", expressionType="TAG",
        )  # fmt: skip
        assert answer.code == ResponseCode.SUCCESS, "the pull is served either way"
        return "served"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(
        data_dir=tmp_path / "broker", remoting_port=0, client_timeout_seconds=600,
        disconnect_grace_seconds=600,
    )  # fmt: skip
    with EmbeddedBroker(config, clock=clock) as b:
        with Producer(b.address) as producer:
            for i in range(MESSAGES):  # one sharding key: one queue
                producer.send(Message("orders", f"m{i}".encode(), sharding_key="k"))
        yield b


def outcomes(broker: EmbeddedBroker, clock: FakeClock, case: str) -> dict[str, tuple[str, int]]:
    """Per path: (what the hostile commit was answered, the committed offset after it)."""
    state = broker.broker.state
    assert state is not None and broker.remoting_address is not None
    remoting_address = broker.remoting_address
    topic = state.store.topics.get("orders")
    queue = next(q for q in range(topic.queue_count) if state.store.end_offset(topic, q))

    async def one(path: str, grpc: BrokerClient) -> tuple[str, int]:
        group = f"parity-{case}-{path}"
        connections: list[RemotingClient] = []

        async def member(client_id: str) -> Member:
            if path == "grpc":
                return GrpcMember(grpc, client_id, group, queue)
            connection = await RemotingClient.connect(remoting_address)
            connections.append(connection)
            return RemotingMember(connection, client_id, group, queue, pull=path == "pull")

        try:
            a, b = await member("a@1"), await member("b@1")
            assert await a.lock()
            await a.commit(2)
            if case == "non-owner":
                answered = await b.hostile(10)
            elif case == "fenced":
                clock.advance(61)  # a is paused past its lease; b takes the queue over
                assert await b.lock()
                answered = await a.hostile(10)
            elif case == "out-of-range":
                answered = await a.hostile(MESSAGES + 5)
            else:  # backwards
                await a.commit(8)
                answered = await a.hostile(3)
            committed = state.offsets.get(group, "orders", queue)
            assert committed is not None
            return answered, committed
        finally:
            for connection in connections:
                await connection.close()

    async def main() -> dict[str, tuple[str, int]]:
        grpc = BrokerClient(broker.address)
        try:
            return {path: await one(path, grpc) for path in PATHS}
        finally:
            await grpc.close()

    return asyncio.run(main())


@pytest.mark.parametrize("case", ["non-owner", "fenced", "out-of-range"])
def test_a_hostile_commit_is_refused_alike_by_every_front(
    broker: EmbeddedBroker, clock: FakeClock, case: str
) -> None:
    assert outcomes(broker, clock, case) == {
        "grpc": ("refused", 2),
        "update": ("refused", 2),
        "pull": ("served", 2),
    }


def test_a_step_back_rewinds_by_an_explicit_commit_and_not_by_a_pull(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    assert outcomes(broker, clock, "backwards") == {
        "grpc": ("accepted", 3),
        "update": ("accepted", 3),
        "pull": ("served", 8),
    }
