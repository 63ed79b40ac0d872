"""Consumer offsets: kept in memory, sent to the broker periodically and on release.

A failed read is retried and then raised: it is never taken as offset 0, the mistake
that sent whole RocketMQ groups back to the start of their queues (#2708, #4215).
Offsets only move forward unless a caller asks otherwise (a seek or a reset).

Fencing: a queue given a lock epoch (set_epoch) is never committed without one. When the
broker refuses a commit because the client no longer owns the queue (LOCK_NOT_HELD,
STALE_EPOCH), the queue is fenced: nothing is recorded or sent for it until a fresh lock
grant sets a different epoch, and `on_fenced` tells the consumer, which must stop taking
the queue for locked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from sdk._transport.protocol import Transport
from sdk.errors import LockNotHeldError, OrderMQError, StaleEpochError
from sdk.message import MessageQueue

log = logging.getLogger("ordermq.consumer")


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, OrderMQError) and exc.retriable


class RemoteOffsetStore:
    """The group's offsets for the queues this client holds."""

    def __init__(
        self,
        transport: Transport,
        group: str,
        client_id: str,
        *,
        read_attempts: int = 5,
        on_fenced: Callable[[MessageQueue], None] | None = None,
    ):
        """`on_fenced(queue)`: the broker refused a commit of `queue` for fencing."""
        self._transport = transport
        self._group = group
        self._client_id = client_id
        self._read_attempts = read_attempts
        self._on_fenced = on_fenced
        self._offsets: dict[MessageQueue, int] = {}
        self._epochs: dict[MessageQueue, int] = {}
        self._persisted: dict[MessageQueue, int] = {}
        self._locked_queues: set[MessageQueue] = set()  # ever given an epoch
        self._fenced: dict[MessageQueue, int] = {}  # queue -> the epoch refused

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Record the next offset to consume; with increase_only, never move it back.

        Ignored while the queue is fenced: a consumer that lost a queue moves no offset.
        """
        if queue in self._fenced:
            return
        current = self._offsets.get(queue)
        if increase_only and current is not None and offset <= current:
            return
        self._offsets[queue] = offset

    def get(self, queue: MessageQueue) -> int | None:
        """The offset in memory, or None."""
        return self._offsets.get(queue)

    def set_epoch(self, queue: MessageQueue, epoch: int) -> None:
        """The lock epoch commits for `queue` carry (orderly consumers).

        A fenced queue stays fenced unless `epoch` differs from the one refused.
        """
        if self._fenced.get(queue, epoch + 1) == epoch:
            return
        self._fenced.pop(queue, None)
        self._locked_queues.add(queue)
        self._epochs[queue] = epoch

    def is_fenced(self, queue: MessageQueue) -> bool:
        """True from a fencing refusal of `queue` until a new epoch is set."""
        return queue in self._fenced

    def remove(self, queue: MessageQueue) -> None:
        """Forget a released queue (a fenced one stays fenced)."""
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
                return await self._transport.query_offset(self._group, queue)
        raise AssertionError("unreachable: tenacity reraises")

    async def persist(self, queues: list[MessageQueue] | None = None) -> None:
        """Send the offsets that changed since they were last sent.

        A queue given an epoch once is sent only with one: not while it is fenced, nor
        after it was released until it is locked again.
        """
        targets = [
            q
            for q in (queues if queues is not None else list(self._offsets))
            if q in self._offsets
            and self._persisted.get(q) != self._offsets[q]
            and (q in self._epochs or q not in self._locked_queues)
        ]
        await asyncio.gather(*(self._persist_one(q) for q in targets))

    async def _persist_one(self, queue: MessageQueue) -> None:
        offset = self._offsets[queue]
        epoch = self._epochs.get(queue, 0)
        try:
            await self._transport.commit_offsets(
                self._group, self._client_id, [(queue, offset, epoch)]
            )
            self._persisted[queue] = offset
        except (LockNotHeldError, StaleEpochError) as exc:
            self._fence(queue, epoch, offset, exc)
        except OrderMQError as exc:
            log.warning("offset %d for %s not persisted (will retry): %s", offset, queue, exc)

    def _fence(self, queue: MessageQueue, epoch: int, offset: int, exc: OrderMQError) -> None:
        if self._epochs.get(queue, 0) != epoch:
            return  # a fresh grant came while the commit was on its way: it is not fenced
        # Someone else owns (or owned) the queue since: this offset must never be sent
        # again, or a later attempt could rewind the new owner's progress.
        log.warning(
            "offset %d for %s refused, the queue has a new owner; no offset is sent for it "
            "until it is locked again: %s",
            offset, queue, exc,
        )  # fmt: skip
        self.remove(queue)
        self._fenced[queue] = epoch
        if self._on_fenced is not None:
            self._on_fenced(queue)
