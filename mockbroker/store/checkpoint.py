"""The checkpoint and the crash marker.

The checkpoint is a commit log position P: every index entry of every record below P is
durable in the consume queues, so recovery after a crash replays the commit log from P.
The marker file exists while the broker runs; finding it at start means the last run did
not shut down cleanly.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from mockbroker.store.files import fsync_dir, write_atomically

_CHECKPOINT = struct.Struct("<QI")


def read_checkpoint(path: Path) -> int:
    """The recorded position, or 0 when missing or unreadable (replay everything)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) != _CHECKPOINT.size:
        return 0
    position, crc = _CHECKPOINT.unpack(data)
    if zlib.crc32(data[:8]) != crc:
        return 0
    return int(position)


def write_checkpoint(path: Path, position: int) -> None:
    """Durably record `position`."""
    head = struct.pack("<Q", position)
    write_atomically(path, head + struct.pack("<I", zlib.crc32(head)))


def mark_running(marker: Path) -> bool:
    """Create the running marker; return True when one was already there (a crash)."""
    crashed = marker.exists()
    marker.touch()
    fsync_dir(marker.parent)
    return crashed


def mark_clean_shutdown(marker: Path) -> None:
    """Remove the running marker after everything is flushed."""
    marker.unlink(missing_ok=True)
    fsync_dir(marker.parent)
