"""ordermq's clients over `rocketmq://` against a cluster: a name server, two brokers.

A topic of 8 queues on each broker is one topic of 16 queues to the clients: keyed sends
land by the sharding formula over the queues sorted by (broker name, queue id), orderly
consumers read every message in per-key order, and locks, offsets and pulls go to each
queue's own broker (issue 39, slice 2).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.namesrv import EmbeddedNameServer
from mockbroker.namesrv.registration import TopicQueues, register_request, unregister_request
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    MessageQueue,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
    shard_index,
)
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.connection import RemotingConnection
from sdk._transport import connect
from sdk._transport.protocol import GroupInfo
from sdk.errors import BrokerUnavailableError
from tests.component.admin_cli import run
from tests.support import pinned, wait_until

TOPIC = "orders"
GROUP = "billing"
BROKERS = ("broker-a", "broker-b")
#: Every queue of the topic as the clients must see it: sorted by (broker name, queue id).
QUEUES = [(name, q) for name in BROKERS for q in range(8)]
#: Short intervals, so that a test's rebalances and commits come within seconds.
FAST = PushConsumerConfig(
    rebalance_interval=0.5, persist_interval=0.2, heartbeat_interval=0.5, pull_suspend=0.5,
    lock_renew_interval=0.5, lock_lease=3.0, pull_error_backoff=0.2,
)  # fmt: skip
#: Sends that give up within seconds when a broker is down.
QUICK_SENDS = ProducerConfig(send_timeout=2.0, retry_times=2, retry_backoff=0.05)


def member(tmp_path: Path, name: str, name_server: str, **extra: Any) -> EmbeddedBroker:
    """A broker named `name` registering with `name_server`, its data under tmp_path."""
    return EmbeddedBroker(BrokerConfig(
        data_dir=tmp_path / name, broker_name=name, remoting_port=0, namesrv_addr=name_server,
        register_seconds=0.5, **extra,
    ))  # fmt: skip


class Cluster:
    """A name server and brokers with the topic on each; `endpoint` for the clients."""

    def __init__(self, name_server: EmbeddedNameServer, brokers: dict[str, EmbeddedBroker]):
        self.name_server = name_server
        self.brokers = brokers
        self.endpoint = f"rocketmq://{name_server.address}"

    def committed(self, name: str) -> dict[int, int]:
        """Queue id -> the offset GROUP committed on broker `name`."""
        state = self.brokers[name].broker.state
        assert state is not None
        out = {}
        for q in range(8):
            offset = state.offsets.get(GROUP, TOPIC, q)
            if offset is not None:
                out[q] = offset
        return out

    def end_offsets(self, name: str) -> dict[int, int]:
        """Queue id -> the end offset of the topic's queue on broker `name`."""
        state = self.brokers[name].broker.state
        assert state is not None
        topic = state.store.topics.get(TOPIC)
        return {q: state.store.end_offset(topic, q) for q in range(8)}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ExitStack() as stack:
        ns = stack.enter_context(EmbeddedNameServer())
        brokers = {
            name: stack.enter_context(member(tmp_path, name, ns.address)) for name in BROKERS
        }
        for broker in brokers.values():
            result = run(broker, "topics", "create", TOPIC, "--queues", "8")
            assert result.exit_code == 0, result.output
        cluster = Cluster(ns, brokers)
        # A broker registers a new topic with the name server after answering its creation:
        # until both have, a client's route has one broker's queues.
        wait_until(lambda: len(_route_queues(cluster.endpoint)) == 16,
                   what="both brokers' queues in the route")  # fmt: skip
        yield cluster


class Recorder(MessageListenerOrderly):
    """Keeps what it consumed, per key, and where each came from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_key: dict[str, list[int]] = {}
        self.queues: dict[str, set[tuple[str, int]]] = {}
        self.keyless = 0

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        """Record each message's sequence number under its key."""
        with self.lock:
            for m in msgs:
                if m.sharding_key is None:
                    self.keyless += 1
                    continue
                key = m.sharding_key
                self.by_key.setdefault(key, []).append(int(m.body))
                self.queues.setdefault(key, set()).add((m.queue.broker_name, m.queue.queue_id))
        return ConsumeOrderlyStatus.SUCCESS

    def count(self) -> int:
        """How many messages were consumed."""
        with self.lock:
            return sum(len(v) for v in self.by_key.values())


