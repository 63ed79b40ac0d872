"""Topic names, reserved prefixes and the durable topic registry."""

from __future__ import annotations

import asyncio
import errno
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid, not_found, out_of_range
from mockbroker.store.files import write_atomically
from sdk._files import read_json
from sdk._validation import DLQ_PREFIX, PARKED_PREFIX, RETRY_PREFIX

NAME_RE = re.compile(r"^[A-Za-z0-9_|-]{1,127}$")
SYSTEM_PREFIX = "rmq_sys_"
#: A group's own topics: retries, dead letters, parked keys (the name's rest is the group).
GROUP_TOPIC_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, PARKED_PREFIX)
#: Where scheduled messages wait, and where their outcomes are recorded.
SCHEDULE_TOPIC = "rmq_sys_SCHEDULE"
SCHEDULE_DONE_TOPIC = "rmq_sys_SCHEDULE_DONE"
#: Where half (transactional) messages wait, and where their outcomes are recorded
#: (RocketMQ's RMQ_SYS_TRANS_HALF_TOPIC and RMQ_SYS_TRANS_OP_HALF_TOPIC).
HALF_TOPIC = "rmq_sys_TRANS_HALF_TOPIC"
HALF_OP_TOPIC = "rmq_sys_TRANS_OP_HALF_TOPIC"
#: The property that marks a half message's record (RocketMQ's PROPERTY_TRANSACTION_PREPARED):
#: recovery indexes such a record in HALF_TOPIC; a committed copy goes without it.
HALF_PROPERTY = "TRAN_MSG"
#: RocketMQ's default topic, which its clients route to auto-create topics.
DEFAULT_TOPIC = "TBW102"
MAX_QUEUES = 1024


def check_user_topic(name: str) -> None:
    """Raise INVALID_TOPIC unless `name` is a topic users may create and send to."""
    if not NAME_RE.fullmatch(name):
        raise invalid(
            "INVALID_TOPIC",
            f"topic {name!r} must match {NAME_RE.pattern} (letters, digits, _ | -; 1-127 chars)",
        )
    if name.startswith(SYSTEM_PREFIX):
        raise invalid("INVALID_TOPIC", f"topic {name!r}: the prefix {SYSTEM_PREFIX!r} is reserved")


def check_any_topic(name: str) -> None:
    """Raise INVALID_TOPIC unless `name` is a user topic or one of a group's own topics."""
    for prefix in GROUP_TOPIC_PREFIXES:
        if name.startswith(prefix):
            check_group(name[len(prefix) :])
            return
    if name.startswith(SYSTEM_PREFIX) and NAME_RE.fullmatch(name):
        return
    check_user_topic(name)


def check_group(name: str) -> None:
    """Raise INVALID_GROUP unless `name` is a valid consumer or producer group name."""
    if not NAME_RE.fullmatch(name):
        raise invalid("INVALID_GROUP", f"group {name!r} must match {NAME_RE.pattern}")


def name_checked(check: Callable[[str], None], name: object) -> str:
    """`name` if `check` accepts it, else ValueError (for names read from files)."""
    if not isinstance(name, str):
        raise ValueError(f"{name!r} is not a name")
    try:
        check(name)
    except BrokerError as exc:
        raise ValueError(exc.message) from None
    return name


def is_system_topic(name: str) -> bool:
    """True for the broker's own topics (retry, dead letter, parked, rmq_sys_)."""
    return name.startswith((*GROUP_TOPIC_PREFIXES, SYSTEM_PREFIX))


def check_deletable_topic(name: str) -> None:
    """INVALID_TOPIC for a malformed name, SYSTEM_TOPIC for one of the broker's own topics."""
    if name != DEFAULT_TOPIC and not is_system_topic(name):
        check_user_topic(name)
        return
    check_any_topic(name)
    why = (
        "; a group's retry, dead-letter and parked topics are deleted with the group "
        "(groups delete)"
        if name.startswith(GROUP_TOPIC_PREFIXES)
        else ""
    )
    raise invalid("SYSTEM_TOPIC", f"topic {name!r} is the broker's own: not deleted by name{why}")


