"""The broker's /metrics endpoint, scraped after a known workload."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import os
import platform
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)

import sdk
from mockbroker import BrokerConfig, EmbeddedBroker, exposition
from mockbroker.config import FlushMode
from mockbroker.histogram import DURATION_BUCKETS
from mockbroker.http_status import StatusServer
from mockbroker.metrics import PAUSE, SERIES_PER_SLICE, BrokerCollector, retention_metrics
from mockbroker.server import Broker
from mockbroker.state import BrokerState
from sdk import Message, Producer
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk._wire import encode_frame
from sdk.errors import InvalidQueueError
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run
from tests.component.pulling import read_queue
from tests.component.scraping import Samples, families, fetch, get, labelled, scrape, types
from tests.remoting_client import RemotingClient
from tests.support import wait_until


def metrics_port(broker: EmbeddedBroker) -> int:
    port = broker.broker.metrics_port
    assert port
    return port


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def timed_broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    """A broker serving metrics, on a fake clock."""
    config = BrokerConfig(data_dir=tmp_path, metrics_port=0)
    with EmbeddedBroker(config, clock=clock) as b:
        yield b


def test_key_series_have_the_right_values(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path, metrics_port=0)) as broker:
        port = metrics_port(broker)
        with Producer(broker.address) as producer:
            results = producer.send_batch(
                [Message("orders", b"x" * 10, sharding_key="k") for _ in range(30)]
            )
            producer.send(Message("audit", b"y"))
        queue = results[0].queue
        assert len(read_queue(broker.address, queue)) == 30

        async def consume(c: BrokerClient) -> None:
            await c.heartbeat("w1", [GroupInfo("billing", "CONSUME_ORDERLY")])
            epoch = (await c.lock_batch("billing", "w1", [queue]))[queue]
            await c.commit_offsets("billing", "w1", [(queue, 12, epoch)])

        run(broker.address, consume)
        m = scrape(port)
    assert m[("ordermq_messages_in_total", (("topic", "orders"),))] == 30
    assert m[("ordermq_messages_in_total", (("topic", "audit"),))] == 1
    assert m[("ordermq_messages_out_total", (("topic", "orders"),))] == 30
    assert m[("ordermq_locks_held", (("group", "billing"),))] == 1
    assert m[("ordermq_group_members", (("group", "billing"),))] == 1
    lag_key = (("group", "billing"), ("queue", str(queue.queue_id)), ("topic", "orders"))
    assert m[("ordermq_consumer_lag", lag_key)] == 30 - 12
    assert m[("ordermq_held_pulls", ())] == 0
    assert m[("ordermq_store_bytes", ())] > 31 * 10
    # Two sends and a pull, at least, took their turns.
    assert m[("ordermq_fair_slices_total", ())] >= 3
    assert 0 <= m[("ordermq_fair_slices_waited_total", ())] <= m[("ordermq_fair_slices_total", ())]
    assert m[("ordermq_client_limit_refusals_total", ())] == 0
    assert ("ordermq_flush_seconds_count", ()) in m


def test_metrics_are_off_unless_asked_for(broker: EmbeddedBroker) -> None:
    assert broker.broker.metrics_port is None


# ---------------------------------------------------------------------- groups that go
def test_a_group_whose_members_left_has_no_series_at_the_next_scrape(
    timed_broker: EmbeddedBroker,
) -> None:
    port = metrics_port(timed_broker)
    with Producer(timed_broker.address) as producer:
        queue = producer.send(Message("orders", b"x", sharding_key="k")).queue

    async def take_a_lock(c: BrokerClient) -> None:
        await join(c, "w1", group="short-lived")
        await c.lock_batch("short-lived", "w1", [queue])

    run(timed_broker.address, take_a_lock)
    present = labelled(scrape(port), group="short-lived")
    assert present[("ordermq_locks_held", (("group", "short-lived"),))] == 1
    assert present[("ordermq_group_members", (("group", "short-lived"),))] == 1

    run(timed_broker.address, lambda c: c.unregister("w1"))
    assert labelled(scrape(port), group="short-lived") == {}


def test_a_group_whose_members_expired_has_no_series_at_the_next_scrape(
    timed_broker: EmbeddedBroker, clock: FakeClock
) -> None:
    port = metrics_port(timed_broker)
    run(timed_broker.address, lambda c: join(c, "w1", group="silent"))
    assert labelled(scrape(port), group="silent") != {}

    clock.advance(BrokerConfig().client_timeout_seconds + 1)  # the sweep runs on this clock
    wait_until(lambda: labelled(scrape(port), group="silent") == {}, what="series dropped")


def test_a_group_with_committed_offsets_stays_with_no_members_and_its_lag(
    timed_broker: EmbeddedBroker,
) -> None:
    """Its offsets keep it (it resumes from them): an offline group's lag is what to watch."""
    port = metrics_port(timed_broker)
    with Producer(timed_broker.address) as producer:
        queue = producer.send_batch([Message("orders", b"x", sharding_key="k")] * 5)[0].queue

    async def commit_and_leave(c: BrokerClient) -> None:
        await join(c, "w1", group="offline")
        epoch = (await c.lock_batch("offline", "w1", [queue]))[queue]
        await c.commit_offsets("offline", "w1", [(queue, 2, epoch)])
        await c.unregister("w1")

    run(timed_broker.address, commit_and_leave)
    group = labelled(scrape(port), group="offline")
    assert group[("ordermq_group_members", (("group", "offline"),))] == 0
    assert group[("ordermq_locks_held", (("group", "offline"),))] == 0
    lag = ("ordermq_consumer_lag",
           (("group", "offline"), ("queue", str(queue.queue_id)), ("topic", "orders")))  # fmt: skip
    assert group[lag] == 5 - 2


