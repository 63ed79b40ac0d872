"""The remoting data path's handlers on a real broker core: RocketMQ requests in, RocketMQ
answers out, and the same messages read over gRPC (and the other way round).

The handlers are called directly with a fake client channel; the broker (store,
scheduler, long polling, offsets) runs in the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mockbroker import offsets as offsets_module
from mockbroker.config import BrokerConfig
from mockbroker.fronts.remoting.channel import Handler
from mockbroker.fronts.remoting.coordination import RemotingClients, coordination_handlers
from mockbroker.fronts.remoting.data_handlers import data_handlers
from mockbroker.groups import GroupMembership
from mockbroker.server import Broker
from mockbroker.state import BrokerState
from sdk import Message
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import FLAG_ONEWAY, RemotingCommand
from sdk._remoting.message_ids import decode_offset_msg_id
from sdk._remoting.message_layout import (
    BatchElement,
    MessageRecord,
    decode_records,
    encode_batch,
)
from sdk._remoting.properties import encode_properties
from sdk._transport.broker_client import BrokerClient
from sdk.aio import Producer
from sdk.clock import Clock
from sdk.message import MessageExt, MessageQueue
from sdk.testing import FakeClock

T = TypeVar("T")
STORE_HOST = "127.0.0.1:10911"
PEER = "10.1.2.3:40000"
UNIQ = "0A0102030FA01B6D35860ABCDEF00001"
BORN = 1_700_000_000_000


@dataclass(eq=False)  # hashed by identity, as connections are
class FakeChannel:
    """A client connection as the handlers see it."""

    peer: str = PEER
    closed: bool = False
    sent: list[RemotingCommand] = field(default_factory=list)

    async def send_oneway(self, command: RemotingCommand) -> None:
        self.sent.append(command)


@dataclass
class Remoting:
    """A running broker core and the data handlers on it."""

    broker: Broker
    state: BrokerState
    handlers: dict[int, Handler]
    channel: FakeChannel = field(default_factory=FakeChannel)
    opaque: int = 0

    async def call(self, code: int, ext: dict[str, str], body: bytes = b"", flag: int = 0) -> Any:
        self.opaque += 1
        opaque = self.opaque
        request = RemotingCommand(code, opaque=opaque, flag=flag, ext_fields=ext, body=body)
        answer = await self.handlers[code](request, self.channel)
        if answer is not None:
            assert answer.opaque == opaque and answer.is_response
        return answer

    async def send(self, topic: str, body: bytes, props: dict[str, str] | None = None,
                   **header: Any) -> RemotingCommand:  # fmt: skip
        return await self.call(RequestCode.SEND_MESSAGE_V2, v2_header(topic, props, **header), body)

    async def pull(self, topic: str, queue_id: int, offset: int, **kw: Any) -> RemotingCommand:
        return await self.call(RequestCode.PULL_MESSAGE, pull_header(topic, queue_id, offset, **kw))

    @property
    def stored(self) -> int:
        return self.state.store.stats.messages_stored


def v2_header(
    topic: str,
    props: dict[str, str] | None = None,
    *,
    queue_id: int = 0,
    sys_flag: int = 0,
    flag: int = 0,
    reconsume: int = 0,
    max_reconsume: int | None = None,
    batch: bool = False,
) -> dict[str, str]:
    ext = {
        "a": "pg", "b": topic, "c": "TBW102", "d": "4", "e": str(queue_id), "f": str(sys_flag),
        "g": str(BORN), "h": str(flag), "i": encode_properties(props or {}),
        "j": str(reconsume), "k": "false", "m": str(batch).lower(),
    }  # fmt: skip
    if max_reconsume is not None:
        ext["l"] = str(max_reconsume)
    return ext


def pull_header(
    topic: str,
    queue_id: int,
    offset: int,
    *,
    group: str = "cg",
    max_nums: int = 32,
    sys_flag: int = 0x4,
    commit: int = 0,
    suspend_ms: int = 0,
    subscription: str | None = "*",
    expression_type: str | None = "TAG",
) -> dict[str, str]:
    ext = {
        "consumerGroup": group, "topic": topic, "queueId": str(queue_id),
        "queueOffset": str(offset), "maxMsgNums": str(max_nums), "sysFlag": str(sys_flag),
        "commitOffset": str(commit), "suspendTimeoutMillis": str(suspend_ms), "subVersion": "0",
    }  # fmt: skip
    if subscription is not None:
        ext["subscription"] = subscription
    if expression_type is not None:
        ext["expressionType"] = expression_type
    return ext


def run(
    tmp_path: Path,
    scenario: Callable[[Remoting], Awaitable[T]],
    *,
    clock: Clock | None = None,
    **config: Any,
) -> T:
    async def main() -> T:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "broker", **config), clock=clock)
        await broker.start()
        try:
            state = broker.state
            assert state is not None
            return await scenario(
                Remoting(
                    broker,
                    state,
                    data_handlers(state, RemotingClients(state), store_host=lambda: STORE_HOST),
                )
            )
        finally:
            await broker.stop()

    return asyncio.run(main())


def records(answer: RemotingCommand) -> list[MessageRecord]:
    assert answer.code == ResponseCode.SUCCESS, (answer.code, answer.remark)
    return decode_records(answer.body)


async def grpc_read(
    remoting: Remoting, topic: str, queue_id: int, offset: int = 0
) -> list[MessageExt]:
    client = BrokerClient(remoting.broker.address)
    try:
        result = await client.pull("grpc-reader", MessageQueue(topic, "broker-a", queue_id), offset)
    finally:
        await client.close()
    return result.messages


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the loop run until `condition` holds (a deadline, not a sleep, bounds it)."""
    deadline = asyncio.get_running_loop().time() + 10
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


