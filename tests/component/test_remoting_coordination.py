"""Consumer coordination over remoting, on the groups, locks and offsets gRPC clients use.

Spoken through real sockets (tests/remoting_client.py) to an embedded broker on a fake
clock, so that leases and the disconnect grace pass when the test says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker import offsets as offsets_module
from mockbroker.fronts.remoting.coordination import RemotingClients, coordination_handlers
from sdk import Message, Producer
from sdk._remoting.codec import encode
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.message_ids import decode_offset_msg_id
from sdk.testing import FakeClock
from tests.component.test_remoting_data import FakeChannel, Remoting
from tests.component.test_remoting_data import run as run_core
from tests.remoting_client import RemotingClient
from tests.support import wait_until

T = TypeVar("T")
GROUP = "readers"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def rocketmq(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(
        data_dir=tmp_path / "broker", remoting_port=0, disconnect_grace_seconds=30
    )
    with EmbeddedBroker(config, clock=clock) as broker:
        yield broker


def run(body: Callable[[], Awaitable[T]]) -> T:
    return asyncio.run(body())


def java_heartbeat(client_id: str, *groups: str) -> bytes:
    return json.dumps({
        "clientID": client_id,
        "producerDataSet": [{"groupName": "CLIENT_INNER_PRODUCER"}],
        "consumerDataSet": [
            {"groupName": g, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
             "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "unitMode": False,
             "subscriptionDataSet": [{"topic": "orders", "subString": "*", "tagsSet": [],
                                      "codeSet": [], "subVersion": 1, "expressionType": "TAG",
                                      "classFilterMode": False}]}
            for g in groups
        ],
    }).encode()  # fmt: skip


def cpp_heartbeat(client_id: str, group: str) -> bytes:
    return json.dumps({
        "clientID": client_id,
        "consumerDataSet": [
            {"groupName": group, "consumeType": 1, "messageModel": 1, "consumeFromWhere": 0,
             "subscriptionDataSet": [{"topic": "orders", "subString": "A || B",
                                      "codeSet": [0, 0], "subVersion": 1}]}
        ],
    }).encode()  # fmt: skip


class Client:
    """A remoting connection speaking as one RocketMQ client id."""

    def __init__(self, connection: RemotingClient, client_id: str) -> None:
        self.connection, self.client_id = connection, client_id

    @classmethod
    async def open(cls, broker: EmbeddedBroker, client_id: str) -> Client:
        assert broker.remoting_address is not None
        return cls(await RemotingClient.connect(broker.remoting_address), client_id)

    async def call(self, code: int, body: bytes = b"", **fields: str) -> RemotingCommand:
        return await self.connection.request(
            RemotingCommand(code, ext_fields=fields or None, body=body)
        )

    async def heartbeat(self, *groups: str) -> RemotingCommand:
        return await self.call(RequestCode.HEART_BEAT, java_heartbeat(self.client_id, *groups))

    async def members(self, group: str = GROUP) -> list[str]:
        answer = await self.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP, consumerGroup=group)
        return list(json.loads(answer.body)["consumerIdList"]) if answer.body else []

    async def lock(self, *queues: int, code: int = RequestCode.LOCK_BATCH_MQ) -> set[int]:
        body = {"consumerGroup": GROUP, "clientId": self.client_id,
                "mqSet": [{"topic": "orders", "brokerName": "broker-a", "queueId": q}
                          for q in queues]}  # fmt: skip
        answer = await self.call(code, json.dumps(body).encode())
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        if code != RequestCode.LOCK_BATCH_MQ:
            return set()
        return {mq["queueId"] for mq in json.loads(answer.body)["lockOKMQSet"]}

    async def close(self) -> None:
        await self.connection.close()


def send_orders(broker: EmbeddedBroker, count: int) -> list[str]:
    with Producer(broker.address) as producer:
        return [
            producer.send(Message("orders", f"m{i}".encode(), sharding_key="k")).msg_id
            for i in range(count)
        ]


def test_java_and_cpp_heartbeats_join_groups_that_grpc_clients_see(
    rocketmq: EmbeddedBroker,
) -> None:
    async def main() -> tuple[list[str], RemotingCommand, RemotingCommand]:
        java, cpp = await Client.open(rocketmq, "10.0.0.1@1"), await Client.open(rocketmq, "7-c")
        try:
            assert (await java.heartbeat(GROUP)).code == ResponseCode.SUCCESS
            cpp_answer = await cpp.call(RequestCode.HEART_BEAT, cpp_heartbeat("7-c", GROUP))
            assert cpp_answer.code == ResponseCode.SUCCESS
            members = await java.members()
            bad = await cpp.call(RequestCode.HEART_BEAT, b"not json")
            return members, bad, await cpp.call(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                consumerGroup="nobody")  # fmt: skip
        finally:
            await java.close()
            await cpp.close()

    members, bad, nobody = run(main)
    assert members == ["10.0.0.1@1", "7-c"]
    state = rocketmq.broker.state
    assert state is not None and state.groups.members(GROUP) == members
    assert state.groups.membership(GROUP)["7-c"].subscriptions == (("orders", "A || B"),)
    assert state.store.topics.find("%RETRY%readers") is not None, "created at the heartbeat"
    assert bad.code == ResponseCode.SYSTEM_ERROR and "not JSON" in (bad.remark or "")
    assert (nobody.code, nobody.remark) == (ResponseCode.SYSTEM_ERROR,
                                            "no consumer for this group, nobody")  # fmt: skip


def test_members_are_told_of_every_change_and_a_closed_connection_leaves_after_the_grace(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    async def main() -> tuple[dict[str, Any] | None, list[str]]:
        first, second = await Client.open(rocketmq, "a@1"), await Client.open(rocketmq, "b@1")
        try:
            await first.heartbeat(GROUP)
            await second.heartbeat(GROUP)
            notice = await asyncio.wait_for(first.connection.requests.get(), 30)
            await second.close()  # its process died: the kernel closed the socket
            state = rocketmq.broker.state
            assert state is not None
            await asyncio.to_thread(
                wait_until, lambda: state.groups.disconnected_since("b@1") is not None, 30,
                "the broker to see b's connection close",
            )  # fmt: skip
            clock.advance(31)
            await asyncio.to_thread(
                wait_until, lambda: state.groups.members(GROUP) == ["a@1"], 30, "b's expiry"
            )
            second_notice = await asyncio.wait_for(first.connection.requests.get(), 30)
            assert second_notice.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED
            return notice.ext_fields, await first.members()
        finally:
            await first.close()

    fields, members = run(main)
    assert fields == {"consumerGroup": GROUP}
    assert members == ["a@1"]


def test_queue_locks_are_granted_renewed_refused_and_expire_as_rocketmqs(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    send_orders(rocketmq, 1)

    async def main() -> list[set[int]]:
        a, b = await Client.open(rocketmq, "a@1"), await Client.open(rocketmq, "b@1")
        try:
            await a.heartbeat(GROUP)
            await b.heartbeat(GROUP)
            got = [await a.lock(0, 1), await b.lock(1, 2)]
            clock.advance(40)
            got.append(await a.lock(0))  # a renews queue 0 only
            clock.advance(30)  # queue 1's lease (60 s) is over, queue 0's is not
            got.append(await b.lock(0, 1))
            await a.lock(0, code=RequestCode.UNLOCK_BATCH_MQ)
            got.append(await b.lock(0))
            return got
        finally:
            await a.close()
            await b.close()

    assert run(main) == [{0, 1}, {2}, {0}, {1}, {0}]


def test_an_owner_back_on_a_new_connection_keeps_its_renewed_lock_past_the_grace(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    # Its connection reset at once, it reconnected and renewed its lock; its heartbeat
    # (every 30 s) had not come yet when the grace (30 s) after the reset ran out. c, gone
    # with its connection at the same moment, shows when the broker swept the expired.
    send_orders(rocketmq, 1)
    state = rocketmq.broker.state
    assert state is not None

    async def main() -> tuple[list[str], set[int]]:
        a, b, c = [await Client.open(rocketmq, f"{n}@1") for n in "abc"]
        back = None
        try:
            for client in (a, b, c):
                await client.heartbeat(GROUP)
            assert await a.lock(0) == {0}
            clock.advance(1)
            await a.close()
            await c.close()
            await asyncio.to_thread(
                wait_until, lambda: all(state.groups.disconnected_since(f"{n}@1") is not None
                                        for n in "ac"), 30, "the broker to see the closes",
            )  # fmt: skip
            back = await Client.open(rocketmq, "a@1")
            clock.advance(19)
            assert await back.lock(0) == {0}, "renewed on the new connection"
            clock.advance(13)  # 32 s after the reset, 13 s after the renewal
            await asyncio.to_thread(
                wait_until, lambda: "c@1" not in state.groups.members(GROUP), 30, "c's expiry"
            )
            return state.groups.members(GROUP), await b.lock(0)
        finally:
            for client in (a, b, c, back):
                if client is not None:
                    await client.close()

    members, taken = run(main)
    assert members == ["a@1", "b@1"], "a spoke on its new connection: it is back"
    assert taken == set(), "a's lease runs: the queue is still a's"


def test_a_heartbeat_or_lock_with_an_oversized_client_id_is_refused_and_joins_nothing(
    rocketmq: EmbeddedBroker,
) -> None:
    send_orders(rocketmq, 1)
    huge = "x" * 65536

    async def main() -> tuple[RemotingCommand, RemotingCommand]:
        client = await Client.open(rocketmq, huge)
        try:
            joined = await client.call(RequestCode.HEART_BEAT, java_heartbeat(huge, GROUP))
            body = {
                "consumerGroup": GROUP,
                "clientId": huge,
                "mqSet": [{"topic": "orders", "brokerName": "broker-a", "queueId": 0}],
            }
            locked = await client.call(RequestCode.LOCK_BATCH_MQ, json.dumps(body).encode())
            return joined, locked  # fmt: skip
        finally:
            await client.close()

    joined, locked = run(main)
    for answer in (joined, locked):
        assert answer.code == ResponseCode.SYSTEM_ERROR
        assert "client_id must be 1-255 characters" in (answer.remark or "")
    state = rocketmq.broker.state
    assert state is not None
    assert state.groups.members(GROUP) == [] and state.locks.locks(GROUP) == {}


def test_offsets_start_at_zero_while_the_first_message_is_kept_and_update_as_told(
    rocketmq: EmbeddedBroker,
) -> None:
    send_orders(rocketmq, 3)
    state = rocketmq.broker.state
    assert state is not None
    queue = next(
        str(q) for q in range(8) if state.store.end_offset(state.store.topics.get("orders"), q)
    )

    async def main() -> list[RemotingCommand]:
        c = await Client.open(rocketmq, "a@1")
        key = {"consumerGroup": GROUP, "topic": "orders", "queueId": queue}
        try:
            return [
                await c.call(RequestCode.QUERY_CONSUMER_OFFSET, **key),
                await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="2"),
                await c.call(RequestCode.QUERY_CONSUMER_OFFSET, **key),
                await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="-1"),
                await c.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="1"),
                await c.call(RequestCode.QUERY_CONSUMER_OFFSET, **key),
                await c.call(RequestCode.QUERY_CONSUMER_OFFSET, **{**key, "topic": "nowhere"}),
            ]
        finally:
            await c.close()

    first, update, after, negative, back, reset, unknown = run(main)
    assert first.ext_fields == {"offset": "0"}, "young queue: from its first message"
    assert update.code == ResponseCode.SUCCESS and after.ext_fields == {"offset": "2"}
    assert negative.code == ResponseCode.SYSTEM_ERROR and "outside [0, 3]" in (
        negative.remark or ""
    )
    assert back.code == ResponseCode.SUCCESS and reset.ext_fields == {"offset": "1"}
    assert state.offsets.get(GROUP, "orders", int(queue)) == 1
    assert unknown.code == ResponseCode.QUERY_NOT_FOUND


def test_a_message_sent_back_goes_to_the_retry_topic_or_straight_to_the_dead_letters(
    rocketmq: EmbeddedBroker,
) -> None:
    state = rocketmq.broker.state
    assert state is not None

    async def main() -> list[RemotingCommand]:
        c = await Client.open(rocketmq, "a@1")
        await c.heartbeat(GROUP)
        send = await c.call(
            RequestCode.SEND_MESSAGE_V2,
            body=b"poison",
            a="p", b="orders", c="TBW102", d="8", e="0", f="0", g="1", h="0", i="", j="0",
        )  # fmt: skip
        assert send.ext_fields is not None
        _host, position = decode_offset_msg_id(send.ext_fields["msgId"])
        try:
            return [
                await c.call(RequestCode.CONSUMER_SEND_MSG_BACK, group=GROUP,
                             offset=str(position), delayLevel="0"),
                await c.call(RequestCode.CONSUMER_SEND_MSG_BACK, group=GROUP,
                             offset=str(position), delayLevel="-1"),
                await c.call(RequestCode.CONSUMER_SEND_MSG_BACK, group=GROUP,
                             offset=str(position + 1), delayLevel="0"),
            ]  # fmt: skip
        finally:
            await c.close()

    retried, dead, nowhere = run(main)
    assert (retried.code, dead.code) == (ResponseCode.SUCCESS, ResponseCode.SUCCESS)
    assert state.retry.retried[GROUP] == 1 and state.retry.dead_lettered[GROUP] == 1
    dlq = state.store.topics.get("%DLQ%readers")
    assert state.store.end_offset(dlq, 0) == 1
    assert nowhere.code == ResponseCode.SYSTEM_ERROR
    assert "look message by offset failed" in (nowhere.remark or "")


def test_an_offset_update_sent_just_before_the_client_closes_is_stored(
    rocketmq: EmbeddedBroker,
) -> None:
    send_orders(rocketmq, 3)
    state = rocketmq.broker.state
    assert state is not None
    queue = next(q for q in range(8) if state.store.end_offset(state.store.topics.get("orders"), q))

    async def main() -> None:
        c = await Client.open(rocketmq, "a@1")
        await c.connection.oneway(
            RemotingCommand(
                RequestCode.UPDATE_CONSUMER_OFFSET,
                ext_fields={"consumerGroup": GROUP, "topic": "orders", "queueId": str(queue),
                            "commitOffset": "3"},
            )
        )  # fmt: skip
        await c.close()  # as a client shutting down: persist, then close at once

    run(main)
    wait_until(lambda: state.offsets.get(GROUP, "orders", queue) == 3, 30, "the commit")


def test_a_commit_is_refused_while_another_client_holds_the_queues_lock(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    # A former owner's late commit (a queue moved on by a rebalance) would move the
    # offset back under the new owner; RocketMQ's commits carry no epoch to fence them.
    send_orders(rocketmq, 10)  # one sharding key: one queue
    state = rocketmq.broker.state
    assert state is not None
    q = next(q for q in range(8) if state.store.end_offset(state.store.topics.get("orders"), q))

    async def main() -> list[RemotingCommand]:
        a, b = await Client.open(rocketmq, "a@1"), await Client.open(rocketmq, "b@1")
        key = {"consumerGroup": GROUP, "topic": "orders", "queueId": str(q)}
        try:
            await a.heartbeat(GROUP)
            await b.heartbeat(GROUP)
            assert await a.lock(q) == {q}
            answers = [
                await a.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="6"),
                await b.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="2"),
            ]
            clock.advance(61)  # a's lease ran out: nobody holds the queue
            answers.append(
                await b.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="8")
            )
            return answers
        finally:
            await a.close()
            await b.close()

    own, stale, unlocked = run(main)
    assert own.code == ResponseCode.SUCCESS
    assert stale.code == ResponseCode.SYSTEM_ERROR
    assert f"orders queue {q} of group 'readers' is locked by 'a@1'" in (stale.remark or "")
    assert unlocked.code == ResponseCode.SUCCESS
    assert state.offsets.get(GROUP, "orders", q) == 8


def test_a_lock_on_a_queue_this_broker_does_not_have_is_refused_and_locks_nothing(
    rocketmq: EmbeddedBroker,
) -> None:
    send_orders(rocketmq, 1)
    state = rocketmq.broker.state
    assert state is not None
    queue = {"topic": "orders", "brokerName": "broker-a", "queueId": 0}
    wrong = [
        ({"topic": "nowhere"}, ResponseCode.TOPIC_NOT_EXIST, "topic 'nowhere' does not exist"),
        ({"queueId": 8}, ResponseCode.SYSTEM_ERROR, "queue id 8 is out of range"),
        ({"topic": "a/b"}, ResponseCode.SYSTEM_ERROR, "topic 'a/b' must match"),
        ({"brokerName": "broker-b"}, ResponseCode.SYSTEM_ERROR,
         "brokerName 'broker-b' is not this broker, 'broker-a'"),
    ]  # fmt: skip

    async def main() -> list[RemotingCommand]:
        a = await Client.open(rocketmq, "a@1")
        try:
            await a.heartbeat(GROUP)
            answers = []
            for change, _code, _remark in wrong:
                mq_set = [queue, {**queue, **change}]
                body = {"consumerGroup": GROUP, "clientId": "a@1", "mqSet": mq_set}
                for code in (RequestCode.LOCK_BATCH_MQ, RequestCode.UNLOCK_BATCH_MQ):
                    answers.append(await a.call(code, json.dumps(body).encode()))
            return answers
        finally:
            await a.close()

    answers = run(main)
    for (change, code, remark), lock, unlock in zip(
        wrong, answers[::2], answers[1::2], strict=True
    ):
        for answer in (lock, unlock):
            assert answer.code == code and remark in (answer.remark or ""), (change, answer)
    assert state.locks.locks(GROUP) == {}


def test_a_query_waits_for_a_commit_of_its_queue_still_being_saved(
    rocketmq: EmbeddedBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    send_orders(rocketmq, 3)
    state = rocketmq.broker.state
    assert state is not None
    queue = next(q for q in range(8) if state.store.end_offset(state.store.topics.get("orders"), q))
    key = {"consumerGroup": GROUP, "topic": "orders", "queueId": str(queue)}
    saving = threading.Event()
    real_write = offsets_module.write_atomically

    def slow_write(path: Path, data: bytes) -> None:
        saving.wait(30)
        real_write(path, data)

    async def main() -> RemotingCommand:
        a, b = await Client.open(rocketmq, "a@1"), await Client.open(rocketmq, "b@1")
        try:
            await a.heartbeat(GROUP)
            await b.heartbeat(GROUP)
            assert await a.lock(queue) == {queue}
            monkeypatch.setattr(offsets_module, "write_atomically", slow_write)
            # A consumer giving its queue up: its last offset, then the unlock, at once.
            await a.connection.oneway(
                RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET,
                                ext_fields={**key, "commitOffset": "3"})
            )  # fmt: skip
            await a.lock(queue, code=RequestCode.UNLOCK_BATCH_MQ)
            assert await b.lock(queue) == {queue}
            query = asyncio.ensure_future(b.call(RequestCode.QUERY_CONSUMER_OFFSET, **key))
            await asyncio.sleep(0)  # the query is on its way before the save completes
            saving.set()
            return await query
        finally:
            saving.set()
            await a.close()
            await b.close()

    assert run(main).ext_fields == {"offset": "3"}, "the new owner starts after a's last"


async def stuck_member(broker: EmbeddedBroker, client_id: str) -> asyncio.StreamWriter:
    """A member of GROUP that asks for 32 MiB of answers and reads none of them."""
    with Producer(broker.address) as producer:
        queue = producer.send(Message("orders", b"x" * (4 << 20), sharding_key="k")).queue
    assert broker.remoting_address is not None
    host, port = broker.remoting_address.rsplit(":", 1)
    pull = {"consumerGroup": GROUP, "topic": "orders", "queueId": str(queue.queue_id),
            "queueOffset": "0", "maxMsgNums": "1", "sysFlag": "2", "commitOffset": "0",
            "suspendTimeoutMillis": "0", "subVersion": "0"}  # fmt: skip
    _reader, stuck = await asyncio.open_connection(host, int(port), limit=1024)
    heartbeat = RemotingCommand(RequestCode.HEART_BEAT, body=java_heartbeat(client_id, GROUP))
    stuck.write(encode(heartbeat))
    for _ in range(8):
        stuck.write(encode(RemotingCommand(RequestCode.PULL_MESSAGE, ext_fields=pull)))
    server = broker.broker.remoting.broker if broker.broker.remoting is not None else None
    assert server is not None

    def writes_stuck() -> bool:
        with contextlib.suppress(RuntimeError):  # the set changed size: look again
            return any(c.unsent_bytes > 0 for c in list(server.connections))
        return False

    while True:  # until a write waits on it, and still does a tenth of a second later
        await asyncio.to_thread(wait_until, writes_stuck, 30, "a write waiting on the peer")
        await asyncio.sleep(0.1)
        if writes_stuck():
            return stuck


def test_a_member_that_reads_nothing_does_not_hold_up_its_groups_notices(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    # Reproduced in review: the notices went to the members one after another, so one
    # whose socket was full held every later notice of its group.
    async def next_notice(client: Client) -> RemotingCommand:
        # The bound on a write to the stuck member passes on the fake clock.
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(client.connection.requests.get(), 0.05)
            assert asyncio.get_running_loop().time() < deadline, "no notice came"
            clock.advance(1)

    async def main() -> RemotingCommand:
        stuck = await stuck_member(rocketmq, "z@1")
        first, second = await Client.open(rocketmq, "a@1"), await Client.open(rocketmq, "b@1")
        try:
            await first.heartbeat(GROUP)
            await next_notice(first)
            await second.heartbeat(GROUP)  # a change after the one the stuck member holds
            return await next_notice(first)
        finally:
            stuck.close()
            await first.close()
            await second.close()

    assert run(main).code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED


def test_a_connection_closing_on_its_own_is_not_closed_again_in_a_loop(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    # Reproduced in review: a connection whose close was under way stayed listed, a second
    # close() returned at once and the idle reaper, its deadline past, never yielded: the
    # broker answered nothing, for good, at 100 % CPU.
    server = rocketmq.broker.remoting.broker if rocketmq.broker.remoting is not None else None
    assert server is not None

    async def main() -> list[list[str]]:
        stuck = await stuck_member(rocketmq, "z@1")
        stuck.write(b"\x00\x00\x00\x01\xff")  # a frame that does not parse: it closes itself
        await asyncio.to_thread(
            wait_until, lambda: server.malformed_frames == 1, 30, "the bad frame read"
        )
        seen = []
        for _ in range(3):  # the reaper runs, and the broker still answers
            clock.advance(121)
            client = await Client.open(rocketmq, "a@1")
            try:
                await asyncio.wait_for(client.heartbeat(GROUP), 10)
                seen.append(await asyncio.wait_for(client.members(), 10))
            finally:
                await client.close()
        stuck.close()
        return seen

    assert [("a@1" in members) for members in run(main)] == [True] * 3


def pull_fields(queue: int, commit: int) -> dict[str, str]:
    """A push consumer's PULL_MESSAGE header with the commit-offset bit (sysFlag 0x5)."""
    return {"consumerGroup": GROUP, "topic": "orders", "queueId": str(queue),
            "queueOffset": str(commit), "maxMsgNums": "32", "sysFlag": str(0x5),
            "commitOffset": str(commit), "suspendTimeoutMillis": "0", "subVersion": "0",
            "subscription": "*", "expressionType": "TAG"}  # fmt: skip


