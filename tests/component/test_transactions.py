"""Transactional messages end to end: half messages, commit, rollback, check-back, restart."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.fronts.grpc_errors import REASON_KEY
from mockbroker.transactions import Transactions
from sdk import (
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionProducer,
    aio,
)
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.broker_client import BrokerClient
from sdk.errors import OrderMQError, TransactionNotFoundError, WrongProducerGroupError
from sdk.testing import FakeClock
from tests.component.coordination import mq, run
from tests.component.pulling import read_queue
from tests.component.scraping import scrape
from tests.component.transports import TRANSPORTS
from tests.support import wait_until

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOWN = LocalTransactionState.UNKNOWN


class Listener:
    """Answers as told, per body; records the check-backs it got."""

    def __init__(self, execute: dict[bytes, Any], check: dict[bytes, Any] | None = None) -> None:
        self.execute = execute
        self.check = check if check is not None else {}
        self.checked: list[MessageExt] = []
        self.lock = threading.Lock()

    def _answer(self, table: dict[bytes, Any], body: bytes) -> LocalTransactionState:
        answer = table.get(body, UNKNOWN)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, LocalTransactionState)
        return answer

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        return self._answer(self.execute, msg.body)

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        with self.lock:
            self.checked.append(msg)
        return self._answer(self.check, msg.body)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    config = BrokerConfig(data_dir=tmp_path, remoting_port=0, namesrv_port=0)
    with EmbeddedBroker(config, clock=clock) as b:
        yield b


@pytest.fixture(params=TRANSPORTS)
def endpoint(request: pytest.FixtureRequest, broker: EmbeddedBroker) -> str:
    """What the producers are given: the gRPC port, or rocketmq://<name server>."""
    if request.param == "rocketmq":
        return f"rocketmq://{broker.namesrv_address}"
    return broker.address


def transactions(broker: EmbeddedBroker) -> Transactions:
    state = broker.broker.state
    assert state is not None
    return state.transactions


def everything(broker: EmbeddedBroker, topic: str = "orders") -> list[bytes]:
    queues = [mq(topic, q) for q in range(8)]
    return [m.body for q in queues for m in read_queue(broker.address, q)]


def test_commit_is_visible_rollback_never(broker: EmbeddedBroker, endpoint: str) -> None:
    listener = Listener({b"yes": COMMIT, b"no": ROLLBACK})
    with TransactionProducer(endpoint, listener, group="pg") as producer:
        yes = producer.send_message_in_transaction(Message("orders", b"yes", sharding_key="k"))
        no = producer.send_message_in_transaction(Message("orders", b"no", sharding_key="k"))
    assert yes.local_transaction_state is COMMIT and no.local_transaction_state is ROLLBACK
    assert yes.queue == no.queue and yes.queue_offset == -1 and yes.transaction_id
    [committed] = read_queue(broker.address, yes.queue)
    assert committed.body == b"yes" and committed.msg_id == yes.msg_id
    assert committed.sharding_key == "k" and committed.properties["PGROUP"] == "pg"
    assert everything(broker) == [b"yes"]
    assert transactions(broker).pending == 0
    assert transactions(broker).outcomes == {"committed": 1, "rolled back": 1, "dropped": 0}


def test_unknown_is_checked_back_then_committed(
    broker: EmbeddedBroker, endpoint: str, clock: FakeClock
) -> None:
    listener = Listener({}, {b"later": COMMIT})
    with TransactionProducer(endpoint, listener, group="pg") as producer:
        sent = producer.send_message_in_transaction(Message("orders", b"later"))
        assert sent.local_transaction_state is UNKNOWN
        assert read_queue(broker.address, sent.queue) == [], "a half message is invisible"
        clock.advance(5.9)
        assert read_queue(broker.address, sent.queue) == []
        assert listener.checked == []
        clock.advance(0.2)  # the transaction timeout: 6 s
        wait_until(lambda: [m.body for m in read_queue(broker.address, sent.queue)] == [b"later"])
    [checked] = listener.checked
    assert checked.msg_id == sent.msg_id and checked.topic == "orders"
    assert transactions(broker).checks_sent == 1


