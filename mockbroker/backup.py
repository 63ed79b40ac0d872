"""Online backup: a consistent copy of a serving broker's data directory.

The cut is one moment on the event loop, between two writes: the commit-log end, each
consume queue's entry count and the index files' sizes are noted and a read-only
descriptor is opened on each of those files; the small state files (topics, consumer
offsets, locks, the schedule mark, the pop snapshot and journal, the format marker) are
read into memory. Nothing else runs meanwhile, and no fsync or copy happens then, so sends
wait only for that.

The copy then runs in a worker thread while the broker serves: every file up to its
noted end (the bytes below it never change: the log, the queues and the index are
append-only), the state files as read, and a checkpoint at the cut, each synced. Retention
is held until the copy is done, as it is the one thing that frees bytes below an end; a
segment it had already unlinked would still be read through its open descriptor.

The copy is a data directory a broker starts on as after a clean shutdown: restoring is
starting a broker on it. A failed copy removes what it wrote.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid
from mockbroker.store.checkpoint import Checkpoint, write_checkpoint
from mockbroker.store.files import fsync_dir
from mockbroker.store.message_store import MessageStore, StoreCut
from sdk.clock import Clock

#: Top-level entries that are not state: the directory lock, the crash marker, the
#: checkpoint (written afresh at the cut) and the store's own directories (copied by extent).
_NOT_STATE = frozenset({"lock", "running", "checkpoint", "commitlog", "consumequeue", "index"})
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BackupReport:
    """What a backup copied."""

    directory: Path
    #: Every record of the commit log before this position is in the copy, none after.
    commit_log_end: int
    #: Queue entries in the copy (messages still served, system topics included).
    messages: int
    files: int
    bytes: int
    seconds: float


def failed_precondition(message: str) -> BrokerError:
    """FAILED_PRECONDITION for a backup directory that cannot be used as it is."""
    return BrokerError(StatusCode.FAILED_PRECONDITION, "INVALID_ARGUMENT", message)


def check_target(data_dir: Path, directory: str) -> Path:
    """The backup directory, checked: absolute, outside the data directory, empty or new.

    INVALID_ARGUMENT for a path that can never be one, FAILED_PRECONDITION for one that
    cannot be one as things are.
    """
    if not directory:
        raise invalid("INVALID_ARGUMENT", "the backup directory is empty")
    if "\x00" in directory:  # no file system takes one, and Python raises ValueError
        raise invalid(
            "INVALID_ARGUMENT", f"the backup directory {directory!r} holds a NUL character"
        )
    path = Path(directory)
    if not path.is_absolute():
        raise invalid(
            "INVALID_ARGUMENT",
            f"the backup directory {directory!r} is not an absolute path "
            "(it is a path on the broker's machine)",
        )
    try:
        return _usable_target(data_dir, path, directory)
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symbolic link loop (3.11, 3.12)
        if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
            raise invalid(
                "INVALID_ARGUMENT", f"the backup directory {directory!r}: {exc.strerror}"
            ) from exc
        raise failed_precondition(
            f"the backup directory {directory} cannot be used: {exc}"
        ) from exc


def _usable_target(data_dir: Path, path: Path, directory: str) -> Path:
    """check_target's look at the file system (which may raise OSError and RuntimeError)."""
    target = path.resolve()
    data = data_dir.resolve()
    if target.is_relative_to(data):
        raise invalid(
            "INVALID_ARGUMENT",
            f"the backup directory {directory} is inside the broker's data directory {data}",
        )
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        if not target.parent.is_dir():
            raise failed_precondition(
                f"the backup directory's parent {target.parent} does not exist on the "
                "broker's machine"
            ) from None
        return target
    if not stat.S_ISDIR(mode):
        raise failed_precondition(f"the backup directory {directory} is not a directory")
    if any(target.iterdir()):
        raise failed_precondition(
            f"the backup directory {directory} exists and is not empty: "
            "give a new or empty directory"
        )
    return target


@dataclass
class _Cut:
    store: StoreCut
    sources: list[tuple[Path, int, int]]  # (path in the copy, open descriptor, bytes)
    state: list[tuple[Path, bytes]]  # (path in the copy, content)


