"""Every front of one broker in random sequences: what one front stores, commits or locks,
the others see, and each refuses what the core's rules refuse.

A hypothesis state machine drives one broker (a FakeClock; it moves only when a rule
says so) through ordermq's clients' transport (its Exchange port and gRPC), ordermq's
transport over RocketMQ remoting (`rocketmq://`: SEND_MESSAGE, PULL_MESSAGE,
UPDATE_CONSUMER_OFFSET, LOCK_BATCH_MQ, ...) and RocketMQ 5's v2 gRPC (SendMessage;
ReceiveMessage, AckMessage and ChangeInvisibleDuration), as two clients of one orderly
group and two SimpleConsumers' groups, one FIFO, and restarts it. Each example has a topic
of two queues and groups of its own (the FIFO group is FIFO only if the broker's
configuration names it at start: one fixed group, kept apart by the example's topic); the
model is what a user of the three would expect:

- a send through any front lands at the queue's next offsets, and every read through any
  front finds each message where its send said, as it was sent (body, tags, keys,
  sharding key or message group, properties), and nothing more;
- a commit is accepted or refused by the rule of mockbroker/offset_commits.py (the
  offset within the queue; with a live lock only its owner, at its epoch over ordermq's
  protocol; a queue ever locked needs the latest epoch from ordermq's clients), and what
  was accepted is what every front's query answers;
- a lock is granted to one client at a time, through either front, until it is unlocked
  or its lease runs out; a grant to a new owner fences the old one's epoch, while the
  owner locking again after its lease ran out (nobody took the queue) keeps it;
- a pull carrying a commit offset (PULL_MESSAGE's commit bit) commits it by the same rule,
  and only forward: never back, never past the queue's end; the pull is served anyway;
- a v2 receive (not FIFO) delivers, queue by queue in offset order, as many as it asks
  of the messages sent that no receive holds, nobody acked and that were delivered fewer
  than POP_ATTEMPTS times (then they are dead-lettered), each with its delivery attempt;
  a held message is not delivered again until its invisible time passes;
- a v2 receive of the FIFO group delivers the same, except that of each message group (the
  sharding key or message group, within its queue) only the first message neither acked
  nor dead-lettered: while it is held its group's next waits; once its invisible time
  passes it comes again, its delivery attempt one higher; once dead-lettered after its
  last attempt (which the broker does in the background, and the machine waits for) the
  group's next comes;
- in either group, an ack with a held message's current receipt settles it; a change of
  invisible duration with it gives the message a new lease (0: visible at once) and a new
  receipt; a receipt that ran out, was replaced or was forged is refused with
  INVALID_RECEIPT_HANDLE, except that an ack of a message already settled answers OK and
  changes nothing (acks are idempotent; mockbroker/pop/service.py);
- a restart on the same data directory keeps every message, commit, receipt and ack,
  and renews every lock with an owner at its epoch (mockbroker/lock_manager.py).

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
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2_grpc as svc_grpc
from mockbroker.pop.receipts import Receipt
from sdk import Message
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.message_layout import decode_records
from sdk._transport import connect
from sdk._transport.broker_client import BrokerClient
from sdk._transport.codec import MessageIdGenerator
from sdk._transport.protocol import GroupInfo, PullStatus, Transport
from sdk._transport.remoting_transport import RemotingTransport
from sdk.errors import OrderMQError
from sdk.message import MessageExt, MessageQueue
from sdk.selector import shard_index
from sdk.testing import FakeClock
from tests.fuzzing import machine_settings
from tests.support import wait_until

T = TypeVar("T")

QUEUES = 2
LEASE = 60.0
CLIENTS = ("client-a", "client-b")
#: The fronts a client speaks through (ordermq's transport over each of its wires).
WIRES = ("ordermq", "remoting")
KEYS = ("k0", "k1", "k2", "k3", "k4")
CALL_SECONDS = 10.0
#: Deliveries of a received message before it goes to the dead-letter topic: few, so
#: that sequences reach it, and in the FIFO group what comes after it.
POP_ATTEMPTS = 2
#: Invisible times of receives and changes (s): one run-out of the leases (LEASE + 1)
#: ends the short one and not the long one; 0 (changes only) makes a message visible.
INVISIBLE = (20, 100)
#: PULL_MESSAGE's sysFlag bits: the request carries a commitOffset; it has a subscription.
PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION = 0x1, 0x4
#: The headers of the v2 front's consumer calls.
V2_CLIENT = (("x-mq-client-id", "v2-consumer"),)
#: The FIFO group receiving through the v2 front: FIFO only as the broker's configuration
#: names it at start, so one fixed name; examples keep apart by their topics.
FIFO_GROUP = "fronts-fifo"


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


@dataclass
class Popped:
    """The model of one message in the receiving group's view (mockbroker/pop).

    A receive delivers it while no receive holds it (its lease ran out, or none was
    taken), it is not settled and it was delivered fewer than POP_ATTEMPTS times; once
    the lease of its last attempt runs out it is dead-lettered, never delivered again.
    """

    attempts: int = 0
    receipt: str | None = None  # the current lease's receipt...
    deadline_ms: int = 0  # ... and when it runs out
    settled_by: str | None = None  # the receipt that acked it

    def held(self, now_ms: int) -> bool:
        """A receive holds it: its lease has not run out."""
        return self.settled_by is None and self.receipt is not None and now_ms < self.deadline_ms

    def dead(self, now_ms: int) -> bool:
        """Its last delivery's lease ran out: it goes (or went) to the dead-letter topic."""
        return self.settled_by is None and self.attempts >= POP_ATTEMPTS and not self.held(now_ms)

    def deliverable(self, now_ms: int) -> bool:
        """A receive may take it now (a FIFO group's: if nothing before it in its group
        is pending)."""
        return self.settled_by is None and not self.held(now_ms) and not self.dead(now_ms)

    def pending(self, now_ms: int) -> bool:
        """Neither acked nor dead-lettered: in a FIFO group, it holds back its group's next."""
        return self.settled_by is None and not self.dead(now_ms)


