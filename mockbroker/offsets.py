"""Consumer offsets per (group, topic, queue), durable before a commit is answered.

The table is one JSON file replaced atomically. Concurrent commits share one write: a
commit waits for a save that started after its change (group commit), so a burst of
commits costs one file write rather than one each. Queries see only what is saved: a
commit whose save fails (a full disk) is refused and leaves the offsets as they were, so
that a restart never finds an offset older than one a query answered.

A save costs what changed since the last one, not the table's size: each group's part of
the file is kept as JSON text and made again only when one of its offsets changed, and
the saved table takes only the changed entries. (Serializing the whole table held the
event loop for every save: 2.8 ms with 3 200 offsets, 35 ms with 32 000.)
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.json_members import json_member, json_object
from mockbroker.store.files import write_atomically
from mockbroker.topics import check_any_topic, check_group, name_checked
from sdk._files import read_json

OffsetKey = tuple[str, str, int]  # group, topic, queue id


class ConsumerOffsets:
    """The committed offset table."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._table: dict[OffsetKey, int] = {}  # what the next save writes
        self._saved: dict[OffsetKey, int] = {}  # what is on disk: what queries answer
        self._groups: set[str] = set()
        self._skipped: dict[OffsetKey, int] = {}
        #: Keys whose offset or skipped count changed since the last snapshot, each
        #: group's keys (those of `_table` and `_skipped`, and maybe some gone since), and
        #: each group's part of either section of the file as of the last snapshot.
        self._changed: set[OffsetKey] = set()
        self._keys: dict[str, set[OffsetKey]] = {}
        #: Each queue's keys, likewise (maybe some gone since): retention's trims of a
        #: queue look at its groups' offsets only.
        self._queue_keys: dict[tuple[str, int], set[OffsetKey]] = {}
        #: Each queue's floor and laggards: every offset of `_table` on the queue is at
        #: or above its floor, or its key is a laggard (a group left behind, as an
        #: abandoned one is, or one that went back). A trim looks at the laggards only
        #: when it stays under the floor, at every group of the queue else.
        self._floors: dict[tuple[str, int], int] = {}
        self._laggards: dict[tuple[str, int], set[OffsetKey]] = {}
        self._parts: dict[str, bytes] = {}
        self._skipped_parts: dict[str, bytes] = {}
        self._version = 0
        self._saved_version = 0
        self._save_lock = asyncio.Lock()

    def load(self) -> None:
        """Read the table file, if any.

        CorruptFileError when it cannot be read: the broker does not start, for committed
        offsets are not to be guessed.
        """
        if self._path.exists():
            self._table, self._skipped = read_json(self._path, _parse)
        self._saved = dict(self._table)
        self._groups = {g for g, _, _ in self._table}
        for key in (*self._table, *self._skipped):
            self._touch(key)
        floors = self._floors
        for (_, topic, queue_id), offset in self._table.items():
            floor = floors.get((topic, queue_id))
            if floor is None or offset < floor:
                floors[(topic, queue_id)] = offset

    def get(self, group: str, topic: str, queue_id: int) -> int | None:
        """The committed offset, or None when the group never committed this queue."""
        return self._saved.get((group, topic, queue_id))

    def latest(self, group: str, topic: str, queue_id: int) -> int | None:
        """The latest accepted commit: the saved offset, or a later one still being saved.

        A rule comparing a new commit with the group's offset reads this one, not get():
        a commit accepted but not yet saved is newer than what the file holds.
        """
        return self._table.get((group, topic, queue_id))

    def committed(self) -> list[OffsetKey]:
        """Every (group, topic, queue) with a committed offset."""
        return list(self._saved)

    def saved(self) -> list[tuple[str, str, int, int]]:
        """Every saved commit as (group, topic, queue id, offset): what retention protects."""
        return [(g, t, q, offset) for (g, t, q), offset in self._saved.items()]

    def groups(self) -> set[str]:
        """Every group with at least one committed offset."""
        return self._groups

    def note_trimmed(self, topic: str, queue_id: int, old_min: int, new_min: int) -> None:
        """Retention moved a queue's min offset: count what each group had not committed.

        Saved with the next commit. Looks at the queue's laggards only while its floor is
        at or above `new_min` (the usual trim: retention deletes what the groups read
        long ago, and a group left behind is a laggard since the first trim that found
        it there); else at every group of the queue, and sets floor and laggards anew.
        """
        queue = (topic, queue_id)
        floor = self._floors.get(queue)
        laggards = self._laggards.get(queue)
        every = floor is not None and floor < new_min
        if every:
            keys = self._queue_keys.get(queue)
            if keys is None:  # every group of it was forgotten since
                del self._floors[queue]
                self._laggards.pop(queue, None)
                return
            looked_at: set[OffsetKey] = keys
            floor = None
        elif laggards:
            looked_at = laggards
        else:
            return
        behind: set[OffsetKey] = set()
        for key in list(looked_at):
            committed = self._table.get(key)
            if committed is None:
                if every and key not in self._skipped:
                    looked_at.discard(key)  # gone since
                continue
            if committed < new_min:
                self._skipped[key] = self._skipped.get(key, 0) + new_min - max(committed, old_min)
                self._touch(key)
                self._version += 1
                behind.add(key)
            elif floor is None or committed < floor:
                floor = committed
        if floor is None:
            self._floors.pop(queue, None)
        else:
            self._floors[queue] = floor
        if behind:
            self._laggards[queue] = behind
        else:
            self._laggards.pop(queue, None)
        if every and not looked_at:
            del self._queue_keys[queue]

    def skipped(self, group: str, topic: str, queue_id: int) -> int:
        """Messages retention deleted before `group` committed past them."""
        return self._skipped.get((group, topic, queue_id), 0)

    async def commit(self, updates: dict[OffsetKey, int]) -> None:
        """Apply `updates` and return once they are on disk.

        A save that fails raises BrokerError UNAVAILABLE (DISK_FULL or STORE_UNAVAILABLE,
        retriable) and takes back those of `updates` that no later commit replaced.
        """
        await self.save_accepted(updates, self.accept(updates))

    async def forget(self, match: Callable[[OffsetKey], bool]) -> list[OffsetKey]:
        """Delete the offsets `match` selects (a deleted topic's or group's); those deleted.

        Gone once on disk: a save that fails raises UNAVAILABLE (DISK_FULL or
        STORE_UNAVAILABLE) and puts back those no commit replaced meanwhile.
        """
        gone = {k: v for k, v in self._table.items() if match(k)}
        skipped = {k: v for k, v in self._skipped.items() if match(k)}
        if not gone and not skipped:
            return []
        for key in gone:
            del self._table[key]
            self._touch(key)
        for key in skipped:
            del self._skipped[key]
            self._touch(key)
        self._version += 1
        try:
            await self._save(self._version)
        except OSError as exc:
            for key, value in gone.items():
                if key not in self._table:
                    self._table[key] = value
                    self._touch(key)
                    self._note_offset(key, value)
            for key, value in skipped.items():
                if key not in self._skipped:
                    self._skipped[key] = value
                    self._touch(key)
            raise _not_saved("deleted", exc) from exc
        self._groups = {g for g, _, _ in self._saved}
        return sorted(gone)

    def accept(self, updates: dict[OffsetKey, int]) -> int:
        """Take `updates` as the latest commits (latest() answers them, get() not yet).

        No I/O and no awaiting: a rule checked just before applies to exactly this state.
        The answer is the version to pass to save_accepted(), which must follow.
        """
        self._table.update(updates)
        for key, offset in updates.items():
            self._touch(key)
            self._note_offset(key, offset)
        self._version += 1
        return self._version

    async def save_accepted(self, updates: dict[OffsetKey, int], version: int) -> None:
        """Return once the accepted `updates` are on disk (the rest of commit())."""
        try:
            await self._save(version)
        except OSError as exc:
            for key, value in updates.items():
                if self._table.get(key) == value:
                    if key in self._saved:
                        self._table[key] = self._saved[key]
                        self._note_offset(key, self._saved[key])
                    else:
                        del self._table[key]
                    self._touch(key)
            raise _not_saved("committed", exc) from exc
        self._groups.update(g for g, _, _ in updates)

    async def _save(self, version: int) -> None:
        async with self._save_lock:
            if self._saved_version >= version:
                return  # a save that started after our change already covered it
            current = self._version
            changed = {key: self._table.get(key) for key in self._changed}
            snapshot = self._snapshot()
            try:
                await asyncio.to_thread(write_atomically, self._path, snapshot)
            except BaseException:
                for key in changed:  # not on disk: the next save writes them
                    self._touch(key)
                raise
            self._saved_version = current
            for key, offset in changed.items():
                if offset is None:
                    self._saved.pop(key, None)
                else:
                    self._saved[key] = offset

    def _touch(self, key: OffsetKey) -> None:
        """Note that `key`'s offset or skipped count changed: the next save writes it."""
        self._changed.add(key)
        keys = self._keys.get(key[0])
        if keys is None:
            keys = self._keys[key[0]] = set()
        keys.add(key)
        queue = key[1:]
        keys = self._queue_keys.get(queue)
        if keys is None:
            keys = self._queue_keys[queue] = set()
        keys.add(key)

    def _note_offset(self, key: OffsetKey, offset: int) -> None:
        """`key` now has `offset`: a laggard if under its queue's floor (the first sets it)."""
        queue = key[1:]
        floor = self._floors.get(queue)
        if floor is None:
            self._floors[queue] = offset
        elif offset < floor:
            laggards = self._laggards.get(queue)
            if laggards is None:
                self._laggards[queue] = {key}
            else:
                laggards.add(key)

    def _snapshot(self) -> bytes:
        """The file as the table is now: the changed groups' parts made again."""
        for group in {key[0] for key in self._changed}:
            keys = self._keys[group]
            gone = [k for k in keys if k not in self._table and k not in self._skipped]
            keys.difference_update(gone)
            for key in gone:  # and from their queues' keys
                queue_keys = self._queue_keys.get(key[1:])
                if queue_keys is not None:
                    queue_keys.discard(key)
                    if not queue_keys:
                        del self._queue_keys[key[1:]]
            for parts, values in ((self._parts, self._table), (self._skipped_parts, self._skipped)):
                part = _group_json(group, sorted([k for k in keys if k in values]), values)
                if part is None:
                    parts.pop(group, None)
                else:
                    parts[group] = part
            if not keys:
                del self._keys[group]
        self._changed = set()
        offsets = json_object(self._parts, b'{\n "offsets": ', b',\n "skipped": ')
        return offsets + json_object(self._skipped_parts, after=b"\n}\n")


