"""Which queues each member of a consumer group takes: RocketMQ's allocation strategies.

Every strategy is deterministic given the same inputs, so all members agree without
talking to each other: queues sorted by (topic, broker, queue id), client ids sorted as
strings. A client id that is not in the list gets nothing; empty inputs are an error.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Protocol

import mmh3

from sdk.errors import InvalidArgumentError
from sdk.message import MessageQueue


class AllocateMessageQueueStrategy(Protocol):
    """How a group's queues are split among its members."""

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        """The queues `current_cid` should consume."""
        ...


def _check(current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]) -> bool:
    if not current_cid:
        raise InvalidArgumentError("current_cid is empty")
    if not mq_all:
        raise InvalidArgumentError("mq_all is empty: there are no queues to allocate")
    if not cid_all:
        raise InvalidArgumentError("cid_all is empty: the group has no members")
    return current_cid in cid_all


class AllocateMessageQueueAveragely:
    """Contiguous, nearly equal ranges: the first `n % c` clients get one more queue."""

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        """RocketMQ's averaging: see the module docstring for the ordering."""
        if not _check(current_cid, mq_all, cid_all):
            return []
        queues, cids = sorted(mq_all), sorted(cid_all)
        n, c, idx = len(queues), len(cids), cids.index(current_cid)
        mod = n % c
        if n <= c:
            avg = 1
        elif mod > 0 and idx < mod:
            avg = n // c + 1
        else:
            avg = n // c
        start = idx * avg if mod > 0 and idx < mod else idx * avg + mod
        return queues[start : start + min(avg, n - start)] if start < n else []


class AllocateMessageQueueAveragelyByCircle:
    """Deal the queues round the clients like cards: queue i to client i % c."""

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        """Queues whose index modulo the member count is this client's index."""
        if not _check(current_cid, mq_all, cid_all):
            return []
        cids = sorted(cid_all)
        idx, c = cids.index(current_cid), len(cids)
        return [q for i, q in enumerate(sorted(mq_all)) if i % c == idx]


class AllocateMessageQueueConsistentHash:
    """A hash ring with `virtual_nodes` points per client.

    A join or leave moves only the queues of the client that came or went.
    """

    def __init__(self, virtual_nodes: int = 10) -> None:
        if virtual_nodes < 1:
            raise InvalidArgumentError("virtual_nodes must be at least 1")
        self.virtual_nodes = virtual_nodes

    def allocate(
        self,
        consumer_group: str,
        current_cid: str,
        mq_all: Sequence[MessageQueue],
        cid_all: Sequence[str],
    ) -> list[MessageQueue]:
        """Each queue goes to the first virtual node at or after its hash on the ring."""
        if not _check(current_cid, mq_all, cid_all):
            return []
        ring = sorted(
            (_hash(f"{cid}-{i}"), cid) for cid in sorted(cid_all) for i in range(self.virtual_nodes)
        )
        points = [h for h, _ in ring]
        out = []
        for queue in sorted(mq_all):
            h = _hash(f"{queue.topic}@{queue.broker_name}@{queue.queue_id}")
            owner = ring[bisect.bisect_left(points, h) % len(ring)][1]
            if owner == current_cid:
                out.append(queue)
        return out


def _hash(key: str) -> int:
    return int(mmh3.hash(key.encode(), 0, signed=False))
