"""Broker-side dedup on the RocketMQ fronts: remoting and RocketMQ 5 by the message's UNIQ_KEY.

Both fronts store a message under the id its UNIQ_KEY (RocketMQ 5: its message id) maps
to, so a producer's retry of a send whose answer was lost is answered with the first
copy's place and not stored again; the data safety rule (a duplicate is answered only
once its first copy is written) is checked on the core, with the write held.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.dedup import DedupWindow, digest
from mockbroker.dedup_sends import DedupSends
from sdk import MessageQueue
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.message_layout import BatchElement, encode_batch
from sdk.testing import FakeClock
from tests.component.pulling import read_queue, read_topic
from tests.component.test_remoting_data import UNIQ, Remoting, records, run, v2_header
from tests.component.test_v2_front import send, v2_message


def test_a_remoting_send_retried_by_uniq_key_is_stored_once(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        first = await r.send("orders", b"hello", {"UNIQ_KEY": UNIQ}, queue_id=1)
        again = await r.send("orders", b"hello", {"UNIQ_KEY": UNIQ}, queue_id=2)
        assert first.code == again.code == ResponseCode.SUCCESS
        fields = ("queueId", "queueOffset", "msgId")
        assert [again.ext_fields[f] for f in fields] == [first.ext_fields[f] for f in fields]
        assert first.ext_fields["queueId"] == "1"
        other = await r.send("orders", b"hello", {"UNIQ_KEY": UNIQ[:-1] + "F"}, queue_id=1)
        assert other.ext_fields["queueOffset"] == "1"  # another key: stored
        assert r.stored == 2
        assert r.state.dedup is not None and r.state.dedup.window.duplicates == 1

    run(tmp_path, scenario, dedup_window_seconds=60)


def test_a_remoting_batch_retried_is_stored_once(tmp_path: Path) -> None:
    async def scenario(r: Remoting) -> None:
        elements = [BatchElement(b"m%d" % i, {"UNIQ_KEY": UNIQ[:-1] + str(i)}) for i in range(3)]
        header = v2_header("orders", {"WAIT": "true"}, queue_id=0, batch=True)
        body = encode_batch(elements)
        first = await r.call(RequestCode.SEND_BATCH_MESSAGE, header, body)
        again = await r.call(RequestCode.SEND_BATCH_MESSAGE, header, body)
        assert again.ext_fields["msgId"] == first.ext_fields["msgId"]
        assert len(records(await r.pull("orders", 0, 0))) == 3 == r.stored

    run(tmp_path, scenario, dedup_window_seconds=60)


def test_a_remoting_batch_partly_repeated_stores_only_its_new_messages(tmp_path: Path) -> None:
    """Each message answered: ordermq's queueIds/queueOffsets/uniqKeys, one offsetMsgId each."""

    async def scenario(r: Remoting) -> None:
        key = [UNIQ[:-1] + str(i) for i in range(3)]
        await r.send("orders", b"m0", {"UNIQ_KEY": key[0]}, queue_id=0)
        elements = [
            BatchElement(b"m1", {"UNIQ_KEY": key[1]}),
            BatchElement(b"m0", {"UNIQ_KEY": key[0]}),
            BatchElement(b"m2", {"UNIQ_KEY": key[2]}),
            BatchElement(b"m1", {"UNIQ_KEY": key[1]}),
        ]
        header = v2_header("orders", {"WAIT": "true"}, queue_id=0, batch=True)
        reply = await r.call(RequestCode.SEND_BATCH_MESSAGE, header, encode_batch(elements))
        assert reply.code == ResponseCode.SUCCESS
        fields = reply.ext_fields
        assert fields["queueOffsets"] == "1,0,2,1" and fields["queueIds"] == "0,0,0,0"
        assert fields["uniqKeys"] == f",{key[0]},,{key[1]}"
        ids = fields["msgId"].split(",")
        assert len(ids) == 4 and ids[0] == ids[3] and len(set(ids)) == 3
        assert [m.body for m in records(await r.pull("orders", 0, 0))] == [b"m0", b"m1", b"m2"]
        assert r.stored == 3

    run(tmp_path, scenario, dedup_window_seconds=60)