#: The longest per-topic retention time accepted (ten years), in hours.
MAX_RETENTION_HOURS = 87_600.0


@dataclass(frozen=True)
class TopicRetention:
    """A topic's own retention, where it differs from the broker's.

    `hours`: its messages are served for this long after they were stored (None: the
    broker's `retention_hours`). `bytes_per_queue`: each of its queues serves at most this
    many bytes of its newest messages (None: no cap). See mockbroker/store/topic_expiry.py.
    """

    hours: float | None = None
    bytes_per_queue: int | None = None

    def __post_init__(self) -> None:
        if self.hours is not None and not 0 < self.hours <= MAX_RETENTION_HOURS:
            raise invalid(
                "INVALID_ARGUMENT",
                f"retention hours {self.hours!r} must be within 0..{MAX_RETENTION_HOURS:g} "
                "(0 in a request: the broker's default)",
            )
        if self.bytes_per_queue is not None and self.bytes_per_queue <= 0:
            raise invalid(
                "INVALID_ARGUMENT",
                f"retention bytes per queue {self.bytes_per_queue} must be positive "
                "(0 in a request: no cap)",
            )

    @property
    def is_default(self) -> bool:
        """True when the topic follows the broker's retention."""
        return self.hours is None and self.bytes_per_queue is None

    def describe(self) -> str:
        """Human-readable, for logs and errors."""
        hours = f"{self.hours:g} h" if self.hours is not None else "the broker's default time"
        size = f", {self.bytes_per_queue} bytes per queue" if self.bytes_per_queue else ""
        return hours + size


DEFAULT_RETENTION = TopicRetention()


@dataclass(frozen=True)
class Topic:
    """A topic, its queue count and its own retention (default: the broker's)."""

    name: str
    queue_count: int
    # Not part of a topic's identity: changing it leaves requests holding the topic valid.
    retention: TopicRetention = field(default=DEFAULT_RETENTION, compare=False)

    def check_queue(self, queue_id: int) -> None:
        """Raise INVALID_QUEUE unless `queue_id` is one of this topic's queues."""
        if not 0 <= queue_id < self.queue_count:
            raise out_of_range(
                "INVALID_QUEUE",
                f"queue id {queue_id} is out of range for topic {self.name!r} "
                f"(queues 0..{self.queue_count - 1})",
            )