# ---------------------------------------------------------------------- flushes
def bucket_bounds(samples: Samples, name: str, **labels: str) -> list[str]:
    return [
        dict(key)["le"]
        for key, _ in sorted(
            ((k[1], v) for k, v in labelled(samples, **labels).items() if k[0] == name),
            key=lambda kv: float(dict(kv[0])["le"]),
        )
    ]


def assert_histogram(samples: Samples, name: str, count: float, **labels: str) -> None:
    """Buckets fit for fsync times, cumulative, +Inf equal to the count."""
    expected = [*(repr(b) for b in DURATION_BUCKETS), "+Inf"]
    assert bucket_bounds(samples, f"{name}_bucket", **labels) == expected
    key = tuple(sorted(labels.items()))
    values = [samples[(f"{name}_bucket", tuple(sorted({**labels, "le": le}.items())))]
              for le in expected]  # fmt: skip
    assert values == sorted(values), "buckets are cumulative"
    assert values[-1] == samples[(f"{name}_count", key)] == count
    assert samples[(f"{name}_sum", key)] > 0


def test_flush_seconds_is_a_histogram_with_buckets_from_sub_millisecond_to_seconds(
    tmp_path: Path,
) -> None:
    config = BrokerConfig(data_dir=tmp_path, metrics_port=0, flush_mode="sync")
    with EmbeddedBroker(config) as broker:
        port = metrics_port(broker)
        assert types(port)["ordermq_flush_seconds"] == "histogram"
        before = scrape(port)[("ordermq_flush_seconds_count", ())]
        with Producer(broker.address) as producer:
            producer.send(Message("orders", b"x"))  # answered once its fsync is done
        after = scrape(port)
    assert after[("ordermq_flush_seconds_count", ())] > before
    assert_histogram(after, "ordermq_flush_seconds", after[("ordermq_flush_seconds_count", ())])


def test_a_stalled_event_loop_shows_in_the_loop_lag_histogram(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path, metrics_port=0)
    with EmbeddedBroker(config) as broker:
        port = metrics_port(broker)
        assert types(port)["ordermq_event_loop_lag_seconds"] == "histogram"
        key = ("ordermq_event_loop_lag_seconds_bucket", (("le", "0.1"),))
        wait_until(
            lambda: scrape(port)[("ordermq_event_loop_lag_seconds_count", ())] > 0,
            10,
            "the probe's first wake-up",
        )
        counted = scrape(port)[("ordermq_event_loop_lag_seconds_count", ())]

        async def stall() -> None:
            time.sleep(0.3)  # a blocking call on the broker's loop

        broker._runner.call(stall)
        wait_until(
            lambda: scrape(port)[("ordermq_event_loop_lag_seconds_count", ())] > counted,
            10,
            "the probe's wake-up after the stall",
        )
        after = scrape(port)
    count = after[("ordermq_event_loop_lag_seconds_count", ())]
    assert after[key] < count, "a wake-up over 100 ms late"
    assert after[("ordermq_event_loop_lag_seconds_sum", ())] >= 0.2
    assert_histogram(after, "ordermq_event_loop_lag_seconds", count)


