"""Deleting topics and consumer groups: the one place every front deletes them.

A topic's deletion removes, in this order: every group's offsets on it, its locks, its
registry entry (from then on it is gone, durably), its consume queues, and once more any
offset committed meanwhile. The commit log keeps its records until retention deletes their
segments; the registry marks them, so they are never served again, not even by a topic
later created with the same name (which starts at offset 0, with no offsets of any group).
A kill -9 between the steps leaves the topic with some of its offsets deleted (deleting it
again finishes the work) or, once it is gone, its queue files, removed at the next start.

A group's deletion removes its offsets, its locks, its receive (pop) windows and its
retry and dead-letter topics (%RETRY%group, %DLQ%group: the group's own, as RocketMQ's
mqadmin deleteSubGroup removes them too).

Both are refused with FAILED_PRECONDITION (GROUP_HAS_MEMBERS) while a group concerned has
live members, unless forced: members that keep running may create again what they use
(a heartbeat the retry topic, a commit an offset, a send an auto-created topic).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.state import BrokerState
from mockbroker.topics import GROUP_TOPIC_PREFIXES, check_deletable_topic, check_group
from sdk.log import log_event

log = logging.getLogger("mockbroker.deletion")


@dataclass(frozen=True)
class TopicDeleted:
    """What a topic's deletion removed."""

    topic: str
    queue_count: int
    groups: list[str]  # the groups whose offsets or locks on it went with it


@dataclass(frozen=True)
class GroupDeleted:
    """What a group's deletion removed."""

    group: str
    topics: list[str]  # the topics it had offsets or locks on
    deleted_topics: list[str]  # its retry and dead-letter topics
    members: int  # live members when it was deleted (forced)


async def delete_topic(state: BrokerState, name: str, *, force: bool) -> TopicDeleted:
    """Delete the user topic `name` (see the module docstring)."""
    check_deletable_topic(name)
    state.store.topics.get(name)
    users = {
        group: len(members)
        for group in sorted(state.groups.active_groups())
        if (members := _subscribers(state, group, name))
    }
    if users and not force:
        listed = ", ".join(f"{g} ({n} member{'s' if n > 1 else ''})" for g, n in users.items())
        raise BrokerError(
            StatusCode.FAILED_PRECONDITION,
            "GROUP_HAS_MEMBERS",
            f"topic {name!r} not deleted: live consumers subscribe to it: {listed}; "
            "stop them, or force",
        )
    return await _delete_topic(state, name, forced=sorted(users))


async def delete_group(state: BrokerState, group: str, *, force: bool) -> GroupDeleted:
    """Delete the consumer group `group` (see the module docstring)."""
    check_group(group)
    own = [
        name
        for prefix in GROUP_TOPIC_PREFIXES
        if state.store.topics.find(name := prefix + group) is not None
    ]
    if not own:
        state.known_group(group)  # GROUP_NOT_FOUND
    members = state.groups.members(group)
    if members and not force:
        raise BrokerError(
            StatusCode.FAILED_PRECONDITION,
            "GROUP_HAS_MEMBERS",
            f"group {group!r} not deleted: it has {len(members)} live member(s) "
            f"({', '.join(members[:3])}{', ...' if len(members) > 3 else ''}); "
            "stop them, or force",
        )
    topics = {t for (t, _q) in state.locks.locks(group)}
    gone = await state.offsets.forget(lambda key: key[0] == group)
    topics |= {t for _, t, _ in gone}
    if state.locks.forget(lambda g, _queue: g == group):
        await state.locks.save()
    await state.pop.forget(group)
    await state.parking.forget(lambda e: e.group == group)
    for name in own:
        await _delete_topic(state, name, forced=[])
    log_event(log, logging.WARNING, "group.deleted",
              f"group {group} deleted ({len(gone)} offsets, topics {own or 'none'})"
              + (f", forced with {len(members)} live members" if members else ""),
              group=group, offsets=len(gone), topics=own, members=len(members))  # fmt: skip
    return GroupDeleted(group, sorted(topics - set(own)), own, len(members))


def _subscribers(state: BrokerState, group: str, topic: str) -> list[str]:
    """The live members of `group` that subscribe to `topic`."""
    return [
        client
        for client, membership in state.groups.membership(group).items()
        if any(t == topic for t, _ in membership.subscriptions)
    ]


async def _delete_topic(state: BrokerState, name: str, *, forced: list[str]) -> TopicDeleted:
    def of_topic(key: tuple[str, str, int]) -> bool:
        return key[1] == name

    gone = await state.offsets.forget(of_topic)
    groups = {g for g, _, _ in gone}
    groups |= state.locks.forget(lambda _g, queue: queue[0] == name)
    await state.locks.save()
    topic = await state.store.delete_topic(name)
    # A commit accepted while the saves above ran; none is accepted from here on, since
    # the topic is gone (the commit rule reads its queue: TOPIC_NOT_FOUND).
    groups |= {g for g, _, _ in await state.offsets.forget(of_topic)}
    for group in sorted(state.pop.groups()):
        await state.pop.forget(group, name)
    await state.parking.forget(lambda e: e.topic == name)
    also = f", forced: {', '.join(forced)} subscribe" if forced else ""
    log_event(log, logging.WARNING, "topic.deleted",
              f"topic {name} deleted ({topic.queue_count} queues, offsets of "
              f"{len(groups)} groups){also}",
              topic=name, queues=topic.queue_count, groups=sorted(groups),
              forced=forced)  # fmt: skip
    return TopicDeleted(name, topic.queue_count, sorted(groups))
