"""Consumer offsets: kept in memory, sent to the broker periodically and on release.

A failed read is retried and then raised: it is never taken as offset 0, the mistake
that sent whole RocketMQ groups back to the start of their queues (#2708, #4215).
Offsets only move forward unless a caller asks otherwise (a seek or a reset).
"""

from __future__ import annotations

import asyncio
import logging

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from sdk._transport.cluster import Cluster
from sdk.errors import LockNotHeldError, OrderMQError, StaleEpochError
from sdk.message import MessageQueue

log = logging.getLogger("ordermq.consumer")


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, OrderMQError) and exc.retriable


class RemoteOffsetStore:
    """The group's offsets for the queues this client holds."""

    def __init__(self, cluster: Cluster, group: str, client_id: str, *, read_attempts: int = 5):
        self._cluster = cluster
        self._group = group
        self._client_id = client_id
        self._read_attempts = read_attempts
        self._offsets: dict[MessageQueue, int] = {}
        self._epochs: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Record the next offset to consume; with increase_only, never move it back."""
        current = self._offsets.get(queue)
        if increase_only and current is not None and offset <= current:
            return
        self._offsets[queue] = offset

    def get(self, queue: MessageQueue) -> int | None:
        """The offset in memory, or None."""
        return self._offsets.get(queue)

    def set_epoch(self, queue: MessageQueue, epoch: int) -> None:
        """The lock epoch commits for `queue` carry (orderly consumers)."""
        self._epochs[queue] = epoch

    def remove(self, queue: MessageQueue) -> None:
        """Forget a released queue."""
        self._offsets.pop(queue, None)
        self._epochs.pop(queue, None)
        self._persisted.pop(queue, None)

    async def fetch(self, queue: MessageQueue) -> int | None:
        """The committed offset from the broker; None when never committed.

        Retriable failures are retried; a lasting one is raised rather than guessed at.
        """
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_retriable),
            stop=stop_after_attempt(self._read_attempts),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            reraise=True,
        ):
            with attempt:
                return await self._cluster.client_for(queue).query_offset(self._group, queue)
        raise AssertionError("unreachable: tenacity reraises")

    async def persist(self, queues: list[MessageQueue] | None = None) -> None:
        """Send the offsets that changed since they were last sent."""
        targets = [
            q
            for q in (queues if queues is not None else list(self._offsets))
            if q in self._offsets and self._persisted.get(q) != self._offsets[q]
        ]
        await asyncio.gather(*(self._persist_one(q) for q in targets))

    async def _persist_one(self, queue: MessageQueue) -> None:
        offset = self._offsets[queue]
        try:
            await self._cluster.client_for(queue).commit_offsets(
                self._group, self._client_id, [(queue, offset, self._epochs.get(queue, 0))]
            )
            self._persisted[queue] = offset
        except (LockNotHeldError, StaleEpochError) as exc:
            # Someone else owns (or owned) the queue since: this offset must never be sent
            # again, or a later attempt could rewind the new owner's progress.
            log.warning(
                "offset %d for %s refused, the queue has a new owner: %s", offset, queue, exc
            )
            self.remove(queue)
        except OrderMQError as exc:
            log.warning("offset %d for %s not persisted (will retry): %s", offset, queue, exc)
