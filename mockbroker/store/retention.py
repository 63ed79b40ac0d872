"""Retention: which commit-log segments may go, and how full the disk is.

RocketMQ's defaults: a segment is kept 72 hours after its last write; when the disk is more
than 75 % used the oldest segments go earlier, one per check, but only those every group
has read (early_deletion.py); above 85 % the oldest go read or not, as many as it takes to
get back under 85 %; above 90 % sends are refused until space is freed. A cap on the
broker's own data (`max_data_bytes`, none by default) deletes the oldest segments, read or
not, while the commit log is over it, and refuses sends while that cannot bring it under. Whole
segments go, oldest first, and never one that holds a record still needed (a scheduled
message not yet delivered) or one not yet covered by a checkpoint.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mockbroker.store.files import bytes_on_disk


@dataclass(frozen=True)
class DiskUsage:
    """What the file system holding the data directory reports."""

    total_bytes: int
    used_bytes: int

    @property
    def ratio(self) -> float:
        """Used share of the disk, 0..1 (0 when the size is unknown)."""
        return self.used_bytes / self.total_bytes if self.total_bytes > 0 else 0.0

    @property
    def free_bytes(self) -> int:
        """Bytes still free."""
        return max(self.total_bytes - self.used_bytes, 0)


#: Reports the disk usage now; injected (like the clock) so tests can set it.
DiskProbe = Callable[[], DiskUsage]


@dataclass(frozen=True)
class RetentionPolicy:
    """How long segments are kept, the disk-use thresholds and the cap on the data.

    The ratios are shares of the disk in use, as `df` and RocketMQ reckon them (the
    probe's DiskUsage); `max_data_bytes` caps the commit log's bytes (None: no cap).
    """

    retention_seconds: float = 72 * 3600.0
    clean_ratio: float = 0.75
    force_ratio: float = 0.85
    refuse_ratio: float = 0.90
    max_data_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.retention_seconds <= 0:
            raise ValueError("retention_hours must be positive")
        if self.max_data_bytes is not None and self.max_data_bytes <= 0:
            raise ValueError(
                f"max_data_bytes must be a positive number of bytes, not {self.max_data_bytes}"
            )
        if not 0 < self.clean_ratio <= self.force_ratio <= self.refuse_ratio <= 1:
            raise ValueError(
                "disk ratios must satisfy 0 < high <= force <= refuse <= 1, not "
                f"{self.clean_ratio}, {self.force_ratio}, {self.refuse_ratio}"
            )


@dataclass
class RetentionStats:
    """What retention did since start."""

    segments_deleted: int = 0
    #: Of those, deleted before their retention time (disk about to fill, the cap).
    segments_deleted_early: int = 0
    bytes_deleted: int = 0
    messages_deleted: int = 0
    #: Messages of topics with their own retention that expired (topic_expiry.py).
    messages_expired: int = 0
    sends_refused: int = 0


def statvfs_probe(directory: Path) -> DiskProbe:
    """The usage of the file system `directory` lives on, as `df` and RocketMQ reckon it.

    Used: the blocks in use. Total: those and the ones the broker may still write. The
    blocks the file system keeps for root (ext4: 5% by default; far more on some
    machines) count as neither, so the ratio is `df`'s Use% (RocketMQ's
    getDiskPartitionSpaceUsedPercent), and 1 exactly when nothing more can be written.
    """

    def probe() -> DiskUsage:
        st = os.statvfs(directory)
        used = (st.f_blocks - st.f_bfree) * st.f_frsize
        return DiskUsage(used + st.f_bavail * st.f_frsize, used)

    return probe


def file_probe(settings: Path, directory: Path) -> DiskProbe:
    """A simulated disk for tests: `settings` (JSON) gives its size and what else uses it.

    `{"total_bytes": N, "other_used_bytes": M}`: used is M plus the bytes the files under
    `directory` occupy, so deleting segments frees simulated space as it would real space.
    The file is read at every probe; a test rewrites it to fill or free the disk.
    """

    def probe() -> DiskUsage:
        text = settings.read_text()
        try:
            conf = json.loads(text)
            total, other = int(conf["total_bytes"]), int(conf["other_used_bytes"])
        except (ValueError, KeyError, TypeError) as exc:
            # Caught while a test rewrites it (write_text truncates first): like a failed
            # read of the disk's size, the check is tried again at the next one.
            raise OSError(f"{settings}: not a disk description ({exc}): {text[:80]!r}") from None
        return DiskUsage(total, other + bytes_on_disk(directory))

    return probe


def age_floor(
    bases: list[int], first_timestamp_ms: Callable[[int], int], horizon_ms: int, limit: int
) -> int:
    """The new start of the log once every segment past the age limit is deleted.

    Segment i holds nothing stored at or after `horizon_ms` when the first record of
    segment i + 1 was stored before it. The last segment is never deleted, nor anything at
    or after `limit`.
    """
    floor = bases[0]
    for nxt in bases[1:]:
        if nxt > limit or first_timestamp_ms(nxt) >= horizon_ms:
            break
        floor = nxt
    return floor


def next_floor(bases: list[int], start: int, limit: int) -> int | None:
    """The start of the log once its oldest segment is deleted (None: none may go)."""
    for nxt in bases:
        if nxt > start:
            return nxt if nxt <= limit else None
    return None
