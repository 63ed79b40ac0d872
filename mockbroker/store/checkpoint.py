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


def read_positions(path: Path, count: int) -> tuple[int, ...] | None:
    """The `count` positions recorded in `path`, or None when missing or unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    layout = struct.Struct(f"<{count}QI")
    if len(data) != layout.size:
        return None
    *positions, crc = layout.unpack(data)
    if zlib.crc32(data[: 8 * count]) != crc:
        return None
    return tuple(int(p) for p in positions)


def write_positions(path: Path, positions: tuple[int, ...]) -> None:
    """Durably record `positions` (crash-safe: the old or the new content survives)."""
    head = struct.pack(f"<{len(positions)}Q", *positions)
    write_atomically(path, head + struct.pack("<I", zlib.crc32(head)))


def read_checkpoint(path: Path) -> int:
    """The recorded position, or 0 when missing or unreadable (replay everything)."""
    positions = read_positions(path, 1)
    return positions[0] if positions is not None else 0


def write_checkpoint(path: Path, position: int) -> None:
    """Durably record `position`."""
    write_positions(path, (position,))


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
