"""Every front of one broker in random sequences: what one front stores, commits or locks,
the others see, and each refuses what the core's rules refuse.

A hypothesis state machine drives one broker (a FakeClock; it moves only when a rule
says so) through ordermq's clients' transport (its Exchange port and gRPC), ordermq's
transport over RocketMQ remoting (`rocketmq://`: SEND_MESSAGE, PULL_MESSAGE,
UPDATE_CONSUMER_OFFSET, LOCK_BATCH_MQ, ...) and RocketMQ 5's v2 gRPC (SendMessage), as
two clients of one orderly group. Each example has a topic of two queues and a group of
its own; the model is what a user of the three would expect:

- a send through any front lands at the queue's next offsets, and every read through any
  front finds each message where its send said, as it was sent (body, tags, keys,
  sharding key or message group, properties), and nothing more;
- a commit is accepted or refused by the rule of mockbroker/offset_commits.py (the
  offset within the queue; with a live lock only its owner, at its epoch over ordermq's
  protocol; a queue ever locked needs the latest epoch from ordermq's clients), and what
  was accepted is what every front's query answers;
- a lock is granted to one client at a time, through either front, until it is unlocked
  or its lease runs out; a grant to a new owner fences the old one's epoch, while the
  owner locking again after its lease ran out (nobody took the queue) keeps it.

The fuzz modules (test_fuzz_*.py) check each front alone against bad input; the parity
modules (test_front_parity_*.py) check single hostile calls. This one checks sequences.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from sdk import Message
from sdk._transport import connect
from sdk._transport.broker_client import BrokerClient
from sdk._transport.codec import MessageIdGenerator
from sdk._transport.protocol import GroupInfo, PullStatus, Transport
from sdk.errors import OrderMQError
from sdk.message import MessageExt, MessageQueue
from sdk.selector import shard_index
from sdk.testing import FakeClock
from tests.fuzzing import machine_settings

T = TypeVar("T")

QUEUES = 2
LEASE = 60.0
CLIENTS = ("client-a", "client-b")
#: The fronts a client speaks through (ordermq's transport over each of its wires).
WIRES = ("ordermq", "remoting")
KEYS = ("k0", "k1", "k2", "k3", "k4")
CALL_SECONDS = 10.0


@dataclass(frozen=True)
class Sent:
    """What a read must give back of a message."""

    body: bytes
    tags: str
    keys: tuple[str, ...]
    key: str
    properties: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, m: MessageExt) -> Sent:
        return cls(m.body, m.tags or "", tuple(m.keys), m.sharding_key or "", _user(m.properties))


#: Messages of one send: body, tags, keys and user properties each.
Batch = list[tuple[bytes, str, list[str], dict[str, str]]]


def sent(batch: Batch, key: str) -> list[Sent]:
    """What reads must give back of `batch`, sent with sharding key (or message group) `key`."""
    return [Sent(body, tags, tuple(keys), key, _user(props)) for body, tags, keys, props in batch]


def _user(properties: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The properties a sender set (each front adds system ones of its own)."""
    return tuple(sorted((k, v) for k, v in properties.items() if k.startswith("p-")))


@dataclass
class Lock:
    """The model of one queue's lock in the example's group (mockbroker/lock_manager.py).

    A lock's entry stays when its lease runs out, until an unlock or another client's
    grant replaces it: its owner locking again renews it at the same epoch.
    """

    owner: str | None = None  # whose entry the table holds, live or not
    live: bool = False
    #: The latest grant to a new owner (a token: the model does not know the broker's
    #: epochs); it outlives the entry...
    grant: int | None = None
    #: ... and, per client, the grant whose epoch it learned (over ordermq's protocol).
    known: dict[str, int] = field(default_factory=dict)

    @property
    def holder(self) -> str | None:
        """The client holding a live lock."""
        return self.owner if self.live else None