KEYS = [f"key-{i}" for i in range(40)]


def test_keyed_sends_spread_by_the_formula_over_both_brokers_and_are_consumed_in_order(
    cluster: Cluster,
) -> None:
    sent: dict[str, tuple[str, int]] = {}
    with Producer(cluster.endpoint) as producer:
        for seq in range(5):
            for key in KEYS:
                result = producer.send(Message(TOPIC, str(seq).encode(), sharding_key=key))
                where = (result.queue.broker_name, result.queue.queue_id)
                assert sent.setdefault(key, where) == where, f"{key} moved queue"
    for key, where in sent.items():
        assert where == QUEUES[shard_index(key, 16)], key
    assert {name for name, _ in sent.values()} == set(BROKERS), "both brokers got keys"
    for name in BROKERS:
        expected = {q: 0 for q in range(8)}
        for broker, q in sent.values():
            if broker == name:
                expected[q] += 5
        assert cluster.end_offsets(name) == expected, name

    recorder = Recorder()
    consumer = PushConsumer(
        GROUP, cluster.endpoint, consume_from_where=ConsumeFromWhere.FIRST_OFFSET, config=FAST
    )
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(recorder)
    consumer.start()
    try:
        wait_until(lambda: recorder.count() == 5 * len(KEYS), 30, "every message consumed")
        with recorder.lock:
            for key in KEYS:
                assert recorder.by_key[key] == list(range(5)), key
                assert recorder.queues[key] == {sent[key]}, key
        for name in BROKERS:  # each queue's offset committed on its own broker
            ends = {q: end for q, end in cluster.end_offsets(name).items() if end}
            wait_until(
                lambda name=name, ends=ends: {
                    q: o for q, o in cluster.committed(name).items() if q in ends
                } == ends, 15, f"the offsets committed on {name}",
            )  # fmt: skip
            state = cluster.brokers[name].broker.state
            assert state is not None
            locked = state.locks.locks(GROUP)
            assert locked, f"no lock held on {name}"
    finally:
        consumer.shutdown()


def _route_queues(endpoint: str) -> list[MessageQueue]:
    """The topic's writable queues as a fresh remoting client sees them."""

    async def main() -> list[MessageQueue]:
        transport = connect(endpoint)
        try:
            return await transport.writable_queues(TOPIC)
        finally:
            await transport.close()

    return asyncio.run(main())


def assert_in_order(seen: list[int], key: str) -> None:
    """A key's messages from the first, each after the one before it or a redelivery.

    At least once: a queue taken back starts again from its last committed offset.
    """
    assert seen[:1] == [0], f"{key}: {seen}"
    for before, after in itertools.pairwise(seen):
        assert after == before + 1 or after <= before, f"{key}: {seen}"


def keys_on(name: str, count: int = 4) -> list[str]:
    """`count` sharding keys whose queue, of the topic's 16, is on broker `name`."""
    found = [k for k in (f"k{i}" for i in range(1000)) if QUEUES[shard_index(k, 16)][0] == name]
    return found[:count]


def still_routed(name_server: str, broker_name: str, address: str) -> None:
    """Register `broker_name` at `address` with `name_server` again, as if it had crashed
    (killed: no UNREGISTER_BROKER, its routes kept until they expire)."""
    request = register_request(
        cluster="DefaultCluster", broker_name=broker_name, address=address, data_version=(1, 1),
        topics={TOPIC: TopicQueues(8, 8), "TBW102": TopicQueues(8, 8)},
    )  # fmt: skip

    tell(name_server, request)


def registered(name_server: str) -> set[str]:
    """The broker names `name_server` has registered (GET_BROKER_CLUSTER_INFO)."""

    async def main() -> bytes:
        connection = await RemotingConnection.open(name_server)
        try:
            answer = await connection.request(
                RemotingCommand(RequestCode.GET_BROKER_CLUSTER_INFO), 5.0
            )
        finally:
            await connection.close()
        assert answer.code == ResponseCode.SUCCESS, answer.remark
        return answer.body

    # fastjson writes integer map keys unquoted, as the name server does.
    text = re.sub(r"([{,])\s*(-?\d+)\s*:", r'\1"\2":', asyncio.run(main()).decode())
    return set(json.loads(text)["brokerAddrTable"])