class TopicRegistry:
    """Topics by name, persisted to one JSON file replaced atomically before every change.

    A deleted topic leaves a mark: the commit-log position its deletion was made at. Its
    records all lie below it and stay in the commit log until retention deletes their
    segments; `holds()` tells them from those of a topic later created with the same name.
    """

    def __init__(self, path: Path) -> None:
        self._path = path
        self._topics: dict[str, Topic] = {}
        self._deleted: dict[str, int] = {}
        #: Counts the changes saved since load (a broker's DataVersion for name servers).
        self.version = 0
        #: Called after each saved change (the name-server registrar registers again).
        self.on_change: Callable[[], None] | None = None
        #: Held by every change made while the broker serves (MessageStore.create_topics,
        #: delete_topic, set_topic_retention) from building the file's data until the
        #: change applies, so that a save whose file work runs in a worker thread never
        #: races another one: each file holds every change applied before it.
        self.lock = asyncio.Lock()

    def load(self) -> None:
        """Read the registry file, if any; CorruptFileError when it cannot be read."""
        if self._path.exists():
            self._topics, self._deleted = read_json(self._path, _parse)

    def deleted(self) -> Mapping[str, int]:
        """Each topic ever deleted -> the commit-log position its last deletion was made at."""
        return MappingProxyType(self._deleted)

    def holds(self, name: str, position: int) -> bool:
        """True unless the record of `name` at commit-log `position` is a deleted topic's."""
        return position >= self._deleted.get(name, 0)

    def delete(self, name: str, position: int) -> Topic:
        """Remove `name` (TOPIC_NOT_FOUND if missing), marking its records below `position`.

        Gone only once the registry file says so (DISK_FULL, STORE_UNAVAILABLE otherwise,
        and nothing changes).
        """
        topic = self.get(name)
        topics = {n: t for n, t in self._topics.items() if n != name}
        deleted = {**self._deleted, name: max(position, self._deleted.get(name, 0))}
        self.write(self._data(topics, deleted), [name], "deleted")
        self._topics, self._deleted = topics, deleted
        self._saved()
        return topic

    def get(self, name: str) -> Topic:
        """The topic, or TOPIC_NOT_FOUND."""
        topic = self._topics.get(name)
        if topic is None:
            raise not_found("TOPIC_NOT_FOUND", f"topic {name!r} does not exist")
        return topic

    def find(self, name: str) -> Topic | None:
        """The topic, or None."""
        return self._topics.get(name)

    def all(self) -> list[Topic]:
        """Every topic, sorted by name."""
        return [self._topics[n] for n in sorted(self._topics)]

    def create(
        self, name: str, queue_count: int, retention: TopicRetention | None = None
    ) -> tuple[Topic, bool]:
        """Create `name`; return (topic, created). Same count again is not an error.

        `retention` None: the broker's default for a new topic, and no check of an existing
        one; given, an existing topic must have the same (TOPIC_EXISTS otherwise, naming
        SetTopicRetention, which changes it).

        The topic exists (find() answers it) only once the registry file holds it: a save
        that fails raises BrokerError UNAVAILABLE (DISK_FULL or STORE_UNAVAILABLE, retriable)
        and leaves the registry as it was, so nothing is ever stored into a topic that a
        restart would not find.
        """
        existing = self.existing(name, queue_count, retention)
        if existing is not None:
            return existing, False
        topic = Topic(name, queue_count, retention or DEFAULT_RETENTION)
        self.write(self.data_with([topic]), [name], "created")
        self.add([topic])  # only once the file holds it: a restart finds it
        return topic, True

    def existing(
        self, name: str, queue_count: int, retention: TopicRetention | None = None
    ) -> Topic | None:
        """The topic `name` if it exists as asked (see create()), None if it is missing.

        INVALID_ARGUMENT for a queue count out of range, TOPIC_EXISTS for an existing topic
        with another queue count or (`retention` given) another retention.
        """
        if not 1 <= queue_count <= MAX_QUEUES:
            raise invalid(
                "INVALID_ARGUMENT", f"queue count {queue_count} must be within 1..{MAX_QUEUES}"
            )
        existing = self._topics.get(name)
        if existing is None:
            return None
        if existing.queue_count != queue_count:
            raise BrokerError(
                StatusCode.ALREADY_EXISTS,
                "TOPIC_EXISTS",
                f"topic {name!r} exists with {existing.queue_count} queues, not {queue_count}",
            )
        if retention is not None and retention != existing.retention:
            raise BrokerError(
                StatusCode.ALREADY_EXISTS,
                "TOPIC_EXISTS",
                f"topic {name!r} exists with retention {existing.retention.describe()}, "
                f"not {retention.describe()}; change it with `ordermq topics "
                "set-retention` (AdminService.SetTopicRetention)",
            )
        return existing

    def data_with(self, new: Iterable[Topic]) -> bytes:
        """The registry file's content once `new` (missing topics) are added."""
        return self._data({**self._topics, **{t.name: t for t in new}}, self._deleted)

    def add(self, new: Iterable[Topic]) -> None:
        """Apply `new` (new or changed topics), once the file holds them.

        The file's content: data_with() or with_retention().
        """
        for topic in new:
            self._topics[topic.name] = topic
        self._saved()

    def set_retention(self, name: str, retention: TopicRetention) -> Topic:
        """Change a topic's own retention (TOPIC_NOT_FOUND); saved before it applies."""
        topic, data = self.with_retention(name, retention)
        self.write(data, [name], "changed")
        self.add([topic])
        return topic

    def with_retention(self, name: str, retention: TopicRetention) -> tuple[Topic, bytes]:
        """`name` with `retention`, and the registry file's content with it.

        Changes nothing (TOPIC_NOT_FOUND if missing): add() applies it once a file holds
        that content.
        """
        topic = replace(self.get(name), retention=retention)
        return topic, self._data({**self._topics, name: topic}, self._deleted)

    @staticmethod
    def _data(topics: Mapping[str, Topic], deleted: Mapping[str, int]) -> bytes:
        """The registry file's content for `topics` and the `deleted` marks."""
        data: dict[str, Any] = {"topics": {n: topics[n].queue_count for n in sorted(topics)}}
        # A key of its own, so that a broker of an older version still reads the file.
        retention = {
            n: _retention_json(topics[n].retention)
            for n in sorted(topics)
            if not topics[n].retention.is_default
        }
        if retention:
            data["retention"] = retention
        if deleted:
            data["deleted"] = {n: deleted[n] for n in sorted(deleted)}
        return json.dumps(data, indent=1).encode()

    def write(self, data: bytes, names: list[str], change: str) -> None:
        """Replace the registry file with `data`; DISK_FULL / STORE_UNAVAILABLE if it fails.

        Changes nothing in memory, so it may run in a worker thread.
        """
        try:
            write_atomically(self._path, data)
        except OSError as exc:
            full = exc.errno == errno.ENOSPC
            what = (
                f"topic {names[0]!r} was"
                if len(names) == 1
                else f"topics {', '.join(map(repr, names))} were"
            )
            raise BrokerError(
                StatusCode.UNAVAILABLE,
                "DISK_FULL" if full else "STORE_UNAVAILABLE",
                f"{what} not {change}: saving the topic registry failed ({exc}); retry later",
            ) from exc

    def _saved(self) -> None:
        self.version += 1
        if self.on_change is not None:
            self.on_change()


