"""The checkpoint and the crash marker.

The checkpoint is a commit log position P with the number of index entries each consume
queue had when P was taken: those entries are durable, and they are all of the entries
that point below P, so recovery after a crash truncates each queue to its count and replays
the commit log from P. Entries past the count are not trusted: a power cut keeps any subset
of the pages written after the last fsync (holes of zeros, entries torn at a page
boundary). A checkpoint written before the counts existed has none (`counts` is None).

`read_positions`/`write_positions` keep other small position files the same crash-safe way
(`commitlog/floor`, `schedule-mark`).

The marker file exists while the broker runs; finding it at start means the last run did
not shut down cleanly.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
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


_OLD = struct.Struct("<QI")  # position, CRC of the position
_MAGIC = b"CKP2"
_HEAD = struct.Struct("<4sQI")  # magic, position, number of queues
_QUEUE = struct.Struct("<HQ")  # name length, entry count; the name follows
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class Checkpoint:
    """A commit log position, and each queue's entry count then ("topic/queue id")."""

    position: int
    counts: dict[str, int] | None


_NONE = Checkpoint(0, None)  # replay everything


def read_checkpoint(path: Path) -> Checkpoint:
    """The recorded checkpoint, or position 0 when missing or unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return _NONE
    if len(data) == _OLD.size:
        position, crc = _OLD.unpack(data)
        return Checkpoint(int(position), None) if zlib.crc32(data[:8]) == crc else _NONE
    if len(data) < _HEAD.size + _CRC.size or not data.startswith(_MAGIC):
        return _NONE
    if zlib.crc32(data[: -_CRC.size]) != _CRC.unpack_from(data, len(data) - _CRC.size)[0]:
        return _NONE
    _, position, n = _HEAD.unpack_from(data)
    counts: dict[str, int] = {}
    at = _HEAD.size
    try:
        for _ in range(n):
            length, count = _QUEUE.unpack_from(data, at)
            at += _QUEUE.size
            counts[data[at : at + length].decode()] = count
            at += length
    except (struct.error, UnicodeDecodeError):
        return _NONE
    return Checkpoint(int(position), counts)


def write_checkpoint(path: Path, checkpoint: Checkpoint) -> None:
    """Durably record `checkpoint` (which must have counts)."""
    assert checkpoint.counts is not None
    parts = [_HEAD.pack(_MAGIC, checkpoint.position, len(checkpoint.counts))]
    for name, count in checkpoint.counts.items():
        raw = name.encode()
        parts += [_QUEUE.pack(len(raw), count), raw]
    data = b"".join(parts)
    write_atomically(path, data + _CRC.pack(zlib.crc32(data)))


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