def test_a_raising_listener_counts_as_unknown_and_is_logged(
    broker: EmbeddedBroker, endpoint: str, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    boom = RuntimeError("database down")
    listener = Listener({b"x": boom}, {b"x": boom})
    with (
        caplog.at_level(logging.ERROR, logger="ordermq.transaction"),
        TransactionProducer(endpoint, listener, group="pg") as producer,
    ):
        sent = producer.send_message_in_transaction(Message("orders", b"x"))
        assert sent.local_transaction_state is UNKNOWN
        clock.advance(6.1)
        wait_until(lambda: len(listener.checked) == 1)
        wait_until(lambda: "check_local_transaction raised" in caplog.text)
    assert "execute_local_transaction raised" in caplog.text and "database down" in caplog.text
    assert transactions(broker).pending == 1


def test_check_back_goes_to_another_producer_when_the_first_is_gone(
    broker: EmbeddedBroker, endpoint: str, clock: FakeClock
) -> None:
    first = Listener({})
    second = Listener({}, {b"orphan": COMMIT})

    def watching() -> int:
        return len(transactions(broker)._watchers.get("pg", []))

    # Each count is waited for in turn: one producer watching at the end is the second
    # only once both were (over rocketmq:// a producer watches from its first heartbeat,
    # so the first could be the one watching while the second was not yet).
    with TransactionProducer(endpoint, second, group="pg"):
        wait_until(lambda: watching() == 1, what="the second producer watching")
        with TransactionProducer(endpoint, first, group="pg") as producer:
            sent = producer.send_message_in_transaction(Message("orders", b"orphan"))
            wait_until(lambda: watching() == 2, what="both producers watching")
        # the first producer is gone: its stream closed
        wait_until(lambda: watching() == 1, what="the first producer gone")
        clock.advance(6.1)
        wait_until(lambda: [m.body for m in read_queue(broker.address, sent.queue)] == [b"orphan"])
    assert first.checked == [] and [m.body for m in second.checked] == [b"orphan"]


def test_dropped_after_the_most_checks(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    config = BrokerConfig(data_dir=tmp_path, transaction_max_checks=3, metrics_port=0)
    listener = Listener({})
    with (
        caplog.at_level(logging.WARNING, logger="mockbroker.transactions"),
        EmbeddedBroker(config, clock=clock) as broker,
        TransactionProducer(broker.address, listener, group="pg") as producer,
    ):
        sent = producer.send_message_in_transaction(Message("orders", b"never"))
        clock.advance(6.1)
        wait_until(lambda: len(listener.checked) == 1)
        for n in (2, 3):
            clock.advance(60.1)
            wait_until(lambda n=n: len(listener.checked) == n)  # type: ignore[misc]
        assert transactions(broker).pending == 1
        clock.advance(60.1)
        wait_until(lambda: transactions(broker).pending == 0)
        assert len(listener.checked) == 3
        port = broker.broker.metrics_port
        assert port is not None
        samples = scrape(port)
        assert samples[("ordermq_transactions_ended_total", (("outcome", "dropped"),))] == 1
        assert samples[("ordermq_transaction_checks_total", ())] == 3
        assert samples[("ordermq_transactions_pending", ())] == 0
        assert read_queue(broker.address, sent.queue) == []
    assert f"transaction {sent.transaction_id} of group pg dropped" in caplog.text


def test_a_transaction_stays_pending_until_its_outcome_is_on_disk(
    tmp_path: Path, clock: FakeClock
) -> None:
    # The pending count fell when the outcome's write began: a make test run saw no
    # transaction pending and still no drop counted, and a reader could see neither the
    # message nor the transaction (tests/component/test_transactions.py's drop test).
    config = BrokerConfig(data_dir=tmp_path, transaction_max_checks=1)
    recording, release = threading.Event(), threading.Event()
    with (
        EmbeddedBroker(config, clock=clock) as broker,
        TransactionProducer(broker.address, Listener({}), group="pg") as producer,
    ):
        txns = transactions(broker)
        record = txns._record

        async def held_record(offset: int, msg_id: bytes, outcome: int) -> None:
            recording.set()
            await asyncio.to_thread(release.wait, 30)
            await record(offset, msg_id, outcome)

        txns._record = held_record  # type: ignore[method-assign]
        producer.send_message_in_transaction(Message("orders", b"never"))
        clock.advance(6.1)
        wait_until(lambda: txns.checks_sent == 1)
        clock.advance(60.1)
        assert recording.wait(10), "the drop's outcome was never written"
        assert txns.pending == 1, "pending while its outcome is not on disk"
        release.set()
        wait_until(lambda: txns.outcomes["dropped"] == 1)
        assert txns.pending == 0


def test_sharding_key_order_among_committed(broker: EmbeddedBroker, endpoint: str) -> None:
    listener = Listener({b"a1": COMMIT, b"a2": COMMIT, b"b1": ROLLBACK, b"a3": COMMIT})
    with TransactionProducer(endpoint, listener, group="pg") as producer:
        results = [
            producer.send_message_in_transaction(Message("orders", body, sharding_key="a"))
            for body in (b"a1", b"a2", b"b1", b"a3")
        ]
    assert len({r.queue for r in results}) == 1
    assert [m.body for m in read_queue(broker.address, results[0].queue)] == [b"a1", b"a2", b"a3"]


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_a_restart_neither_commits_twice_nor_resurrects(
    tmp_path: Path, clock: FakeClock, flush_mode: str
) -> None:
    config = BrokerConfig(data_dir=tmp_path, flush_mode=flush_mode)
    listener = Listener({b"c": COMMIT, b"r": ROLLBACK}, {b"p": COMMIT})
    with (
        EmbeddedBroker(config, clock=clock) as broker,
        TransactionProducer(broker.address, listener, group="pg") as producer,
    ):
        queue = producer.send_message_in_transaction(Message("orders", b"c", sharding_key="k"))
        producer.send_message_in_transaction(Message("orders", b"r", sharding_key="k"))
        producer.send_message_in_transaction(Message("orders", b"p", sharding_key="k"))
    with EmbeddedBroker(config, clock=clock) as broker:
        assert transactions(broker).pending == 1
        assert [m.body for m in read_queue(broker.address, queue.queue)] == [b"c"]
        with TransactionProducer(broker.address, listener, group="pg"):
            wait_until(lambda: "pg" in transactions(broker)._watchers)
            clock.advance(6.1)
            wait_until(lambda: transactions(broker).pending == 0)
        bodies = [m.body for m in read_queue(broker.address, queue.queue)]
        assert bodies == [b"c", b"p"]
    with EmbeddedBroker(config, clock=clock) as broker:
        assert transactions(broker).pending == 0
        assert [m.body for m in read_queue(broker.address, queue.queue)] == [b"c", b"p"]


def test_a_commit_whose_outcome_was_lost_is_not_committed_again(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A crash between the commit's append and its outcome record: start-up records it."""
    config = BrokerConfig(data_dir=tmp_path)
    listener = Listener({}, {b"once": COMMIT})
    with (
        EmbeddedBroker(config, clock=clock) as broker,
        TransactionProducer(broker.address, listener, group="pg") as producer,
    ):
        sent = producer.send_message_in_transaction(Message("orders", b"once"))
        core = transactions(broker)
        state = broker.broker.state
        assert state is not None
        waiting = next(iter(core._pending.values()))
        record = state.store.read_record(core._half, 0, waiting.offset)

        # the commit's append, without its outcome
        broker._runner.call(lambda: core._deliver(record))
    with EmbeddedBroker(config, clock=clock) as broker:
        assert transactions(broker).pending == 0
        assert transactions(broker).outcomes["committed"] == 1
        assert [m.body for m in read_queue(broker.address, sent.queue)] == [b"once"]


def test_end_for_an_unknown_id_or_another_group_is_refused_and_changes_nothing(
    broker: EmbeddedBroker,
) -> None:
    listener = Listener({})
    with TransactionProducer(broker.address, listener, group="pg") as producer:
        sent = producer.send_message_in_transaction(Message("orders", b"x"))
    txn = sent.transaction_id
    unknown = "00" * 16 + "-999"

    async def refused(client: BrokerClient) -> None:
        with pytest.raises(TransactionNotFoundError) as not_found:
            await client.end_transaction("pg", unknown, True, from_check=False)
        assert not_found.value.reason == "TRANSACTION_NOT_FOUND" and unknown in str(not_found.value)
        with pytest.raises(WrongProducerGroupError) as wrong:
            await client.end_transaction("other", txn, True, from_check=False)
        assert isinstance(wrong.value, OrderMQError) and "'pg'" in str(wrong.value)
        with pytest.raises(OrderMQError):
            await client.end_transaction("pg", "not-an-id", True, from_check=False)

    run(broker.address, refused)
    assert transactions(broker).pending == 1
    assert read_queue(broker.address, sent.queue) == []

    async def status(client: BrokerClient) -> None:
        stub = pb_grpc.MessagingServiceStub(grpc.aio.insecure_channel(broker.address))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.EndTransaction(
                pb.EndTransactionRequest(
                    group="pg", transaction_id=unknown, resolution=pb.TRANSACTION_COMMIT
                )
            )
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        trailing = dict(err.value.trailing_metadata() or ())
        assert trailing[REASON_KEY] == "TRANSACTION_NOT_FOUND"

    run(broker.address, status)

    async def ends(client: BrokerClient) -> None:
        await client.end_transaction("pg", txn, False, from_check=False)
        await client.end_transaction("pg", txn, False, from_check=False)  # the same again: OK
        with pytest.raises(TransactionNotFoundError, match="rolled back"):
            await client.end_transaction("pg", txn, True, from_check=False)

    run(broker.address, ends)
    assert transactions(broker).pending == 0 and read_queue(broker.address, sent.queue) == []


def test_asyncio_producer(broker: EmbeddedBroker, endpoint: str, clock: FakeClock) -> None:
    class AsyncListener:
        def __init__(self) -> None:
            self.checked: list[str] = []

        async def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
            return COMMIT if arg == "commit" else UNKNOWN

        async def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
            self.checked.append(msg.msg_id)
            return ROLLBACK

    listener = AsyncListener()

    async def main() -> tuple[str, str]:
        async with aio.TransactionProducer(endpoint, listener, group="pg") as producer:
            done = await producer.send_message_in_transaction(Message("orders", b"a"), "commit")
            left = await producer.send_message_in_transaction(Message("orders", b"b"))
            assert left.local_transaction_state is UNKNOWN
            clock.advance(6.1)
            async with asyncio.timeout(30):
                while transactions(broker).pending:
                    await asyncio.sleep(0.02)
            return done.msg_id, left.msg_id

    _, left = asyncio.run(main())
    assert listener.checked == [left]
    assert everything(broker) == [b"a"]


def test_a_broker_stops_at_once_while_producers_watch_for_checks(
    tmp_path: Path, clock: FakeClock
) -> None:
    broker = EmbeddedBroker(BrokerConfig(data_dir=tmp_path), clock=clock)
    # A stop waits for running calls as long as its grace: a check-back stream left
    # running would hold this one for an hour, where the broker ending it stops at once.
    broker._runner._stop = functools.partial(broker.broker.stop, grace_seconds=3600.0)
    broker.start()
    with TransactionProducer(broker.address, Listener({}), group="pg"):
        wait_until(lambda: "pg" in transactions(broker)._watchers)
        stopping = threading.Thread(target=broker.stop, daemon=True)
        stopping.start()
        stopping.join(timeout=300)
        assert not stopping.is_alive(), "the check-back stream held the broker's stop"


def test_lookups_skip_half_messages_and_find_a_committed_one_once(
    broker: EmbeddedBroker, endpoint: str
) -> None:
    listener = Listener({b"c": COMMIT, b"r": ROLLBACK})
    with TransactionProducer(endpoint, listener, group="pg") as producer:
        sent = {
            body: producer.send_message_in_transaction(
                Message("orders", body, keys=f"key-{body!r}")
            )
            for body in (b"c", b"r", b"p")  # committed, rolled back, pending
        }

    async def lookups() -> dict[bytes, tuple[int, int]]:
        async with grpc.aio.insecure_channel(broker.address) as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            found: dict[bytes, tuple[int, int]] = {}
            for body, result in sent.items():
                by_key = await admin.QueryMessagesByKey(
                    pb.QueryMessagesByKeyRequest(topic="orders", key=f"key-{body!r}")
                )
                try:
                    by_id = (
                        await admin.QueryMessageById(
                            pb.QueryMessageByIdRequest(msg_id=result.msg_id)
                        )
                    ).record_count
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.NOT_FOUND
                    by_id = 0
                found[body] = (by_id, by_key.record_count)
            return found

    assert asyncio.run(lookups()) == {b"c": (1, 1), b"r": (0, 0), b"p": (0, 0)}
