"""Consumer groups: who is in a group, what it subscribes to, and membership versions.

Clients join by heartbeat and leave by unregistering, by silence, or by disconnecting:

- a client not heard from for `client_timeout_seconds` expires;
- a client whose connection closed expires once `disconnect_grace_seconds` pass without
  a request from it. A connection is known by its peer address (host:port of the
  client's end), the one its latest request came from, and counts as closed when the
  last long-lived stream on it (membership watch, Exchange, a remoting connection) ends:
  that happens at once when the client's process dies, since its kernel closes its
  sockets. Any request of a known client (`alive`: a heartbeat, a lock, an unlock, a
  pull, an offset commit or query, on either front) means it is back on that connection.
  A process that is only paused (SIGSTOP, a debugger) keeps its connection open, so it
  expires by silence only.
  A client that shuts down cleanly unregisters before it closes its Exchange streams.

Every join or leave raises the group's membership version and wakes its watchers, so
rebalances follow within moments.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
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
    peer: str = ""  # where its last heartbeat came from
    disconnected_at: float | None = None  # when that connection closed, if it did


@dataclass
class _Group:
    version: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    watchers: int = 0


class ConsumerGroups:
    """Membership of every consumer group on this broker."""

    def __init__(
        self,
        clock: Clock,
        client_timeout_seconds: float = 120.0,
        disconnect_grace_seconds: float = 30.0,
    ) -> None:
        self._clock = clock
        self.client_timeout_seconds = client_timeout_seconds
        self.disconnect_grace_seconds = disconnect_grace_seconds
        self._clients: dict[str, _Client] = {}
        #: Each group's members now (no empty sets): a group's members are read for
        #: every rebalance query and scrape, which must not cost every client's look.
        self._members: dict[str, set[str]] = {}
        self._groups: dict[str, _Group] = {}
        self._streams: dict[str, int] = {}  # peer -> long-lived streams open from it
        self._closed = False

    def heartbeat(
        self, client_id: str, groups: dict[str, GroupMembership], peer: str = ""
    ) -> dict[str, int]:
        """Record that `client_id` is alive, at `peer`, and in exactly `groups`.

        Returns the groups' membership versions.
        """
        client = self._clients.get(client_id)
        if client is None:
            client = self._clients[client_id] = _Client(self._clock.now())
        client.last_seen = self._clock.now()
        client.peer, client.disconnected_at = peer, None
        for left in set(client.groups) - set(groups):
            self._leave(client_id, left)
        for joined in set(groups) - set(client.groups):
            self._members.setdefault(joined, set()).add(client_id)
            self._changed(joined)
        client.groups = dict(groups)
        if not groups:
            del self._clients[client_id]
        return {g: self._group(g).version for g in groups}

    def alive(self, client_id: str, peer: str = "") -> None:
        """`client_id` made a request (any: a lock, a pull, a commit) from `peer`.

        A known client counts as heard from, on that connection: if the connection its
        heartbeats came from closed, the grace stops running, since it is back. Its groups
        stay as they are; an unknown client stays unknown (only a heartbeat joins).
        """
        client = self._clients.get(client_id)
        if client is None:
            return
        client.last_seen = self._clock.now()
        if peer:
            client.peer, client.disconnected_at = peer, None

    def is_member(self, client_id: str, group: str) -> bool:
        """True when `client_id` is in `group` now."""
        client = self._clients.get(client_id)
        return client is not None and group in client.groups

    def unregister(self, client_id: str) -> bool:
        """Remove a client from all its groups; False if it was unknown."""
        client = self._clients.pop(client_id, None)
        if client is None:
            return False
        for group in client.groups:
            self._leave(client_id, group)
        return True

    def stream_opened(self, peer: str) -> None:
        """A membership watch or an Exchange stream from `peer` began."""
        if peer:
            self._streams[peer] = self._streams.get(peer, 0) + 1

    def stream_closed(self, peer: str) -> None:
        """Such a stream ended; the last one from `peer` means its connection closed."""
        left = self._streams.get(peer, 0) - 1
        if left > 0:
            self._streams[peer] = left
            return
        self._streams.pop(peer, None)
        if not peer or self._closed:  # the broker itself is stopping
            return
        now = self._clock.now()
        for client in self._clients.values():
            if client.peer == peer and client.disconnected_at is None:
                client.disconnected_at = now

    def disconnected_since(self, client_id: str) -> float | None:
        """When the connection `client_id` heartbeats on closed; None while it is open."""
        client = self._clients.get(client_id)
        return client.disconnected_at if client is not None else None

    def expire(self) -> dict[str, str]:
        """Remove clients silent for too long, or gone with their connection.

        Returns the ids removed, each with the reason in words.
        """
        now = self._clock.now()
        gone: dict[str, str] = {}
        for cid, c in self._clients.items():
            if now - c.last_seen > self.client_timeout_seconds:
                gone[cid] = f"silent for {now - c.last_seen:.0f} s"
            elif (
                c.disconnected_at is not None
                and now - c.disconnected_at > self.disconnect_grace_seconds
            ):
                gone[cid] = f"disconnected {now - c.disconnected_at:.0f} s ago, not back"
        for cid in gone:
            self.unregister(cid)
        return gone

    def groups_of(self, client_id: str) -> dict[str, GroupMembership]:
        """The groups `client_id` is in now (empty for a client not known)."""
        client = self._clients.get(client_id)
        return dict(client.groups) if client is not None else {}

    def members(self, group: str) -> list[str]:
        """Client ids of the group, sorted as strings."""
        return sorted(self._members.get(group, ()))

    def membership(self, group: str) -> dict[str, GroupMembership]:
        """Each member's subscriptions and consume type, by client id in order."""
        clients = self._clients
        return {cid: clients[cid].groups[group] for cid in self.members(group)}

    def version(self, group: str) -> int:
        """The group's membership version (0 for a group nobody joined)."""
        state = self._groups.get(group)
        return state.version if state is not None else 0

    def active_groups(self) -> set[str]:
        """Every group with at least one member now."""
        return set(self._members)

    async def watch(
        self, group: str, known_version: int
    ) -> AsyncGenerator[tuple[int, list[str]], None]:
        """Yield (version, members) now if `known_version` is behind, then on every change."""
        state = self._group(group)
        state.watchers += 1
        try:
            while not self._closed:
                event = state.changed  # taken before the check, so no change slips between
                if state.version != known_version:
                    known_version = state.version
                    yield known_version, self.members(group)
                    continue
                await event.wait()
        finally:
            state.watchers -= 1
            # A watch of a group nobody ever joined leaves nothing behind (any name can be
            # watched: the registry would grow with each).
            if not state.watchers and not state.version and self._groups.get(group) is state:
                del self._groups[group]

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

    def _leave(self, client_id: str, group: str) -> None:
        members = self._members[group]
        members.discard(client_id)
        if not members:
            del self._members[group]
        self._changed(group)

    def _changed(self, group: str) -> None:
        state = self._group(group)
        state.version += 1
        state.changed.set()
        state.changed = asyncio.Event()