@dataclass
class Receiving:
    """One group receiving the example's topic through the v2 front: its view of each
    message sent (per queue, per offset) and the receipts it was given."""

    name: str
    fifo: bool
    popped: list[list[Popped]] = field(default_factory=lambda: [[] for _ in range(QUEUES)])
    issued: list[Issued] = field(default_factory=list)


@dataclass(frozen=True)
class Issued:
    """A receipt handle the broker gave out (by a receive or a change), current or not."""

    receipt: str
    queue_id: int
    offset: int
    deadline_ms: int


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
            pop_max_delivery_attempts=POP_ATTEMPTS, fifo_groups=(FIFO_GROUP,),
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
        self._thread.start()
        self._open()

    def restart(self) -> None:
        """Stop the broker, start it again on its data directory, connect anew."""
        self.embedded.stop()
        self._close_clients()
        self.embedded = EmbeddedBroker(self.embedded.config, clock=self.clock)
        self._open()

    def _open(self) -> None:
        self.embedded.start()
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

    def _close_clients(self) -> None:
        for transport in self.transports.values():
            self.run(transport.close())
        if self.channel is not None:
            self.channel.close()

    def stop(self) -> None:
        self._close_clients()
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
        #: The groups receiving through the v2 front (SimpleConsumers'), by FIFO or not.
        self.receivers = {
            False: Receiving(f"fronts-pop-{n}", fifo=False),
            True: Receiving(FIFO_GROUP, fifo=True),
        }
        #: What the FIFO group dead-lettered of the topic before the broker last started
        #: (its counters start at zero).
        self.dead_lettered_before = 0
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
            await self._join()

        self.b.run(setup())

    async def _join(self) -> None:
        """Each client finds the topic's queues and joins the group over each wire."""
        info = GroupInfo(self.group, "CONSUME_ORDERLY", subscriptions=((self.topic, "*"),))
        for (_, client), transport in self.b.transports.items():
            await transport.writable_queues(self.topic)
            await transport.readable_queues(self.topic)
            await transport.heartbeat(client, [info])

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
        self._stored(queue_id, sent(batch, key))

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
        self._stored(queue_id, sent(batch, key))

    def _stored(self, queue_id: int, messages: list[Sent]) -> None:
        self.queues[queue_id] += messages
        for receiver in self.receivers.values():
            receiver.popped[queue_id] += [Popped() for _ in messages]

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

    @rule()
    def restart(self) -> None:
        """The broker stops and starts again on its data directory (the clients connect
        and join again): what it acknowledged stays, messages, commits, receipts and acks
        alike, and every lock with an owner counts as renewed at start, its owner keeping
        it at its epoch for a lease (mockbroker/lock_manager.py)."""
        self.dead_lettered_before = self._await_dead_letters()
        self.b.restart()
        self.b.run(self._join())
        for model in self.locks:
            model.live = model.owner is not None

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

    @rule(client=st.sampled_from(CLIENTS), queue_id=st.integers(0, QUEUES - 1), data=st.data())
    def pull_committing(self, client: str, queue_id: int, data: st.DataObject) -> None:
        """RocketMQ's PULL_MESSAGE with the commit bit: its commitOffset is committed by the
        rule UPDATE_CONSUMER_OFFSET follows, and only forward; the pull is served anyway."""
        end = len(self.queues[queue_id])
        offset = data.draw(st.integers(0, end + 2), label="offset")
        commit = data.draw(st.integers(0, end + 2), label="commit_offset")
        transport = self.transport("remoting", client)
        assert isinstance(transport, RemotingTransport)
        fields = {
            "consumerGroup": self.group, "topic": self.topic, "queueId": str(queue_id),
            "queueOffset": str(offset), "maxMsgNums": "4",
            "sysFlag": str(PULL_COMMIT_OFFSET | PULL_SUBSCRIPTION),
            "commitOffset": str(commit), "suspendTimeoutMillis": "0",
            "subscription": "*", "subVersion": "0", "expressionType": "TAG",
        }  # fmt: skip
        response = self.b.run(
            transport._at_broker(self.mq(queue_id), RequestCode.PULL_MESSAGE, fields)
        )
        what = f"{client}'s pull of queue {queue_id} at {offset} committing {commit} (end {end})"
        if offset < end:
            assert response.code == ResponseCode.SUCCESS, f"{what}: {response}"
            served = [r.queue_offset for r in decode_records(response.body)]
            assert served and served == list(range(offset, offset + len(served))), what
        else:  # RocketMQ's answers: OFFSET_OVERFLOW_ONE, OFFSET_OVERFLOW_BADLY
            moved = ResponseCode.PULL_OFFSET_MOVED if offset > end else ResponseCode.PULL_NOT_FOUND
            assert response.code == moved, f"{what}: {response}"
        latest = self.committed[queue_id]
        if (
            commit <= end
            and self._may_commit("remoting", client, queue_id)
            and (latest is None or commit > latest)
        ):
            self.committed[queue_id] = commit
        got = self.b.run(self.transport("ordermq").query_offset(self.group, self.mq(queue_id)))
        assert got == self.committed[queue_id], (
            f"{what}: the group's offset is {got}, was {latest}; lock held by "
            f"{self.locks[queue_id].holder}"
        )

    # ------------------------------------------------------------------ receiving (v2)
    def now_ms(self) -> int:
        """The broker's clock, as the pop core reads it."""
        return int(self.b.clock.now() * 1000)

    def _deliverable(self, r: Receiving, now: int) -> list[list[int]]:
        """Per queue, the offsets a receive of `r`'s group may take now, in order; a FIFO
        group's only where no earlier message of the same queue and message group (sharding
        key) is pending."""
        out = []
        for queue_id, msgs in enumerate(r.popped):
            blocked: set[str] = set()
            offsets = []
            for offset, m in enumerate(msgs):
                key = self.queues[queue_id][offset].key
                if m.deliverable(now) and key not in blocked:
                    offsets.append(offset)
                if r.fifo and m.pending(now):
                    blocked.add(key)
            out.append(offsets)
        return out

    def _await_dead_letters(self) -> int:
        """Wait for the broker's sweeper to dead-letter what the FIFO group's model counts
        dead (it does so in the background once a last lease runs out, and only then may the
        message group's next message come); how many the model counts dead."""
        now = self.now_ms()
        dead = sum(m.dead(now) for msgs in self.receivers[True].popped for m in msgs)
        want = dead - self.dead_lettered_before
        state = self.b.embedded.broker.state
        assert state is not None
        counted = state.pop.stats.dead_lettered
        wait_until(
            lambda: counted[FIFO_GROUP, self.topic] >= want,
            CALL_SECONDS,
            f"the broker to dead-letter {want} of {self.topic} for {FIFO_GROUP}, as the model",
        )
        assert counted[FIFO_GROUP, self.topic] == want, (
            f"the broker dead-lettered {counted[FIFO_GROUP, self.topic]} of {self.topic} for "
            f"{FIFO_GROUP} since it started, the model {want}"
        )
        return dead

    @rule(fifo=st.booleans(), batch_size=st.integers(1, 4), invisible=st.sampled_from(INVISIBLE))
    def receive_v2(self, fifo: bool, batch_size: int, invisible: int) -> None:
        """A SimpleConsumer's receive: what no receive holds and nobody settled, in order;
        for the FIFO group, of each message group only its first message not yet settled."""
        r = self.receivers[fifo]
        if fifo:
            self._await_dead_letters()
        now = self.now_ms()
        deliverable = self._deliverable(r, now)
        request = svc.ReceiveMessageRequest(
            group=v2.Resource(name=r.name),
            message_queue=v2.MessageQueue(topic=v2.Resource(name=self.topic), id=-1),
            filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
            batch_size=batch_size,
        )
        request.invisible_duration.FromSeconds(invisible)
        request.long_polling_timeout.FromSeconds(0)
        assert self.b.v2 is not None
        answer = list(self.b.v2.ReceiveMessage(request, timeout=CALL_SECONDS, metadata=V2_CLIENT))
        status = [a.status for a in answer if a.HasField("status")]
        got = [a.message for a in answer if a.HasField("message")]
        what = f"{r.name} v2 receive of {batch_size} (deliverable: {deliverable}): {status}"
        assert len(status) == 1 and sum(a.HasField("delivery_timestamp") for a in answer) == 1, what
        want = min(batch_size, sum(map(len, deliverable)))
        assert status[0].code == (v2.OK if want else v2.MESSAGE_NOT_FOUND), what
        assert len(got) == want, f"{what}: {len(got)} messages"
        by_queue: list[list[int]] = [[] for _ in range(QUEUES)]
        for message in got:
            sp = message.system_properties
            queue_id, offset = sp.queue_id, sp.queue_offset
            by_queue[queue_id].append(offset)
            m = r.popped[queue_id][offset]
            assert Sent(message.body, sp.tag, tuple(sp.keys), sp.message_group,
                        _user(dict(message.user_properties))) == self.queues[queue_id][offset], (
                f"{what}: queue {queue_id} offset {offset} as served"
            )  # fmt: skip
            assert sp.delivery_attempt == m.attempts + 1, f"{what}: {queue_id}/{offset}"
            m.attempts += 1
            m.receipt, m.deadline_ms = sp.receipt_handle, now + invisible * 1000
            r.issued.append(Issued(m.receipt, queue_id, offset, m.deadline_ms))
        for queue_id, offsets in enumerate(by_queue):
            # each queue's messages in offset order, from its first deliverable one
            assert offsets == deliverable[queue_id][: len(offsets)], f"{what}: got {by_queue}"

    def _receipt_to_try(self, r: Receiving, data: st.DataObject) -> tuple[str, Issued | None]:
        """A receipt handle the broker gave `r`'s group, or a forged one (Issued None)."""
        now = self.now_ms()
        kinds = ["forged text"]
        if r.issued:
            kinds.append("issued")
        targets = [(q, o) for q, msgs in enumerate(r.popped) for o in range(len(msgs))]
        if targets:
            kinds.append("forged nonce")
        kind = data.draw(st.sampled_from(kinds), label="receipt")
        if kind == "issued":
            issued = data.draw(st.sampled_from(r.issued), label="issued")
            return issued.receipt, issued
        if kind == "forged text":
            return data.draw(st.sampled_from(("x", "AAAA", "forged-receipt")), label="text"), None
        # One of ours in form, for a message that exists, under a lease never given out.
        queue_id, offset = data.draw(st.sampled_from(targets), label="message")
        deadline = now + data.draw(st.sampled_from((-1000, 1000 * INVISIBLE[0])), label="by")
        receipt = Receipt(r.name, self.topic, queue_id, offset, 0x5EED, deadline)
        return receipt.encode(), Issued(receipt.encode(), queue_id, offset, deadline)

    def _outcome(
        self, r: Receiving, receipt: str, issued: Issued | None, *, change: bool
    ) -> set[int]:
        """The v2 codes an ack (or change) with `receipt` may answer now (the pop core's
        rule); a receipt not from a receive is refused unless its message is settled
        (acks are idempotent) and it has not run out."""
        refused = v2.INVALID_RECEIPT_HANDLE
        if issued is None:
            return {refused}
        now = self.now_ms()
        m = r.popped[issued.queue_id][issued.offset]
        expired = now >= issued.deadline_ms
        if m.settled_by is None and m.receipt == receipt:
            return {refused} if expired else {v2.OK}
        done = refused if change else v2.OK
        if m.dead(now):  # settled once the broker's sweeper has dead-lettered it
            return {refused} if expired else {refused, done}
        if m.settled_by is not None and m.settled_by == receipt:
            # remembered while the group's window holds the message, else judged by its time
            return {done, refused} if expired else {done}
        if expired or m.settled_by is None:
            return {refused}
        return {done}

    def _ack(self, r: Receiving, receipt: str) -> svc.AckMessageResponse:
        request = svc.AckMessageRequest(
            group=v2.Resource(name=r.name), topic=v2.Resource(name=self.topic),
            entries=[svc.AckMessageEntry(message_id="0" * 32, receipt_handle=receipt)],
        )  # fmt: skip
        assert self.b.v2 is not None
        return self.b.v2.AckMessage(request, timeout=CALL_SECONDS, metadata=V2_CLIENT)

    @rule(fifo=st.booleans(), data=st.data())
    def ack_v2(self, fifo: bool, data: st.DataObject) -> None:
        """AckMessage: a held message's current receipt settles it, once; another is
        refused with a status (or, for a message settled already, answered OK)."""
        r = self.receivers[fifo]
        receipt, issued = self._receipt_to_try(r, data)
        allowed = self._outcome(r, receipt, issued, change=False)
        answer = self._ack(r, receipt)
        what = f"{r.name} ack with {issued or receipt}: {answer}; {allowed}"
        assert answer.status.code in allowed, what
        assert [e.status.code for e in answer.entries] == [answer.status.code], answer
        if answer.status.code == v2.OK and issued is not None:
            m = r.popped[issued.queue_id][issued.offset]
            if m.held(self.now_ms()) and m.receipt == receipt:
                m.settled_by = receipt

    def _held_now(self) -> list[tuple[bool, int, int]]:
        """Each message a receive holds now: FIFO group or not, queue, offset."""
        now = self.now_ms()
        return [
            (fifo, q, o)
            for fifo, r in self.receivers.items()
            for q, msgs in enumerate(r.popped)
            for o, m in enumerate(msgs)
            if m.held(now)
        ]

    @precondition(lambda self: self._held_now())
    @rule(data=st.data())
    def ack_held_v2(self, data: st.DataObject) -> None:
        """The usual case, made frequent: a consumer acks what it holds, with its receipt."""
        fifo, queue_id, offset = data.draw(st.sampled_from(self._held_now()), label="held")
        r = self.receivers[fifo]
        m = r.popped[queue_id][offset]
        assert m.receipt is not None
        answer = self._ack(r, m.receipt)
        assert answer.status.code == v2.OK, f"{r.name} ack of a held message: {answer}"
        m.settled_by = m.receipt

    @rule(fifo=st.booleans(), data=st.data(), invisible=st.sampled_from((0, *INVISIBLE)))
    def change_invisible_v2(self, fifo: bool, data: st.DataObject, invisible: int) -> None:
        """ChangeInvisibleDuration: a held message's current receipt gives it a new lease
        from now (0: visible at once) and a new receipt, the old one no longer works."""
        r = self.receivers[fifo]
        receipt, issued = self._receipt_to_try(r, data)
        self._change(r, receipt, issued, invisible)

    @precondition(lambda self: self._held_now())
    @rule(data=st.data())
    def release_held_v2(self, data: st.DataObject) -> None:
        """A consumer gives back what it holds (invisible duration 0): made frequent so that
        sequences reach a message's last delivery and, in the FIFO group, what follows it."""
        fifo, queue_id, offset = data.draw(st.sampled_from(self._held_now()), label="held")
        r = self.receivers[fifo]
        m = r.popped[queue_id][offset]
        assert m.receipt is not None
        self._change(r, m.receipt, Issued(m.receipt, queue_id, offset, m.deadline_ms), 0)

    def _change(self, r: Receiving, receipt: str, issued: Issued | None, invisible: int) -> None:
        allowed = self._outcome(r, receipt, issued, change=True)
        request = svc.ChangeInvisibleDurationRequest(
            group=v2.Resource(name=r.name), topic=v2.Resource(name=self.topic),
            receipt_handle=receipt, message_id="0" * 32,
        )  # fmt: skip
        request.invisible_duration.FromSeconds(invisible)
        assert self.b.v2 is not None
        now = self.now_ms()
        answer = self.b.v2.ChangeInvisibleDuration(
            request, timeout=CALL_SECONDS, metadata=V2_CLIENT
        )
        what = f"{r.name} change to {invisible} s with {issued or receipt}: {answer}; {allowed}"
        assert answer.status.code in allowed, what
        if answer.status.code != v2.OK:
            assert not answer.receipt_handle, what
            return
        assert issued is not None and answer.receipt_handle not in ("", receipt), what
        m = r.popped[issued.queue_id][issued.offset]
        m.receipt, m.deadline_ms = answer.receipt_handle, now + invisible * 1000
        r.issued.append(Issued(m.receipt, issued.queue_id, issued.offset, m.deadline_ms))

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