def _parse(raw: dict[str, Any]) -> tuple[dict[str, Topic], dict[str, int]]:
    topics: dict[str, Topic] = {}
    deleted: dict[str, int] = {}
    for name, position in raw.get("deleted", {}).items():
        name_checked(check_any_topic, name)
        if type(position) is not int or position < 0:
            raise ValueError(f"deleted topic {name!r}: position {position!r} is not an offset")
        deleted[name] = position
    for name, count in raw["topics"].items():
        name_checked(check_any_topic, name)
        if type(count) is not int or not 1 <= count <= MAX_QUEUES:
            raise ValueError(f"topic {name!r}: queue count {count!r} is outside 1..{MAX_QUEUES}")
        topics[name] = Topic(name, count)
    for name, settings in raw.get("retention", {}).items():
        if name in topics:
            topics[name] = replace(topics[name], retention=_retention_parsed(name, settings))
    return topics, deleted


def _retention_json(retention: TopicRetention) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if retention.hours is not None:
        out["hours"] = retention.hours
    if retention.bytes_per_queue is not None:
        out["bytes_per_queue"] = retention.bytes_per_queue
    return out


def _retention_parsed(name: str, settings: Any) -> TopicRetention:
    if not isinstance(settings, dict):
        raise ValueError(f"topic {name!r}: retention {settings!r} is not an object")
    hours, size = settings.get("hours"), settings.get("bytes_per_queue")
    if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float))):
        raise ValueError(f"topic {name!r}: retention hours {hours!r} is not a number")
    if size is not None and type(size) is not int:
        raise ValueError(f"topic {name!r}: retention bytes_per_queue {size!r} is not an integer")
    try:
        return TopicRetention(None if hours is None else float(hours), size)
    except BrokerError as exc:
        raise ValueError(f"topic {name!r}: {exc.message}") from None
