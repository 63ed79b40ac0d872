"""A flooding client against a real broker: fair turns and the per-client limit.

The broker runs in-process on the test's event loop and its MessagingService is called
directly, so that which request the broker has taken when is up to the test, not to the
network. Its clock ticks a millisecond at every monotonic reading, so every slice of
store work costs more than the turn budget: the scheduler's decisions are deterministic
(see mockbroker/fairness.py). What the checks count is where records landed in the
commit log, never how long anything took.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest

from mockbroker import Broker, BrokerConfig
from mockbroker.fronts.grpc.service import MessagingService
from sdk import Message
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.codec import MessageIdGenerator, encode_message
from sdk._wire import iter_records
from sdk.testing import FakeClock

T = TypeVar("T")
FLOOD_BATCHES = 50
QUEUES = 8


class TickingClock(FakeClock):
    """A fake clock whose monotonic time moves 1 ms at every reading."""

    def monotonic(self) -> float:
        self.advance(0.001)
        return super().monotonic()


class Aborted(Exception):
    """What FakeContext.abort raises (grpc.aio raises its own)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code


class FakeContext:
    """The bits of a grpc.aio.ServicerContext the unary handlers use."""

    def __init__(self, peer: str) -> None:
        self._peer = peer
        self.trailing: tuple[tuple[str, str], ...] = ()

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.trailing = metadata

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


def serve(
    tmp_path: Path, config: dict[str, Any], body: Callable[[Broker, MessagingService], Awaitable[T]]
) -> T:
    async def main() -> T:
        broker = Broker(BrokerConfig(data_dir=tmp_path / "b", **config), clock=TickingClock())
        await broker.start()
        try:
            assert broker.state is not None
            return await body(broker, MessagingService(broker.state))
        finally:
            await broker.stop()

    return asyncio.run(main())


def request(topic: str, queue_id: int, count: int) -> pb.SendRequest:
    ids = MessageIdGenerator()
    frames = b"".join(
        encode_message(Message(topic, f"{topic}-{queue_id}-{i}".encode()), ids.next(), 0)
        for i in range(count)
    )
    return pb.SendRequest(topic=topic, queue_id=queue_id, frames=frames)