def tell(name_server: str, request: RemotingCommand) -> None:
    """Send `request` to `name_server`, which must answer SUCCESS."""

    async def main() -> None:
        connection = await RemotingConnection.open(name_server)
        try:
            answer = await connection.request(request, 5.0)
        finally:
            await connection.close()
        assert answer.code == ResponseCode.SUCCESS, answer.remark

    asyncio.run(main())


@pytest.mark.parametrize("how", ["stopped", "crashed"])
def test_a_broker_down_fails_its_keyed_sends_clearly_while_the_other_goes_on(
    tmp_path: Path, how: str
) -> None:
    on_a, on_b = keys_on("broker-a"), keys_on("broker-b")
    recorder = Recorder()
    with ExitStack() as stack:
        ns = stack.enter_context(EmbeddedNameServer())
        b_config = BrokerConfig(
            data_dir=tmp_path / "broker-b", broker_name="broker-b", port=0,
            remoting_port=0, namesrv_addr=ns.address, register_seconds=0.5,
        )  # fmt: skip
        a = stack.enter_context(member(tmp_path, "broker-a", ns.address))
        b = EmbeddedBroker(b_config)
        b.start()
        b_config = pinned(b_config, b)
        stack.callback(lambda: b.stop())
        for broker in (a, b):
            assert run(broker, "topics", "create", TOPIC, "--queues", "8").exit_code == 0
        endpoint = f"rocketmq://{ns.address}"
        wait_until(lambda: len(_route_queues(endpoint)) == 16, what="both brokers routed")
        producer = stack.enter_context(Producer(endpoint, config=QUICK_SENDS))
        consumer = PushConsumer(
            GROUP, endpoint, consume_from_where=ConsumeFromWhere.FIRST_OFFSET, config=FAST
        )
        consumer.subscribe(TOPIC)
        consumer.register_message_listener(recorder)
        consumer.start()
        stack.callback(consumer.shutdown)
        sequence = dict.fromkeys(on_a + on_b, 0)

        def send_keyed(keys: list[str]) -> None:
            for key in keys:
                result = producer.send(Message(TOPIC, str(sequence[key]).encode(),
                                               sharding_key=key))  # fmt: skip
                assert (result.queue.broker_name, result.queue.queue_id) == QUEUES[
                    shard_index(key, 16)
                ], key
                sequence[key] += 1

        def consumed_all() -> bool:
            with recorder.lock:
                return all(
                    set(recorder.by_key.get(k, [])) == set(range(n)) for k, n in sequence.items()
                )

        send_keyed(on_a + on_b)
        wait_until(consumed_all, 30, "the first messages consumed")

        b.stop()  # unregisters: the name server's routes lose broker-b's queues at once
        if how == "crashed":  # ... unless it died: then they stay until they expire
            still_routed(ns.address, "broker-b", f"127.0.0.1:{b_config.remoting_port}")
        for _ in range(10):  # keyless: broker-a takes them
            result = producer.send(Message(TOPIC, b"keyless"))
            assert result.queue.broker_name == "broker-a"
        for key in on_b:  # keyed: they keep their queue, and fail naming its broker
            with pytest.raises(BrokerUnavailableError, match="broker-b"):
                producer.send(Message(TOPIC, b"lost", sharding_key=key))
        for _ in range(3):  # broker-a's keys go on being sent and consumed meanwhile
            send_keyed(on_a)
        wait_until(consumed_all, 30, "broker-a's queues consumed while broker-b is down")

        b = EmbeddedBroker(b_config)  # the same data and ports
        b.start()
        wait_until(lambda: len(_route_queues(endpoint)) == 16, what="broker-b routed again")
        send_keyed(on_b)  # may need a route refresh: retried within the send
        send_keyed(on_a + on_b)
        wait_until(consumed_all, 30, "broker-b's queues taken back")
        with recorder.lock:
            for key in sequence:
                assert_in_order(recorder.by_key[key], key)


