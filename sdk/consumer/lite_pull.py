"""sdk.LitePullConsumer: the blocking poll-loop consumer for batch jobs."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Any

from sdk._blocking import BlockingClient
from sdk._transport import connect
from sdk.clock import Clock
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.consumer.config import ConsumeFromWhere, LitePullConsumerConfig
from sdk.consumer.core import QueueHook
from sdk.consumer.lite_pull_core import LitePullConsumerCore
from sdk.credentials import Credentials
from sdk.message import MessageExt, MessageQueue
from sdk.tls import TLSConfig

#: RocketMQ's default poll timeout.
DEFAULT_POLL_TIMEOUT = 5.0


class LitePullConsumer(BlockingClient):
    """Pull messages in your own loop: `poll()`, process, `commit()`.

    Args:
        group: Consumer group (for offsets, and for sharing queues when subscribing).
        endpoints: One broker "host:port" or several.
        auto_commit: Commit what poll() returned every `config.auto_commit_interval`
            seconds (checked in poll), when a rebalance takes a queue away, and at
            shutdown. It commits a batch only once the caller is done with it: when it
            calls poll() again (or commit(), or shutdown()). So a crash, or an exception
            that leaves the `with` block, delivers the batch in hand again. Off: call
            commit() yourself.
        orderly: Hold the broker lock of every queue this consumer polls, so two workers
            of the group never process one queue at the same time; a worker that lost
            its lock gets StaleEpochError / LockNotHeldError from commit().
        consume_from_where: As for PushConsumer.
        consume_timestamp: As for PushConsumer.
        allocate_strategy: As for PushConsumer.
        on_queues_assigned: As for PushConsumer.
        on_queues_revoked: As for PushConsumer.
        clock: As for PushConsumer.
        tls: As for PushConsumer.
        credentials: As for PushConsumer.
        config: LitePullConsumerConfig.

    Example::

        consumer = LitePullConsumer("nightly-export", "127.0.0.1:8081", auto_commit=False)
        consumer.subscribe("orders")
        with consumer:
            while batch := consumer.poll(timeout=1.0):
                export(batch)
                consumer.commit()

    Or with queues of your choosing (RocketMQ's assign flow)::

        with LitePullConsumer("replay", "127.0.0.1:8081") as consumer:
            consumer.assign(consumer.fetch_message_queues("orders")[:2])
            batch = consumer.poll()
    """

    def __init__(
        self,
        group: str,
        endpoints: str | list[str],
        *,
        auto_commit: bool = True,
        orderly: bool = False,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: datetime | float | None = None,
        allocate_strategy: AllocateMessageQueueStrategy | None = None,
        config: LitePullConsumerConfig | None = None,
        on_queues_assigned: QueueHook | None = None,
        on_queues_revoked: QueueHook | None = None,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._core = LitePullConsumerCore(
            group,
            connect(endpoints, tls, credentials, clock),
            auto_commit=auto_commit,
            orderly=orderly,
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
            config=config,
            on_queues_assigned=on_queues_assigned,
            on_queues_revoked=on_queues_revoked,
            clock=clock,
        )
        self._core.batches_lent = 2  # see LitePullConsumerCore.batches_lent
        super().__init__(self._core, f"ordermq-pull-{group}")

    @property
    def client_id(self) -> str:
        """The member id this consumer has in its group."""
        return self._core.client_id

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Share `topic`'s queues with the group (exclusive with assign); before start().

        The topic need not exist yet: its queues are taken once a producer creates it.
        """
        self._core.subscribe(topic, expression)

    def assign(self, queues: list[MessageQueue]) -> None:
        """Consume exactly these queues (exclusive with subscribe), before or after start().

        After start() it replaces the assignment and returns once the queues are taken
        (RocketMQ's flow: start, fetch_message_queues, assign, poll); queues no longer
        assigned are released. InvalidQueueError, changing nothing, unless every queue is
        a readable queue of its topic.
        """
        if self._core.running:
            self._run(_assign(self._core, queues))
        else:
            self._core.assign(queues)

    def shutdown(self) -> None:
        """Commit what poll() returned (auto commit), release locks, leave the group.

        The last batch counts as processed (as with Kafka's close()); leaving a `with`
        block by an exception leaves it uncommitted instead.
        """
        super().shutdown()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._core.running:
            self._run(_call(self._core.abandon_last_batch))
        super().__exit__(exc_type, exc, tb)

    def poll(self, timeout: float = DEFAULT_POLL_TIMEOUT) -> list[MessageExt]:
        """Messages of one queue in order, or [] if none arrive within `timeout` seconds."""
        core = self._core
        if timeout < 0:
            return self._run(core.poll(timeout))  # which refuses it
        # One hop to the consumer's loop: a batch already pulled comes straight back,
        # without a task (poll_now); anything else (waiting, auto commit) runs poll().
        return self._run_or_call(core.poll_now, lambda: core.poll(timeout))

    def commit(self, offsets: dict[MessageQueue, int] | None = None, persist: bool = True) -> None:
        """Commit what poll() returned, or `offsets` (the next offset to consume)."""
        self._run(self._core.commit(offsets, persist=persist))

    def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset of `mq` at the broker; -1 if none.

        InvalidQueueError for a queue its topic does not have (see fetch_message_queues).
        """
        return self._run(self._core.committed(mq))

    def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue `mq` at `offset`, which must be within [min, max]."""
        self._run(self._core.seek(mq, offset))

    def seek_to_begin(self, mq: MessageQueue) -> None:
        """Continue `mq` at its min offset."""
        self._run(self._core.seek_to_begin(mq))

    def seek_to_end(self, mq: MessageQueue) -> None:
        """Continue `mq` at its max offset."""
        self._run(self._core.seek_to_end(mq))

    def pause(self, queues: list[MessageQueue]) -> None:
        """Hold these queues back from poll() until resume()."""
        self._run(_call(self._core.pause, queues))

    def resume(self, queues: list[MessageQueue]) -> None:
        """Let paused queues be polled again."""
        self._run(_call(self._core.resume, queues))

    def assignment(self) -> set[MessageQueue]:
        """The queues held now."""
        return self._core.assignment()

    def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic` (after start(); for assign())."""
        return self._run(self._core.fetch_message_queues(topic))

    def offsets_for_timestamp(self, mq: MessageQueue, timestamp: float) -> int:
        """The first offset of `mq` stored at or after `timestamp` (epoch seconds).

        InvalidQueueError for a queue its topic does not have (see fetch_message_queues).
        """
        return self._run(self._core.offsets_for_timestamp(mq, timestamp))


async def _assign(core: LitePullConsumerCore, queues: list[MessageQueue]) -> None:
    await core.assign(queues)


async def _call(fn: Callable[..., None], *args: Any) -> None:
    """Run a state change on the consumer's loop (its events and locks are not thread-safe)."""
    fn(*args)
