"""Consumer offsets per (group, topic, queue), durable before a commit is answered.

The table is one JSON file replaced atomically. Concurrent commits share one write: a
commit waits for a save that started after its change (group commit), so a burst of
commits costs one file write rather than one each. Queries see only what is saved: a
commit whose save fails (a full disk) is refused and leaves the offsets as they were, so
that a restart never finds an offset older than one a query answered.
"""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpc import StatusCode

from mockbroker.errors import BrokerError
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

        Saved with the next commit.
        """
        for key, committed in self._table.items():
            if key[1] == topic and key[2] == queue_id and committed < new_min:
                self._skipped[key] = self._skipped.get(key, 0) + new_min - max(committed, old_min)
                self._version += 1

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
        for key in skipped:
            del self._skipped[key]
        self._version += 1
        try:
            await self._save(self._version)
        except OSError as exc:
            for key, value in gone.items():
                self._table.setdefault(key, value)
            for key, value in skipped.items():
                self._skipped.setdefault(key, value)
            raise _not_saved("deleted", exc) from exc
        self._groups = {g for g, _, _ in self._saved}
        return sorted(gone)

    def accept(self, updates: dict[OffsetKey, int]) -> int:
        """Take `updates` as the latest commits (latest() answers them, get() not yet).

        No I/O and no awaiting: a rule checked just before applies to exactly this state.
        The answer is the version to pass to save_accepted(), which must follow.
        """
        self._table.update(updates)
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
                    else:
                        del self._table[key]
            raise _not_saved("committed", exc) from exc
        self._groups.update(g for g, _, _ in updates)

    async def _save(self, version: int) -> None:
        async with self._save_lock:
            if self._saved_version >= version:
                return  # a save that started after our change already covered it
            current = self._version
            table = dict(self._table)
            snapshot = self._snapshot(table)
            await asyncio.to_thread(write_atomically, self._path, snapshot)
            self._saved_version = current
            self._saved = table

    def _snapshot(self, table: dict[OffsetKey, int]) -> bytes:
        nested: dict[str, dict[str, dict[str, int]]] = {}
        for (group, topic, qid), offset in sorted(table.items()):
            nested.setdefault(group, {}).setdefault(topic, {})[str(qid)] = offset
        skipped: dict[str, dict[str, dict[str, int]]] = {}
        for (group, topic, qid), count in sorted(self._skipped.items()):
            skipped.setdefault(group, {}).setdefault(topic, {})[str(qid)] = count
        return json.dumps({"offsets": nested, "skipped": skipped}, indent=1).encode()


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
