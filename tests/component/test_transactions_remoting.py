"""Transactional messages over RocketMQ's remoting, spoken raw: half sends with the prepared
sysFlag, END_TRANSACTION, and CHECK_TRANSACTION_STATE sent to a producer connection.

Through real sockets (tests/remoting_client.py) to an embedded broker on a fake clock;
what is committed is read back over ordermq's gRPC.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.fronts.remoting.coordination import MAX_PRODUCER_GROUPS
from mockbroker.transactions import Transactions
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.message_ids import decode_offset_msg_id
from sdk._remoting.message_layout import decode_records
from sdk.testing import FakeClock
from tests.component.coordination import mq
from tests.component.pulling import read_queue
from tests.component.test_remoting_data import v2_header
from tests.remoting_client import RemotingClient
from tests.support import wait_until

GROUP = "pg"
PREPARED, COMMIT, ROLLBACK = 0x4, 0x8, 0xC
UNIQ = "0A0102030FA01B6D35860ABCDEF000{:02X}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path / "broker", remoting_port=0)
    with EmbeddedBroker(config, clock=clock) as b:
        yield b


def transactions(broker: EmbeddedBroker) -> Transactions:
    state = broker.broker.state
    assert state is not None
    return state.transactions


def visible(broker: EmbeddedBroker, topic: str = "orders") -> list[bytes]:
    return [m.body for q in range(8) for m in read_queue(broker.address, mq(topic, q))]


def producer_heartbeat(client_id: str, group: str = GROUP) -> bytes:
    return json.dumps({
        "clientID": client_id,
        "producerDataSet": [{"groupName": group}, {"groupName": "CLIENT_INNER_PRODUCER"}],
        "consumerDataSet": [],
    }).encode()  # fmt: skip


async def connect(broker: EmbeddedBroker) -> RemotingClient:
    assert broker.remoting_address is not None
    return await RemotingClient.connect(broker.remoting_address)


async def send_half(
    client: RemotingClient, body: bytes, n: int, *, sys_flag: int = PREPARED, **props: str
) -> RemotingCommand:
    properties = {"UNIQ_KEY": UNIQ.format(n), "TRAN_MSG": "true", "PGROUP": GROUP, **props}
    header = v2_header("orders", properties, queue_id=1, sys_flag=sys_flag)
    return await client.request(RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header,
                                                body=body))  # fmt: skip


def end_fields(sent: RemotingCommand, n: int, kind: int, **extra: str) -> dict[str, str]:
    _host, position = decode_offset_msg_id(sent.ext_fields["msgId"])
    return {
        "producerGroup": GROUP, "tranStateTableOffset": sent.ext_fields["queueOffset"],
        "commitLogOffset": str(position), "commitOrRollback": str(kind),
        "fromTransactionCheck": "false", "msgId": UNIQ.format(n), **extra,
    }  # fmt: skip


async def end(client: RemotingClient, fields: dict[str, str]) -> RemotingCommand:
    return await client.request(RemotingCommand(RequestCode.END_TRANSACTION, ext_fields=fields))


def test_a_prepared_send_is_unseen_until_committed_and_a_rollback_never_shows(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> None:
        client = await connect(broker)
        try:
            yes, no = await send_half(client, b"yes", 1), await send_half(client, b"no", 2)
            for sent in (yes, no):
                assert sent.code == ResponseCode.SUCCESS, sent.remark
                assert sent.ext_fields["queueId"] == "1"
            assert (yes.ext_fields["queueOffset"], no.ext_fields["queueOffset"]) == ("0", "1")
            assert await asyncio.to_thread(visible, broker) == [], "half messages are unseen"
            query = await client.request(
                RemotingCommand(
                    RequestCode.QUERY_MESSAGE,
                    ext_fields={
                        "topic": "orders",
                        "key": UNIQ.format(1),
                        "maxNum": "32",
                        "beginTimestamp": "0",
                        "endTimestamp": str(2**62),
                        "_UNIQUE_KEY_QUERY": "true",
                    },
                )
            )
            assert query.code == ResponseCode.QUERY_NOT_FOUND, "a half message is not found"
            assert transactions(broker).pending == 2
            for sent, n, kind in ((yes, 1, COMMIT), (no, 2, ROLLBACK)):
                answer = await end(client, end_fields(sent, n, kind))
                assert answer.code == ResponseCode.SUCCESS, answer.remark
            again = await end(client, end_fields(yes, 1, COMMIT))
            assert again.code == ResponseCode.SUCCESS, "ending it again the same way"
            other_way = await end(client, end_fields(no, 2, COMMIT))
            assert other_way.code == ResponseCode.SYSTEM_ERROR
            assert "rolled back" in (other_way.remark or "")
        finally:
            await client.close()

    asyncio.run(main())
    [committed] = read_queue(broker.address, mq("orders", 1))
    assert committed.body == b"yes" and committed.properties["PGROUP"] == GROUP
    assert transactions(broker).outcomes == {"committed": 1, "rolled back": 1, "dropped": 0}


def test_end_transaction_refusals_name_why_and_change_nothing(broker: EmbeddedBroker) -> None:
    async def main() -> list[tuple[int, str]]:
        client = await connect(broker)
        try:
            sent = await send_half(client, b"x", 1)
            answers = [
                await end(client, end_fields(sent, 1, 5)),
                await end(client, {**end_fields(sent, 1, COMMIT), "producerGroup": "other"}),
                await end(client, {**end_fields(sent, 1, COMMIT), "tranStateTableOffset": "7"}),
                await end(client, {**end_fields(sent, 1, COMMIT), "msgId": UNIQ.format(9)}),
                await end(
                    client, {k: v for k, v in end_fields(sent, 1, COMMIT).items() if k != "msgId"}
                ),
                await end(client, end_fields(sent, 1, 0)),  # not type: it stays unknown
            ]
            # oneway: refused silently, as RocketMQ's clients expect
            await client.oneway(
                RemotingCommand(
                    RequestCode.END_TRANSACTION,
                    ext_fields={**end_fields(sent, 1, COMMIT), "producerGroup": "other"},
                )
            )
            return [(a.code, a.remark or "") for a in answers]
        finally:
            await client.close()

    answers = asyncio.run(main())
    codes = [code for code, _ in answers]
    assert codes == [ResponseCode.SYSTEM_ERROR] * 5 + [ResponseCode.SUCCESS], answers
    assert "commitOrRollback 5" in answers[0][1]
    assert "producer group 'pg', not 'other'" in answers[1][1]
    assert "not pending" in answers[2][1] and "not pending" in answers[3][1]
    assert "msgId" in answers[4][1]
    assert transactions(broker).pending == 1 and visible(broker) == []


def test_sends_that_cannot_be_half_messages_are_refused_and_store_nothing(
    broker: EmbeddedBroker,
) -> None:
    async def main() -> list[tuple[int, str]]:
        client = await connect(broker)
        try:
            header = v2_header("orders", {"TRAN_MSG": "true"}, sys_flag=PREPARED, batch=True)
            batch = await client.request(
                RemotingCommand(RequestCode.SEND_MESSAGE_V2, ext_fields=header, body=b"")
            )
            return [
                (a.code, a.remark or "")
                for a in (
                    await send_half(client, b"c", 1, sys_flag=COMMIT),
                    await send_half(client, b"d", 2, DELAY="3"),
                    batch,
                )
            ]
        finally:
            await client.close()

    answers = asyncio.run(main())
    assert [code for code, _ in answers] == [ResponseCode.MESSAGE_ILLEGAL] * 3, answers
    assert "END_TRANSACTION" in answers[0][1]
    assert "delayed" in answers[1][1] and "batch" in answers[2][1]
    assert transactions(broker).pending == 0


def test_an_unknown_transaction_is_checked_back_on_a_producer_connection_of_its_group(
    broker: EmbeddedBroker, clock: FakeClock
) -> None:
    async def main() -> RemotingCommand:
        producer, stranger = await connect(broker), await connect(broker)
        try:
            beat = await producer.request(
                RemotingCommand(RequestCode.HEART_BEAT, body=producer_heartbeat("p@1"))
            )
            assert beat.code == ResponseCode.SUCCESS, beat.remark
            await stranger.request(
                RemotingCommand(RequestCode.HEART_BEAT, body=producer_heartbeat("s@1", "other"))
            )
            sent = await send_half(stranger, b"later", 3)
            clock.advance(6.1)  # the transaction timeout
            check = await asyncio.wait_for(producer.requests.get(), 30)
            assert check.code == RequestCode.CHECK_TRANSACTION_STATE and check.is_oneway
            assert check.ext_fields["tranStateTableOffset"] == sent.ext_fields["queueOffset"]
            assert check.ext_fields["offsetMsgId"] == sent.ext_fields["msgId"]
            _host, position = decode_offset_msg_id(sent.ext_fields["msgId"])
            assert check.ext_fields["commitLogOffset"] == str(position)
            assert check.ext_fields["msgId"] == check.ext_fields["transactionId"] == UNIQ.format(3)
            # the producer answers as RocketMQ's do: END_TRANSACTION, oneway, from the check
            await producer.oneway(
                RemotingCommand(
                    RequestCode.END_TRANSACTION,
                    ext_fields={
                        "producerGroup": GROUP,
                        "tranStateTableOffset": check.ext_fields["tranStateTableOffset"],
                        "commitLogOffset": check.ext_fields["commitLogOffset"],
                        "commitOrRollback": str(COMMIT),
                        "fromTransactionCheck": "true",
                        "msgId": check.ext_fields["msgId"],
                        "transactionId": check.ext_fields["transactionId"],
                    },
                )
            )
            await asyncio.to_thread(
                wait_until, lambda: transactions(broker).pending == 0, 30, "the commit"
            )
            assert stranger.requests.empty(), "another group's producer is not asked"
            return check
        finally:
            await producer.close()
            await stranger.close()

    check = asyncio.run(main())
    [record] = decode_records(check.body)
    assert (record.topic, record.queue_id, record.body) == ("orders", 1, b"later")
    assert record.properties["UNIQ_KEY"] == UNIQ.format(3)
    assert record.properties["TRAN_MSG"] == "true" and record.properties["PGROUP"] == GROUP
    assert visible(broker) == [b"later"]
    assert transactions(broker).checks_sent == 1


def test_a_closed_or_unregistered_producer_connection_is_asked_no_more(
    broker: EmbeddedBroker,
) -> None:
    def watchers() -> int:
        return sum(len(w) for w in transactions(broker)._watchers.values())

    async def main() -> None:
        first, second = await connect(broker), await connect(broker)
        try:
            for client, name in ((first, "a@1"), (second, "b@1")):
                await client.request(
                    RemotingCommand(RequestCode.HEART_BEAT, body=producer_heartbeat(name))
                )
            await first.request(  # a second heartbeat offers nothing more
                RemotingCommand(RequestCode.HEART_BEAT, body=producer_heartbeat("a@1"))
            )
            await asyncio.to_thread(wait_until, lambda: watchers() == 2, 30, "two watchers")
            await first.request(
                RemotingCommand(
                    RequestCode.UNREGISTER_CLIENT,
                    ext_fields={"clientID": "a@1", "producerGroup": GROUP},
                )
            )
            await asyncio.to_thread(wait_until, lambda: watchers() == 1, 30, "a unregistered")
            await second.close()
            await asyncio.to_thread(wait_until, lambda: watchers() == 0, 30, "b's close")
        finally:
            await first.close()
            await second.close()

    asyncio.run(main())


def test_one_connection_answers_check_backs_for_a_bounded_number_of_groups(
    broker: EmbeddedBroker,
) -> None:
    def watchers() -> int:
        return sum(len(w) for w in transactions(broker)._watchers.values())

    body = json.dumps({
        "clientID": "many@1", "consumerDataSet": [],
        "producerDataSet": [{"groupName": f"pg{i}"} for i in range(MAX_PRODUCER_GROUPS + 6)],
    }).encode()  # fmt: skip

    async def main() -> None:
        client = await connect(broker)
        try:
            beat = await client.request(RemotingCommand(RequestCode.HEART_BEAT, body=body))
            assert beat.code == ResponseCode.SUCCESS, beat.remark
            await asyncio.to_thread(
                wait_until, lambda: watchers() == MAX_PRODUCER_GROUPS, 30, "the watchers"
            )
        finally:
            await client.close()
        await asyncio.to_thread(wait_until, lambda: watchers() == 0, 30, "the close")

    asyncio.run(main())
