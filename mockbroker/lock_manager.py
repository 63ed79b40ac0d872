"""RebalanceLockManager: which client may consume which queue of a group.

The table is consumer group -> queue -> lock entry (owner, last renewal, epoch). Every
read-modify-write happens under one global lock, in plain synchronous methods: no I/O and
no awaiting inside. The rules are RocketMQ's, with two improvements:

- an unlock releases the caller's locks (and expired ones); a queue whose live lock is
  another client's stays locked and is reported back (RocketMQ skips it silently);
- every grant to a new owner carries a higher fencing epoch, and commits are fenced
  (`check_commit`):
  * while a lock lives, only its owner may commit the queue's offset, at the lock's epoch;
  * a queue that was ever locked in the group (it has a granted epoch) is consumed under
    locks: without a live lock only its latest epoch may commit (its last owner finishing
    up), and a commit without an epoch is refused (LOCK_NOT_HELD), for it could come from
    a former owner fenced off since;
  * a queue never locked in the group is a concurrent consumer's: commits carry no epoch,
    and one carrying an epoch this broker never granted for it is refused (STALE_EPOCH).
  Granted epochs are kept for good, so a group that consumed a queue orderly keeps
  needing epochs for it: concurrent consumption of that queue needs another group name.

Epochs start from the broker's start time in milliseconds times 1 000, so they keep
growing across broker restarts (locks themselves do not survive a restart, as in RocketMQ).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

from grpc import StatusCode

from mockbroker.errors import BrokerError
from sdk.clock import Clock

QueueKey = tuple[str, int]  # topic, queue id


@dataclass
class LockEntry:
    """Who holds a queue, since when it was last renewed, and the grant's epoch."""

    client_id: str
    last_update: float
    epoch: int


@dataclass(frozen=True)
class LockView:
    """A lock as the admin API shows it."""

    client_id: str
    epoch: int
    live: bool


def lock_not_held(message: str) -> BrokerError:
    """FAILED_PRECONDITION / LOCK_NOT_HELD."""
    return BrokerError(StatusCode.FAILED_PRECONDITION, "LOCK_NOT_HELD", message)


def stale_epoch(message: str) -> BrokerError:
    """FAILED_PRECONDITION / STALE_EPOCH."""
    return BrokerError(StatusCode.FAILED_PRECONDITION, "STALE_EPOCH", message)


class RebalanceLockManager:
    """Leases on (group, queue), renewed by their owner, expiring after `lease_seconds`."""

    def __init__(self, clock: Clock, lease_seconds: float = 60.0) -> None:
        self._clock = clock
        self.lease_seconds = lease_seconds
        self._table: dict[str, dict[QueueKey, LockEntry]] = {}
        # The last epoch granted per queue outlives the lock itself, so a former owner's
        # late commit is refused even after the queue was unlocked or expired.
        self._granted: dict[str, dict[QueueKey, int]] = {}
        self._global = threading.Lock()
        self._next_epoch = int(clock.now() * 1000) * 1000 + 1

    def _live(self, entry: LockEntry, now: float) -> bool:
        # RocketMQ: expired when now - last_update > lease; exactly at the lease it lives.
        return now - entry.last_update <= self.lease_seconds

    def _try_lock(self, group: str, queue: QueueKey, client_id: str, now: float) -> int | None:
        queues = self._table.setdefault(group, {})
        entry = queues.get(queue)
        if entry is not None and entry.client_id == client_id:
            entry.last_update = now
            return entry.epoch
        if entry is not None and self._live(entry, now):
            return None
        epoch = self._next_epoch
        self._next_epoch += 1
        queues[queue] = LockEntry(client_id, now, epoch)
        self._granted.setdefault(group, {})[queue] = epoch
        return epoch

    def try_lock(self, group: str, queue: QueueKey, client_id: str) -> int | None:
        """Take or renew one lock; the epoch when held, None when another client holds it."""
        with self._global:
            return self._try_lock(group, queue, client_id, self._clock.now())

    def lock_batch(
        self, group: str, client_id: str, queues: Iterable[QueueKey]
    ) -> dict[QueueKey, int]:
        """Take or renew many locks; the ones the caller now holds, with their epochs."""
        with self._global:
            now = self._clock.now()
            held: dict[QueueKey, int] = {}
            for queue in queues:
                epoch = self._try_lock(group, queue, client_id, now)
                if epoch is not None:
                    held[queue] = epoch
            return held

    def unlock_batch(
        self, group: str, client_id: str, queues: Iterable[QueueKey]
    ) -> dict[QueueKey, str]:
        """Release the caller's locks, and expired ones, among `queues`.

        A live lock of another client stays; the answer maps each such queue to its owner.
        """
        with self._global:
            now = self._clock.now()
            table = self._table.get(group, {})
            refused: dict[QueueKey, str] = {}
            for queue in queues:
                entry = table.get(queue)
                if entry is None:
                    continue
                if entry.client_id != client_id and self._live(entry, now):
                    refused[queue] = entry.client_id
                    continue
                del table[queue]
            if not table:
                self._table.pop(group, None)
            return refused

    def check_commit(self, group: str, queue: QueueKey, client_id: str, epoch: int) -> None:
        """Refuse a commit for `queue` that the module docstring's rules do not allow."""
        name = f"{queue[0]} queue {queue[1]} of group {group!r}"
        with self._global:
            entry = self._table.get(group, {}).get(queue)
            if entry is not None and self._live(entry, self._clock.now()):
                if entry.client_id != client_id:
                    raise lock_not_held(
                        f"{name} is locked by {entry.client_id!r}; "
                        f"{client_id!r} may not commit its offset"
                    )
                if epoch != entry.epoch:
                    raise stale_epoch(
                        f"{name}: commit carries epoch {epoch}, the lock's epoch is {entry.epoch}"
                    )
                return
            last = self._granted.get(group, {}).get(queue)
        if last is None:
            if epoch:
                raise stale_epoch(
                    f"{name}: commit carries epoch {epoch}, which this broker never granted "
                    "for the queue (was its lock table lost?)"
                )
            return
        if not epoch:
            raise lock_not_held(
                f"{name} is consumed under locks (latest epoch {last}); a commit without "
                "the epoch of the client's lock is refused"
            )
        if epoch != last:
            raise stale_epoch(
                f"{name}: commit carries epoch {epoch}, the latest granted is {last} "
                "(another client has owned the queue since)"
            )

    def is_locked_by(self, group: str, queue: QueueKey, client_id: str) -> bool:
        """True when `client_id` holds a live lock on `queue`."""
        with self._global:
            entry = self._table.get(group, {}).get(queue)
            return (
                entry is not None
                and entry.client_id == client_id
                and self._live(entry, self._clock.now())
            )

    def is_lock_all_expired(self, group: str) -> bool:
        """True when no lock of `group` is live."""
        with self._global:
            now = self._clock.now()
            return not any(self._live(e, now) for e in self._table.get(group, {}).values())

    def release_client(self, client_id: str) -> int:
        """Drop every lock `client_id` holds (it left or expired); how many were dropped."""
        with self._global:
            dropped = 0
            for group in list(self._table):
                table = self._table[group]
                for queue in [q for q, e in table.items() if e.client_id == client_id]:
                    del table[queue]
                    dropped += 1
                if not table:
                    del self._table[group]
            return dropped

    def locks(self, group: str) -> dict[QueueKey, LockView]:
        """The group's lock entries, live or not (for the admin API)."""
        with self._global:
            now = self._clock.now()
            return {
                q: LockView(e.client_id, e.epoch, self._live(e, now))
                for q, e in self._table.get(group, {}).items()
            }