def test_a_pulls_commit_is_ignored_while_another_client_holds_the_queues_lock(
    rocketmq: EmbeddedBroker, clock: FakeClock
) -> None:
    # UPDATE_CONSUMER_OFFSET refuses a non-owner; the commit bit of its pull moved the
    # offset anyway, and the owner's successor started past messages nobody processed.
    send_orders(rocketmq, 12)  # one sharding key: one queue
    state = rocketmq.broker.state
    assert state is not None
    q = next(q for q in range(8) if state.store.end_offset(state.store.topics.get("orders"), q))

    async def main() -> list[RemotingCommand]:
        a, b = await Client.open(rocketmq, "a@1"), await Client.open(rocketmq, "b@1")
        key = {"consumerGroup": GROUP, "topic": "orders", "queueId": str(q)}
        try:
            await a.heartbeat(GROUP)
            await b.heartbeat(GROUP)
            assert await a.lock(q) == {q}
            await a.call(RequestCode.UPDATE_CONSUMER_OFFSET, **key, commitOffset="2")
            clock.advance(61)  # a is paused past its lease; b takes the queue over
            assert await b.lock(q) == {q}
            answers = [await a.call(RequestCode.PULL_MESSAGE, **pull_fields(q, 10))]
            answers.append(await b.call(RequestCode.QUERY_CONSUMER_OFFSET, **key))
            answers.append(await b.call(RequestCode.PULL_MESSAGE, **pull_fields(q, 4)))
            return answers
        finally:
            await a.close()
            await b.close()

    stale_pull, query, own_pull = run(main)
    assert stale_pull.code == ResponseCode.SUCCESS, "the pull itself is served, as RocketMQ's"
    assert query.ext_fields == {"offset": "2"}, "the non-owner's commit bit moved the offset"
    assert own_pull.code == ResponseCode.SUCCESS
    assert state.offsets.get(GROUP, "orders", q) == 4, "the owner's commit bit commits"


def test_a_member_joining_before_its_groups_watcher_first_ran_is_told_to_the_others(
    tmp_path: Path,
) -> None:
    # Seen on a loaded machine: two heartbeats were handled before the watcher task the
    # first one started had run once; it watched from the second's version, so that
    # change reached nobody (the first member never heard of the second).
    async def scenario(r: Remoting) -> list[list[int]]:
        clients = RemotingClients(r.state)
        heartbeat = coordination_handlers(r.state, clients)[RequestCode.HEART_BEAT]
        await r.state.topic_creation.retry_topics([GROUP], client=None)  # no await below
        first, second = FakeChannel(peer="10.0.0.1:1"), FakeChannel(peer="10.0.0.2:2")
        for client_id, channel in (("z@1", first), ("a@1", second)):  # one loop pass
            body = java_heartbeat(client_id, GROUP)
            await heartbeat(RemotingCommand(RequestCode.HEART_BEAT, body=body), channel)
        for _ in range(5):
            await asyncio.sleep(0)
        return [[c.code for c in channel.sent] for channel in (first, second)]

    told = run_core(tmp_path, scenario)
    assert told[0] == [RequestCode.NOTIFY_CONSUMER_IDS_CHANGED], "the first member heard nothing"