class Backups:
    """Backups of one store, one at a time."""

    def __init__(self, store: MessageStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._running = False

    async def backup(self, directory: str) -> BackupReport:
        """Copy the data directory as of now into `directory` (on the broker's machine)."""
        target = check_target(self._store.data_dir, directory)
        if self._running:
            raise failed_precondition("a backup is already running; wait for it to finish")
        self._running = True
        started = self._clock.now()
        try:
            with self._store.retention_held():
                cut = self._take_cut()
                copying = asyncio.ensure_future(asyncio.to_thread(_write_copy, target, cut))
                try:
                    copied = await asyncio.shield(copying)
                except asyncio.CancelledError:
                    # A thread cannot be stopped: retention stays held until it is done.
                    with contextlib.suppress(Exception):
                        await copying
                    raise
        except OSError as exc:
            raise failed_precondition(
                f"the backup into {directory} failed and was removed: {exc}"
            ) from exc
        finally:
            self._running = False
        return BackupReport(
            directory=target,
            commit_log_end=cut.store.position,
            messages=cut.store.messages,
            files=len(cut.sources) + len(cut.state) + 1,
            bytes=copied,
            seconds=self._clock.now() - started,
        )

    def _take_cut(self) -> _Cut:
        """The cut (see the module docstring): no await in here."""
        data_dir = self._store.data_dir
        store = self._store.cut()
        sources: list[tuple[Path, int, int]] = []
        try:
            for path, size in store.extents:
                sources.append((path.relative_to(data_dir), os.open(path, os.O_RDONLY), size))
            state = [(p.relative_to(data_dir), p.read_bytes()) for p in _state_files(data_dir)]
        except BaseException:
            for _, fd, _ in sources:
                os.close(fd)
            raise
        return _Cut(store, sources, state)


def _state_files(data_dir: Path) -> list[Path]:
    """The small state files: top level and in subdirectories other than the store's."""
    found: list[Path] = []
    for entry in sorted(data_dir.iterdir()):
        if entry.name in _NOT_STATE or entry.name.endswith(".tmp"):
            continue
        if entry.is_dir():
            found += sorted(p for p in entry.rglob("*") if p.is_file() and p.suffix != ".tmp")
        elif entry.is_file():
            found.append(entry)
    return found


def _write_copy(target: Path, cut: _Cut) -> int:
    """Write the copy (a worker thread); the bytes written. Closes the cut's descriptors."""
    try:
        return _write_files(target, cut)
    finally:
        for _, fd, _ in cut.sources:
            os.close(fd)


def _write_files(target: Path, cut: _Cut) -> int:
    """Write every file of the copy, each synced; remove them all on a failure."""
    created = not target.exists()
    target.mkdir(exist_ok=True)
    try:
        dirs: set[Path] = {target}
        total = 0
        for rel, fd, size in cut.sources:
            dest = target / rel
            _make_parents(target, dest, dirs)
            total += _copy(fd, dest, size)
        for rel, data in cut.state:
            dest = target / rel
            _make_parents(target, dest, dirs)
            total += _write(dest, data)
        write_checkpoint(target / "checkpoint", Checkpoint(cut.store.position, cut.store.counts))
        for directory in sorted(dirs, key=lambda d: len(d.parts), reverse=True):
            fsync_dir(directory)
        fsync_dir(target.parent)
        return total
    except BaseException:
        if created:
            shutil.rmtree(target, ignore_errors=True)
        else:
            for entry in target.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        raise


def _make_parents(target: Path, path: Path, made: set[Path]) -> None:
    """Create `path`'s missing parents inside `target`, noting them in `made` (to sync)."""
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    while parent != target and parent not in made:
        made.add(parent)
        parent = parent.parent


def _copy(src: int, dest: Path, size: int) -> int:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        at = 0
        while at < size:
            chunk = os.pread(src, min(_CHUNK, size - at), at)
            if not chunk:
                raise OSError(f"{dest.name} ended at {at} bytes, before the cut at {size}")
            _write_all(fd, chunk)
            at += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    return size


def _write(dest: Path, data: bytes) -> int:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