# ---------------------------------------------------------------------- requests
def unary_send(address: str, request: pb.SendRequest) -> grpc.StatusCode:
    """Send `request` as a unary call; its status code."""
    with grpc.insecure_channel(address) as channel:
        try:
            pb_grpc.MessagingServiceStub(channel).Send(request, timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_a_send_counts_a_send_request_and_its_duration_in_its_flush_mode(
    tmp_path: Path, flush_mode: FlushMode
) -> None:
    config = BrokerConfig(data_dir=tmp_path, metrics_port=0, flush_mode=flush_mode)
    with EmbeddedBroker(config) as broker:
        port = metrics_port(broker)
        with Producer(broker.address) as producer:  # on the Exchange stream
            queue = producer.send(Message("orders", b"x")).queue
            producer.send_batch([Message("orders", b"y", sharding_key="k")] * 10)
        m = scrape(port)
        sends = ("ordermq_rpc_requests_total", (("code", "OK"), ("method", "Send")))
        assert m[sends] == 2
        assert_histogram(m, "ordermq_send_duration_seconds", 2, flush_mode=flush_mode)

        frames = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"z")
        request = pb.SendRequest(topic="orders", queue_id=queue.queue_id, frames=frames)
        assert unary_send(broker.address, request) == grpc.StatusCode.OK
        m = scrape(port)
    assert m[sends] == 3
    assert m[("ordermq_send_duration_seconds_count", (("flush_mode", flush_mode),))] == 3
    assert m[("ordermq_rpc_requests_total", (("code", "OK"), ("method", "QueryRoute")))] >= 1


def test_a_refused_request_counts_an_error_with_its_code_and_reason(
    timed_broker: EmbeddedBroker,
) -> None:
    port = metrics_port(timed_broker)
    with Producer(timed_broker.address) as producer:
        producer.send(Message("orders", b"x"))
    durations = scrape(port)[("ordermq_send_duration_seconds_count", (("flush_mode", "async"),))]

    async def bad_queue(c: BrokerClient) -> None:  # on the Exchange stream
        with pytest.raises(InvalidQueueError):
            await c.send("orders", 99, b"")

    run(timed_broker.address, bad_queue)
    bad = pb.SendRequest(topic="orders", queue_id=99)
    assert unary_send(timed_broker.address, bad) == grpc.StatusCode.OUT_OF_RANGE
    m = scrape(port)
    error = ("code", "OUT_OF_RANGE"), ("method", "Send"), ("reason", "INVALID_QUEUE")
    assert m[("ordermq_rpc_errors_total", error)] == 2
    assert m[("ordermq_rpc_requests_total", (("code", "OUT_OF_RANGE"), ("method", "Send")))] == 2
    assert m[("ordermq_rpc_requests_total", (("code", "OK"), ("method", "Send")))] == 1
    assert m[("ordermq_send_duration_seconds_count", (("flush_mode", "async"),))] == durations


# ---------------------------------------------------------------------- retry, DLQ
def test_retries_and_dead_letters_are_counted_per_group(timed_broker: EmbeddedBroker) -> None:
    port = metrics_port(timed_broker)
    with Producer(timed_broker.address) as producer:
        sent = producer.send(Message("orders", b"poison", sharding_key="o-1"))
    retried = ("ordermq_messages_retried_total", (("group", "g"),))
    dead = ("ordermq_messages_dead_lettered_total", (("group", "g"),))

    async def retry(c: BrokerClient) -> None:
        await join(c, "client-1")
        back = await c.send_back("g", sent.queue, sent.queue_offset, max_reconsume_times=2)
        assert back.topic == "%RETRY%g"

    run(timed_broker.address, retry)
    m = scrape(port)
    assert (m[retried], m.get(dead, 0)) == (1, 0)

    async def give_up(c: BrokerClient) -> None:
        await join(c, "client-1")
        back = await c.send_back("g", sent.queue, sent.queue_offset, max_reconsume_times=2,
                                 reconsume_times=2)  # fmt: skip
        assert back.dead_letter

    run(timed_broker.address, give_up)
    m = scrape(port)
    assert (m[retried], m[dead]) == (1, 1)
    assert read_queue(timed_broker.address, mq("%DLQ%g", 0))[0].body == b"poison"


