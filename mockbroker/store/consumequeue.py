"""Consume queue: the per-(topic, queue) index of fixed-size entries into the commit log.

Entry k describes the message at queue offset k: (commit log position, record size, tag
hash). A size of CORRUPT_SIZE marks an offset whose record was found corrupt at recovery.
Entries are read from the file on demand; none are kept in memory.

Retention moves `min_offset`: the entries below it point into deleted commit-log segments
or are expired by their topic's own retention, and their blocks are freed (they read back
as zeros, which keeps positions ascending). The min offset is not stored: the store's
open trims below the commit log's start, and its first retention check expires again what
its topic's retention expired (topic_expiry.py).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from mockbroker.store.files import open_durably, punch_hole

ENTRY = struct.Struct("<qiq")
CORRUPT_SIZE = -1


class ConsumeQueue:
    """One queue's index file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = open_durably(path, os.O_RDWR)
        size = os.fstat(self._fd).st_size
        if size % ENTRY.size:
            # A torn entry from a crash: the commit log replay writes it again.
            size -= size % ENTRY.size
            os.ftruncate(self._fd, size)
        self.count = size // ENTRY.size
        self.dirty = False
        self._min = 0

    @property
    def name(self) -> str:
        """The queue's name in a checkpoint: "topic/queue id"."""
        return f"{self.path.parent.name}/{self.path.name}"

    @property
    def max_offset(self) -> int:
        """The queue offset the next message will take."""
        return self.count

    @property
    def min_offset(self) -> int:
        """The oldest queue offset still served."""
        return self._min

    def trim_below(self, position: int) -> int:
        """Drop the entries that point below commit-log `position`; the new min offset.

        The min offset never moves backwards.
        """
        return self.trim_to(self.count_before(position, lo=self._min))

    def trim_to(self, offset: int) -> int:
        """Drop the entries below queue `offset` (expired); the new min offset.

        The min offset never moves backwards nor past the end.
        """
        trimmed = min(max(self._min, offset), self.count)
        if trimmed > self._min:
            self._min = trimmed
            punch_hole(self._fd, trimmed * ENTRY.size)
        return self._min

    def append(self, packed_entries: bytes) -> None:
        """Append already-packed entries."""
        n = len(packed_entries) // ENTRY.size
        view = memoryview(packed_entries)
        written = 0
        start = self.count * ENTRY.size
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], start + written)
        self.count += n
        self.dirty = True

    def read(self, offset: int, n: int) -> list[tuple[int, int, int]]:
        """Up to `n` entries from `offset` as (position, size, tag hash)."""
        n = min(n, self.count - offset)
        if n <= 0:
            return []
        data = os.pread(self._fd, n * ENTRY.size, offset * ENTRY.size)
        return list(ENTRY.iter_unpack(data))

    def entry(self, offset: int) -> tuple[int, int, int]:
        """The entry at `offset` (which must exist)."""
        return self.read(offset, 1)[0]

    def truncate(self, count: int) -> None:
        """Keep only the first `count` entries (and drop bytes a failed append left)."""
        if count < self.count or os.fstat(self._fd).st_size > count * ENTRY.size:
            os.ftruncate(self._fd, count * ENTRY.size)
            self.count = count
            self._min = min(self._min, count)
            self.dirty = True

    def count_before(self, position: int, lo: int = 0, hi: int | None = None) -> int:
        """How many entries point below commit log `position` (positions only grow).

        The search covers entries `lo` to `hi` (default: all): an answer below `lo` comes
        back as `lo`, and none is above `hi`.
        """
        hi = self.count if hi is None else hi
        if hi > lo and self.entry(hi - 1)[0] < position:
            return hi  # the common case: everything indexed is below it
        while lo < hi:
            mid = (lo + hi) // 2
            pos = self.entry(mid)[0]
            if pos < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def fileno(self) -> int:
        """The index file's descriptor, for flushing from a worker thread."""
        return self._fd

    def close(self) -> None:
        """Close the index file."""
        os.close(self._fd)
