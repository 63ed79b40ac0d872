"""Early deletion: may the oldest segment go before its time, and whom would it cost.

The disk ratios are shares of the file system in use as `df` reckons it (statvfs_probe),
which other programs share: a disk 75 % full of someone else's files must not cost
consumers their unread messages. So a segment holding messages some group has not consumed
yet goes early only when the disk is about to fill (at or over the force ratio, close to
where sends are refused) or when the broker's own data is over its cap (`max_data_bytes`:
the operator asked for that). A segment every group has read goes from the clean ratio on,
as in RocketMQ.

"Unread" is counted against committed offsets: a group reads a topic once it committed an
offset on any of its queues; a queue of that topic it never committed counts as unread from
its oldest message. A topic no group has committed on has no reader to lose anything, and
counts as read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mockbroker.store.retention import DiskUsage, RetentionPolicy

#: (group, topic, queue id, committed offset): the offset table as retention reads it.
Committed = tuple[str, str, int, int]
#: (topic, queue id) -> (min offset now, min offset once the segment is deleted).
Trims = Mapping[tuple[str, int], tuple[int, int]]


def unread_by_group(trims: Trims, committed: Iterable[Committed]) -> dict[str, int]:
    """How many messages each group has not consumed among those a deletion would remove.

    Only groups with something unread are in the answer.
    """
    readers: dict[str, set[str]] = {}
    offsets: dict[tuple[str, str, int], int] = {}
    for group, topic, queue_id, offset in committed:
        readers.setdefault(topic, set()).add(group)
        offsets[group, topic, queue_id] = offset
    unread: dict[str, int] = {}
    for (topic, queue_id), (old_min, new_min) in trims.items():
        for group in readers.get(topic, ()):
            lost = new_min - max(offsets.get((group, topic, queue_id), 0), old_min)
            if lost > 0:
                unread[group] = unread.get(group, 0) + lost
    return dict(sorted(unread.items()))


def early_reason(
    policy: RetentionPolicy, usage: DiskUsage, data_bytes: int, has_unread: bool
) -> str | None:
    """Why the oldest segment may be deleted before its time now; None: it is kept.

    `data_bytes` is the size of the commit log, which `max_data_bytes` caps.
    """
    if over_cap(policy, data_bytes):
        return (
            f"the commit log holds {data_bytes} bytes, over max_data_bytes {policy.max_data_bytes}"
        )
    if usage.ratio >= policy.force_ratio:
        return (
            f"disk {usage.ratio:.1%} used, at or over the force ratio "
            f"{policy.force_ratio:.0%}: the disk is about to fill"
        )
    if usage.ratio >= policy.clean_ratio and not has_unread:
        return (
            f"disk {usage.ratio:.1%} used, at or over the clean ratio "
            f"{policy.clean_ratio:.0%}, and every group had read the segment"
        )
    return None


def keep_deleting(policy: RetentionPolicy, usage: DiskUsage, data_bytes: int) -> bool:
    """Whether one check goes on past one early deletion (else: one segment per check)."""
    return usage.ratio >= policy.force_ratio or over_cap(policy, data_bytes)


def over_cap(policy: RetentionPolicy, data_bytes: int) -> bool:
    """The commit log is over `max_data_bytes`."""
    return policy.max_data_bytes is not None and data_bytes > policy.max_data_bytes