def test_a_v2_send_of_several_messages_answers_each_entry(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "data", v2_port=0, dedup_window_seconds=60)
    with EmbeddedBroker(config) as broker:
        ids = [f"0102FC0000000126DF0B1658060000000{i}" for i in range(3)]
        first = send(broker, v2_message(b"m0", ids[0])).entries[0]
        batch = [v2_message(b"m1", ids[1]), v2_message(b"m0", ids[0]), v2_message(b"m1", ids[1])]
        entries = send(broker, *batch).entries
        assert [e.message_id for e in entries] == [ids[1], ids[0], ids[1]]
        assert entries[1].offset == first.offset and entries[0].offset == entries[2].offset
        assert sorted(m.body for m in read_topic(broker.address, "orders")) == [b"m0", b"m1"]


def test_a_key_whose_message_is_gone_is_stored_again(tmp_path: Path) -> None:
    """Its topic deleted and made again within the window: the message is new there."""

    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"hello", {"UNIQ_KEY": UNIQ}, queue_id=1)
        await r.state.store.delete_topic("orders")
        again = await r.send("orders", b"hello", {"UNIQ_KEY": UNIQ}, queue_id=1)
        assert (again.code, again.ext_fields["queueOffset"]) == (ResponseCode.SUCCESS, "0")
        assert len(records(await r.pull("orders", 1, 0))) == 1 and r.stored == 2
        assert r.state.dedup is not None and r.state.dedup.window.duplicates == 0

    run(tmp_path, scenario, dedup_window_seconds=60)


def test_a_remoting_send_without_uniq_key_is_never_a_duplicate(tmp_path: Path) -> None:
    """The broker gives such a message a new UNIQ_KEY, so each send is a message of its own."""

    async def scenario(r: Remoting) -> None:
        await r.send("orders", b"hello")
        await r.send("orders", b"hello")
        assert r.stored == 2

    run(tmp_path, scenario, dedup_window_seconds=60)


def test_a_v2_send_retried_with_its_message_id_is_stored_once(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "data", v2_port=0, dedup_window_seconds=60)
    with EmbeddedBroker(config) as broker:
        message_id = "0102FC0000000126DF0B16580600000001"
        first = send(broker, v2_message(b"hello", message_id))
        again = send(broker, v2_message(b"hello", message_id))  # the next queue in turn
        assert again.entries[0].offset == first.entries[0].offset == 0
        assert again.entries[0].message_id == message_id
        assert [m.body for m in read_topic(broker.address, "orders")] == [b"hello"]
        assert read_queue(broker.address, MessageQueue("orders", "broker-a", 1)) == []


class _HeldStore:
    """What DedupSends asks of the store: durable() answers only once released."""

    class _Log:
        end = 100

    commitlog = _Log()

    def __init__(self) -> None:
        self.released = asyncio.Event()

    async def durable(self, end: int) -> bool:
        await self.released.wait()
        return True


def test_a_duplicate_of_a_send_being_written_waits_for_it() -> None:
    """Never answered before the first copy is stored (and then as durable as the flush)."""

    async def scenario() -> None:
        store = _HeldStore()
        sends = DedupSends(DedupWindow(60, 10, FakeClock()), store)  # type: ignore[arg-type]
        keys = [digest("orders", b"i:" + bytes(16))]
        with sends.storing(keys):
            waiting = asyncio.create_task(sends.settle(keys))
            await asyncio.sleep(0.01)
            assert not waiting.done()  # the first copy is still being written
            sends.stored(keys, 3, 7, 1000)
        await waiting
        assert sends.window.find(keys[0]) is not None  # kept (placed() reads it back)
        durable = asyncio.create_task(sends.durable(1))
        await asyncio.sleep(0.01)
        assert not durable.done()  # not until what is written now is flushed
        store.released.set()
        assert await durable

    asyncio.run(scenario())
