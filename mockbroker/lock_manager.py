"""RebalanceLockManager: which client may consume which queue of a group.

The table is consumer group -> queue -> lock entry (owner, last renewal, epoch). Every
read-modify-write happens under one global lock, in plain synchronous methods: no I/O and
no awaiting inside. The servicer then awaits `save()`, which writes what changed to disk,
and only then answers. The rules are RocketMQ's, with these improvements:

- Leases are measured on the monotonic clock: setting the wall clock neither expires nor
  extends one. A lock lives while no more than `lease_seconds` passed since its renewal.
- Every grant to a new owner carries a fencing epoch higher than every epoch granted
  before on this data directory; a renewal by the owner keeps it.
- An unlock releases the caller's locks (and expired ones); a queue whose live lock is
  another client's stays locked and is reported back (RocketMQ skips it silently).
- Commits are fenced (`check_commit`):
  * while a lock lives, only its owner may commit the queue's offset, at the lock's epoch;
  * a queue that was ever locked in the group (it has a granted epoch) is consumed under
    locks: without a live lock only its latest epoch may commit (its last owner finishing
    up), and a commit without an epoch is refused (LOCK_NOT_HELD), for it could come from
    a former owner fenced off since;
  * a queue never locked in the group is a concurrent consumer's: commits carry no epoch,
    and one carrying an epoch this broker never granted for it is refused (STALE_EPOCH).
  * a commit without an epoch from a protocol that has none (RocketMQ remoting,
    `check_unfenced_commit`) is refused while another client holds a live lock.
  Granted epochs are kept for good, so a group that consumed a queue orderly keeps
  needing epochs for it: concurrent consumption of that queue needs another group name.

What survives a restart (RocketMQ keeps locks in memory only): the lock table, each
queue's latest granted epoch and the epoch counter are written to `locks.json` (atomic
replace, fsync) before a grant to a new owner, an unlock or a release is answered;
a renewal by the owner writes nothing. On start every loaded lock counts as renewed at
that moment, so its owner renews it at the same epoch and nobody else can take it for one
lease: a client's own view of its lease (30 s) is shorter than the broker's (60 s), so a
restart never hands a queue to a second consumer while the first one still uses it.

A table started afresh takes its first epoch from the wall clock (milliseconds x 1 000),
so that epochs of a table that was lost stay below the new ones; after that epochs come
from the persisted counter only. A missing file on a data directory without consumer
offsets is a fresh start. A file that cannot be read is moved aside to
`locks.json.corrupt`; it, or a missing file on a data directory that has consumer offsets
(an upgrade from a broker that kept no lock file, or a deleted file), starts a fresh
table that grants no lock for one lease, until every lease a client may hold has run out.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.json_members import json_member, json_object
from mockbroker.store.files import write_atomically
from sdk._files import parse_json
from sdk.clock import Clock
from sdk.errors import CorruptFileError

log = logging.getLogger("mockbroker.locks")

QueueKey = tuple[str, int]  # topic, queue id
Granted = dict[str, dict[QueueKey, int]]  # group -> queue -> latest epoch granted
#: The lock table's file in the data directory.
LOCK_FILE = "locks.json"
_FORMAT = 1


#: A lock: who holds the queue, when (monotonic clock) it was last renewed, the grant's
#: epoch. A plain tuple of those three, which the garbage collector stops tracking: an
#: object per lock had every full collection walk them all (32 000 locks: 15 ms more a
#: collection, a pause of the broker's loop).
LockEntry = tuple[str, float, int]
_OWNER: Final = 0
_RENEWED: Final = 1
_EPOCH: Final = 2
#: Groups whose part of the lock file a save makes again per turn of the event loop
#: (about 30 us each with 32 queues' locks).
SNAPSHOT_GROUPS_PER_TURN = 50


@dataclass(frozen=True)
class LockView:
    """A lock as the admin API shows it."""

    client_id: str
    epoch: int
    live: bool


def _group_part(
    group: str, granted: dict[QueueKey, int], locks: dict[QueueKey, LockEntry]
) -> bytes:
    """One group's entry of the file: its queues' granted epochs and owners, by queue."""
    entries = [
        {
            "topic": topic,
            "queue": qid,
            "granted": epoch,
            "owner": locks[(topic, qid)][_OWNER] if (topic, qid) in locks else None,
        }
        for (topic, qid), epoch in sorted(granted.items())
    ]
    return json_member(group, entries)


def lock_not_held(message: str) -> BrokerError:
    """FAILED_PRECONDITION / LOCK_NOT_HELD."""
    return BrokerError(StatusCode.FAILED_PRECONDITION, "LOCK_NOT_HELD", message)


def _queue_name(group: str, queue: QueueKey) -> str:
    # Built only for a refusal: a push subscription checks its lock before every batch.
    return f"{queue[0]} queue {queue[1]} of group {group!r}"


def stale_epoch(message: str) -> BrokerError:
    """FAILED_PRECONDITION / STALE_EPOCH."""
    return BrokerError(StatusCode.FAILED_PRECONDITION, "STALE_EPOCH", message)


class LockFileError(ValueError):
    """The lock file exists but does not hold a lock table."""


class RebalanceLockManager:
    """Leases on (group, queue), renewed by their owner, expiring after `lease_seconds`.

    With a `path`, the table is loaded by `load()` and kept there by `save()`; without
    one it lives in memory only.
    """

    def __init__(self, clock: Clock, lease_seconds: float = 60.0, path: Path | None = None) -> None:
        self._clock = clock
        self.lease_seconds = lease_seconds
        self._path = path
        self._table: dict[str, dict[QueueKey, LockEntry]] = {}
        #: The lock entries (live or not) each client owns, as (group, queue), over every
        #: group: counted against client_max_locks at each lock request, renewals too,
        #: and dropped when the client leaves.
        self._held: dict[str, set[tuple[str, QueueKey]]] = {}
        # The last epoch granted per queue outlives the lock itself, so a former owner's
        # late commit is refused even after the queue was unlocked or expired.
        self._granted: dict[str, dict[QueueKey, int]] = {}
        self._global = threading.Lock()
        self._next_epoch = int(clock.now() * 1000) * 1000 + 1
        self._quiet_until = -math.inf  # no grant before this (monotonic) time
        self._version = 0  # changes made; `save()` writes them
        self._saved_version = 0
        self._save_lock = asyncio.Lock()
        #: Each group's part of the file as the table was at the last snapshot (JSON,
        #: json_member's), and the groups changed since: a save makes only theirs again.
        self._parts: dict[str, bytes] = {}
        self._changed: set[str] = set()

    # ------------------------------------------------------------------ persistence
    def load(self, *, previous_run: bool = False) -> None:
        """Read the lock file at start, before serving (see the module docstring).

        `previous_run`: the data directory shows a broker ran on it (it has consumer
        offsets), so a missing file means the table was lost, not that there is none.
        """
        if self._path is None:
            return
        try:
            raw = self._path.read_bytes()
        except FileNotFoundError:
            if previous_run:
                self._hold_grants(f"{self._path} is missing but consumer offsets exist")
            write_atomically(self._path, self._snapshot())
            return
        try:
            self._restore(raw)
        except CorruptFileError as exc:
            aside = self._path.with_name(self._path.name + ".corrupt")
            os.replace(self._path, aside)
            self._hold_grants(f"{exc}; moved to {aside}")
            write_atomically(self._path, self._snapshot())

    def _hold_grants(self, why: str) -> None:
        self._quiet_until = self._clock.monotonic() + self.lease_seconds
        log.error(
            "%s: the lock table starts empty, and no lock is granted for %g s, until "
            "every lease a client may still hold has run out",
            why, self.lease_seconds,
        )  # fmt: skip

    def _restore(self, raw: bytes) -> None:
        path = self._path or Path(LOCK_FILE)
        self._table, self._granted, self._next_epoch = parse_json(raw, self._parse, path)
        for group, entries in self._table.items():
            for queue, entry in entries.items():
                self._own(entry[_OWNER], group, queue)
        self._changed.update(self._granted)

    def _parse(self, data: Any) -> tuple[dict[str, dict[QueueKey, LockEntry]], Granted, int]:
        if data["format"] != _FORMAT:
            raise LockFileError(f"format {data['format']!r}, not {_FORMAT}")
        next_epoch = _positive(data["next_epoch"])
        table: dict[str, dict[QueueKey, LockEntry]] = {}
        granted: Granted = {}
        renewed = self._clock.monotonic()  # every loaded lock is renewed at start
        for group, entries in data["groups"].items():
            _text(group)
            for item in entries:
                queue = (_text(item["topic"]), _natural(item["queue"]))
                epoch = _positive(item["granted"])
                granted.setdefault(group, {})[queue] = epoch
                next_epoch = max(next_epoch, epoch + 1)
                if item["owner"] is not None:
                    owner = _text(item["owner"])
                    table.setdefault(group, {})[queue] = (owner, renewed, epoch)
        return table, granted, next_epoch

    def _make_parts(self, groups: Iterable[str]) -> None:
        """Make the parts of `groups` again from the table as it is (global lock held)."""
        for group in groups:
            queues = self._granted.get(group)
            if queues:
                self._parts[group] = _group_part(group, queues, self._table.get(group, {}))
            else:
                self._parts.pop(group, None)

    def _snapshot(self) -> bytes:
        """The file as the table is now: the changed groups' parts made again, at once."""
        with self._global:
            self._make_parts(self._changed)
            self._changed = set()
            return self._file()

    async def _snapshot_in_turns(self) -> tuple[int, bytes]:
        """`_snapshot` a few groups a turn of the loop, and the version it saves.

        The parts are made SNAPSHOT_GROUPS_PER_TURN a turn. (Serializing every group
        held the event loop for each save: 12.8 ms with 3 200 queues' locks, 192 ms with
        32 000; and a thousand groups changed at once, as when a partition ends their
        clients together, took 30 ms in one turn.) A change made between two turns is in
        the next save: its version is above the one returned; a snapshot that does not
        finish leaves its groups to be made again by the next.
        """
        with self._global:
            version = self._version
            changed, self._changed = list(self._changed), set()
        made = 0
        try:
            while made < len(changed):
                if made:
                    await asyncio.sleep(0)
                with self._global:
                    self._make_parts(changed[made : made + SNAPSHOT_GROUPS_PER_TURN])
                made += SNAPSHOT_GROUPS_PER_TURN
        finally:
            if made < len(changed):
                with self._global:
                    self._changed.update(changed[made:])
        with self._global:
            return version, self._file()

    def _file(self) -> bytes:
        """The file made of the groups' parts as they were last made."""
        head = f'{{\n "format": {_FORMAT},\n "next_epoch": {self._next_epoch},\n "groups": '
        return json_object(self._parts, head.encode(), b"\n}\n")

    async def save(self) -> None:
        """Return once every change made so far is on disk; no I/O when none is pending.

        Raises UNAVAILABLE (STORE_UNAVAILABLE) when the file cannot be written: the
        change stays in memory, and the next save writes it.
        """
        with self._global:
            target = self._version
        if self._path is None or self._saved_version >= target:
            return
        async with self._save_lock:
            if self._saved_version >= target:
                return  # a save that started after our change covered it
            version, data = await self._snapshot_in_turns()
            work = asyncio.ensure_future(asyncio.to_thread(write_atomically, self._path, data))
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                # The write goes on in its thread: hold the lock until it is done, or the
                # next save would write the same temporary file at the same time.
                await asyncio.wait([work])
                if not work.cancelled() and work.exception() is None:
                    self._saved_version = version
                raise
            except OSError as exc:
                raise BrokerError(
                    StatusCode.UNAVAILABLE,
                    "STORE_UNAVAILABLE",
                    f"the lock table could not be written to {self._path}: {exc}",
                ) from exc
            self._saved_version = version

    # ------------------------------------------------------------------ locking
    def _own(self, client_id: str, group: str, queue: QueueKey) -> None:
        held = self._held.get(client_id)
        if held is None:
            held = self._held[client_id] = set()
        held.add((group, queue))

    def _disown(self, client_id: str, group: str, queue: QueueKey) -> None:
        held = self._held[client_id]
        held.discard((group, queue))
        if not held:
            del self._held[client_id]

    def _live(self, entry: LockEntry, now: float) -> bool:
        # RocketMQ: expired when now - last renewal > lease; exactly at the lease it lives.
        return now - entry[_RENEWED] <= self.lease_seconds

    def _try_lock(self, group: str, queue: QueueKey, client_id: str, now: float) -> int | None:
        queues = self._table.setdefault(group, {})
        entry = queues.get(queue)
        if entry is not None and entry[_OWNER] == client_id:
            queues[queue] = (client_id, now, entry[_EPOCH])
            return entry[_EPOCH]
        if (entry is not None and self._live(entry, now)) or now < self._quiet_until:
            if not queues:
                del self._table[group]
            return None
        epoch = self._next_epoch
        self._next_epoch += 1
        if entry is not None:
            self._disown(entry[_OWNER], group, queue)
        self._own(client_id, group, queue)
        queues[queue] = (client_id, now, epoch)
        self._granted.setdefault(group, {})[queue] = epoch
        self._changed.add(group)
        self._version += 1
        return epoch

    def try_lock(self, group: str, queue: QueueKey, client_id: str) -> int | None:
        """Take or renew one lock; the epoch when held, None when another client holds it."""
        with self._global:
            return self._try_lock(group, queue, client_id, self._clock.monotonic())

    def lock_batch(
        self,
        group: str,
        client_id: str,
        queues: Iterable[QueueKey],
        *,
        renew_only: bool = False,
        max_held: int | None = None,
    ) -> dict[QueueKey, int]:
        """Take or renew many locks; the ones the caller now holds, with their epochs.

        `renew_only`: renew the caller's locks among `queues`, take none. `max_held`: a
        batch that would leave the caller holding more lock entries than this, over every
        group, is refused whole (RESOURCE_EXHAUSTED / TOO_MANY_LOCKS) and changes nothing.
        """
        with self._global:
            now = self._clock.monotonic()
            queues = list(dict.fromkeys(queues))
            table = self._table.get(group, {})
            if renew_only:
                queues = [q for q in queues if q in table and table[q][_OWNER] == client_id]
            if max_held is not None:
                self._check_held(group, client_id, queues, now, max_held)
            held: dict[QueueKey, int] = {}
            for queue in queues:
                epoch = self._try_lock(group, queue, client_id, now)
                if epoch is not None:
                    held[queue] = epoch
            return held

    def _check_held(
        self, group: str, client_id: str, queues: list[QueueKey], now: float, max_held: int
    ) -> None:
        owned = len(self._held.get(client_id, ()))
        table = self._table.get(group, {})
        taken = 0
        for queue in queues:
            entry = table.get(queue)
            if entry is None or (entry[_OWNER] != client_id and not self._live(entry, now)):
                taken += 1
        if owned + taken > max_held:
            raise BrokerError(
                StatusCode.RESOURCE_EXHAUSTED,
                "TOO_MANY_LOCKS",
                f"client {client_id[:64]!r} holds {owned} locks and asks for {taken} more; "
                f"a client holds at most {max_held} (client_max_locks)",
            )

    def holds_any(self, group: str, client_id: str) -> bool:
        """True when `client_id` has a lock entry in `group`, live or not."""
        with self._global:
            return any(e[_OWNER] == client_id for e in self._table.get(group, {}).values())

    def unlock_batch(
        self, group: str, client_id: str, queues: Iterable[QueueKey]
    ) -> dict[QueueKey, str]:
        """Release the caller's locks, and expired ones, among `queues`.

        A live lock of another client stays; the answer maps each such queue to its owner.
        """
        with self._global:
            now = self._clock.monotonic()
            table = self._table.get(group, {})
            refused: dict[QueueKey, str] = {}
            for queue in queues:
                entry = table.get(queue)
                if entry is None:
                    continue
                if entry[_OWNER] != client_id and self._live(entry, now):
                    refused[queue] = entry[_OWNER]
                    continue
                self._disown(entry[_OWNER], group, queue)
                del table[queue]
                self._changed.add(group)
                self._version += 1
            if not table:
                self._table.pop(group, None)
            return refused

    def check_commit(self, group: str, queue: QueueKey, client_id: str, epoch: int) -> None:
        """Refuse a commit for `queue` that the module docstring's rules do not allow."""
        name = f"{queue[0]} queue {queue[1]} of group {group!r}"
        with self._global:
            entry = self._table.get(group, {}).get(queue)
            if entry is not None and self._live(entry, self._clock.monotonic()):
                if entry[_OWNER] != client_id:
                    raise lock_not_held(
                        f"{name} is locked by {entry[_OWNER]!r}; "
                        f"{client_id!r} may not commit its offset"
                    )
                if epoch != entry[_EPOCH]:
                    raise stale_epoch(
                        f"{name}: commit carries epoch {epoch}, the lock's epoch is {entry[_EPOCH]}"
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

    def check_unfenced_commit(
        self, group: str, queue: QueueKey, client_ids: Collection[str]
    ) -> None:
        """Refuse an epoch-less commit while another client holds the queue (LOCK_NOT_HELD).

        For RocketMQ's remoting, whose commits carry no epoch and name no client: the
        committers, `client_ids`, are the clients that spoke on the connection. Without a
        live lock the commit is allowed, as RocketMQ allows it.
        """
        with self._global:
            entry = self._table.get(group, {}).get(queue)
            if entry is None or not self._live(entry, self._clock.monotonic()):
                return
            owner = entry[_OWNER]
        if owner not in client_ids:
            raise lock_not_held(
                f"{queue[0]} queue {queue[1]} of group {group!r} is locked by {owner!r}; "
                "only it may commit the queue's offset"
            )

    def check_lock(self, group: str, queue: QueueKey, client_id: str, epoch: int) -> None:
        """Refuse unless `client_id` holds a live lock on `queue` at `epoch`.

        LOCK_NOT_HELD when it holds none (another owner, expired, unlocked), STALE_EPOCH
        when its lock has another epoch: what a commit of the queue would be refused with.
        """
        with self._global:
            entry = self._table.get(group, {}).get(queue)
            if (
                entry is None
                or entry[_OWNER] != client_id
                or not self._live(entry, self._clock.monotonic())
            ):
                name = _queue_name(group, queue)
                raise lock_not_held(f"{name}: {client_id!r} does not hold its lock")
            if entry[_EPOCH] != epoch:
                name = _queue_name(group, queue)
                raise stale_epoch(f"{name}: the lock's epoch is {entry[_EPOCH]}, not {epoch}")

    def is_locked_by(self, group: str, queue: QueueKey, client_id: str) -> bool:
        """True when `client_id` holds a live lock on `queue`."""
        with self._global:
            entry = self._table.get(group, {}).get(queue)
            return (
                entry is not None
                and entry[_OWNER] == client_id
                and self._live(entry, self._clock.monotonic())
            )

    def is_lock_all_expired(self, group: str) -> bool:
        """True when no lock of `group` is live."""
        with self._global:
            now = self._clock.monotonic()
            return not any(self._live(e, now) for e in self._table.get(group, {}).values())

    def knows_group(self, group: str) -> bool:
        """True when `group` has, or had, a lock here (it survives restarts, unlike members)."""
        with self._global:
            return group in self._granted

    def release_client(self, client_id: str) -> int:
        """Drop every lock `client_id` holds (it left or expired); how many were dropped."""
        with self._global:
            held = self._held.pop(client_id, set())
            for group, queue in held:
                table = self._table[group]
                del table[queue]
                self._changed.add(group)
                if not table:
                    del self._table[group]
            if held:
                self._version += 1
            return len(held)

    def forget(self, match: Callable[[str, QueueKey], bool]) -> set[str]:
        """Drop the locks and granted epochs `match` selects (of a deleted topic or group).

        The groups that had some; `save()` writes the change.
        """
        groups: set[str] = set()
        with self._global:
            for table in (self._table, self._granted):
                for group in list(table):
                    queues: dict[QueueKey, Any] = table[group]
                    for queue in [q for q in queues if match(group, q)]:
                        if table is self._table:
                            self._disown(queues[queue][_OWNER], group, queue)
                        del queues[queue]
                        groups.add(group)
                    if not queues:
                        del table[group]
            if groups:
                self._changed.update(groups)
                self._version += 1
        return groups

    def locks(self, group: str) -> dict[QueueKey, LockView]:
        """The group's lock entries, live or not (for the admin API)."""
        with self._global:
            now = self._clock.monotonic()
            return {
                q: LockView(e[_OWNER], e[_EPOCH], self._live(e, now))
                for q, e in self._table.get(group, {}).items()
            }


def _positive(value: object) -> int:
    if type(value) is not int or value <= 0:
        raise LockFileError(f"{value!r} is not a positive integer")
    return value


def _natural(value: object) -> int:
    if type(value) is not int or value < 0:
        raise LockFileError(f"{value!r} is not a queue id")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise LockFileError(f"{value!r} is not a name")
    return value
