"""The rule of committing a consumer offset, written once for every front.

A commit of a queue's offset for a group is accepted when, in this order:

1. the offset lies within the queue, [min offset, end offset] (OUT_OF_RANGE /
   INVALID_OFFSET);
2. the lock rule lets the committer commit (RebalanceLockManager): with ordermq's
   fencing epoch, `check_commit` (LOCK_NOT_HELD, STALE_EPOCH); without one (RocketMQ
   remoting, whose commits carry none), `check_unfenced_commit`: refused while a client
   other than the committer holds a live lock (LOCK_NOT_HELD);
3. for a forward-only commit (the offset a remoting pull carries with its commit bit),
   the offset is past the latest *accepted* commit of the queue: one still being saved
   counts, for it is newer than the saved one.

An explicit commit may move a group back: that is how tools reset or rewind one.

A commit equal to the saved offset, with no other commit of the queue being saved, is
answered at once; any other is accepted in memory at once (ConsumerOffsets.accept: the
rule is checked and applied with no await between, so two commits never both pass
against the same old state) and then saved, in a task of its own that goes on if the
request that asked for it is cancelled. What queries answer changes once the save
succeeded; a failed save is taken back and refused (ConsumerOffsets). `settled()` waits
for the commits of a queue still being saved.

The fronts only translate: gRPC CommitConsumerOffsets, remoting UPDATE_CONSUMER_OFFSET
and PULL_MESSAGE's commit bit call `commit` or `commit_forward`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from mockbroker.errors import BrokerError, out_of_range
from mockbroker.lock_manager import RebalanceLockManager
from mockbroker.offsets import ConsumerOffsets, OffsetKey
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import Topic


@dataclass(frozen=True)
class Fenced:
    """An ordermq client, each update at the epoch of its lock on the queue."""

    client_id: str


@dataclass(frozen=True)
class Unfenced:
    """A commit that carries no epoch and names no client: the connection's clients."""

    client_ids: Collection[str]


Committer = Fenced | Unfenced


@dataclass(frozen=True)
class OffsetUpdate:
    """One queue's new offset."""

    topic: Topic
    queue_id: int
    offset: int
    #: The epoch of the committer's lock on the queue (0: none), for a Fenced committer.
    epoch: int = 0


class OffsetCommits:
    """Commits consumer offsets by the rule of the module docstring."""

    def __init__(
        self, store: MessageStore, offsets: ConsumerOffsets, locks: RebalanceLockManager
    ) -> None:
        self._store = store
        self._offsets = offsets
        self._locks = locks
        self._saving: dict[OffsetKey, asyncio.Future[None]] = {}

    def check(self, group: str, update: OffsetUpdate, committer: Committer) -> None:
        """Raise the BrokerError that refuses `update` by rules 1 and 2, if any."""
        topic, queue_id, offset = update.topic, update.queue_id, update.offset
        low = self._store.queue(topic, queue_id).min_offset
        high = self._store.end_offset(topic, queue_id)
        if not low <= offset <= high:
            raise out_of_range(
                "INVALID_OFFSET",
                f"offset {offset} for {topic.name} queue {queue_id} is outside [{low}, {high}]",
            )
        queue = (topic.name, queue_id)
        if isinstance(committer, Fenced):
            self._locks.check_commit(group, queue, committer.client_id, update.epoch)
        else:
            self._locks.check_unfenced_commit(group, queue, committer.client_ids)

    async def commit(
        self, group: str, updates: Iterable[OffsetUpdate], committer: Committer
    ) -> None:
        """Commit every update durably, or none: the first refusal is raised.

        BrokerError UNAVAILABLE (DISK_FULL, STORE_UNAVAILABLE) when the save fails.
        """
        table: dict[OffsetKey, int] = {}
        for update in updates:
            self.check(group, update, committer)
            table[(group, update.topic.name, update.queue_id)] = update.offset
        if table:
            await self._write(table)

    async def commit_forward(self, group: str, update: OffsetUpdate, committer: Committer) -> bool:
        """Commit `update` if the rule allows it and it moves the group forward.

        False when it was dropped (refused, or not past the latest accepted commit): a
        pull carrying it is served all the same, as RocketMQ's broker serves it, for its
        commit is a hint a client repeats. A failed save still raises.
        """
        try:
            self.check(group, update, committer)
        except BrokerError:
            return False
        latest = self._offsets.latest(group, update.topic.name, update.queue_id)
        if latest is not None and update.offset <= latest:
            return False
        await self._write({(group, update.topic.name, update.queue_id): update.offset})
        return True

    async def settled(self, group: str, topic: str, queue_id: int) -> None:
        """Return once no commit of the queue is being saved (a failed one counts as done)."""
        saving = self._saving.get((group, topic, queue_id))
        if saving is not None:
            await asyncio.wait([saving])

    async def _write(self, table: dict[OffsetKey, int]) -> None:
        offsets = self._offsets
        if all(offsets.get(*k) == v and offsets.latest(*k) == v for k, v in table.items()):
            return  # saved already, and no other commit of these queues is being saved
        version = offsets.accept(table)
        saving = asyncio.ensure_future(offsets.save_accepted(table, version))
        for key in table:
            self._saving[key] = saving
        saving.add_done_callback(functools.partial(self._saved, list(table)))
        await asyncio.shield(saving)  # saved even if the asking request is cancelled

    def _saved(self, keys: list[OffsetKey], saving: asyncio.Future[None]) -> None:
        for key in keys:
            if self._saving.get(key) is saving:
                del self._saving[key]
        if not saving.cancelled():
            saving.exception()  # retrieved: the request that awaited it may be gone