def test_routes_of_name_servers_with_different_views_are_merged(tmp_path: Path) -> None:
    with ExitStack() as stack:
        knows_a = stack.enter_context(EmbeddedNameServer())
        knows_b = stack.enter_context(EmbeddedNameServer())
        brokers = {
            "broker-a": stack.enter_context(member(tmp_path, "broker-a", knows_a.address)),
            "broker-b": stack.enter_context(member(tmp_path, "broker-b", knows_b.address)),
        }
        for broker in brokers.values():
            assert run(broker, "topics", "create", TOPIC, "--queues", "8").exit_code == 0
        for endpoint in (
            f"rocketmq://{knows_a.address};{knows_b.address}",
            f"rocketmq://{knows_b.address};{knows_a.address}",
        ):
            wait_until(
                lambda endpoint=endpoint: [
                    (q.broker_name, q.queue_id) for q in _route_queues(endpoint)
                ] == QUEUES, what=f"all 16 queues through {endpoint}",
            )  # fmt: skip
        endpoint = f"rocketmq://{knows_a.address};{knows_b.address}"
        keys = keys_on("broker-a", 2) + keys_on("broker-b", 2)
        with Producer(endpoint) as producer:
            for key in keys:
                result = producer.send(Message(TOPIC, b"0", sharding_key=key))
                assert (result.queue.broker_name, result.queue.queue_id) == QUEUES[
                    shard_index(key, 16)
                ], key
        recorder = Recorder()
        consumer = PushConsumer(
            GROUP, endpoint, consume_from_where=ConsumeFromWhere.FIRST_OFFSET, config=FAST
        )
        consumer.subscribe(TOPIC)
        consumer.register_message_listener(recorder)
        consumer.start()
        stack.callback(consumer.shutdown)
        wait_until(lambda: recorder.count() == len(keys), 30, "every message consumed")


def test_a_dead_broker_does_not_keep_heartbeats_from_the_others(cluster: Cluster) -> None:
    # broker-0, dead, routed before the others; its address sorts first too.
    still_routed(cluster.name_server.address, "broker-0", "127.0.0.1:1")

    async def main() -> None:
        transport = connect(cluster.endpoint)
        try:
            assert len(await transport.readable_queues(TOPIC)) == 24
            groups = [GroupInfo(GROUP, "CONSUME_ORDERLY", subscriptions=((TOPIC, "*"),))]
            with pytest.raises(BrokerUnavailableError, match="broker-0"):
                await transport.heartbeat("client-1", groups)
        finally:
            await transport.close()

    asyncio.run(main())
    for name in BROKERS:
        state = cluster.brokers[name].broker.state
        assert state is not None
        assert state.groups.members(GROUP) == ["client-1"], name


def test_a_broker_keeps_its_queues_while_unregistered_and_loses_them_with_the_topic(
    tmp_path: Path,
) -> None:
    """A stopping broker unregisters while its port still answers; one restarting answers
    before it registers: neither moves keys. A registered broker without the topic does."""
    with ExitStack() as stack:
        ns = stack.enter_context(EmbeddedNameServer())
        brokers = {  # registering at changes only (and every 30 s)
            name: stack.enter_context(EmbeddedBroker(BrokerConfig(
                data_dir=tmp_path / name, broker_name=name, remoting_port=0,
                namesrv_addr=ns.address,
            ))) for name in BROKERS
        }  # fmt: skip
        for broker in brokers.values():
            assert run(broker, "topics", "create", TOPIC, "--queues", "8").exit_code == 0
        endpoint = f"rocketmq://{ns.address}"
        wait_until(lambda: len(_route_queues(endpoint)) == 16, what="both brokers routed")
        b = brokers["broker-b"]
        assert b.remoting_address is not None

        def delete_on_b() -> None:
            assert run(b, "topics", "delete", TOPIC, "--yes").exit_code == 0
            # The route had 8 queues since the unregistration already: what the deletion
            # changes is that b registers again (at the change), without the topic.
            wait_until(lambda: "broker-b" in registered(ns.address), what="b registered")
            assert len(_route_queues(endpoint)) == 8

        async def main() -> None:
            transport = connect(endpoint)
            try:
                assert len(await transport.writable_queues(TOPIC)) == 16
                await asyncio.to_thread(tell, ns.address, unregister_request(
                    cluster="DefaultCluster", broker_name="broker-b", address=b.remoting_address,
                ))  # fmt: skip
                assert len(await asyncio.to_thread(_route_queues, endpoint)) == 8, "dropped"
                for _ in range(2):
                    queues = await transport.writable_queues(TOPIC, refresh=True)
                    assert [(q.broker_name, q.queue_id) for q in queues] == QUEUES
                    assert len(await transport.readable_queues(TOPIC, refresh=True)) == 16
                await asyncio.to_thread(delete_on_b)  # b registers again, without the topic
                queues = await transport.writable_queues(TOPIC, refresh=True)
                assert {q.broker_name for q in queues} == {"broker-a"}
            finally:
                await transport.close()

        asyncio.run(main())