# ---------------------------------------------------------------------- build, disk
def test_build_info_and_the_data_directory_disk_space(timed_broker: EmbeddedBroker) -> None:
    m = scrape(metrics_port(timed_broker))
    info = ("ordermq_build_info",
            (("python", platform.python_version()), ("version", sdk.__version__)))  # fmt: skip
    assert m[info] == 1
    fs = os.statvfs(timed_broker.config.data_dir)
    assert m[("ordermq_disk_size_bytes", ())] == fs.f_blocks * fs.f_frsize
    assert 0 < m[("ordermq_disk_free_bytes", ())] <= m[("ordermq_disk_size_bytes", ())]
    assert m[("ordermq_ready", ())] == 1


#: Every series the broker exports, with its type (the list in the operator docs).
def test_a_remoting_member_counts_as_disconnected_once_all_it_sent_was_read(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Its last commit, written just before its socket closed, is answered once it counts.

    What a test that kills a RocketMQ client waits for before reading the offsets the
    client left (tests/system/test_rocketmq_cpp_client.py).
    """
    config = BrokerConfig(data_dir=tmp_path, metrics_port=0, remoting_port=0,
                          disconnect_grace_seconds=30)  # fmt: skip
    with EmbeddedBroker(config, clock=clock) as broker:
        port = metrics_port(broker)
        assert broker.remoting_address is not None
        address = broker.remoting_address
        with Producer(broker.address) as producer:
            queue = producer.send_batch([Message("orders", b"x", sharding_key="k")] * 5)[0].queue
        key = {"consumerGroup": "dying", "topic": "orders", "queueId": str(queue.queue_id)}
        gauge = ("ordermq_group_members_disconnected", (("group", "dying"),))
        heartbeat = json.dumps(
            {
                "clientID": "c1@1",
                "consumerDataSet": [
                    {
                        "groupName": "dying",
                        "consumeType": 1,
                        "messageModel": 1,
                        "subscriptionDataSet": [{"topic": "orders", "subString": "*"}],
                    }
                ],
            }
        ).encode()
        lock = json.dumps(
            {
                "consumerGroup": "dying",
                "clientId": "c1@1",
                "mqSet": [{"topic": "orders", "brokerName": "broker-a", "queueId": queue.queue_id}],
            }
        ).encode()

        async def join_then_commit_and_die() -> None:
            c = await RemotingClient.connect(address)
            for code, body in (
                (RequestCode.HEART_BEAT, heartbeat),
                (RequestCode.LOCK_BATCH_MQ, lock),
            ):
                answer = await c.request(RemotingCommand(code, body=body))
                assert answer.code == ResponseCode.SUCCESS, answer.remark
            assert scrape(port)[gauge] == 0
            # Oneway, as RocketMQ clients persist offsets, and closed at once: nothing waits
            # for the broker to read it.
            await c.oneway(RemotingCommand(RequestCode.UPDATE_CONSUMER_OFFSET,
                                           ext_fields={**key, "commitOffset": "4"}))  # fmt: skip
            await c.close()

        async def committed() -> str:
            c = await RemotingClient.connect(address)
            try:
                answer = await c.request(
                    RemotingCommand(RequestCode.QUERY_CONSUMER_OFFSET, ext_fields=key)
                )
            finally:
                await c.close()
            assert answer.code == ResponseCode.SUCCESS and answer.ext_fields, answer.remark
            return answer.ext_fields["offset"]

        asyncio.run(join_then_commit_and_die())
        wait_until(lambda: scrape(port).get(gauge) == 1, 30, "c1 counted as disconnected")
        assert asyncio.run(committed()) == "4"
        samples = scrape(port)
        assert samples[("ordermq_group_members", (("group", "dying"),))] == 1  # in its grace
        clock.advance(31)  # the grace is over: it leaves the group, and the gauge with it
        wait_until(lambda: labelled(scrape(port), group="dying").get(gauge, 0) == 0, 30,
                   "c1 gone from the group")  # fmt: skip


DOCUMENTED = {
    "ordermq_build_info": "gauge",
    "ordermq_ready": "gauge",
    "ordermq_disk_free_bytes": "gauge",
    "ordermq_disk_size_bytes": "gauge",
    "ordermq_messages_in": "counter",
    "ordermq_messages_out": "counter",
    "ordermq_held_pulls": "gauge",
    "ordermq_scheduled_messages": "gauge",
    "ordermq_transactions_pending": "gauge",
    "ordermq_transactions_ended": "counter",
    "ordermq_transaction_checks": "counter",
    "ordermq_store_bytes": "gauge",
    "ordermq_corrupt_records": "counter",
    "ordermq_dedup_duplicates": "counter",
    "ordermq_dedup_keys": "gauge",
    "ordermq_flush_seconds": "histogram",
    "ordermq_event_loop_lag_seconds": "histogram",
    "ordermq_fair_slices": "counter",
    "ordermq_fair_slices_waited": "counter",
    "ordermq_client_limit_refusals": "counter",
    "ordermq_topic_creations_refused": "counter",
    "ordermq_rpc_requests": "counter",
    "ordermq_rpc_errors": "counter",
    "ordermq_send_duration_seconds": "histogram",
    "ordermq_locks_held": "gauge",
    "ordermq_group_members": "gauge",
    "ordermq_group_members_disconnected": "gauge",
    "ordermq_messages_retried": "counter",
    "ordermq_messages_dead_lettered": "counter",
    "ordermq_pop_messages_in_flight": "gauge",
    "ordermq_pop_messages_received": "counter",
    "ordermq_pop_messages_acked": "counter",
    "ordermq_pop_messages_expired": "counter",
    "ordermq_pop_messages_dead_lettered": "counter",
    "ordermq_consumer_lag": "gauge",
    "ordermq_disk_used_ratio": "gauge",
    "ordermq_sends_refused": "gauge",
    "ordermq_retention_oldest_timestamp_seconds": "gauge",
    "ordermq_retention_deleted_messages": "counter",
    "ordermq_retention_expired_messages": "counter",
    "ordermq_retention_early_deletions": "counter",
    "ordermq_queue_min_offset": "gauge",
    "ordermq_consumer_retention_skipped": "counter",
    "ordermq_exchange_port_connections": "gauge",
    "ordermq_exchange_port_connections_accepted": "counter",
    "ordermq_exchange_port_connections_refused": "counter",
}


def test_the_documented_series_are_exported_with_conventional_names(
    timed_broker: EmbeddedBroker,
) -> None:
    """Counters end in _total, histograms in _seconds, sizes in _bytes."""
    port = metrics_port(timed_broker)
    with Producer(timed_broker.address) as producer:
        producer.send(Message("orders", b"x"))
    run(timed_broker.address, lambda c: join(c, "w1"))
    exported = families(port)
    assert {f.name: f.type for f in exported} == DOCUMENTED
    for family in exported:
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.samples
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
        if "bytes" in family.name:
            assert family.name.endswith("_bytes"), family.name


def test_pop_series_count_receives_acks_expiries_and_dead_letters(
    timed_broker: EmbeddedBroker, clock: FakeClock
) -> None:
    """Five jobs: two acked at once, three expire, one of those acked, two dead-lettered."""
    port = metrics_port(timed_broker)
    with Producer(timed_broker.address) as producer:
        for i in range(5):
            producer.send(Message("jobs", b"job-%d" % i))
    key = (("group", "workers"), ("topic", "jobs"))

    def pop(m: Samples) -> dict[str, float]:
        names = ("received_total", "acked_total", "expired_total", "dead_lettered_total",
                 "in_flight")  # fmt: skip
        return {n: m.get((f"ordermq_pop_messages_{n}", key), -1) for n in names}

    def counts(received: int, acked: int, expired: int, dead: int, held: int) -> dict[str, float]:
        return {"received_total": received, "acked_total": acked, "expired_total": expired,
                "dead_lettered_total": dead, "in_flight": held}  # fmt: skip

    workers = sdk.SimpleConsumer(
        "workers", timed_broker.address, await_duration=0, max_delivery_attempts=2, clock=clock
    )
    workers.subscribe("jobs")
    with workers:
        first = workers.receive(max_messages=16, invisible_duration=10)
        assert len(first) == 5
        for job in first[:2]:
            workers.ack(job)
        assert pop(scrape(port)) == counts(5, 2, 0, 0, 3)

        clock.advance(10)  # the other three's time runs out: visible again
        wait_until(lambda: pop(scrape(port))["expired_total"] == 3, 30, "three expiries")
        again = workers.receive(max_messages=16, invisible_duration=10)
        assert sorted(m.delivery_attempt for m in again) == [2, 2, 2]
        workers.ack(again[0])
        assert pop(scrape(port)) == counts(8, 3, 3, 0, 2)

        clock.advance(10)  # their second and last attempt runs out: dead letters
        wait_until(lambda: pop(scrape(port))["dead_lettered_total"] == 2, 30, "two dead letters")
        m = scrape(port)
    assert pop(m) == counts(8, 3, 5, 2, 0)
    assert m[("ordermq_messages_dead_lettered_total", (("group", "workers"),))] == 2
    assert types(port)["ordermq_pop_messages_in_flight"] == "gauge"
    assert types(port)["ordermq_pop_messages_received"] == "counter"


@contextlib.asynccontextmanager
async def in_process_broker(tmp_path: Path) -> AsyncIterator[tuple[Broker, BrokerState]]:
    """A broker on the test's own loop (its snapshot's pauses are the test's turns)."""
    broker = Broker(BrokerConfig(data_dir=tmp_path, port=0))
    await broker.start()
    try:
        assert broker.state is not None
        yield broker, broker.state
    finally:
        await broker.stop()


async def commit_lag_series(state: BrokerState) -> None:
    """2 500 committed offsets (5 topics of 10 queues, 50 groups): as many lag series."""
    for t in range(5):
        state.store.create_topic(f"topic-{t}", 10)
    await state.offsets.commit(
        {(f"g{g}", f"topic-{t}", q): 0 for g in range(50) for t in range(5) for q in range(10)}
    )


def snapshot_of(broker: Broker) -> asyncio.Future[list[Metric]]:
    """The broker's /metrics snapshot, started as a task on the running loop."""
    return asyncio.ensure_future(BrokerCollector(broker)._snapshot())


def test_a_scrape_of_many_series_gives_the_event_loop_back_between_slices(
    tmp_path: Path,
) -> None:
    """The snapshot runs on the broker's loop: with 2 500 committed offsets (and as many
    lag series) it lets other work run between slices of SERIES_PER_SLICE series, and
    still has every series."""

    async def main() -> tuple[int, list[tuple[dict[str, str], float]]]:
        async with in_process_broker(tmp_path) as (broker, state):
            await commit_lag_series(state)
            snapshot = snapshot_of(broker)
            turns = 0
            while not snapshot.done():
                await asyncio.sleep(0)
                turns += 1
            lag = next(f for f in await snapshot if f.name == "ordermq_consumer_lag")
            return turns, [(s.labels, s.value) for s in lag.samples]

    turns, lag = asyncio.run(main())
    assert turns >= 2500 // SERIES_PER_SLICE
    assert len(lag) == 2500 and all(value == 0 for _, value in lag)


def test_topics_deleted_while_a_scrape_gives_the_loop_back_are_left_out(
    tmp_path: Path,
) -> None:
    """Topics listed before a pause and deleted during it have no series, and the scrape
    does not fail on them."""

    async def main() -> list[str]:
        async with in_process_broker(tmp_path) as (_, state):
            system_topics = {t.name for t in state.store.topics.all()}  # the broker's own
            for t in range(30):
                state.store.create_topic(f"topic-{t:02}", 100)  # a pause every 10 topics
            families, paused = [], 0
            for family in retention_metrics(state):
                if family is not PAUSE:
                    families.append(family)
                    continue
                paused += 1
                if paused == 1:  # after topic-09: two of those listed go meanwhile
                    await state.store.delete_topic("topic-12")
                    await state.store.delete_topic("topic-15")
            assert paused == 2
            oldest = next(f for f in families if f.name == "ordermq_queue_min_offset")
            return sorted({s.labels["topic"] for s in oldest.samples} - system_topics)

    topics = asyncio.run(main())
    assert len(topics) == 28 and "topic-12" not in topics and "topic-15" not in topics


def test_a_scrape_that_gives_the_loop_back_while_the_broker_stops_ends_there(
    tmp_path: Path,
) -> None:
    """The store closes on the way of stop(): a snapshot paused meanwhile reads no more."""

    async def main() -> list[str]:
        async with in_process_broker(tmp_path) as (broker, state):
            state.store.create_topic("t", 4)
            await state.offsets.commit({(f"g{g}", "t", q): 0 for g in range(300) for q in range(4)})
            snapshot = snapshot_of(broker)
            await asyncio.sleep(0)  # the snapshot runs to its first pause (100 groups in)
            stop = asyncio.ensure_future(broker.stop())
            names = [f.name for f in await snapshot]
            await stop
            return names

    names = asyncio.run(main())
    assert "ordermq_ready" in names and "ordermq_consumer_lag" not in names


def test_a_scrape_of_many_series_sets_off_no_garbage_collection(tmp_path: Path) -> None:
    """A scrape makes an object per series and drops them once its text is written; while
    they lived, their allocations set off collections, full ones among them, which walk
    everything the broker holds with every thread of the process stopped (up to 19 ms
    with 1 000 groups). Collections are now held off for the scrape and given back after."""

    async def main() -> tuple[list[int], str]:
        async with in_process_broker(tmp_path) as (broker, state):
            await commit_lag_series(state)
            server = StatusServer(broker, "127.0.0.1", 0)
            started: list[int] = []

            def note(phase: str, info: dict[str, int]) -> None:
                if phase == "start":
                    started.append(info["generation"])

            # Counted from nothing, and past what the test's own request allocates around
            # the scrape's hold (the scrape alone allocates several times this).
            threshold = gc.get_threshold()
            gc.collect()
            gc.set_threshold(2000, *threshold[1:])
            gc.callbacks.append(note)
            try:
                _, _, text = await asyncio.to_thread(get, server.port, "/metrics")
            finally:
                gc.callbacks.remove(note)
                gc.set_threshold(*threshold)
                server.close()
            return started, text

    collections, text = asyncio.run(main())
    assert text.count("ordermq_consumer_lag{") == 2500
    assert collections == []  # each scrape set off a dozen
    assert gc.isenabled()


def test_the_page_is_served_as_the_scraper_asks_openmetrics_gzip_head_and_names(
    timed_broker: EmbeddedBroker,
) -> None:
    """Prometheus asks for OpenMetrics and gzip; HEAD answers the headers only (it was 405);
    name[] keeps the samples of those names."""
    port = metrics_port(timed_broker)
    _, plain_headers, plain = fetch(port, "/metrics")
    assert plain_headers["Content-Type"].startswith("text/plain")
    assert b"# HELP ordermq_ready " in plain

    accept = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
    _, headers, body = fetch(port, "/metrics", Accept=accept, Accept_Encoding="gzip")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(body).decode()
    assert text.endswith("# EOF\n") and text.count("# EOF") == 1
    names = {f.name for f in openmetrics_families(text)}  # it parses
    assert {"ordermq_ready", "ordermq_build_info"} <= names

    status, headers, body = fetch(port, "/metrics", "HEAD")
    assert (status, body) == (200, b"")
    assert int(headers["Content-Length"]) > 0

    _, _, only = fetch(port, "/metrics?name[]=ordermq_ready")
    assert only.decode().splitlines() == [
        "# HELP ordermq_ready 1 when the broker is ready (recovered, the store accepts writes), "
        "else 0",
        "# TYPE ordermq_ready gauge",
        "ordermq_ready 1.0",
    ]


def test_a_page_not_made_in_time_is_given_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scrape that waited its time for a page (a loop too busy to make it) is answered
    with an error, and the page's work on the loop stops there: it went on for nobody, and
    a scraper trying again piled up more of it."""
    monkeypatch.setattr(exposition, "SNAPSHOT_TIMEOUT_SECONDS", 0.2)
    given_up: list[asyncio.Event] = []

    async def endless(page: exposition.MetricsPage, *args: object) -> bytes:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            given_up[0].set()
            raise
        return b""

    monkeypatch.setattr(exposition.MetricsPage, "_page", endless)

    async def main() -> int:
        given_up.append(asyncio.Event())
        async with in_process_broker(tmp_path) as (broker, _):
            server = StatusServer(broker, "127.0.0.1", 0)
            try:
                status, _, _ = await asyncio.to_thread(get, server.port, "/metrics")
                async with asyncio.timeout(5):  # the cancellation reaches the page's turn
                    await given_up[0].wait()
                return status
            finally:
                server.close()

    assert asyncio.run(main()) == 500