class Broker:
    """The broker under test, the loop the clients run on, and their connections."""

    def __init__(self, data_dir: Path) -> None:
        self.clock = FakeClock(start=1_800_000_000.0)
        config = BrokerConfig(
            data_dir=data_dir, v2_port=0, remoting_port=0, namesrv_port=0, exchange_port=0,
            lock_lease_seconds=LEASE, client_timeout_seconds=10.0**9,
            disconnect_grace_seconds=10.0**9,
            # each example has a topic and a group (and so a retry topic) of its own
            max_topics=10**6, client_max_topics=10**6,
        )  # fmt: skip
        self.embedded = EmbeddedBroker(config, clock=self.clock)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.transports: dict[tuple[str, str], Transport] = {}
        self.channel: grpc.Channel | None = None
        self.v2: svc_grpc.MessagingServiceStub | None = None
        self.ids = MessageIdGenerator()
        self.topics = count()

    def start(self) -> None:
        self.embedded.start()
        self._thread.start()
        endpoints = {
            "ordermq": self.embedded.address,
            "remoting": f"rocketmq://{self.embedded.namesrv_address}",
        }
        for wire in WIRES:
            for client in CLIENTS:
                self.transports[wire, client] = connect(endpoints[wire])
        self.channel = grpc.insecure_channel(self.embedded.v2_address)
        self.v2 = svc_grpc.MessagingServiceStub(self.channel)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        """`work` on the clients' loop; its result."""
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(CALL_SECONDS)

    def stop(self) -> None:
        for transport in self.transports.values():
            self.run(transport.close())
        if self.channel is not None:
            self.channel.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()
        self.embedded.stop()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(tmp_path_factory.mktemp("fronts-stateful") / "broker")
    b.start()
    try:
        yield b
    finally:
        b.stop()


bodies = st.binary(min_size=1, max_size=40)
tag_names = st.sampled_from(("TagA", "TagB"))
key_lists = st.lists(st.sampled_from(("order-1", "order-2", "order-3")), max_size=2, unique=True)
user_properties = st.dictionaries(
    st.sampled_from(("p-a", "p-b")), st.text("xyz019", min_size=1, max_size=6), max_size=2
)
messages_to_send = st.lists(
    st.tuples(bodies, tag_names, key_lists, user_properties), min_size=1, max_size=3
)