def test_a_restarted_broker_knows_the_client_before_its_first_request(tmp_path: Path) -> None:
    """After a broker restarts, the client's first request on the new connection (here an
    offset commit, on a queue whose lock the broker restored) is not refused for want of
    a heartbeat: the transport heartbeats first on every new broker connection."""
    with EmbeddedNameServer() as ns:
        config = BrokerConfig(
            data_dir=tmp_path / "broker-b", broker_name="broker-b", port=0,
            remoting_port=0, namesrv_addr=ns.address,
        )  # fmt: skip
        endpoint = f"rocketmq://{ns.address}"
        queue = MessageQueue(TOPIC, "broker-b", 0)
        groups = [GroupInfo(GROUP, "CONSUME_ORDERLY", subscriptions=((TOPIC, "*"),))]
        with EmbeddedBroker(config) as b:
            config = pinned(config, b)  # its restarts keep the ports
            assert run(b, "topics", "create", TOPIC, "--queues", "8").exit_code == 0
            with Producer(endpoint) as producer:
                for _ in range(3):
                    producer.send(Message(TOPIC, b"x"), selector=lambda qs, m, a: qs[0])

        async def main() -> None:
            transport = connect(endpoint)
            try:
                assert queue in await transport.readable_queues(TOPIC)
                await transport.heartbeat("client-1", groups)
                assert (await transport.lock_batch(GROUP, "client-1", [queue])).locked
                await transport.commit_offsets(GROUP, "client-1", [(queue, 1, 0)])
                await asyncio.to_thread(restart)
                await transport.commit_offsets(GROUP, "client-1", [(queue, 2, 0)])
                assert await transport.query_offset(GROUP, queue) == 2
            finally:
                await transport.close()

        brokers: list[EmbeddedBroker] = []

        def restart() -> None:
            brokers[0].stop()
            brokers[0] = EmbeddedBroker(config)
            brokers[0].start()

        brokers.append(EmbeddedBroker(config))
        brokers[0].start()
        try:
            asyncio.run(main())
        finally:
            brokers[0].stop()


def test_the_group_members_come_from_a_live_broker_when_the_first_is_dead(
    cluster: Cluster,
) -> None:
    still_routed(cluster.name_server.address, "broker-0", "127.0.0.1:1")  # dead, sorted first

    async def main() -> list[str]:
        transport = connect(cluster.endpoint)
        try:
            assert len(await transport.readable_queues(TOPIC)) == 24
            groups = [GroupInfo(GROUP, "CONSUME_ORDERLY", subscriptions=((TOPIC, "*"),))]
            with pytest.raises(BrokerUnavailableError):
                await transport.heartbeat("client-1", groups)
            return await transport.consumer_list(GROUP, TOPIC)
        finally:
            await transport.close()

    assert asyncio.run(main()) == ["client-1"]


def test_the_group_members_are_every_broker_s_when_one_knows_only_some(
    cluster: Cluster,
) -> None:
    """A broker just restarted knows only the members that heartbeated to it since. Asked
    alone, it shrank the group: consumers re-spread the queues over fewer members and moved
    some between them, although the group had not changed (found by the cluster system
    test, tests/system/test_cluster.py). The members are those any broker knows."""
    groups = [GroupInfo(GROUP, "CONSUME_ORDERLY", subscriptions=((TOPIC, "*"),))]
    broker_a = cluster.brokers["broker-a"]
    address = broker_a.remoting_address
    assert address is not None
    forget = RemotingCommand(
        code=RequestCode.UNREGISTER_CLIENT,
        ext_fields={"clientID": "client-2", "consumerGroup": GROUP},
    )

    async def main() -> list[str]:
        one, two = connect(cluster.endpoint), connect(cluster.endpoint)
        try:
            for transport, client in ((one, "client-1"), (two, "client-2")):
                assert len(await transport.readable_queues(TOPIC)) == 16
                await transport.heartbeat(client, groups)
            await asyncio.to_thread(tell, address, forget)
            return await one.consumer_list(GROUP, TOPIC)
        finally:
            await one.close()
            await two.close()

    assert asyncio.run(main()) == ["client-1", "client-2"]
    state = broker_a.broker.state
    assert state is not None
    assert state.groups.members(GROUP) == ["client-1"], "broker-a knew only one member"


