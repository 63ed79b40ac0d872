"""Consumer groups: who is in a group, what it subscribes to, and membership versions.

Clients join by heartbeat and leave by unregistering or by silence: a client not heard
from for `client_timeout_seconds` expires. Every join or leave raises the group's
membership version and wakes its watchers, so rebalances follow within moments.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from sdk.clock import Clock


@dataclass(frozen=True)
class GroupMembership:
    """How one client takes part in one group."""

    consume_type: str  # CONSUME_ORDERLY, CONSUME_CONCURRENTLY, CONSUME_POLL
    message_model: str  # CLUSTERING or BROADCASTING
    subscriptions: tuple[tuple[str, str], ...]  # (topic, tag expression)


@dataclass
class _Client:
    last_seen: float
    groups: dict[str, GroupMembership] = field(default_factory=dict)


@dataclass
class _Group:
    version: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)


class ConsumerGroups:
    """Membership of every consumer group on this broker."""

    def __init__(self, clock: Clock, client_timeout_seconds: float = 120.0) -> None:
        self._clock = clock
        self.client_timeout_seconds = client_timeout_seconds
        self._clients: dict[str, _Client] = {}
        self._groups: dict[str, _Group] = {}
        self._closed = False

    def heartbeat(self, client_id: str, groups: dict[str, GroupMembership]) -> dict[str, int]:
        """Record that `client_id` is alive and in exactly `groups`; their versions."""
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = _Client(self._clock.now())
        client.last_seen = self._clock.now()
        for left in set(client.groups) - set(groups):
            self._changed(left)
        for joined in set(groups) - set(client.groups):
            self._changed(joined)
        client.groups = dict(groups)
        if not groups:
            del self._clients[client_id]
        return {g: self._group(g).version for g in groups}

    def unregister(self, client_id: str) -> bool:
        """Remove a client from all its groups; False if it was unknown."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return False
        for group in client.groups:
            self._changed(group)
        return True

    def expire(self) -> list[str]:
        """Remove clients silent for longer than the timeout; their ids."""
        now = self._clock.now()
        gone = [
            cid
            for cid, c in self._clients.items()
            if now - c.last_seen > self.client_timeout_seconds
        ]
        for cid in gone:
            self.unregister(cid)
        return gone

    def members(self, group: str) -> list[str]:
        """Client ids of the group, sorted as strings."""
        return sorted(cid for cid, c in self._clients.items() if group in c.groups)

    def membership(self, group: str) -> dict[str, GroupMembership]:
        """Each member's subscriptions and consume type."""
        return {cid: c.groups[group] for cid, c in self._clients.items() if group in c.groups}

    def version(self, group: str) -> int:
        """The group's membership version."""
        return self._group(group).version

    def groups(self) -> list[str]:
        """Every group that has or had members since the broker started."""
        return sorted(self._groups)

    async def watch(self, group: str, known_version: int) -> AsyncIterator[tuple[int, list[str]]]:
        """Yield (version, members) now if `known_version` is behind, then on every change."""
        state = self._group(group)
        while not self._closed:
            event = state.changed  # taken before the check, so no change slips between
            if state.version != known_version:
                known_version = state.version
                yield known_version, self.members(group)
                continue
            await event.wait()

    def close(self) -> None:
        """End every watch (the broker is stopping)."""
        self._closed = True
        for state in self._groups.values():
            state.changed.set()

    def _group(self, group: str) -> _Group:
        state = self._groups.get(group)
        if state is None:
            state = self._groups[group] = _Group()
        return state

    def _changed(self, group: str) -> None:
        state = self._group(group)
        state.version += 1
        state.changed.set()
        state.changed = asyncio.Event()
