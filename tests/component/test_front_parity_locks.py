"""One hostile lock request through every front that takes locks, with one outcome.

The rule of taking a queue lock is the core's (mockbroker/queue_locks.py). Each case
runs the same request through gRPC LockBatch and remoting LOCK_BATCH_MQ, on one broker
(fake clock), each in a group of its own: a client id past 255 characters, an empty one,
a group nobody joined, a client that is not a member of the group, and a member asking
for more locks than `client_max_locks`. Both fronts refuse it, naming why, and nothing is
locked: the group's lock table stays empty and `locks.json` is not rewritten.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.lock_manager import LOCK_FILE
from sdk import Message, Producer
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import OrderMQError
from sdk.message import MessageQueue
from sdk.testing import FakeClock
from tests.remoting_client import RemotingClient

MAX_LOCKS = 2
#: case -> (client id, words the refusal names)
CASES = {
    "huge-client-id": ("x" * 65536, "1-255 characters"),
    "empty-client-id": ("", "client"),
    "group-nobody-joined": ("c@1", "has no members"),
    "not-a-member": ("c@1", "not a member"),
    "too-many-locks": ("c@1", "client_max_locks"),
}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path / "broker", remoting_port=0, client_max_locks=MAX_LOCKS)
    with EmbeddedBroker(config, clock=FakeClock()) as b:
        with Producer(b.address) as producer:
            producer.send(Message("orders", b"m", sharding_key="k"))  # creates the topic
        yield b


def remoting_heartbeat(client_id: str, group: str) -> bytes:
    return json.dumps({"clientID": client_id, "consumerDataSet": [
        {"groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
         "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
         "subscriptionDataSet": [{"topic": "orders", "subString": "*", "subVersion": 1}]}
    ]}).encode()  # fmt: skip


async def set_up(front: str, case: str, group: str, client_id: str, grpc: BrokerClient,
                 connection: RemotingClient) -> None:  # fmt: skip
    """Who is in the group before the hostile request."""
    joiner = {"not-a-member": "m@1", "too-many-locks": client_id}.get(case)
    if joiner is None:
        return
    if front == "grpc":
        await grpc.heartbeat(joiner, [GroupInfo(group, "CONSUME_ORDERLY")])
        return
    answer = await connection.request(
        RemotingCommand(RequestCode.HEART_BEAT, body=remoting_heartbeat(joiner, group))
    )
    assert answer.code == ResponseCode.SUCCESS, answer.remark


async def lock(front: str, group: str, client_id: str, queues: range, grpc: BrokerClient,
               connection: RemotingClient) -> tuple[str, str]:  # fmt: skip
    """("granted" or "refused", the refusal's text)."""
    if front == "grpc":
        try:
            await grpc.lock_batch(
                group, client_id, [MessageQueue("orders", "broker-a", q) for q in queues]
            )
        except OrderMQError as exc:
            return "refused", exc.message
        return "granted", ""
    body = {"consumerGroup": group, "clientId": client_id,
            "mqSet": [{"topic": "orders", "brokerName": "broker-a", "queueId": q}
                      for q in queues]}  # fmt: skip
    answer = await connection.request(
        RemotingCommand(RequestCode.LOCK_BATCH_MQ, body=json.dumps(body).encode())
    )
    if answer.code == ResponseCode.SUCCESS:
        return "granted", ""
    assert answer.code == ResponseCode.SYSTEM_ERROR, answer.code
    return "refused", answer.remark or ""


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_lock_request_is_refused_alike_by_every_front(
    broker: EmbeddedBroker, case: str
) -> None:
    state = broker.broker.state
    assert state is not None and broker.remoting_address is not None
    remoting_address = broker.remoting_address
    client_id, words = CASES[case]
    queues = range(MAX_LOCKS + 1 if case == "too-many-locks" else 1)
    lock_file = broker.config.data_dir / LOCK_FILE

    async def one(front: str, grpc: BrokerClient) -> tuple[str, bool, bool, bool]:
        group = f"parity-{case}-{front}"
        connection = await RemotingClient.connect(remoting_address)
        try:
            await set_up(front, case, group, client_id, grpc, connection)
            before = lock_file.read_bytes()
            answered, why = await lock(front, group, client_id, queues, grpc, connection)
            return (
                answered,
                words in why,
                state.locks.locks(group) == {},
                lock_file.read_bytes() == before,
            )
        finally:
            await connection.close()

    async def main() -> dict[str, tuple[str, bool, bool, bool]]:
        grpc = BrokerClient(broker.address)
        try:
            return {front: await one(front, grpc) for front in ("grpc", "remoting")}
        finally:
            await grpc.close()

    refused = ("refused", True, True, True)
    assert asyncio.run(main()) == {"grpc": refused, "remoting": refused}