def _group_json(group: str, keys: list[OffsetKey], values: dict[OffsetKey, int]) -> bytes | None:
    """One group's entry of a section, `"group": {"topic": {"queue id": n}}` (None: empty)."""
    if not keys:
        return None
    topics: dict[str, dict[str, int]] = {}
    for key in keys:
        _, topic, qid = key
        queues = topics.get(topic)
        if queues is None:
            queues = topics[topic] = {}
        queues[str(qid)] = values[key]
    return json_member(group, topics)


def _not_saved(what: str, exc: OSError) -> BrokerError:
    """UNAVAILABLE (DISK_FULL or STORE_UNAVAILABLE, retriable): the table was not saved."""
    return BrokerError(
        StatusCode.UNAVAILABLE,
        "DISK_FULL" if exc.errno == errno.ENOSPC else "STORE_UNAVAILABLE",
        f"the offsets were not {what}: saving them failed ({exc}); retry later",
    )


def _parse(raw: dict[str, Any]) -> tuple[dict[OffsetKey, int], dict[OffsetKey, int]]:
    return _table(raw["offsets"]), _table(raw.get("skipped", {}))


def _table(nested: dict[str, Any]) -> dict[OffsetKey, int]:
    """A table of group -> topic -> queue id -> a natural number, flattened."""
    table: dict[OffsetKey, int] = {}
    for group, topics in nested.items():
        name_checked(check_group, group)
        for topic, queues in topics.items():
            name_checked(check_any_topic, topic)
            for qid, value in queues.items():
                if not (qid.isascii() and qid.isdigit()) or type(value) is not int or value < 0:
                    raise ValueError(f"{group}/{topic} queue {qid!r}: {value!r}")
                table[(group, topic, int(qid))] = value
    return table