# ---------------------------------------------------------------------------- send, pull


@pytest.mark.parametrize("fair", [True, False], ids=["fair-turns", "plain-store"])
def test_a_v1_send_is_answered_with_offset_msg_id_and_pulled_back_as_sent(
    tmp_path: Path, fair: bool
) -> None:
    async def scenario(r: Remoting) -> None:
        props = {"TAGS": "TagA", "KEYS": "k1 k2", "UNIQ_KEY": UNIQ, "WAIT": "true", "color": "red"}
        v1 = {
            "producerGroup": "pg", "topic": "orders", "defaultTopic": "TBW102",
            "defaultTopicQueueNums": "4", "queueId": "3", "sysFlag": "0",
            "bornTimestamp": str(BORN), "flag": "7", "properties": encode_properties(props),
            "reconsumeTimes": "0", "unitMode": "false", "batch": "false",
        }  # fmt: skip
        sent = await r.call(RequestCode.SEND_MESSAGE, v1, b"hello")
        assert sent.code == ResponseCode.SUCCESS and sent.remark is None
        ext = sent.ext_fields
        assert (ext["queueId"], ext["queueOffset"]) == ("3", "0")
        assert (ext["MSG_REGION"], ext["TRACE_ON"]) == ("DefaultRegion", "true")
        host, physical = decode_offset_msg_id(ext["msgId"])
        assert str(host) == STORE_HOST
        pulled = await r.pull("orders", 3, 0)
        assert pulled.remark == "FOUND"
        assert {k: pulled.ext_fields[k] for k in ("nextBeginOffset", "minOffset", "maxOffset")} == {
            "nextBeginOffset": "1", "minOffset": "0", "maxOffset": "1",
        }  # fmt: skip
        [m] = records(pulled)
        assert (m.topic, m.body, m.queue_id, m.queue_offset, m.flag) == (
            "orders",
            b"hello",
            3,
            0,
            7,
        )
        assert m.properties == {"UNIQ_KEY": UNIQ, "TAGS": "TagA", "KEYS": "k1 k2", "color": "red"}
        assert (m.physical_offset, m.offset_msg_id) == (physical, ext["msgId"])
        assert (str(m.born_host), m.born_timestamp_ms, m.sys_flag) == (PEER, BORN, 0)
        assert all(isinstance(v, str) for v in [*ext.values(), *pulled.ext_fields.values()])

    run(tmp_path, scenario, fair_scheduling=fair)


def test_a_pull_read_in_several_slices_names_each_records_commit_log_position(
    tmp_path: Path,
) -> None:
    async def scenario(r: Remoting) -> None:
        elements = [BatchElement(b"m%03d" % i, {"UNIQ_KEY": f"{i:032X}"}) for i in range(300)]
        header = v2_header("orders", batch=True)
        sent = await r.call(RequestCode.SEND_BATCH_MESSAGE, header, encode_batch(elements))
        ids = sent.ext_fields["msgId"].split(",")
        pulled = records(await r.pull("orders", 0, 0, max_nums=300))
        assert [m.body for m in pulled] == [e.body for e in elements]
        assert [m.offset_msg_id for m in pulled] == ids
        positions = [decode_offset_msg_id(i)[1] for i in ids]
        assert positions == sorted(set(positions))
        for m in pulled[::97]:
            viewed = await r.call(
                RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(m.physical_offset)}
            )
            assert records(viewed) == [m]

    run(tmp_path, scenario, fair_slice_messages=64)