@pytest.mark.parametrize("batch", [1000, 200])
def test_a_single_send_is_not_stored_behind_a_flooders_queued_batches(
    tmp_path: Path, batch: int
) -> None:
    """The test that fails without the protection: with fair_scheduling=False the single
    message is stored after every message of the flooder's 50 batches ahead of it; with
    slices served first come, first served (no turns), after about 49 of its slices."""

    async def body(broker: Broker, service: MessagingService) -> tuple[int, list[int]]:
        # The topics exist: a first send waits for its topic's creation (in a thread), and
        # others' sends rightly go on meanwhile; this measures the store's turns.
        for topic in ("flood", "normal"):
            broker.store.create_topic(topic, QUEUES)
        flood = [
            asyncio.create_task(service.send(request("flood", i % QUEUES, batch), "flooder"))
            for i in range(FLOOD_BATCHES)
        ]
        await asyncio.sleep(0)  # the broker has taken all 50; they wait for their turns
        single = asyncio.create_task(service.send(request("normal", 0, 1), "normal"))
        answers = await asyncio.gather(*flood)
        await single
        store = broker.store
        flood_topic, normal_topic = store.topics.get("flood"), store.topics.get("normal")
        normal_at = store.queue(normal_topic, 0).entry(0)[0]
        ahead = 0
        for q in range(QUEUES):
            cq = store.queue(flood_topic, q)
            assert cq.count == batch * len(range(q, FLOOD_BATCHES, QUEUES)), "none lost"
            ahead += sum(1 for o in range(cq.count) if cq.entry(o)[0] < normal_at)
        firsts = [a.first_queue_offset for a in answers]
        return ahead, firsts

    ahead, firsts = serve(tmp_path, {}, body)
    # It waited for at most one slice of the flooder's store work per step of its own
    # (check, append), not for the flooder's 50 batches ahead of it.
    slice_messages = min(batch, BrokerConfig().fair_slice_messages)
    assert ahead <= 2 * slice_messages, f"{ahead} flooder messages stored first"
    # Each queue's batches were stored whole, in the order the broker took them.
    assert firsts == [batch * (i // QUEUES) for i in range(FLOOD_BATCHES)]


def test_a_unary_send_past_the_clients_limit_is_refused_and_stores_nothing(
    tmp_path: Path,
) -> None:
    async def body(broker: Broker, service: MessagingService) -> tuple[Aborted, FakeContext]:
        assert broker.state is not None
        broker.state.limits.hold("ipv4:10.0.0.1:5000", 1024)  # say, its sends in flight
        context = FakeContext("ipv4:10.0.0.1:5000")
        with pytest.raises(Aborted) as caught:
            await service.Send(request("refused", 0, 3), context)  # type: ignore[arg-type]
        assert broker.store.topics.find("refused") is None, "nothing changed"
        other = FakeContext("ipv4:10.0.0.2:5000")
        sent = await service.Send(request("accepted", 0, 3), other)  # type: ignore[arg-type]
        assert sent.count == 3, "another client is not held back"
        return caught.value, context

    refusal, context = serve(tmp_path, {"client_max_in_flight_bytes": 1024}, body)
    assert refusal.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ("ordermq-reason", "CLIENT_OVER_LIMIT") in context.trailing
    assert "client_max_in_flight_bytes" in str(refusal)


def test_another_clients_sends_to_a_flooded_queue_never_split_its_batches(
    tmp_path: Path,
) -> None:
    async def body(broker: Broker, service: MessagingService) -> list[pb.SendResponse]:
        flood = [
            asyncio.create_task(service.send(request("shared", 0, 1000), "flooder"))
            for _ in range(10)
        ]
        singles = []
        while not all(task.done() for task in flood):  # one more at each pass of the loop
            singles.append(asyncio.create_task(service.send(request("shared", 0, 1), "normal")))
            await asyncio.sleep(0)
        answers = await asyncio.gather(*flood)
        assert sum(s.count for s in await asyncio.gather(*singles)) == len(singles)
        store = broker.store
        topic = store.topics.get("shared")
        assert store.queue(topic, 0).count == 10 * 1000 + len(singles)
        for a in answers:  # each batch's 1 000 consecutive offsets hold its messages, in order
            got = store.get(topic, 0, a.first_queue_offset, max_messages=1000, max_bytes=1 << 30)
            assert [r.body for r in iter_records(got.records)] == [
                f"shared-0-{i}".encode() for i in range(1000)
            ], f"the batch at {a.first_queue_offset} was split"
        return answers

    answers = serve(tmp_path, {}, body)
    starts = sorted(a.first_queue_offset for a in answers)
    assert all(a.count == 1000 for a in answers)
    assert all(b - a >= 1000 for a, b in itertools.pairwise(starts))


# ---------------------------------------------------------------------- receives (pop)
def receive_request(group: str, topic: str, count: int) -> pb.ReceiveRequest:
    return pb.ReceiveRequest(
        group=group, topic=topic, max_messages=count, invisible_duration_ms=60_000
    )


def journaled_leases(broker: Broker) -> list[tuple[str, int]]:
    """(group, messages) of each lease record of the pop journal, in order."""
    out = []
    for path in sorted((broker.config.data_dir / "pop").glob("journal-*.log")):
        for line in path.read_bytes().splitlines():
            record = json.loads(line[9:])
            if record["op"] == "lease":
                out.append((record["g"], len(record["e"])))
    return out


@pytest.mark.parametrize("other", ["pull", "receive"])
def test_a_clients_flood_of_receives_does_not_starve_another_clients_pull_or_receive(
    tmp_path: Path, other: str
) -> None:
    """Fails without receives taking turns: the 50 receives read and lease all the
    flooder's 8 000 messages before the other client's request reads anything."""

    async def body(broker: Broker, service: MessagingService) -> tuple[int, list[int]]:
        assert broker.state is not None
        for q in range(QUEUES):
            await service.send(request("flood", q, 1000), "flooder")
        await service.send(request("normal", 0, 1), "normal")
        flood = [
            asyncio.create_task(service.receive(receive_request("fg", "flood", 1000), "flooder"))
            for _ in range(FLOOD_BATCHES)
        ]
        await asyncio.sleep(0)  # the broker has taken all 50; they wait for their turns
        if other == "pull":
            pulled = await service.pull(
                pb.PullRequest(group="ng", topic="normal", queue_id=0, offset=0,
                               max_messages=32, max_bytes=1 << 20), "normal",
            )  # fmt: skip
            ahead = broker.state.pop.in_flight().get(("fg", "flood"), 0)  # no await since it read
            assert pulled.record_count == 1
        else:
            received = await service.receive(receive_request("ng", "normal", 32), "normal")
            assert received.record_count == 1
            leases = journaled_leases(broker)
            first = next(i for i, (g, _) in enumerate(leases) if g == "ng")
            ahead = sum(n for g, n in leases[:first] if g == "fg")
        answers = await asyncio.gather(*flood)
        counts = [a.record_count for a in answers]
        assert sum(counts) == broker.state.pop.in_flight()[("fg", "flood")]
        return ahead, counts

    ahead, counts = serve(tmp_path, {}, body)
    slice_messages = BrokerConfig().fair_slice_messages
    assert ahead <= 2 * slice_messages, f"the flooder leased {ahead} messages first"
    # While the other client was active each flooding receive answered a slice.
    assert all(counts), "every flooding receive got messages"


def test_a_receive_over_the_clients_limit_waits_and_its_answer_counts(tmp_path: Path) -> None:
    async def body(broker: Broker, service: MessagingService) -> None:
        assert broker.state is not None
        limits = broker.state.limits
        await service.send(request("jobs", 0, 40), "producer")
        limits.hold("c", 1024)  # say, its sends in flight
        waiting = asyncio.create_task(service.receive(receive_request("g", "jobs", 5), "c"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done() and broker.state.pop.progress("g", "jobs", 0) is None, (
            "a receive over the limit reads nothing"
        )
        limits.hold("c", -1024)
        assert (await waiting).record_count == 5

        # Its answer counts until answered: held while the journal syncs it.
        synced = asyncio.Event()
        sync = broker.state.pop.journal.sync

        async def slow_sync() -> None:
            await synced.wait()
            await sync()

        broker.state.pop.journal.sync = slow_sync  # type: ignore[method-assign]
        first = asyncio.create_task(service.receive(receive_request("g", "jobs", 15), "c"))
        try:
            for _ in range(20):
                await asyncio.sleep(0)
            held = limits.held("c")
            assert held > 1024, "the first answer's records (15 messages) count"
            second = asyncio.create_task(service.receive(receive_request("g", "jobs", 5), "c"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert limits.held("c") == held, "the second waits for room"
            assert not second.done()
        finally:
            synced.set()
        answer = await first
        assert held == len(answer.records)
        assert (await second).record_count == 5
        assert limits.held("c") == 0

    serve(tmp_path, {"client_max_in_flight_bytes": 1024}, body)
