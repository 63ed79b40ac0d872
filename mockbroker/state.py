"""What a broker's servicers share, and the checks several requests have in common.

Store, offsets and the rule of committing them, locks, groups, held pulls, scheduler, retry
and topic creation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mockbroker.config import BrokerConfig
from mockbroker.dedup_sends import DedupSends
from mockbroker.errors import invalid, not_found
from mockbroker.fair_store import SlicedStore
from mockbroker.groups import ConsumerGroups
from mockbroker.limits import ClientLimits
from mockbroker.lock_manager import RebalanceLockManager
from mockbroker.long_polling import PullHolder
from mockbroker.offset_commits import OffsetCommits
from mockbroker.offsets import ConsumerOffsets
from mockbroker.parking import Parking
from mockbroker.pop import PopService
from mockbroker.request_stats import RequestStats
from mockbroker.retry import RetryService
from mockbroker.schedule import Scheduler
from mockbroker.store.message_store import MessageStore
from mockbroker.topic_creation import TopicCreation
from mockbroker.topics import Topic, check_any_topic, check_group
from mockbroker.transactions import Transactions
from sdk.clock import Clock


class RateMeter:
    """Messages in and out per second over a sliding window of samples."""

    def __init__(self, window_seconds: float = 60.0) -> None:
        self._window = window_seconds
        self._samples: deque[tuple[float, int, int]] = deque()

    def sample(self, now: float, stored: int, served: int) -> None:
        """Record the counters at `now`."""
        self._samples.append((now, stored, served))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self._window:
            self._samples.popleft()

    def rates(self) -> tuple[float, float]:
        """(in, out) per second over the window; 0 until two samples exist."""
        if len(self._samples) < 2:
            return 0.0, 0.0
        (t0, in0, out0), (t1, in1, out1) = self._samples[0], self._samples[-1]
        elapsed = t1 - t0
        return ((in1 - in0) / elapsed, (out1 - out0) / elapsed) if elapsed > 0 else (0.0, 0.0)


@dataclass
class BrokerState:
    """The broker's domain objects, built by mockbroker.server.Broker."""

    config: BrokerConfig
    clock: Clock
    store: MessageStore
    offsets: ConsumerOffsets
    locks: RebalanceLockManager
    groups: ConsumerGroups
    holder: PullHolder
    scheduler: Scheduler
    retry: RetryService
    #: What each client has the broker hold (config.client_max_in_flight_bytes).
    limits: ClientLimits
    #: Receives, acks and invisible durations (RocketMQ 5's pop), for every front.
    pop: PopService
    #: The rule of committing an offset, for every front that commits one.
    commits: OffsetCommits
    #: Where every front creates topics (the disk check, max_topics, client_max_topics).
    topic_creation: TopicCreation
    #: Half messages, their ends and check-backs (mockbroker/transactions.py).
    transactions: Transactions
    #: Keys parked for a group, skipped by its pulls until released (mockbroker/parking.py).
    parking: Parking
    started: float = 0.0
    address: str = ""
    #: 'host:port' of the Exchange port (framed TCP) clients are routed to ("" when off).
    exchange_address: str = ""
    #: The broker's id, which routes give beside exchange_address (mockbroker/identity.py).
    exchange_broker_id: str = ""
    rates: RateMeter = field(default_factory=RateMeter)
    requests: RequestStats = field(default_factory=RequestStats)
    #: Sends and pulls go through it when config.fair_scheduling is on.
    sliced: SlicedStore | None = None
    #: The dedup window sends go through when config.dedup_window_seconds is set.
    dedup: DedupSends | None = None

    def existing_groups(self) -> set[str]:
        """Groups that exist now: with members, committed offsets or received messages.

        A group whose members all left and that never committed is gone (nothing of it
        survives a restart); one with committed offsets stays, since it resumes from them.
        """
        return self.groups.active_groups() | self.offsets.groups() | self.pop.groups()

    def topic_queue(self, topic: str, queue_id: int) -> Topic:
        """The existing topic, checked to have `queue_id` (TOPIC_NOT_FOUND, INVALID_QUEUE)."""
        check_any_topic(topic)
        found = self.store.topics.get(topic)
        found.check_queue(queue_id)
        return found

    def known_group(self, group: str) -> None:
        """GROUP_NOT_FOUND unless the group has members, committed offsets, locks or pops."""
        check_group(group)
        if (
            not self.groups.members(group)
            and group not in self.offsets.groups()
            and not self.locks.knows_group(group)
            and group not in self.pop.groups()
        ):
            raise not_found(
                "GROUP_NOT_FOUND",
                f"consumer group {group!r} has no members and no offsets; "
                "its clients must send a heartbeat first",
            )


def check_client_id(client_id: str) -> None:
    """INVALID_ARGUMENT for an empty or oversized client id."""
    if not client_id or len(client_id) > 255:
        raise invalid("INVALID_ARGUMENT", "client_id must be 1-255 characters")