def test_a_stopped_name_server_changes_nothing_while_another_answers(tmp_path: Path) -> None:
    with ExitStack() as stack:
        first = EmbeddedNameServer()
        first.start()
        stack.callback(first.stop)
        second = stack.enter_context(EmbeddedNameServer())
        both = f"{first.address};{second.address}"
        brokers = [stack.enter_context(member(tmp_path, name, both)) for name in BROKERS]
        for broker in brokers:
            assert run(broker, "topics", "create", TOPIC, "--queues", "8").exit_code == 0
        endpoint = f"rocketmq://{both}"
        wait_until(lambda: len(_route_queues(endpoint)) == 16, what="both brokers routed")
        first.stop()

        async def main() -> None:
            transport = connect(endpoint)
            try:
                for _ in range(2):
                    queues = await transport.writable_queues(TOPIC, refresh=True)
                    assert [(q.broker_name, q.queue_id) for q in queues] == QUEUES
            finally:
                await transport.close()

        asyncio.run(main())
        keys = keys_on("broker-a", 2) + keys_on("broker-b", 2)
        with Producer(endpoint) as producer:
            for key in keys:
                result = producer.send(Message(TOPIC, b"0", sharding_key=key))
                assert (result.queue.broker_name, result.queue.queue_id) == QUEUES[
                    shard_index(key, 16)
                ], key


def test_keyless_sends_pass_over_a_broker_that_just_failed(cluster: Cluster) -> None:
    cluster.brokers["broker-b"].stop()
    still_routed(cluster.name_server.address, "broker-b", "127.0.0.1:1")  # crashed: routed
    attempts: list[str] = []
    with Producer(cluster.endpoint, config=QUICK_SENDS) as producer:
        transport = producer._core._transport
        send = transport.send

        async def counted(queue: MessageQueue, *args: Any, **kwargs: Any) -> Any:
            attempts.append(queue.broker_name)
            return await send(queue, *args, **kwargs)

        transport.send = counted  # type: ignore[method-assign]
        for _ in range(16):
            assert producer.send(Message(TOPIC, b"x")).queue.broker_name == "broker-a"
    assert attempts.count("broker-b") == 1, attempts


def test_a_topic_whose_only_broker_left_keeps_its_queues(tmp_path: Path) -> None:
    """Not borrowed from the default topic's brokers, which would move every key."""
    with ExitStack() as stack:
        ns = stack.enter_context(EmbeddedNameServer())
        brokers = {  # registering at changes only (and every 30 s)
            name: stack.enter_context(EmbeddedBroker(BrokerConfig(
                data_dir=tmp_path / name, broker_name=name, remoting_port=0,
                namesrv_addr=ns.address,
            ))) for name in BROKERS
        }  # fmt: skip
        b = brokers["broker-b"]
        assert run(b, "topics", "create", TOPIC, "--queues", "8").exit_code == 0
        endpoint = f"rocketmq://{ns.address}"
        wait_until(lambda: len(_route_queues(endpoint)) == 8, what="broker-b routed")
        assert b.remoting_address is not None

        async def main() -> None:
            transport = connect(endpoint)
            try:
                before = await transport.writable_queues(TOPIC)
                assert {q.broker_name for q in before} == {"broker-b"}
                await asyncio.to_thread(tell, ns.address, unregister_request(
                    cluster="DefaultCluster", broker_name="broker-b", address=b.remoting_address,
                ))  # fmt: skip
                assert await transport.writable_queues(TOPIC, refresh=True) == before
                assert await transport.readable_queues(TOPIC, refresh=True) == before
            finally:
                await transport.close()

        asyncio.run(main())
