"""Creating topics: the one place every front creates a topic, and the checks on it.

Topics are created by a send or a route query for a missing user topic (auto-creation),
by a heartbeat naming a new consumer group (its retry topic `%RETRY%<group>`, created at
the first heartbeat as RocketMQ's broker does: RocketMQ's clients route and pull it from
then on), by a send-back (the group's retry and dead-letter topics) and by an operator
(AdminService.CreateTopic). A front translates its request into one call here; the checks,
in this order, are made once, before anything is created:

1. the names (INVALID_TOPIC, INVALID_GROUP);
2. the disk: while sends are refused for a full disk (DISK_FULL), so is a new topic;
3. the limits: at most `max_topics` topics in all, and at most `client_max_topics`
   created at one client's request (a client is a connection, as in mockbroker/limits.py),
   so that one heartbeat naming a thousand groups cannot take the file descriptors every
   queue keeps open. A request past either is refused whole with RESOURCE_EXHAUSTED
   (TOO_MANY_TOPICS) naming the limit, and nothing of it is created.

A topic exists once `topics.json` holds it (TopicRegistry.create): one whose save fails is
refused (DISK_FULL, STORE_UNAVAILABLE) and leaves no trace. The file work of a creation
(fsync'd) runs in a worker thread (MessageStore.create_topics), never on the event loop
every client waits on; finding a topic that exists awaits nothing. Creations are one at a
time, so the limits are checked again just before the files are made. The count per
client lives in memory, one entry per client that had a topic created, so never more than
`max_topics`.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import (
    Topic,
    TopicRetention,
    check_any_topic,
    check_group,
    check_user_topic,
)
from sdk._validation import RETRY_PREFIX


class TopicCreation:
    """Finds or creates topics for every front, under the disk check and the limits."""

    def __init__(self, store: MessageStore, *, max_topics: int, client_max_topics: int) -> None:
        self._store = store
        self.max_topics = max_topics
        self.client_max_topics = client_max_topics
        self._created_by: dict[Hashable, int] = {}
        #: Creations refused, by cause: "disk_full", "max_topics", "client_max_topics".
        self.refused: dict[str, int] = {}

    async def user_topic(self, name: str, queue_count: int, *, client: Hashable) -> Topic:
        """The user topic `name`, created with `queue_count` queues if it is missing."""
        check_user_topic(name)
        topic = self._store.topics.find(name)
        if topic is not None:
            return topic
        return (await self._ensure([name], queue_count, client))[0]

    async def retry_topics(self, groups: Iterable[str], *, client: Hashable) -> None:
        """Each group's retry topic (one queue), created where missing: all, or none."""
        names = []
        for group in groups:
            check_group(group)
            names.append(RETRY_PREFIX + group)
        await self._ensure(names, 1, client)

    async def system_topic(self, name: str) -> Topic:
        """A group's retry or dead-letter topic (one queue), for the broker's own use."""
        check_any_topic(name)
        topic = self._store.topics.find(name)
        if topic is not None:
            return topic
        return (await self._ensure([name], 1, None))[0]

    async def create(
        self, name: str, queue_count: int, retention: TopicRetention | None = None
    ) -> tuple[Topic, bool]:
        """An operator's topic: (topic, created); the same settings again are no error."""
        check_user_topic(name)
        existing = self._store.topics.existing(name, queue_count, retention)
        if existing is not None:
            return existing, False
        self._check([name], None)
        created = await self._store.create_topics(
            [name], queue_count, retention, check=lambda missing: self._check(missing, None)
        )
        return created[0]

    async def _ensure(
        self, names: list[str], queue_count: int, client: Hashable | None
    ) -> list[Topic]:
        topics = self._store.topics
        missing = [n for n in dict.fromkeys(names) if topics.find(n) is None]
        if missing:
            self._check(missing, client)
            # Checked again where the answer could have changed: under the registry's lock.
            await self._store.create_topics(
                missing,
                queue_count,
                check=lambda new: self._check(new, client),
                created=lambda new: self._count(new, client),
            )
        return [topics.get(n) for n in names]

    def _count(self, created: list[str], client: Hashable | None) -> None:
        if client is not None:
            self._created_by[client] = self._created_by.get(client, 0) + len(created)

    def _check(self, missing: list[str], client: Hashable | None) -> None:
        """DISK_FULL or TOO_MANY_TOPICS unless every topic of `missing` may be created."""
        what = f"topic {missing[0]!r}" if len(missing) == 1 else f"{len(missing)} topics"
        store = self._store
        if store.refusing_sends:
            raise self._refusal(
                "disk_full",
                StatusCode.UNAVAILABLE,
                "DISK_FULL",
                f"{what} {'was' if len(missing) == 1 else 'were'} not created: "
                f"{store.refusal()}; retry once space is freed",
            )
        present = len(store.topics.all())
        if present + len(missing) > self.max_topics:
            raise self._refusal(
                "max_topics",
                StatusCode.RESOURCE_EXHAUSTED,
                "TOO_MANY_TOPICS",
                f"{what} not created: the broker holds {present} topics, and holds at most "
                f"{self.max_topics} (max_topics)",
            )
        if client is None:
            return
        had = self._created_by.get(client, 0)
        if had + len(missing) > self.client_max_topics:
            raise self._refusal(
                "client_max_topics",
                StatusCode.RESOURCE_EXHAUSTED,
                "TOO_MANY_TOPICS",
                f"{what} not created: this client had the broker create {had} topics, and "
                f"may have it create at most {self.client_max_topics} (client_max_topics; "
                "a heartbeat creates a retry topic for each group it names)",
            )

    def _refusal(self, cause: str, status: StatusCode, reason: str, message: str) -> BrokerError:
        self.refused[cause] = self.refused.get(cause, 0) + 1
        return BrokerError(status, reason, message)
