"""Consume queue: the per-(topic, queue) index of fixed-size entries into the commit log.

Entry k describes the message at queue offset k: (commit log position, record size, tag
hash). A size of CORRUPT_SIZE marks an offset whose record was found corrupt at recovery.
Entries are read from the file on demand. The newest ones (at most TAIL_BYTES) are kept
in memory until they fill that or the flusher writes them before its sync: a batch over
several queues costs one write a queue only every so often, not one each. Nothing relies
on an entry past the last checkpoint being in the file: recovery rebuilds those from the
commit log, and the flusher writes every queue's tail before a checkpoint counts it.

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
#: Bytes of entries a queue keeps in memory before it writes them to its file.
TAIL_BYTES = 200 * ENTRY.size


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
        # (entries in the file, the packed entries after them kept in memory): replaced
        # whole, never changed in place, so a reader in another thread takes both at once.
        self._tail: tuple[int, bytes] = (self.count, b"")

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
        """Append already-packed entries (written to the file once the tail is full)."""
        in_file, tail = self._tail
        self._tail = (in_file, tail + packed_entries)
        self.count += len(packed_entries) // ENTRY.size
        self.dirty = True
        if len(tail) + len(packed_entries) >= TAIL_BYTES:
            self.write_tail()

    def write_tail(self) -> None:
        """Write the entries kept in memory to the file (the flusher's, before a sync).

        On an error they stay in memory, and bytes of them a short write left in the
        file are overwritten by the next try (or dropped by `truncate`).
        """
        in_file, tail = self._tail
        if not tail:
            return
        view = memoryview(tail)
        written = 0
        start = in_file * ENTRY.size
        while written < len(view):
            written += os.pwrite(self._fd, view[written:], start + written)
        self._tail = (in_file + len(tail) // ENTRY.size, b"")

    def read(self, offset: int, n: int) -> list[tuple[int, int, int]]:
        """Up to `n` entries from `offset` as (position, size, tag hash)."""
        in_file, tail = self._tail  # one snapshot: the loop may write the tail meanwhile
        n = min(n, in_file + len(tail) // ENTRY.size - offset)
        if n <= 0:
            return []
        if offset >= in_file:
            start = (offset - in_file) * ENTRY.size
            return list(ENTRY.iter_unpack(tail[start : start + n * ENTRY.size]))
        data = os.pread(self._fd, (min(n, in_file - offset)) * ENTRY.size, offset * ENTRY.size)
        if offset + n > in_file:
            data += tail[: (offset + n - in_file) * ENTRY.size]
        return list(ENTRY.iter_unpack(data))

    def entry(self, offset: int) -> tuple[int, int, int]:
        """The entry at `offset` (which must exist)."""
        return self.read(offset, 1)[0]

    def truncate(self, count: int) -> None:
        """Keep only the first `count` entries (and drop bytes a failed write left)."""
        in_file, tail = self._tail
        if count >= in_file:  # the file keeps its entries: only the tail is cut
            if count < self.count:
                self._tail = (in_file, tail[: (count - in_file) * ENTRY.size])
                self.count = count
                self.dirty = True
            if os.fstat(self._fd).st_size > in_file * ENTRY.size:
                os.ftruncate(self._fd, in_file * ENTRY.size)
            return
        os.ftruncate(self._fd, count * ENTRY.size)
        self._tail = (count, b"")
        self.count = count
        self._min = min(self._min, count)
        self.dirty = True

    def count_before(self, position: int, lo: int = 0, hi: int | None = None) -> int:
        """How many entries point below commit log `position` (positions only grow).

        The search covers entries `lo` to `hi` (default: all): an answer below `lo` comes
        back as `lo`, and none is above `hi`.
        """
        hi = self.count if hi is None else hi
        if hi > lo and self.entry(hi - 1)[0] < position and self.entry(lo)[0] < position:
            # The common case: everything indexed is below it. The first entry is read too:
            # a damaged last one (a position under the log) would otherwise claim them all.
            return hi
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
        """Close the index file; entries still in memory are dropped (`write_tail` first)."""
        os.close(self._fd)
