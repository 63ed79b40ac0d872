"""The commit log: every stored record of every queue, appended to segment files.

Positions are global byte offsets. A segment file is named by the position of its first
byte (20 digits) and is rolled before a write would take it past the segment size, so a
write never spans two files and a position maps to one file by bisection.

Retention deletes whole segments from the oldest on. The new start (the floor) is written
to the file `floor` before any segment is unlinked, so a crash in the middle of a deletion
leaves a floor whose segments below it `open` finishes deleting.

Reads may run in worker threads (message queries) while the event loop appends and
retention deletes: a segment is looked up and read under the same lock under which
retention takes it out and closes its file, so a read never uses a closed descriptor,
or one the number of which was given to another file meanwhile.

The next segment is made ahead of the writes, in a thread (segment_allocator.py): a roll
renames the spare, and the directory's sync that makes the new name durable is left to
the next flush, before which nothing in the new segment counts as durable. Neither waits
on the event loop for the file system's journal.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from mockbroker.store.checkpoint import read_positions, write_positions
from mockbroker.store.files import fault_point, fsync_dir, make_dirs
from mockbroker.store.segment_allocator import SegmentAllocator

_NAME_DIGITS = 20
_FLOOR_FILE = "floor"
_PAGE = 4096
_ZERO_PAGE = bytes(_PAGE)


@dataclass
class FlushPlan:
    """What one flush must sync: taken in the loop, executed in a worker thread."""

    target: int
    fds: list[int] = field(default_factory=list)
    #: A directory whose entries (a rolled-to segment's name) must be synced too.
    directory: Path | None = None


@dataclass
class _Segment:
    base: int
    path: Path
    fd: int
    size: int


class CommitLog:
    """Append-only segmented log with positional reads.

    `may_preallocate` says whether a spare segment may take its disk space now (see the
    module docstring); without it none is made.
    """

    def __init__(
        self,
        directory: Path,
        segment_bytes: int,
        *,
        may_preallocate: Callable[[], bool] | None = None,
    ) -> None:
        self._dir = directory
        self._segment_bytes = segment_bytes
        self._segments: list[_Segment] = []
        self._bases: list[int] = []
        self._unsynced_rolled: list[int] = []
        self.flushed = 0
        #: Held while reading a segment and while taking one out (see the docstring).
        self._guard = threading.Lock()
        self._may_preallocate = may_preallocate
        self._allocator = SegmentAllocator(directory, segment_bytes)
        self._unsynced_name = False  # a roll's new name awaits the directory's sync
        self._allocated_ahead = False  # the active segment was a spare: blocks past its end

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Open the existing segments, or create the first one."""
        make_dirs(self._dir)
        self._allocator.open()
        for path in sorted(self._dir.iterdir()):
            if path.name.isdigit() and len(path.name) == _NAME_DIGITS:
                fd = os.open(path, os.O_RDWR)
                self._add(_Segment(int(path.name), path, fd, os.fstat(fd).st_size))
        if not self._segments:
            self._create_first()
        floor = (read_positions(self._dir / _FLOOR_FILE, 1) or (0,))[0]
        if floor > self.start:
            self._unlink_below(floor)  # a deletion the last run did not finish
        self.flushed = self.end

    def close(self) -> None:
        """Close every segment file (does not flush) and remove the spare."""
        self._allocator.close()
        with self._guard:
            for seg in self._segments:
                os.close(seg.fd)
            self._segments.clear()
            self._bases.clear()
            self._unsynced_rolled.clear()

    # ------------------------------------------------------------------ writing
    @property
    def end(self) -> int:
        """The position the next append will take."""
        last = self._segments[-1]
        return last.base + last.size

    @property
    def start(self) -> int:
        """The position of the oldest byte still stored."""
        return self._segments[0].base

    def total_bytes(self) -> int:
        """Bytes held in all segments."""
        return sum(seg.size for seg in self._segments)

    def make_room(self, size: int) -> int:
        """Roll to a new segment if `size` bytes do not fit; return where they will go."""
        last = self._segments[-1]
        if last.size > 0 and last.size + size > self._segment_bytes:
            self._unsynced_rolled.append(last.fd)
            self._roll_to(last.base + last.size)
        return self.end

    def append(self, data: bytes) -> int:
        """Append `data` in one segment and return its position."""
        self.make_room(len(data))
        last = self._segments[-1]
        position = last.base + last.size
        view = memoryview(data)
        written = 0
        # A failed write leaves garbage past `size`: it is never indexed, and the store
        # truncates it (rolling the batch back), or recovery does.
        while written < len(data):
            written += os.pwrite(last.fd, view[written:], last.size + written)
        last.size += len(data)
        return position

    def begin_flush(self) -> FlushPlan:
        """Capture what must be synced to make everything appended so far durable."""
        fds = [*self._unsynced_rolled, self._segments[-1].fd]
        self._unsynced_rolled = []
        directory = self._dir if self._unsynced_name else None
        self._unsynced_name = False
        return FlushPlan(self.end, fds, directory)

    @staticmethod
    def execute_flush(plan: FlushPlan) -> None:
        """Fdatasync the plan's files; runs in a worker thread. Raises OSError on failure."""
        if plan.directory is not None:
            fsync_dir(plan.directory)
        for fd in plan.fds:
            os.fdatasync(fd)

    def complete_flush(self, plan: FlushPlan) -> None:
        """Record a successful flush."""
        self.flushed = max(self.flushed, plan.target)

    # ------------------------------------------------------------------ the spare segment
    def prepare_spare(self) -> None:
        """Have a spare segment made in a thread, if `may_preallocate` allows it."""
        if self._may_preallocate is not None and self._may_preallocate():
            self._allocator.want()

    def settle(self) -> None:
        """Wait for the allocator's thread to finish what it was given (tests)."""
        self._allocator.settle()

    @property
    def spare_ready(self) -> bool:
        """True when the next roll will rename a spare instead of creating a file."""
        return self._allocator.ready

    def give_back_space(self) -> None:
        """Free what was allocated ahead: the spare, and the active segment's unwritten rest.

        For a disk that is filling up. Raises OSError when the rest cannot be freed.
        """
        self._allocator.drop()
        if self._allocated_ahead:
            last = self._segments[-1]
            os.ftruncate(last.fd, last.size)  # the size it has: frees the blocks past it
            self._allocated_ahead = False

    def _roll_to(self, base: int) -> None:
        rolled = self._segments[-1]
        if self._allocated_ahead:
            self._allocator.trim_later(rolled.fd, rolled.size)
        path = self._dir / f"{base:0{_NAME_DIGITS}d}"
        fd = self._allocator.take(path)
        self._allocated_ahead = fd is not None
        if fd is None:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        self._add(_Segment(base, path, fd, 0))
        self._unsynced_name = True
        self.prepare_spare()

    # ------------------------------------------------------------------ reading
    def read(self, position: int, size: int) -> bytes:
        """Read `size` bytes at `position`, across segment boundaries if need be."""
        parts: list[bytes] = []
        with self._guard:
            while size > 0:
                seg = self._segment_at(position)
                offset = position - seg.base
                n = min(size, seg.size - offset)
                if n <= 0:
                    raise ValueError(f"read past the end of the commit log at {position}")
                parts.append(os.pread(seg.fd, n, offset))
                position += n
                size -= n
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def zeros_to_page_end(self, position: int) -> bool:
        """True when the bytes from `position` to the end of its 4 KiB page are all zeros.

        After a power cut that is the part of a page written after the last fsync that
        was never written back (see `holds_zero_page`); no record starts with a zero size.
        """
        seg = self._segment_at(position)
        offset = position - seg.base
        end = min(offset // _PAGE * _PAGE + _PAGE, seg.size)
        return end > offset and os.pread(seg.fd, end - offset, offset) == bytes(end - offset)

    def holds_zero_page(self, start: int, end: int) -> bool:
        """True when a whole 4 KiB page of a segment file between `start` and `end` is zeros.

        After a power cut that is a page written after the last fsync and never written
        back: the kernel writes dirty pages back in any order, and a lost one reads as zeros.
        """
        for seg in self._segments:
            lo, hi = max(start, seg.base) - seg.base, min(end, seg.base + seg.size) - seg.base
            page = -(-lo // _PAGE) * _PAGE  # the first page boundary at or after lo
            while page + _PAGE <= hi:
                if os.pread(seg.fd, _PAGE, page) == _ZERO_PAGE:
                    return True
                page += _PAGE
        return False

    def segment_ranges(self, start: int) -> Iterator[tuple[int, int]]:
        """(base, size) of each segment holding bytes at or after `start`."""
        for seg in self._segments:
            if seg.base + seg.size > start:
                yield seg.base, seg.size

    def extents(self, end: int) -> list[tuple[Path, int]]:
        """(file, bytes) of each segment's records below `end`, oldest first (a backup's cut)."""
        return [
            (seg.path, min(seg.size, end - seg.base)) for seg in self._segments if seg.base < end
        ]

    def segment_bases(self) -> list[int]:
        """The first position of every segment, oldest first."""
        return list(self._bases)

    # ------------------------------------------------------------------ retention
    def delete_below(self, floor: int) -> int:
        """Delete every segment below `floor`, a segment base; return the bytes freed.

        The floor is durable before the first unlink (see the module docstring). The
        active (last) segment is never deleted.
        """
        if floor not in self._bases[1:]:
            raise ValueError(f"retention floor {floor} is not the base of a later segment")
        write_positions(self._dir / _FLOOR_FILE, (floor,))
        fault_point("retention-floor-written")
        return self._unlink_below(floor)

    def _unlink_below(self, floor: int) -> int:
        freed = 0
        while len(self._segments) > 1 and self._segments[1].base <= floor:
            with self._guard:
                seg = self._segments.pop(0)
                self._bases.pop(0)
                if seg.fd in self._unsynced_rolled:
                    self._unsynced_rolled.remove(seg.fd)
                os.close(seg.fd)
            seg.path.unlink(missing_ok=True)
            freed += seg.size
            fault_point("retention-unlinked-one")
        fsync_dir(self._dir)
        return freed

    # ------------------------------------------------------------------ recovery
    def truncate(self, position: int) -> int:
        """Drop everything at and after `position`; return the number of bytes dropped."""
        self._allocator.void_trims()
        self._allocated_ahead = True  # the new end may be a former spare's, left untrimmed
        dropped = 0
        while len(self._segments) > 1 and self._segments[-1].base >= position:
            with self._guard:
                seg = self._segments.pop()
                self._bases.pop()
                os.close(seg.fd)
            dropped += seg.size
            seg.path.unlink()
        last = self._segments[-1]
        keep = max(position - last.base, 0)
        if keep < last.size or os.fstat(last.fd).st_size > keep:  # or a failed write's bytes
            dropped += max(last.size - keep, 0)
            os.ftruncate(last.fd, keep)
            os.fsync(last.fd)
            last.size = keep
        fsync_dir(self._dir)
        self.flushed = min(self.flushed, self.end)
        return dropped

    # ------------------------------------------------------------------ internals
    def _segment_at(self, position: int) -> _Segment:
        i = bisect.bisect_right(self._bases, position) - 1
        if i < 0:
            raise ValueError(f"position {position} precedes the commit log")
        return self._segments[i]

    def _add(self, seg: _Segment) -> None:
        self._segments.append(seg)
        self._bases.append(seg.base)

    def _create_first(self) -> None:
        path = self._dir / f"{0:0{_NAME_DIGITS}d}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        fsync_dir(self._dir)
        self._add(_Segment(0, path, fd, 0))
