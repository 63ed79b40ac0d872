"""The remote offset store: failed reads are never 0, offsets only move forward."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sdk.consumer.offset_store import RemoteOffsetStore
from sdk.errors import BrokerUnavailableError, LockNotHeldError, OrderMQError, StaleEpochError
from sdk.message import MessageQueue

Q = MessageQueue("t", "b", 0)


class FakeBroker:
    """The offset calls of a Transport: query_offset from a script; commits recorded."""

    def __init__(self, answers: list[Any]) -> None:
        self.answers = answers
        self.queries = 0
        self.commits: list[tuple[int, int]] = []
        self.commit_error: OrderMQError | None = None

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        self.queries += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]

    async def commit_offsets(self, group: str, client: str, items: list[Any]) -> None:
        if self.commit_error is not None:
            raise self.commit_error
        self.commits += [(offset, epoch) for _q, offset, epoch in items]


def store(broker: FakeBroker) -> RemoteOffsetStore:
    return RemoteOffsetStore(broker, "g", "me", read_attempts=3)  # type: ignore[arg-type]


def test_a_failed_read_is_retried_and_then_raised_never_taken_as_zero() -> None:
    flaky = FakeBroker([BrokerUnavailableError("down"), BrokerUnavailableError("down"), 42])
    assert asyncio.run(store(flaky).fetch(Q)) == 42
    down = FakeBroker([BrokerUnavailableError("down")] * 3)
    with pytest.raises(BrokerUnavailableError):
        asyncio.run(store(down).fetch(Q))
    assert down.queries == 3


def test_never_committed_is_none_not_zero() -> None:
    assert asyncio.run(store(FakeBroker([None])).fetch(Q)) is None


def test_offsets_move_forward_unless_told_otherwise() -> None:
    s = store(FakeBroker([]))
    s.update(Q, 10)
    s.update(Q, 7)
    assert s.get(Q) == 10
    s.update(Q, 3, increase_only=False)  # a seek or a reset
    assert s.get(Q) == 3


def test_persist_sends_changes_once_with_the_epoch() -> None:
    broker = FakeBroker([])
    s = store(broker)
    s.update(Q, 5)
    s.set_epoch(Q, 77)

    async def twice() -> None:
        await s.persist()
        await s.persist()

    asyncio.run(twice())
    assert broker.commits == [(5, 77)]


def test_an_offset_refused_for_a_new_owner_is_dropped_and_never_resent() -> None:
    broker = FakeBroker([])
    broker.commit_error = StaleEpochError("epoch 9 has been granted since")
    s = store(broker)
    s.update(Q, 5)
    asyncio.run(s.persist())
    assert s.get(Q) is None
    broker.commit_error = None
    asyncio.run(s.persist())
    assert broker.commits == [], "the stale offset must not rewind the new owner"


def test_a_fenced_queue_commits_nothing_until_a_fresh_grant_gives_a_new_epoch() -> None:
    broker = FakeBroker([])
    fenced: list[MessageQueue] = []
    s = RemoteOffsetStore(broker, "g", "me", on_fenced=fenced.append)  # type: ignore[arg-type]
    s.set_epoch(Q, 7)
    s.update(Q, 5)
    broker.commit_error = LockNotHeldError("t queue 0 is locked by 'other'")
    asyncio.run(s.persist())
    assert fenced == [Q] and s.is_fenced(Q)
    broker.commit_error = None
    s.update(Q, 9)  # the listener finished a batch after the queue was lost
    asyncio.run(s.persist())
    s.set_epoch(Q, 7)  # a renewal answered before the loss: not a fresh grant
    s.update(Q, 9)
    asyncio.run(s.persist())
    assert broker.commits == [], "a fenced owner must move no offset, with or without epoch"
    s.set_epoch(Q, 8)  # locked again
    assert not s.is_fenced(Q)
    s.update(Q, 12)
    asyncio.run(s.persist())
    assert broker.commits == [(12, 8)]


def test_a_queue_given_an_epoch_is_never_committed_without_one() -> None:
    broker = FakeBroker([])
    s = store(broker)
    s.set_epoch(Q, 7)
    s.update(Q, 5)
    asyncio.run(s.persist())
    s.remove(Q)  # released (unlocked); a listener call that outlived it ends later
    s.update(Q, 6)
    asyncio.run(s.persist())
    assert broker.commits == [(5, 7)], "epoch 0 would pass wherever no lock is live"


def test_a_refusal_crossed_by_a_fresh_grant_does_not_fence_the_queue() -> None:
    class SlowBroker(FakeBroker):
        def __init__(self) -> None:
            super().__init__([])
            self.arrived = asyncio.Event()
            self.answer = asyncio.Event()

        async def commit_offsets(self, group: str, client: str, items: list[Any]) -> None:
            self.arrived.set()
            await self.answer.wait()
            await super().commit_offsets(group, client, items)

    async def scenario() -> list[tuple[int, int]]:
        broker = SlowBroker()
        fenced: list[MessageQueue] = []
        s = RemoteOffsetStore(broker, "g", "me", on_fenced=fenced.append)  # type: ignore[arg-type]
        s.set_epoch(Q, 7)
        s.update(Q, 5)
        broker.commit_error = StaleEpochError("epoch 7 is stale")
        persisting = asyncio.ensure_future(s.persist())
        await broker.arrived.wait()
        s.set_epoch(Q, 9)  # the renewal loop got a fresh grant meanwhile
        broker.answer.set()
        await persisting
        assert fenced == [] and not s.is_fenced(Q)
        broker.commit_error = None
        await s.persist()
        return broker.commits

    assert asyncio.run(scenario()) == [(5, 9)]
