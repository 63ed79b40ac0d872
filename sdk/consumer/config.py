"""Consumer settings: RocketMQ's defaults, checked when the consumer is built."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sdk._validation import check_counts, check_durations
from sdk.errors import InvalidArgumentError

MIB = 1024 * 1024


#: A queue whose first message (offset 0) is still stored and which holds at most this
#: many messages is young: a new group starts there even with LAST_OFFSET.
YOUNG_QUEUE_MAX_MESSAGES = 1000
#: The consumers' durations that may be 0 (no wait); the others must be above 0.
_MAY_BE_ZERO = frozenset(
    {"pull_suspend", "pull_error_backoff", "flow_control_backoff", "shutdown_timeout"}
)


class ConsumeFromWhere(enum.Enum):
    """Where a group with no committed offset for a queue starts reading it.

    LAST_OFFSET (the default): at the queue's end, except on a young queue (its first
    message, offset 0, is still stored and it holds at most the consumer config's
    `young_queue_max_messages`, 1000 by default), where it starts at offset 0, as
    RocketMQ's broker starts a new group at 0 while a queue's first message is still in
    memory. So a group started after its first messages were sent gets them, and one
    added to a busy topic starts with what is sent from now on. A topic created after the
    consumer subscribed is read from its start whatever its size. Broadcasting consumers
    keep their offsets on their own host: like RocketMQ's, they start at the end of a
    young queue too.
    FIRST_OFFSET: at the oldest stored message. TIMESTAMP: at the first message stored
    at or after `consume_timestamp`. A committed offset always wins over all three.
    """

    LAST_OFFSET = "LAST_OFFSET"
    FIRST_OFFSET = "FIRST_OFFSET"
    TIMESTAMP = "TIMESTAMP"


class MessageModel(enum.Enum):
    """Clustering: each message to one member. Broadcasting: every member gets all."""

    CLUSTERING = "CLUSTERING"
    BROADCASTING = "BROADCASTING"


class ProcessingOrder(enum.Enum):
    """What an orderly push consumer keeps in order.

    QUEUE (the default, RocketMQ's): a queue's messages one call at a time, in queue order.
    KEY: each sharding key's messages one call at a time, in order, while different keys
    of one queue are called side by side (up to `max_keys_in_flight_per_queue`). A queue
    commits its lowest unfinished offset, so after a crash or a rebalance messages of other
    keys finished past it are handled again. Messages without a sharding key are in order
    among themselves, as if they shared one key.
    """

    QUEUE = "queue"
    KEY = "key"


class KeyFailurePolicy(enum.Enum):
    """Key mode: what becomes of a key whose batch failed 1 + max_reconsume_times times.

    With `max_reconsume_times` None (the orderly default, RocketMQ's: unlimited) neither
    applies: the key stalls, retried every `suspend_current_queue_time`, while the queue's
    other keys go on.

    DEAD_LETTER (the default, RocketMQ's): the batch goes to the group's dead-letter topic
    %DLQ%<group> and the key goes on with its next message.
    PARK: the key is parked at the broker: its messages from the failing one on, and those
    that come later, are set aside in order in %PARKED%<group> and skipped by the group's
    pulls, until an operator releases the key (`ordermq parked release`); the messages
    then come back, in order, after the queue's newer ones. Needs ordermq's broker
    (over rocketmq:// it raises UnsupportedByTransportError when a key would be parked).
    A key the broker does not park (its disk full: DISK_FULL) stalls and is parked at a
    later try; it is never dead-lettered instead.
    """

    DEAD_LETTER = "dead-letter"
    PARK = "park"


@dataclass(frozen=True)
class PushConsumerConfig:
    """Tuning of a push consumer; every duration is in seconds.

    Attributes:
        consume_threads: Size of the thread pool that runs (non-async) listeners.
        pull_threshold_for_queue: Stop pulling a queue while this many messages wait.
        pull_threshold_bytes_for_queue: ... or while this many body bytes wait.
        pull_threshold_for_topic: Split evenly over the queues held; -1 turns it off.
        pull_batch_size: Most messages one pull asks for. Larger than RocketMQ's 32: a
            pull costs a round trip, so batches of hundreds keep a queue flowing.
        pull_max_bytes: Most bytes one pull asks for.
        consume_message_batch_max_size: Most messages handed to one listener call.
        max_reconsume_times: Retries after the first try before a message goes to the
            dead-letter queue (so 1 + this many listener calls, RocketMQ's count, for
            orderly and concurrent listeners alike); None means RocketMQ's default
            (orderly: unlimited; concurrent: 16).
        suspend_current_queue_time: Orderly: wait before retrying a failed batch.
        pull_suspend: How long the broker holds a pull that finds nothing.
        pull_timeout: The deadline of a pull call (longer than pull_suspend).
        pull_error_backoff: Wait after a failed pull.
        flow_control_backoff: Wait while a queue is over a threshold (cut short when
            messages leave that queue's cache).
        rebalance_interval: Periodic rebalance (also on start and membership change).
        lock_renew_interval: Orderly: re-lock every held queue this often.
        lock_lease: Orderly: the client's own view of how long a lock lives unrenewed.
        max_continuous_consume: Orderly: longest one queue is consumed before yielding.
        persist_interval: How often offsets are sent to the broker.
        heartbeat_interval: How often the client tells the broker it is alive.
        shutdown_timeout: How long shutdown waits for listener calls in flight.
        young_queue_max_messages: With ConsumeFromWhere.LAST_OFFSET, a queue the group
            never committed starts at offset 0 instead of its end while its first message
            is still stored and it holds at most this many messages (RocketMQ's broker
            starts a new group at 0 while the queue's first message is in memory). 0: always
            at the end.
        max_keys_in_flight_per_queue: Key mode (`ordering=ProcessingOrder.KEY`): most
            listener calls one queue runs at once, each for a different sharding key.
            `consume_threads` bounds the calls of the whole consumer.
        key_failure_policy: Key mode: what becomes of a key whose batch failed
            1 + `max_reconsume_times` times (KeyFailurePolicy: dead-letter the batch, or
            park the key; PARK needs `max_reconsume_times`).
        delivery: How messages reach the consumer. "push" (the default): it subscribes
            to each queue it holds and the broker sends batches as messages arrive, within
            credit the consumer grants as its cache frees room, so a queue's cache stays
            within `pull_threshold_for_queue` messages (and about
            `pull_threshold_bytes_for_queue` bytes). Orderly consumers keep their locks:
            the broker ends a queue's subscription when its lock is lost. Over rocketmq://,
            or with a broker that has no push delivery, the consumer pulls. "pull": it
            asks the broker for each batch, a round trip each (RocketMQ's way; slower:
            docs/performance.md).
    """

    consume_threads: int = 20
    pull_threshold_for_queue: int = 1000
    pull_threshold_bytes_for_queue: int = 100 * MIB
    pull_threshold_for_topic: int = -1
    pull_batch_size: int = 512
    pull_max_bytes: int = 4 * MIB
    consume_message_batch_max_size: int = 1
    max_reconsume_times: int | None = None
    suspend_current_queue_time: float = 1.0
    pull_suspend: float = 15.0
    pull_timeout: float = 30.0
    pull_error_backoff: float = 3.0
    flow_control_backoff: float = 0.05
    rebalance_interval: float = 20.0
    lock_renew_interval: float = 20.0
    lock_lease: float = 30.0
    max_continuous_consume: float = 60.0
    persist_interval: float = 5.0
    heartbeat_interval: float = 10.0
    shutdown_timeout: float = 30.0
    young_queue_max_messages: int = YOUNG_QUEUE_MAX_MESSAGES
    max_keys_in_flight_per_queue: int = 16
    key_failure_policy: KeyFailurePolicy = KeyFailurePolicy.DEAD_LETTER
    delivery: str = "push"

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise InvalidArgumentError(what)

        check_counts(self)
        check_durations(self, zero=_MAY_BE_ZERO)
        need(self.delivery in ("pull", "push"), "delivery must be 'pull' or 'push'")
        need(1 <= self.consume_threads <= 1000, "consume_threads must be within 1..1000")
        need(
            1 <= self.max_keys_in_flight_per_queue <= 1000,
            "max_keys_in_flight_per_queue must be within 1..1000",
        )
        need(1 <= self.pull_threshold_for_queue <= 65535, "pull_threshold_for_queue: 1..65535")
        need(
            MIB <= self.pull_threshold_bytes_for_queue <= 1024 * MIB,
            "pull_threshold_bytes_for_queue must be within 1 MiB..1 GiB",
        )
        need(
            self.pull_threshold_for_topic == -1 or 1 <= self.pull_threshold_for_topic <= 6553500,
            "pull_threshold_for_topic must be -1 (off) or within 1..6553500",
        )
        need(1 <= self.pull_batch_size <= 10_000, "pull_batch_size must be within 1..10000")
        need(1024 <= self.pull_max_bytes <= 32 * MIB, "pull_max_bytes: 1 KiB..32 MiB")
        need(
            1 <= self.consume_message_batch_max_size <= 1024,
            "consume_message_batch_max_size must be within 1..1024",
        )
        need(
            self.max_reconsume_times is None or self.max_reconsume_times >= 1,
            "max_reconsume_times must be at least 1 (or None for the default)",
        )
        need(
            isinstance(self.key_failure_policy, KeyFailurePolicy),
            "key_failure_policy must be a KeyFailurePolicy, "
            f"not {type(self.key_failure_policy).__name__}",
        )
        need(
            self.key_failure_policy is not KeyFailurePolicy.PARK
            or self.max_reconsume_times is not None,
            "key_failure_policy PARK needs max_reconsume_times: the retries before a key is parked",
        )
        need(
            0.01 <= self.suspend_current_queue_time <= 30,
            "suspend_current_queue_time must be within 0.01..30 seconds",
        )
        need(self.young_queue_max_messages >= 0, "young_queue_max_messages must not be negative")
        need(self.pull_timeout > self.pull_suspend >= 0, "pull_timeout must exceed pull_suspend")
        need(
            self.lock_lease > self.lock_renew_interval, "lock_lease must exceed lock_renew_interval"
        )


@dataclass(frozen=True)
class LitePullConsumerConfig:
    """Tuning of a lite pull consumer; every duration is in seconds.

    Attributes:
        pull_batch_size: Most messages one broker pull asks for, and one poll() returns.
            Larger than RocketMQ's 10: a pull costs a round trip.
        pull_max_bytes: Most bytes one pull asks for.
        pull_threshold_for_all: Messages cached over all queues before pulling pauses.
        pull_threshold_for_queue: ... and per queue.
        pull_threshold_bytes_for_queue: ... and body bytes per queue.
        auto_commit_interval: With auto commit, poll() commits at most this often (>= 1).
        pull_suspend: How long the broker holds a pull that finds nothing.
        pull_timeout: The deadline of a pull call.
        pull_error_backoff: Wait after a failed pull.
        flow_control_backoff: Wait while the cache is full or a queue is paused (cut
            short when messages leave that queue's cache).
        rebalance_interval: Periodic rebalance (also on start and membership change).
        lock_renew_interval: Orderly: re-lock every held queue this often.
        lock_lease: Orderly: the client's own view of how long a lock lives unrenewed.
        persist_interval: How often committed offsets are sent to the broker.
        heartbeat_interval: How often the client tells the broker it is alive.
        young_queue_max_messages: With ConsumeFromWhere.LAST_OFFSET, a queue the group
            never committed starts at offset 0 instead of its end while its first message
            is still stored and it holds at most this many messages (RocketMQ's broker
            starts a new group at 0 while the queue's first message is in memory). 0: always
            at the end.
        delivery: How messages reach the cache poll() reads. "push" (the default): it
            subscribes to each queue it holds and the broker sends batches as messages
            arrive, within credit the consumer grants as poll() frees room (a queue's
            share of `pull_threshold_for_all`, at most `pull_threshold_for_queue`
            messages, and about `pull_threshold_bytes_for_queue` bytes). A paused queue
            gets no new subscription; one open keeps its credit, the messages wait in the
            cache. Over rocketmq://, or with a broker that has no push delivery, the
            consumer pulls. "pull": a round trip per batch (RocketMQ's way; slower).
    """

    pull_batch_size: int = 512
    pull_max_bytes: int = 4 * MIB
    pull_threshold_for_all: int = 10_000
    pull_threshold_for_queue: int = 1000
    pull_threshold_bytes_for_queue: int = 100 * MIB
    auto_commit_interval: float = 5.0
    pull_suspend: float = 20.0
    pull_timeout: float = 30.0
    pull_error_backoff: float = 3.0
    flow_control_backoff: float = 0.05
    rebalance_interval: float = 20.0
    lock_renew_interval: float = 20.0
    lock_lease: float = 30.0
    persist_interval: float = 5.0
    heartbeat_interval: float = 10.0
    young_queue_max_messages: int = YOUNG_QUEUE_MAX_MESSAGES
    delivery: str = "push"

    def __post_init__(self) -> None:
        def need(ok: bool, what: str) -> None:
            if not ok:
                raise InvalidArgumentError(what)

        check_counts(self)
        check_durations(self, zero=_MAY_BE_ZERO)
        need(self.delivery in ("pull", "push"), "delivery must be 'pull' or 'push'")
        need(1 <= self.pull_batch_size <= 10_000, "pull_batch_size must be within 1..10000")
        need(1024 <= self.pull_max_bytes <= 32 * MIB, "pull_max_bytes: 1 KiB..32 MiB")
        need(self.pull_threshold_for_all >= 1, "pull_threshold_for_all must be at least 1")
        need(1 <= self.pull_threshold_for_queue <= 65535, "pull_threshold_for_queue: 1..65535")
        need(
            MIB <= self.pull_threshold_bytes_for_queue <= 1024 * MIB,
            "LitePullConsumerConfig.pull_threshold_bytes_for_queue must be within 1 MiB..1 GiB "
            f"(as RocketMQ's), not {self.pull_threshold_bytes_for_queue}",
        )
        need(self.auto_commit_interval >= 1.0, "auto_commit_interval must be at least 1 second")
        need(self.young_queue_max_messages >= 0, "young_queue_max_messages must not be negative")
        need(self.pull_timeout > self.pull_suspend >= 0, "pull_timeout must exceed pull_suspend")
        need(
            self.lock_lease > self.lock_renew_interval, "lock_lease must exceed lock_renew_interval"
        )