class FrontsMachine(RuleBasedStateMachine):
    """One example: its own topic and group on the module's broker (see the docstring)."""

    b: Broker

    def __init__(self) -> None:
        super().__init__()
        n = next(self.b.topics)
        self.topic, self.group = f"fronts-{n}", f"fronts-group-{n}"
        self.queues: list[list[Sent]] = [[] for _ in range(QUEUES)]
        self.committed: list[int | None] = [None] * QUEUES
        self.locks = [Lock() for _ in range(QUEUES)]
        self.grants = count(1)
        #: The epoch each client last learned for each queue (ordermq's lock answers).
        self.epochs: dict[tuple[str, int], int] = {}

    @initialize()
    def create(self) -> None:
        async def setup() -> None:
            admin = BrokerClient(self.b.embedded.address)
            try:
                await admin.create_topic(self.topic, QUEUES)
            finally:
                await admin.close()
            info = GroupInfo(self.group, "CONSUME_ORDERLY", subscriptions=((self.topic, "*"),))
            for (_, client), transport in self.b.transports.items():
                await transport.writable_queues(self.topic)
                await transport.readable_queues(self.topic)
                await transport.heartbeat(client, [info])

        self.b.run(setup())

    def mq(self, queue_id: int) -> MessageQueue:
        return MessageQueue(self.topic, "broker-a", queue_id)

    def transport(self, wire: str, client: str = CLIENTS[0]) -> Transport:
        return self.b.transports[wire, client]

    # ------------------------------------------------------------------ sending
    @rule(
        wire=st.sampled_from(WIRES),
        queue_id=st.integers(0, QUEUES - 1),
        key=st.sampled_from(KEYS),
        batch=messages_to_send,
    )
    def send(
        self,
        wire: str,
        queue_id: int,
        key: str,
        batch: Batch,
    ) -> None:
        transport = self.transport(wire)
        messages = [
            Message(self.topic, body, tags=tags, keys=keys, properties=props, sharding_key=key)
            for body, tags, keys, props in batch
        ]
        now = time.time()
        prepared = [transport.prepare(m, self.b.ids.next(), now) for m in messages]
        appended = self.b.run(transport.send(self.mq(queue_id), prepared))
        stored = self.queues[queue_id]
        assert (appended.first_offset, appended.count) == (len(stored), len(batch)), (
            f"{wire} send to queue {queue_id}: {appended}, the queue held {len(stored)}"
        )
        stored += sent(batch, key)

    @rule(key=st.sampled_from(KEYS), batch=messages_to_send)
    def send_v2(self, key: str, batch: Batch) -> None:
        """RocketMQ 5's FIFO send: the broker picks the queue by the message group."""
        request = svc.SendMessageRequest()
        for body, tags, keys, props in batch:
            sp = v2.SystemProperties(
                message_id=self.b.ids.next().hex().upper(), born_host="10.0.0.9",
                body_encoding=v2.IDENTITY, message_type=v2.FIFO, message_group=key,
                tag=tags, keys=keys,
            )  # fmt: skip
            sp.born_timestamp.FromMilliseconds(int(time.time() * 1000))
            request.messages.add(
                topic=v2.Resource(name=self.topic), system_properties=sp, body=body,
                user_properties=props,
            )  # fmt: skip
        assert self.b.v2 is not None
        answer = self.b.v2.SendMessage(request, timeout=CALL_SECONDS,
                                       metadata=(("x-mq-client-id", "v2-producer"),))  # fmt: skip
        assert answer.status.code == v2.OK, answer
        queue_id = shard_index(key, QUEUES)
        stored = self.queues[queue_id]
        assert [e.offset for e in answer.entries] == list(
            range(len(stored), len(stored) + len(batch))
        ), f"v2 send of group {key!r} (queue {queue_id}): {answer}; the queue held {len(stored)}"
        stored += sent(batch, key)

    # ------------------------------------------------------------------ reading
    @rule(wire=st.sampled_from(WIRES), queue_id=st.integers(0, QUEUES - 1), data=st.data())
    def read(self, wire: str, queue_id: int, data: st.DataObject) -> None:
        stored = self.queues[queue_id]
        offset = data.draw(st.integers(0, len(stored)), label="offset")
        most = data.draw(st.integers(1, 4), label="max_messages")
        got = self.b.run(
            self.transport(wire).pull(self.group, self.mq(queue_id), offset, max_messages=most)
        )
        want = stored[offset : offset + most]
        what = f"{wire} pull of queue {queue_id} at {offset} (of {len(stored)})"
        if not want:
            assert got.status is PullStatus.NO_NEW_MESSAGE and not got.messages, f"{what}: {got}"
            return
        assert got.status is PullStatus.FOUND, f"{what}: {got}"
        assert [m.queue_offset for m in got.messages] == list(
            range(offset, offset + len(got.messages))
        ), what
        # A pull may stop short of `most` (it gives what one read found), never at nothing.
        assert got.messages and len(got.messages) <= most, f"{what}: {len(got.messages)}"
        assert [Sent.of(m) for m in got.messages] == want[: len(got.messages)], what
        assert got.next_offset == offset + len(got.messages), what
        assert got.max_offset == len(stored), f"{what}: max offset {got.max_offset}"

    @rule(wire=st.sampled_from(WIRES), queue_id=st.integers(0, QUEUES - 1))
    def offsets(self, wire: str, queue_id: int) -> None:
        lowest, end, _ = self.b.run(self.transport(wire).queue_offsets(self.mq(queue_id)))
        assert (lowest, end) == (0, len(self.queues[queue_id])), f"{wire}: queue {queue_id}"

    # ------------------------------------------------------------------ locks
    @rule(
        wire=st.sampled_from(WIRES),
        client=st.sampled_from(CLIENTS),
        queue_id=st.integers(0, QUEUES - 1),
    )
    def lock(self, wire: str, client: str, queue_id: int) -> None:
        mq = self.mq(queue_id)
        result = self.b.run(self.transport(wire, client).lock_batch(self.group, client, [mq]))
        model = self.locks[queue_id]
        granted = model.holder in (None, client)
        assert (mq in result.locked) == granted, (
            f"{client} locking queue {queue_id} over {wire}: {result}; held by {model.holder}"
        )
        if not granted:
            return
        if model.owner != client:  # a grant to a new owner: a new epoch
            model.owner, model.grant = client, next(self.grants)
        model.live = True
        if wire == "ordermq":
            assert result.locked[mq] > 0, "ordermq's protocol gives the lock's epoch"
            model.known[client] = model.grant  # type: ignore[assignment]
            self.epochs[client, queue_id] = result.locked[mq]

    @rule(
        wire=st.sampled_from(WIRES),
        client=st.sampled_from(CLIENTS),
        queue_id=st.integers(0, QUEUES - 1),
    )
    def unlock(self, wire: str, client: str, queue_id: int) -> None:
        mq = self.mq(queue_id)
        result = self.b.run(self.transport(wire, client).unlock_batch(self.group, client, [mq]))
        model = self.locks[queue_id]
        # RocketMQ's UNLOCK_BATCH_MQ does not say which queues others hold.
        other = model.holder not in (None, client) and wire == "ordermq"
        assert (mq in result.not_held) == other, (
            f"{client} unlocking queue {queue_id} over {wire}: {result}; held by {model.holder}"
        )
        if model.owner == client or not model.live:  # its own, or one that ran out
            model.owner, model.live = None, False

    @rule()
    def leases_run_out(self) -> None:
        self.b.clock.advance(LEASE + 1)
        for model in self.locks:
            model.live = False

        async def touch() -> None:
            # The remoting front and name server close a connection idle for 120 s of
            # their clock (RocketMQ's rule): each advance is followed by traffic on each.
            for (wire, _), transport in self.b.transports.items():
                if wire == "remoting":
                    await transport.readable_queues(self.topic, refresh=True)
                    await transport.queue_offsets(self.mq(0))

        self.b.run(touch())

    # ------------------------------------------------------------------ offsets
    @rule(
        wire=st.sampled_from(WIRES),
        client=st.sampled_from(CLIENTS),
        queue_id=st.integers(0, QUEUES - 1),
        data=st.data(),
    )
    def commit(self, wire: str, client: str, queue_id: int, data: st.DataObject) -> None:
        end = len(self.queues[queue_id])
        offset = data.draw(st.integers(0, end + 2), label="offset")
        epoch = self.epochs.get((client, queue_id), 0) if wire == "ordermq" else 0
        try:
            self.b.run(
                self.transport(wire, client).commit_offsets(
                    self.group, client, [(self.mq(queue_id), offset, epoch)]
                )
            )
            accepted = True
        except OrderMQError:
            accepted = False
        expected = offset <= end and self._may_commit(wire, client, queue_id)
        model = self.locks[queue_id]
        assert accepted == expected, (
            f"{client} committing {offset} of queue {queue_id} (end {end}) over {wire} at "
            f"epoch {epoch}: {'accepted' if accepted else 'refused'}; lock held by "
            f"{model.holder} at grant {model.grant}, {client} knows grant "
            f"{model.known.get(client)}"
        )
        if accepted:
            self.committed[queue_id] = offset

    def _may_commit(self, wire: str, client: str, queue_id: int) -> bool:
        model = self.locks[queue_id]
        if wire == "remoting":  # no epoch, no client named: the connection's clients
            return model.holder in (None, client)
        known = model.known.get(client)
        if model.holder is not None:
            return model.holder == client and known == model.grant
        if model.grant is None:  # never locked in the group: a concurrent consumer's
            return known is None
        return known == model.grant  # its last owner finishing up

    @rule(wire=st.sampled_from(WIRES), queue_id=st.integers(0, QUEUES - 1))
    def query(self, wire: str, queue_id: int) -> None:
        got = self.b.run(self.transport(wire).query_offset(self.group, self.mq(queue_id)))
        want = self.committed[queue_id]
        if want is None and wire == "remoting":
            want = 0  # RocketMQ's rule: the queue still holds its first message, read it all
        assert got == want, f"{wire}: queue {queue_id}"

    @invariant()
    def stored_as_sent(self) -> None:
        """The broker's queues end where the sends the model accepted put them."""
        state = self.b.embedded.broker.state
        assert state is not None
        topic = state.store.topics.find(self.topic)
        if topic is None:  # before `create`
            return
        ends = [state.store.end_offset(topic, q) for q in range(QUEUES)]
        assert ends == [len(q) for q in self.queues], "the store's queue ends"


FrontsMachine.TestCase.settings = machine_settings(12, 200, steps=(25, 60))


def test_fronts_agree_in_every_sequence(broker: Broker) -> None:
    FrontsMachine.b = broker
    FrontsMachine.TestCase().runTest()
