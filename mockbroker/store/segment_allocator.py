"""Commit-log segments allocated ahead of the writes, in a thread of their own.

Creating a file and allocating its blocks wait on the file system's journal, which the
periodic flush keeps busy for a hundred milliseconds at a time under heavy writes: done on
the event loop at a roll, they stalled every client (docs/reliability.md). Writes into
blocks allocated beforehand do not wait so.

The allocator keeps one spare file, `spare` in the commit log's directory (never a
segment by its name), with a whole segment's blocks allocated and its size 0. A roll takes
it and renames it. A segment is rolled when the next write does not fit, so the blocks past
a rolled segment's end were allocated for nothing: the same thread frees them (a truncation
to the size it has), unless the log truncated that segment since (`void_trims`).

The thread is started once, when the log opens, and waits for work until the log closes:
`Thread.start` waits until the new thread runs, which on a busy machine (a flood of sends
keeping every core busy) took tens of milliseconds, and a roll that started one stalled the
event loop that long.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from mockbroker.store.files import allocate

log = logging.getLogger("mockbroker.store")

SPARE_FILE = "spare"


@dataclass
class _Trim:
    fd: int  # a duplicate of the rolled segment's descriptor: retention may close its own
    size: int
    void: bool = False


class SegmentAllocator:
    """Makes the spare segment and frees rolled segments' unused blocks, off the loop."""

    def __init__(self, directory: Path, segment_bytes: int) -> None:
        self._path = directory / SPARE_FILE
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()  # every field below
        self._spare: int | None = None  # the spare's descriptor, once it is made
        self._wanted = False
        self._unable = False  # the file system cannot allocate blocks ahead
        self._no_room = False  # the last try found the disk full (logged once)
        self._trims: list[_Trim] = []
        #: Notified when work is added, when the thread has done all it was given, and
        #: when the thread is to stop.
        self._changed = threading.Condition(self._lock)
        self._busy = False  # the thread is doing what it took
        self._stopping = False
        self._worker: threading.Thread | None = None
        #: Held while a rolled segment is truncated, and while the log voids those pending.
        self._trimming = threading.Lock()

    @property
    def ready(self) -> bool:
        """True when a spare is made and not taken."""
        return self._spare is not None

    def open(self) -> None:
        """Remove a spare the last run left, and start the thread (at the log's open)."""
        self._path.unlink(missing_ok=True)
        with self._lock:
            self._start_locked()

    def want(self) -> None:
        """Make a spare (in the thread) unless one is ready or being made."""
        with self._lock:
            if self._unable:
                return
            self._wanted = True
            if self._spare is None:  # else nothing to do
                self._wake_locked()

    def take(self, path: Path) -> int | None:
        """Rename the spare to `path` and return its descriptor (None: there is none).

        Raises OSError when the rename fails (the spare is then gone).
        """
        with self._lock:  # else the thread could begin the next one under the same name
            fd, self._spare = self._spare, None
            if fd is not None:
                try:
                    os.rename(self._path, path)
                except OSError:
                    self._discard(fd)
                    raise
        return fd

    def drop(self) -> None:
        """Remove the spare, and one being made once it is: its space goes back."""
        with self._lock:
            fd, self._spare = self._spare, None
            self._wanted = False
        if fd is not None:
            self._discard(fd)

    def trim_later(self, fd: int, size: int) -> None:
        """Free the blocks past `size` of a rolled segment (its descriptor `fd`), in the thread."""
        trim = _Trim(os.dup(fd), size)
        with self._lock:
            self._trims.append(trim)
            self._wake_locked()

    def void_trims(self) -> None:
        """The log is about to truncate a segment: no pending trim may touch it afterwards."""
        with self._trimming, self._lock:
            for trim in self._trims:
                trim.void = True

    def settle(self) -> None:
        """Wait until the thread has done all it was asked."""
        with self._lock:
            while self._worker is not None and (self._busy or self._has_work_locked()):
                self._changed.wait()

    def close(self) -> None:
        """Settle, stop the thread, then remove the spare."""
        self.settle()
        with self._lock:
            worker, self._worker = self._worker, None
            self._stopping = True
            self._changed.notify_all()
        if worker is not None:
            worker.join()
        with self._lock:
            self._stopping = False  # a later want() or trim_later() starts a thread again
        self.drop()

    def _has_work_locked(self) -> bool:
        return bool(self._trims) or (self._wanted and self._spare is None)

    def _wake_locked(self) -> None:
        self._start_locked()  # not opened (or closed): started here, once
        self._changed.notify_all()

    def _start_locked(self) -> None:
        if self._worker is None:
            self._worker = threading.Thread(
                target=self._work, name="commitlog-allocator", daemon=True
            )
            self._worker.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                self._busy = False
                while not self._has_work_locked():
                    self._changed.notify_all()  # settle() waits for this
                    if self._stopping:
                        return
                    self._changed.wait()
                self._busy = True
                trim = self._trims[0] if self._trims else None
            if trim is not None:
                self._trim(trim)
                with self._lock:
                    self._trims.remove(trim)
                continue
            fd = self._make()
            with self._lock:
                if fd is None:
                    self._wanted = False  # tried again at the next roll
                elif self._wanted and self._spare is None:
                    self._spare, fd = fd, None
            if fd is not None:
                self._discard(fd)  # dropped while it was being made

    def _trim(self, trim: _Trim) -> None:
        try:
            with self._trimming:
                if not trim.void:
                    os.ftruncate(trim.fd, trim.size)  # the size it has: frees the blocks past it
        except OSError as exc:
            log.warning("cannot free the unused end of a commit-log segment: %s", exc)
        finally:
            os.close(trim.fd)

    def _make(self) -> int | None:
        fd: int | None = None
        try:
            fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            allocate(fd, self._segment_bytes)
        except OSError as exc:
            if fd is not None:
                self._discard(fd)
            if exc.errno == errno.ENOSPC:  # tried again at the next roll or disk check
                if not self._no_room:
                    log.info("no room for a spare commit-log segment: %s", exc)
                self._no_room = True
            else:  # a file system without fallocate: it will not have it at the next try
                self._unable = True
                log.warning("cannot allocate commit-log segments ahead (%s): each is created "
                            "at its roll", exc)  # fmt: skip
            return None
        self._no_room = False
        return fd

    def _discard(self, fd: int) -> None:
        os.close(fd)
        self._path.unlink(missing_ok=True)
