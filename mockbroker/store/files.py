"""Small durable-file helpers: atomic replace and directory fsync."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger("mockbroker.store")

_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_punch_supported = True


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
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: give back what the partial copy took
        raise
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def bytes_on_disk(directory: Path) -> int:
    """The disk space the files under `directory` take, in bytes.

    The broker renames and deletes files while it counts (a temporary file replacing its
    target, a segment retention removes): one gone by the time it is looked at takes nothing.
    """
    total = 0
    for root, _dirs, names in os.walk(directory):
        for name in names:
            try:
                info = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            total += info.st_blocks * 512
    return total


def allocate(fd: int, length: int) -> None:
    """Allocate disk blocks for a file's first `length` bytes, leaving its size as it is.

    Writes into allocated blocks need no allocation while the file system is busy writing
    back. Raises OSError where there is no room or the file system cannot do it.
    """
    if _libc.fallocate(fd, _FALLOC_FL_KEEP_SIZE, 0, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def punch_hole(fd: int, length: int) -> None:
    """Free the disk blocks of a file's first `length` bytes; they read back as zeros.

    The file keeps its size and every later byte its offset, so an index of fixed-size
    entries can drop its head in place. Where the file system cannot punch holes the
    space is simply kept (logged once).
    """
    global _punch_supported
    if length <= 0 or not _punch_supported:
        return
    mode = _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE
    if _libc.fallocate(fd, mode, 0, length) != 0:
        err = ctypes.get_errno()
        _punch_supported = False
        log.warning("cannot free index space here (%s): trimmed index heads keep their blocks",
                    os.strerror(err))  # fmt: skip


def fault_point(name: str) -> None:
    """Kill this process here when the environment names this point (crash tests only).

    `ORDERMQ_FAULT_POINT=<name>` makes the broker die as kill -9 would at that step.
    """
    if os.environ.get("ORDERMQ_FAULT_POINT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
