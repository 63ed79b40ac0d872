"""Early deletion: unread messages wait for a shared disk to be about to fill; the cap on
the broker's own data deletes oldest first, read or not, and refuses sends it cannot meet."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from mockbroker.errors import BrokerError
from mockbroker.store.early_deletion import Committed, early_reason, unread_by_group
from mockbroker.store.message_store import MessageStore
from mockbroker.store.retention import DiskUsage, RetentionPolicy
from sdk.testing import FakeClock
from tests.unit.test_retention import (
    SEGMENT,
    FakeDisk,
    checkpoint,
    offsets_served,
    open_store,
    send,
)

POLICY = RetentionPolicy()


def usage(ratio: float) -> DiskUsage:
    return DiskUsage(1000, int(ratio * 1000))


@pytest.mark.parametrize(
    ("ratio", "has_unread", "deleted"),
    [
        (0.70, False, False),
        (0.80, False, True),
        (0.80, True, False),
        (0.849, True, False),
        (0.85, True, True),
        (0.95, True, True),
    ],
    ids=["under clean", "read over clean", "unread over clean", "unread under force",
         "unread at force", "unread over refuse"],
)  # fmt: skip
def test_the_decision_keeps_unread_segments_until_the_force_ratio(
    ratio: float, has_unread: bool, deleted: bool
) -> None:
    assert (early_reason(POLICY, usage(ratio), 0, has_unread) is not None) is deleted


def test_the_cap_deletes_unread_segments_at_any_disk_use() -> None:
    capped = RetentionPolicy(max_data_bytes=1000)
    assert early_reason(capped, usage(0.10), 1000, True) is None, "at the cap: kept"
    why = early_reason(capped, usage(0.10), 1001, True)
    assert why is not None and "max_data_bytes 1000" in why


@pytest.mark.parametrize("cap", [0, -5])
def test_a_cap_that_is_not_positive_is_refused_with_its_name(cap: int) -> None:
    with pytest.raises(ValueError, match=f"max_data_bytes must be a positive.*{cap}"):
        RetentionPolicy(max_data_bytes=cap)


def test_unread_counts_each_group_from_its_offset_and_ignores_topics_nobody_reads() -> None:
    trims = {("t", 0): (10, 40), ("t", 1): (0, 5), ("lonely", 0): (0, 100)}
    committed: list[Committed] = [
        ("behind", "t", 0, 25),  # 15 unread on queue 0; queue 1 never committed: 5 unread
        ("done", "t", 0, 40),
        ("done", "t", 1, 9),
        ("older", "t", 0, 3),  # below the current minimum: counts from 10, 30 unread
    ]
    assert unread_by_group(trims, committed) == {"behind": 20, "older": 35}
    assert unread_by_group({("lonely", 0): (0, 100)}, committed) == {}


def filled(loop: asyncio.AbstractEventLoop, path: Path, disk: FakeDisk) -> MessageStore:
    """A store with about 7 segments of topic t queue 0 (60 messages), checkpointed."""
    store = open_store(loop, path, FakeClock(), disk)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 60)
    checkpoint(loop, store)
    return store


def test_a_shared_disk_over_the_clean_ratio_deletes_only_what_every_group_read(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FakeDisk()
    store = filled(loop, tmp_path, disk)
    table: dict[str, int] = {"fast": 60, "slow": 0}
    store.committed_offsets = lambda: [(g, "t", 0, o) for g, o in table.items()]
    cq = store.queue(store.topics.get("t"), 0)
    start = store.commitlog.start

    disk.ratio = 0.80  # other programs' files: over the clean ratio, under the force ratio
    caplog.set_level(logging.WARNING, "mockbroker")
    for _ in range(3):
        store.enforce_retention()
    assert store.commitlog.start == start and cq.min_offset == 0, "slow has read nothing"
    assert not caplog.records

    table["slow"] = 20  # slow read the first ~2 segments: those may go, one per check
    store.enforce_retention()
    store.enforce_retention()
    store.enforce_retention()
    assert 0 < cq.min_offset <= 20, "only segments every group read went"
    early = [r for r in caplog.records if getattr(r, "event", "") == "retention.early_deletion"]
    assert early and all(r.levelno == logging.WARNING for r in early)
    assert all("every group had read" in r.getMessage() for r in early)
    assert all(r.fields["unread"] == {} for r in early)  # type: ignore[attr-defined]
    assert store.retention_stats.segments_deleted_early == len(early)
    loop.run_until_complete(store.close())


def test_a_disk_about_to_fill_deletes_unread_segments_and_names_the_groups(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FakeDisk()
    store = filled(loop, tmp_path, disk)
    store.committed_offsets = lambda: [("fast", "t", 0, 60), ("slow", "t", 0, 0)]
    cq = store.queue(store.topics.get("t"), 0)

    disk.ratio = 0.86  # about to fill: unread data goes, until under the force ratio
    caplog.set_level(logging.WARNING, "mockbroker")
    store.enforce_retention()
    assert cq.min_offset > 0 and not store.refusing_sends
    early = [r for r in caplog.records if getattr(r, "event", "") == "retention.early_deletion"]
    assert early
    first = early[0]
    assert "force ratio" in first.getMessage() and "slow (" in first.getMessage()
    assert "fast" not in first.getMessage()
    lost = sum(r.fields["unread"]["slow"] for r in early)  # type: ignore[attr-defined]
    assert lost == cq.min_offset, "the log counts every unread message deleted"
    assert f"{first.fields['segment']:020d}" in first.getMessage()  # type: ignore[attr-defined]
    loop.run_until_complete(store.close())


def capped_store(
    loop: asyncio.AbstractEventLoop, path: Path, disk: FakeDisk, cap: int
) -> MessageStore:
    """A store capped at `cap` bytes, where group slow has read nothing of topic t."""
    store = open_store(loop, path, FakeClock(), disk, RetentionPolicy(max_data_bytes=cap))
    store.committed_offsets = lambda: [("slow", "t", 0, 0)]
    return store


def test_the_cap_deletes_the_oldest_segments_read_or_not_and_logs_the_groups(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FakeDisk()  # 10 % used: only the cap deletes anything
    store = capped_store(loop, tmp_path, disk, 3 * SEGMENT)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 60)
    checkpoint(loop, store)
    bases = store.commitlog.segment_bases()
    assert store.commitlog.total_bytes() > 3 * SEGMENT

    caplog.set_level(logging.WARNING, "mockbroker")
    store.enforce_retention()
    assert store.commitlog.total_bytes() <= 3 * SEGMENT and not store.refusing_sends
    kept = store.commitlog.segment_bases()
    assert kept == bases[len(bases) - len(kept) :], "the oldest went, the newest stayed"
    cq = store.queue(topic, 0)
    assert offsets_served(store, topic, cq.min_offset) == list(range(cq.min_offset, 60))
    early = [r for r in caplog.records if getattr(r, "event", "") == "retention.early_deletion"]
    assert len(early) == len(bases) - len(kept), "one warning per segment"
    assert all("max_data_bytes" in r.getMessage() for r in early)
    assert sum(r.fields["unread"]["slow"] for r in early) == cq.min_offset  # type: ignore[attr-defined]

    loop.run_until_complete(store.close())  # a restart keeps the cap
    store = capped_store(loop, tmp_path, disk, 3 * SEGMENT)
    topic = store.topics.get("t")
    send(loop, store, topic, 30)
    checkpoint(loop, store)
    store.enforce_retention()
    cq = store.queue(topic, 0)
    assert store.commitlog.total_bytes() <= 3 * SEGMENT and not store.refusing_sends
    assert offsets_served(store, topic, cq.min_offset) == list(range(cq.min_offset, 90))
    loop.run_until_complete(store.close())


def test_sends_are_refused_while_the_cap_cannot_be_met_and_accepted_again_after(
    loop: asyncio.AbstractEventLoop, tmp_path: Path
) -> None:
    disk = FakeDisk()
    store = capped_store(loop, tmp_path, disk, 3 * SEGMENT)
    topic, _ = store.create_topic("t", 1)
    send(loop, store, topic, 60)  # nothing checkpointed yet: every segment is still needed

    store.enforce_retention()
    assert store.refusing_sends and store.queue(topic, 0).min_offset == 0
    with pytest.raises(BrokerError) as refused:
        store.check_accepting_sends()
    assert (refused.value.reason, refused.value.status.name) == ("DISK_FULL", "UNAVAILABLE")
    assert f"over its cap (max_data_bytes) of {3 * SEGMENT}" in refused.value.message
    assert store.retention_stats.sends_refused == 1

    checkpoint(loop, store)  # now the old segments may go
    store.enforce_retention()
    assert not store.refusing_sends and store.commitlog.total_bytes() <= 3 * SEGMENT
    store.check_accepting_sends()
    send(loop, store, topic, 1)
    assert store.queue(topic, 0).max_offset == 61
    loop.run_until_complete(store.close())
