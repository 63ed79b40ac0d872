"""Rebalance: decide which queues this client should hold, then take and release them.

Every member computes the same split from the same inputs (the topic's queues and the
group's members, both sorted), so no coordinator is needed; the broker's locks keep
orderly members from overlapping while they disagree for a moment.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Protocol

from sdk import metrics
from sdk._transport.protocol import Transport
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.errors import OrderMQError, TopicNotFoundError
from sdk.log import log_event
from sdk.message import MessageQueue

log = logging.getLogger("ordermq.rebalance")


class NotAMemberYet(OrderMQError):
    """The broker does not list this client in its group yet: the round waits."""


class RebalanceHost(Protocol):
    """The consumer whose queues are being balanced."""

    def held(self) -> Collection[MessageQueue]:
        """The queues currently held (including ones being released)."""

    async def acquire(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Start consuming `queues`; the ones actually taken."""

    async def release(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Stop consuming `queues`; the ones actually released."""

    def releasing(self) -> Collection[MessageQueue]:
        """Queues whose release was postponed (a listener call still runs)."""


class Rebalancer:
    """One group's queue assignment for one client."""

    def __init__(
        self,
        transport: Transport,
        group: str,
        client_id: str,
        strategy: AllocateMessageQueueStrategy,
        host: RebalanceHost,
        *,
        broadcasting: bool = False,
    ) -> None:
        self._transport = transport
        self._group = group
        self._client_id = client_id
        self._strategy = strategy
        self._host = host
        self._broadcasting = broadcasting
        self.topics: list[str] = []
        #: A fixed assignment (lite pull assign()) instead of the topics' share.
        self.assigned: list[MessageQueue] | None = None
        self.rounds = 0
        self._round = asyncio.Lock()  # one round at a time: the loop's, or an assign()'s
        #: Subscribed topics that did not exist at their last lookup.
        self.missing: set[str] = set()
        #: Topics this client saw missing that exist now: each of their messages was sent
        #: after this client subscribed.
        self.created_later: set[str] = set()

    async def topic_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of `topic` (route refreshed); [] while it does not exist."""
        try:
            queues = await self._transport.readable_queues(topic, refresh=True)
        except TopicNotFoundError as exc:
            if topic not in self.missing:
                self.missing.add(topic)
                log.log(
                    logging.DEBUG if topic.startswith("%") else logging.WARNING,
                    "group %s: topic %r does not exist yet (%s); its queues are taken when "
                    "it appears",
                    self._group, topic, exc,
                )  # fmt: skip
            return []
        if topic in self.missing:
            self.missing.discard(topic)
            self.created_later.add(topic)
            log.info("group %s: topic %r exists now", self._group, topic)
        return queues

    async def missing_appeared(self) -> bool:
        """Whether a subscribed topic that was missing exists now; looks up only those.

        A group's own `%`-topics (retry) are left to the periodic round: they appear with
        the group's first sendback, and nothing waits on them.
        """
        appeared = False
        for topic in sorted(t for t in self.missing if not t.startswith("%")):
            if await self.topic_queues(topic):
                appeared = True
        return appeared

    async def desired(self) -> set[MessageQueue]:
        """The queues this client should hold now."""
        if self.assigned is not None:
            return set(self.assigned)
        wanted: set[MessageQueue] = set()
        members: list[str] | None = None
        for topic in self.topics:
            queues = await self.topic_queues(topic)
            if not queues:
                continue
            if self._broadcasting:
                wanted.update(queues)
                continue
            if members is None:
                members = await self._transport.consumer_list(self._group, topic)
            if self._client_id not in members:
                # Our heartbeat has not landed yet (a broker that just restarted knows
                # no member): keep what we hold rather than give everything up.
                raise NotAMemberYet(
                    f"client {self._client_id} is not yet a member of group {self._group}"
                )
            wanted.update(self._strategy.allocate(self._group, self._client_id, queues, members))
        return wanted

    async def rebalance(self) -> bool:
        """One round (after the one under way); True when the client holds what it should."""
        async with self._round:
            return await self._rebalance()

    async def _rebalance(self) -> bool:
        self.rounds += 1
        try:
            wanted = await self.desired()
        except OrderMQError as exc:
            log.warning("rebalance of group %s postponed: %s", self._group, exc)
            return False
        except Exception:  # an allocate strategy's (the user's) bug: retry, as RocketMQ does
            log.exception("rebalance of group %s failed: its allocation raised", self._group)
            return False
        # A postponed release is finished first even when the queue is wanted again:
        # its pull loop stopped, so it is taken back afresh once released.
        to_release = sorted((set(self._host.held()) - wanted) | set(self._host.releasing()))
        released = await self._host.release(to_release) if to_release else []
        to_acquire = sorted(wanted - set(self._host.held()))
        acquired = await self._host.acquire(to_acquire) if to_acquire else []
        if to_release or to_acquire:
            metrics.rebalanced(self._group)
            log_event(
                log, logging.INFO, "rebalance",
                f"rebalance of group {self._group}: +{len(acquired)} -{len(released)} queues "
                f"({len(wanted)} wanted)",
                group=self._group, added=len(acquired), removed=len(released), held=len(wanted),
            )  # fmt: skip
        return len(released) == len(to_release) and len(acquired) == len(to_acquire)