def test_a_v2_send_to_queue_minus_one_lets_the_broker_pick(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        sent = await r.send("picked", b"x", {"UNIQ_KEY": UNIQ}, queue_id=-1)
        queue_id = int(sent.ext_fields["queueId"])
        assert sent.code == ResponseCode.SUCCESS and 0 <= queue_id < 8
        assert r.state.store.topics.get("picked").queue_count == 8
        assert [m.body for m in records(await r.pull("picked", queue_id, 0))] == [b"x"]

    run(tmp_path, scenario)


def test_a_message_sent_over_remoting_is_read_over_grpc(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        props = {
            "TAGS": "TagA",
            "KEYS": "k1 k2",
            "UNIQ_KEY": UNIQ,
            "__SHARDINGKEY": "o-1",
            "c": "d",
        }
        await r.send("orders", b"over remoting", props, queue_id=2, flag=5)
        [m] = await grpc_read(r, "orders", 2)
        assert (m.topic, m.body, m.tags, m.keys, m.sharding_key) == (
            "orders", b"over remoting", "TagA", ("k1", "k2"), "o-1",
        )  # fmt: skip
        assert m.msg_id == UNIQ and m.born_timestamp == BORN
        assert m.properties == {"c": "d", "__rmq.flag": "5", "__rmq.bornHost": PEER}

    run(tmp_path, scenario)


def test_a_message_sent_over_grpc_is_pulled_over_remoting(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        async with Producer(r.broker.address) as producer:
            sent = await producer.send(
                Message("orders", b"over grpc", tags="TagB", keys=["a", "b"], sharding_key="s-1",
                        properties={"p": "q"}),
            )  # fmt: skip
        pulled = await r.pull("orders", sent.queue.queue_id, 0)
        [m] = records(pulled)
        assert m.properties == {
            "UNIQ_KEY": sent.msg_id, "TAGS": "TagB", "__SHARDINGKEY": "s-1", "KEYS": "a b",
            "p": "q",
        }  # fmt: skip
        assert (m.body, m.queue_offset, m.flag, str(m.born_host)) == (
            b"over grpc",
            0,
            0,
            "0.0.0.0:0",
        )
        assert 0 < m.born_timestamp_ms <= m.store_timestamp_ms
        viewed = await r.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(m.physical_offset)})
        assert records(viewed) == [m]

    run(tmp_path, scenario)


def test_a_batch_is_stored_in_order_with_the_batch_properties(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        elements = [
            BatchElement(b"one", {"UNIQ_KEY": UNIQ[:-1] + "1", "TAGS": "A"}, flag=1),
            BatchElement(b"two", {"UNIQ_KEY": UNIQ[:-1] + "2", "KEYS": "k"}),
            BatchElement(b"three", {"UNIQ_KEY": UNIQ[:-1] + "3"}),
        ]
        header = v2_header("orders", {"WAIT": "true", "batchwide": "1"}, queue_id=1, batch=True)
        sent = await r.call(RequestCode.SEND_BATCH_MESSAGE, header, encode_batch(elements))
        assert sent.code == ResponseCode.SUCCESS and sent.ext_fields["queueOffset"] == "0"
        ids = sent.ext_fields["msgId"].split(",")
        pulled = records(await r.pull("orders", 1, 0))
        assert [m.offset_msg_id for m in pulled] == ids and len(ids) == 3
        assert [(m.body, m.queue_offset, m.flag) for m in pulled] == [
            (b"one", 0, 1), (b"two", 1, 0), (b"three", 2, 0),
        ]  # fmt: skip
        assert pulled[0].properties == {"UNIQ_KEY": UNIQ[:-1] + "1", "TAGS": "A", "batchwide": "1"}
        assert [m.msg_id for m in await grpc_read(r, "orders", 1)] == [
            UNIQ[:-1] + "1", UNIQ[:-1] + "2", UNIQ[:-1] + "3",
        ]  # fmt: skip

    run(tmp_path, scenario)


def test_a_compressed_body_is_stored_and_served_plain(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        plain = b"a body long enough for the producer to compress it. " * 200
        sent = await r.send("orders", zlib.compress(plain, 5), {"UNIQ_KEY": UNIQ}, sys_flag=0x301)
        assert sent.code == ResponseCode.SUCCESS
        [m] = records(await r.pull("orders", 0, 0))
        assert (m.body, m.sys_flag) == (plain, 0)
        assert [g.body for g in await grpc_read(r, "orders", 0)] == [plain]

    run(tmp_path, scenario)


def test_a_oneway_send_is_stored_and_not_answered(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        header = v2_header("orders", {"UNIQ_KEY": UNIQ})
        assert await r.call(RequestCode.SEND_MESSAGE_V2, header, b"x", flag=FLAG_ONEWAY) is None
        assert r.stored == 1

    run(tmp_path, scenario)


# ---------------------------------------------------------------------------- delays, retry


def test_a_delay_level_waits_in_the_scheduler_and_wakes_a_held_pull(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"first", {"UNIQ_KEY": UNIQ})
        sent = await r.send("orders", b"later", {"DELAY": "2", "UNIQ_KEY": UNIQ[:-1] + "9"})
        assert sent.code == ResponseCode.SUCCESS and r.state.scheduler.pending == 1
        assert sent.ext_fields["queueId"] == "0"
        assert sent.ext_fields["queueOffset"] == "0", "its offset in the schedule queue"
        _host, waiting_at = decode_offset_msg_id(sent.ext_fields["msgId"])
        assert r.state.store.read_at(waiting_at) is None, "not a message of orders yet"
        held = asyncio.create_task(r.pull("orders", 0, 1, sys_flag=0x6, suspend_ms=30_000))
        await until(lambda: r.state.holder.held == 1, "the pull to be held")
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not held.done()
        clock.advance(0.2)  # level 2 is 5 s
        [m] = records(await held)
        assert (m.body, m.queue_offset, m.properties.get("DELAY")) == (b"later", 1, None)

    run(tmp_path, scenario, clock=clock)


def test_retry_topic_sends_go_to_the_retry_topic_then_the_dead_letter_topic(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        props = {"UNIQ_KEY": UNIQ, "RETRY_TOPIC": "orders"}
        retried = await r.send("%RETRY%cg", b"again", props, reconsume=1)
        assert retried.code == ResponseCode.SUCCESS
        assert r.state.store.topics.get("%RETRY%cg").queue_count == 1
        [m] = records(await r.pull("%RETRY%cg", 0, 0))
        assert (m.reconsume_times, m.properties["RETRY_TOPIC"]) == (1, "orders")
        [g] = await grpc_read(r, "%RETRY%cg", 0)
        assert g.properties["ORIGIN_TOPIC"] == "orders" and g.reconsume_times == 1
        dead = await r.send("%RETRY%cg", b"dead", {**props, "DELAY": "3"}, reconsume=3,
                            max_reconsume=3)  # fmt: skip
        assert dead.code == ResponseCode.SUCCESS and r.state.scheduler.pending == 0
        [d] = records(await r.pull("%DLQ%cg", 0, 0))
        assert (d.body, d.reconsume_times, "DELAY" in d.properties) == (b"dead", 3, False)
        [gd] = await grpc_read(r, "%DLQ%cg", 0)
        assert gd.properties["ORIGIN_TOPIC"] == "orders"

    run(tmp_path, scenario)


# ---------------------------------------------------------------------------- long polling


def test_a_held_pull_is_answered_when_a_message_is_sent(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"create the topic", {"UNIQ_KEY": UNIQ})
        held = asyncio.create_task(r.pull("orders", 0, 1, sys_flag=0x2, suspend_ms=15_000))
        await until(lambda: r.state.holder.held == 1, "the pull to be held")
        assert not held.done()
        await r.send("orders", b"wake up", {"UNIQ_KEY": UNIQ})
        answer = await held
        assert [m.body for m in records(answer)] == [b"wake up"]
        assert answer.ext_fields["nextBeginOffset"] == "2"

    run(tmp_path, scenario)


def test_a_held_pull_times_out_on_the_broker_clock_as_not_found(tmp_path: Path) -> None:
    clock = FakeClock()

    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"x", {"UNIQ_KEY": UNIQ})
        held = asyncio.create_task(r.pull("orders", 0, 1, sys_flag=0x2, suspend_ms=15_000))
        await until(lambda: r.state.holder.held == 1, "the pull to be held")
        clock.advance(15.1)
        answer = await held
        assert (answer.code, answer.remark) == (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE")
        assert answer.ext_fields["nextBeginOffset"] == "1"
        unsuspended = await r.pull("orders", 0, 1, sys_flag=0x0, suspend_ms=15_000)
        assert unsuspended.code == ResponseCode.PULL_NOT_FOUND, "without 0x2 it is not held"

    run(tmp_path, scenario, clock=clock)


# ---------------------------------------------------------------------------- pull answers


def test_pull_codes_follow_rocketmqs_store_statuses(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"a", {"UNIQ_KEY": UNIQ, "TAGS": "A"})
        await r.send("orders", b"b", {"UNIQ_KEY": UNIQ, "TAGS": "B"})

        async def answer(offset: int, **kw: Any) -> tuple[int, str | None, str]:
            a = await r.pull("orders", 0, offset, **kw)
            return a.code, a.remark, a.ext_fields.get("nextBeginOffset", "")

        assert await answer(2) == (ResponseCode.PULL_NOT_FOUND, "OFFSET_OVERFLOW_ONE", "2")
        assert await answer(9) == (ResponseCode.PULL_OFFSET_MOVED, "OFFSET_OVERFLOW_BADLY", "2")
        assert await answer(1, subscription="C") == (
            ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE", "2",
        )  # fmt: skip
        assert (await r.pull("orders", 1, 0)).code == ResponseCode.PULL_NOT_FOUND
        moved = await r.pull("orders", 1, 5)
        assert (moved.code, moved.remark, moved.ext_fields["nextBeginOffset"]) == (
            ResponseCode.PULL_OFFSET_MOVED, "NO_MESSAGE_IN_QUEUE", "0",
        )  # fmt: skip

    run(tmp_path, scenario)


def test_pull_refusals_name_what_is_wrong(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"a", {"UNIQ_KEY": UNIQ})
        cases = [
            (pull_header("nope", 0, 0), ResponseCode.TOPIC_NOT_EXIST, "'nope' does not exist"),
            (pull_header("orders", 8, 0), ResponseCode.SYSTEM_ERROR, "queueId 8 is illegal"),
            (pull_header("orders", 0, 0, group="bad group"),
             ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, "'bad group'"),
            (pull_header("orders", 0, 0, subscription="||"),
             ResponseCode.SUBSCRIPTION_PARSE_FAILED, "names no tag"),
            (pull_header("orders", 0, 0, subscription="a > 1", expression_type="SQL92"),
             ResponseCode.SYSTEM_ERROR, "does not filter messages by SQL92"),
            (pull_header("orders", 0, 0, max_nums=0), ResponseCode.SYSTEM_ERROR, "maxMsgNums 0"),
            ({"topic": "orders"}, ResponseCode.SYSTEM_ERROR, "'consumerGroup' is missing"),
        ]  # fmt: skip
        for ext, code, remark in cases:
            answer = await r.call(RequestCode.PULL_MESSAGE, ext)
            assert (answer.code, answer.ext_fields) == (code, {}), ext
            assert remark in answer.remark, (remark, answer.remark)

    run(tmp_path, scenario)


def test_tag_subscriptions_filter_by_tag_string(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        for body, tag in ((b"1", "A"), (b"2", "B"), (b"3", None), (b"4", "A"), (b"5", "C")):
            props = {"UNIQ_KEY": UNIQ, **({"TAGS": tag} if tag else {})}
            await r.send("orders", body, props)

        async def bodies(**kw: Any) -> list[bytes]:
            return [m.body for m in records(await r.pull("orders", 0, 0, **kw))]

        assert await bodies(subscription=" A ||C|| ") == [b"1", b"4", b"5"]
        for m in records(await r.pull("orders", 0, 0, subscription="C||A")):
            viewed = await r.call(
                RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(m.physical_offset)}
            )
            assert records(viewed) == [m], "positions skip the records the filter skipped"
        assert await bodies(subscription="*") == [b"1", b"2", b"3", b"4", b"5"]
        assert await bodies(subscription=None) == [b"1", b"2", b"3", b"4", b"5"]
        # Without 0x4 the group's heartbeat subscription counts, not the request's.
        r.state.groups.heartbeat(
            "client-1", {"cg": GroupMembership("CONSUME_ORDERLY", "CLUSTERING", (("orders", "B"),))}
        )
        assert await bodies(sys_flag=0x0, subscription="A") == [b"2"]

    run(tmp_path, scenario)


def test_a_pulls_commit_offset_only_moves_the_group_forward(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        for _ in range(4):
            await r.send("orders", b"m", {"UNIQ_KEY": UNIQ})
        offsets = r.state.offsets

        async def commit(offset: int) -> int | None:
            answer = await r.pull("orders", 0, offset, sys_flag=0x5, commit=offset)
            assert answer.code in (ResponseCode.SUCCESS, ResponseCode.PULL_NOT_FOUND)
            return offsets.get("cg", "orders", 0)

        assert await commit(2) == 2
        assert await commit(1) == 2, "a stale pull does not move the group back"
        assert await commit(3) == 3
        assert await commit(4) == 4
        answer = await r.pull("orders", 0, 4, sys_flag=0x5, commit=9)
        assert (
            answer.code == ResponseCode.PULL_OFFSET_MOVED
            or answer.code == ResponseCode.PULL_NOT_FOUND
        )
        assert offsets.get("cg", "orders", 0) == 4, "past the queue's end: not committed"
        await r.pull("orders", 0, 0, sys_flag=0x4, commit=1)
        assert offsets.get("cg", "orders", 0) == 4, "without 0x1 nothing is committed"

    run(tmp_path, scenario)


def hold_offset_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """(began, release): the offset table's file writes wait for `release`."""
    began, release = threading.Event(), threading.Event()
    real = offsets_module.write_atomically

    def held(path: Path, data: bytes) -> None:
        began.set()
        release.wait(30)
        real(path, data)

    monkeypatch.setattr(offsets_module, "write_atomically", held)
    return began, release


def offset_update(r: Remoting, offset: int) -> Awaitable[RemotingCommand | None]:
    """UPDATE_CONSUMER_OFFSET of group cg's orders queue 0, from r's connection."""
    handler = coordination_handlers(r.state, RemotingClients(r.state))[
        RequestCode.UPDATE_CONSUMER_OFFSET
    ]
    fields = {"consumerGroup": "cg", "topic": "orders", "queueId": "0",
              "commitOffset": str(offset)}  # fmt: skip
    return handler(
        RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET, ext_fields=fields), r.channel
    )


def test_a_rewind_sent_while_a_commit_is_being_saved_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The update compared the rewind with the saved offset (0): equal, it wrote nothing and
    # answered success; the commit of 10 being saved then stood, and 0..9 were skipped.
    async def scenario(r: Remoting) -> None:
        for _ in range(12):
            await r.send("orders", b"m", {"UNIQ_KEY": UNIQ})
        first = await offset_update(r, 0)
        assert first is not None and first.code == ResponseCode.SUCCESS
        began, release = hold_offset_writes(monkeypatch)
        try:
            forward = asyncio.ensure_future(offset_update(r, 10))
            await until(began.is_set, "the save of offset 10")
            rewind = asyncio.ensure_future(offset_update(r, 0))
            asyncio.get_running_loop().call_soon(release.set)  # after the rewind's first step
            answers = await asyncio.gather(forward, rewind)
        finally:
            release.set()
        assert [a.code if a else None for a in answers] == [ResponseCode.SUCCESS] * 2
        assert r.state.offsets.get("cg", "orders", 0) == 0, "the later commit wins"

    run(tmp_path, scenario)


def test_a_pulls_commit_is_compared_with_a_commit_still_being_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pull's forward-only check read the saved offset (2), took 5 for a step forward
    # and wrote it after the commit of 10 being saved: the group went back to 5.
    async def scenario(r: Remoting) -> None:
        for _ in range(12):
            await r.send("orders", b"m", {"UNIQ_KEY": UNIQ})
        first = await offset_update(r, 2)
        assert first is not None and first.code == ResponseCode.SUCCESS
        began, release = hold_offset_writes(monkeypatch)
        try:
            update = asyncio.ensure_future(offset_update(r, 10))
            await until(began.is_set, "the save of offset 10")
            pull = asyncio.ensure_future(r.pull("orders", 0, 5, sys_flag=0x5, commit=5))
            asyncio.get_running_loop().call_soon(release.set)  # after the pull's first step
            answers = await asyncio.gather(update, pull)
        finally:
            release.set()
        assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 2
        assert r.state.offsets.get("cg", "orders", 0) == 10, "a stale pull moved the group back"

    run(tmp_path, scenario)


# ---------------------------------------------------------------------------- view, query


def test_view_by_offset_and_query_by_key_and_uniq_key(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        first = await r.send("orders", b"one", {"UNIQ_KEY": UNIQ, "KEYS": "order-1 shared"})
        await r.send("orders", b"two", {"UNIQ_KEY": UNIQ[:-1] + "2", "KEYS": "shared"})
        await r.send("other", b"elsewhere", {"UNIQ_KEY": UNIQ[:-1] + "3", "KEYS": "shared"})
        _host, position = decode_offset_msg_id(first.ext_fields["msgId"])
        [viewed] = records(await r.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(position)}))
        assert (viewed.body, viewed.physical_offset) == (b"one", position)
        missing = await r.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": str(position + 1)})
        assert (missing.code, missing.remark) == (
            ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {position + 1}",
        )  # fmt: skip

        def query(key: str, *, unique: bool = False, begin: int = 0,
                  end: int = 2**62) -> dict[str, str]:  # fmt: skip
            ext = {"topic": "orders", "key": key, "maxNum": "32", "beginTimestamp": str(begin),
                   "endTimestamp": str(end), "_UNIQUE_KEY_QUERY": str(unique).lower()}  # fmt: skip
            return ext

        shared = await r.call(RequestCode.QUERY_MESSAGE, query("shared"))
        assert [m.body for m in records(shared)] == [b"two", b"one"]
        assert set(shared.ext_fields) == {"indexLastUpdateTimestamp", "indexLastUpdatePhyoffset"}
        by_uniq = await r.call(RequestCode.QUERY_MESSAGE, query(UNIQ, unique=True, begin=2**61))
        assert [m.properties["UNIQ_KEY"] for m in records(by_uniq)] == [UNIQ]
        outside = await r.call(RequestCode.QUERY_MESSAGE, query("shared", end=1))
        assert (outside.code, outside.remark) == (
            ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct",
        )  # fmt: skip
        none = await r.call(RequestCode.QUERY_MESSAGE, query("no such key"))
        assert none.code == ResponseCode.QUERY_NOT_FOUND

    run(tmp_path, scenario)


def test_a_foreign_uniq_key_is_found_by_query_and_served_verbatim(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        go_key = "0A0102030FA000000000" + "0abcdef00001"
        await r.send("orders", b"from go", {"UNIQ_KEY": go_key})
        [m] = records(await r.pull("orders", 0, 0))
        assert m.properties["UNIQ_KEY"] == go_key
        ext = {"topic": "orders", "key": go_key, "maxNum": "1", "beginTimestamp": "0",
               "endTimestamp": str(2**62), "_UNIQUE_KEY_QUERY": "true"}  # fmt: skip
        assert [q.body for q in records(await r.call(RequestCode.QUERY_MESSAGE, ext))] == [
            b"from go"
        ]

    run(tmp_path, scenario)


# ---------------------------------------------------------------------------- send refusals


def test_send_refusals_carry_rocketmqs_codes_and_store_nothing(tmp_path: Path) -> None:
    big = b"x" * (4 * 1024 * 1024 + 1)
    cases: list[tuple[int, dict[str, str], bytes, int, str]] = [
        (310, v2_header("orders", {"UNIQ_KEY": UNIQ}), b"", ResponseCode.MESSAGE_ILLEGAL,
         "message body is empty"),
        (310, v2_header("orders", {"UNIQ_KEY": UNIQ}), big, ResponseCode.MESSAGE_ILLEGAL,
         "over the limit of 4194304"),
        (310, v2_header("fresh", {"UNIQ_KEY": UNIQ}), b"", ResponseCode.MESSAGE_ILLEGAL,
         "message body is empty"),
        (310, v2_header("fresh", {"UNIQ_KEY": UNIQ}, queue_id=8), b"x",
         ResponseCode.SYSTEM_ERROR, "queue id 8 is out of range"),
        (310, v2_header("orders", {"UNIQ_KEY": UNIQ}, sys_flag=1), b"junk",
         ResponseCode.MESSAGE_ILLEGAL, "does not inflate"),
        (310, v2_header("orders", {"__rmq.flag": "1"}), b"x", ResponseCode.MESSAGE_ILLEGAL,
         "reserved"),
        (310, v2_header("orders", {"p": "v" * 17_000}), b"x", ResponseCode.MESSAGE_ILLEGAL,
         "over its limit of 16384"),
        (310, v2_header("orders", {"DELAY": "soon"}), b"x", ResponseCode.MESSAGE_ILLEGAL,
         "not an integer"),
        (320, v2_header("orders", batch=True), b"\x00\x00\x00\x63garbage",
         ResponseCode.MESSAGE_ILLEGAL, "batch body does not parse"),
        (320, v2_header("orders", batch=True),
         encode_batch([BatchElement(b"x", {"DELAY": "1"})]), ResponseCode.MESSAGE_ILLEGAL,
         "delayed"),
        (320, v2_header("orders", batch=True, sys_flag=1),
         encode_batch([BatchElement(b"x", {})]), ResponseCode.MESSAGE_ILLEGAL,
         "cannot be compressed"),
        (320, v2_header("orders", batch=True), b"", ResponseCode.MESSAGE_ILLEGAL,
         "carries no messages"),
        (320, v2_header("%RETRY%cg", batch=True), encode_batch([BatchElement(b"x", {})]),
         ResponseCode.MESSAGE_ILLEGAL, "retry topic"),
        (310, v2_header("%RETRY%cg", {"TRAN_MSG": "true"}), b"x", ResponseCode.NO_PERMISSION,
         "transactional"),
        (310, v2_header("orders", sys_flag=0x8), b"x", ResponseCode.MESSAGE_ILLEGAL,
         "END_TRANSACTION"),
        (310, v2_header("%DLQ%cg"), b"x", ResponseCode.NO_PERMISSION, "forbidden"),
        (310, v2_header("rmq_sys_SCHEDULE"), b"x", ResponseCode.NO_PERMISSION, "forbidden"),
        (310, v2_header("bad.topic"), b"x", ResponseCode.SYSTEM_ERROR, "must match"),
        (310, v2_header("orders", queue_id=8), b"x", ResponseCode.SYSTEM_ERROR,
         "queue id 8 is out of range"),
        (310, {"b": "orders"}, b"x", ResponseCode.SYSTEM_ERROR, "'producerGroup' is missing"),
        # Java reads these as Long and Integer: a value past their width is refused by name.
        (310, {**v2_header("orders"), "g": str(2**64)}, b"x", ResponseCode.SYSTEM_ERROR,
         "'bornTimestamp' is not a 64-bit integer"),
        (310, {**v2_header("orders"), "g": str(-(2**63) - 1)}, b"x",
         ResponseCode.SYSTEM_ERROR, "'bornTimestamp' is not a 64-bit integer"),
        (310, {**v2_header("orders"), "h": str(2**31)}, b"x", ResponseCode.SYSTEM_ERROR,
         "'flag' is not a 32-bit integer"),
        (310, {**v2_header("orders"), "f": str(2**40)}, b"x", ResponseCode.SYSTEM_ERROR,
         "'sysFlag' is not a 32-bit integer"),
        (310, {**v2_header("orders"), "j": str(2**31)}, b"x", ResponseCode.SYSTEM_ERROR,
         "'reconsumeTimes' is not a 32-bit integer"),
    ]  # fmt: skip

    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"the topic exists", {"UNIQ_KEY": UNIQ})
        topics = {t.name for t in r.state.store.topics.all()}
        for code, ext, body, expected, remark in cases:
            answer = await r.call(code, ext, body)
            assert answer.code == expected, (ext, answer.remark)
            assert remark in answer.remark, (remark, answer.remark)
            assert answer.ext_fields == {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        assert r.stored == 1 and r.state.scheduler.pending == 0
        assert {t.name for t in r.state.store.topics.all()} == topics, "no topic was created"

    run(tmp_path, scenario)


def test_an_unknown_topic_is_refused_when_topics_are_not_created_on_send(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        answer = await r.send("unknown", b"x", {"UNIQ_KEY": UNIQ})
        assert (answer.code, answer.remark) == (
            ResponseCode.TOPIC_NOT_EXIST, "topic 'unknown' does not exist",
        )  # fmt: skip
        assert r.stored == 0 and r.state.store.topics.find("unknown") is None

    run(tmp_path, scenario, auto_create_topics=False)


def test_a_full_disk_refuses_sends_as_service_not_available(tmp_path: Path) -> None:
    usage = tmp_path / "disk.json"
    usage.write_text(json.dumps({"total_bytes": 10**9, "other_used_bytes": 95 * 10**7}))

    async def scenario(r: Remoting) -> None:
        answer = await r.send("orders", b"x", {"UNIQ_KEY": UNIQ})
        assert answer.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "sends are refused" in answer.remark
        assert r.stored == 0 and r.state.store.topics.find("orders") is None

    run(tmp_path, scenario, disk_usage_file=usage)


def test_a_sync_flush_that_does_not_complete_in_time_is_flush_disk_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()
    real_fdatasync = os.fdatasync

    def slow_fdatasync(fd: int) -> None:
        release.wait(30)
        real_fdatasync(fd)

    async def scenario(r: Remoting) -> None:
        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        try:
            answer = await r.send("orders", b"stored, not yet durable", {"UNIQ_KEY": UNIQ})
        finally:
            release.set()
        assert answer.code == ResponseCode.FLUSH_DISK_TIMEOUT
        assert answer.ext_fields["queueOffset"] == "0" and answer.ext_fields["msgId"]
        await until(lambda: r.state.store.end_offset(r.state.store.topics.get("orders"), 0) == 1,
                    "the fsync to complete")  # fmt: skip
        assert [m.body for m in records(await r.pull("orders", 0, 0))] == [
            b"stored, not yet durable"
        ]

    run(tmp_path, scenario, flush_mode="sync", sync_flush_timeout_seconds=0.05)
