"""Small durable-file helpers: atomic replace and directory fsync."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DirectoryLock:
    """An exclusive lock on a data directory, held while a broker uses it."""

    def __init__(self, directory: Path) -> None:
        self._path = directory / "lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise OSError naming the process that holds it."""
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OSError(
                f"data directory {self._path.parent} is in use by another broker (pid {holder})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Give the lock up."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (new, renamed or removed files) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """Create `directory` and its missing parents, each one's name made durable."""
    if directory.is_dir():
        return
    make_dirs(directory.parent)
    try:
        directory.mkdir()
    except FileExistsError:
        return
    fsync_dir(directory.parent)


def open_durably(path: Path, flags: int) -> int:
    """`os.open` with O_CREAT whose new file keeps its name through a power cut.

    Syncing a file's data does not make its name durable: its directory must be synced
    after it was created (and so must its parents', when they are new).
    """
    make_dirs(path.parent)
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return os.open(path, flags)
    try:
        fsync_dir(path.parent)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
