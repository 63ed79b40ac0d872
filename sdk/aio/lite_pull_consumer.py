"""sdk.aio.LitePullConsumer: poll loops on the caller's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable
from datetime import datetime
from types import TracebackType

from sdk._transport import connect
from sdk.clock import Clock
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.consumer.config import ConsumeFromWhere, LitePullConsumerConfig
from sdk.consumer.core import QueueHook
from sdk.consumer.lite_pull import DEFAULT_POLL_TIMEOUT
from sdk.consumer.lite_pull_core import LitePullConsumerCore
from sdk.credentials import Credentials
from sdk.message import MessageExt, MessageQueue
from sdk.tls import TLSConfig


class LitePullConsumer:
    """The asyncio lite pull consumer; arguments as sdk.LitePullConsumer.

    Besides `await poll()`, `async for message in consumer` yields messages one by one
    (in queue order) until the consumer is shut down. Auto commit covers the messages it
    yielded: leaving the loop mid-batch leaves the rest of the batch uncommitted.
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

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Share `topic`'s queues with the group (exclusive with assign); before start()."""
        self._core.subscribe(topic, expression)

    def assign(self, queues: list[MessageQueue]) -> Awaitable[None]:
        """Consume exactly these queues (exclusive with subscribe), before or after start().

        Before start() it only records them; awaiting is optional. After start(),
        `await consumer.assign(queues)` returns once the queues are taken (the next
        poll(), commit() or seek waits for that too, so the await may be left out) and
        raises InvalidQueueError, changing nothing, for a queue its topic does not have.
        """
        return self._core.assign(queues)

    async def start(self) -> None:
        """Join the group and start pulling in the background."""
        await self._core.start()

    async def shutdown(self) -> None:
        """Commit what poll() returned (auto commit), release locks, leave the group.

        The last batch counts as processed; leaving an `async with` block by an exception
        leaves it uncommitted instead.
        """
        await self._core.shutdown()

    async def poll(self, timeout: float = DEFAULT_POLL_TIMEOUT) -> list[MessageExt]:
        """Messages of one queue in order, or [] if none arrive within `timeout` seconds."""
        return await self._core.poll(timeout)

    async def commit(
        self, offsets: dict[MessageQueue, int] | None = None, persist: bool = True
    ) -> None:
        """Commit what poll() returned, or `offsets`."""
        await self._core.commit(offsets, persist=persist)

    async def committed(self, mq: MessageQueue) -> int:
        """The group's committed offset of `mq`; -1 if none.

        InvalidQueueError for a queue its topic does not have (see fetch_message_queues).
        """
        return await self._core.committed(mq)

    async def seek(self, mq: MessageQueue, offset: int) -> None:
        """Continue `mq` at `offset` within [min, max]."""
        await self._core.seek(mq, offset)

    async def seek_to_begin(self, mq: MessageQueue) -> None:
        """Continue `mq` at its min offset."""
        await self._core.seek_to_begin(mq)

    async def seek_to_end(self, mq: MessageQueue) -> None:
        """Continue `mq` at its max offset."""
        await self._core.seek_to_end(mq)

    def pause(self, queues: list[MessageQueue]) -> None:
        """Hold these queues back until resume()."""
        self._core.pause(queues)

    def resume(self, queues: list[MessageQueue]) -> None:
        """Let paused queues be polled again."""
        self._core.resume(queues)

    def assignment(self) -> set[MessageQueue]:
        """The queues held now."""
        return self._core.assignment()

    async def fetch_message_queues(self, topic: str) -> list[MessageQueue]:
        """Every readable queue of `topic`."""
        return await self._core.fetch_message_queues(topic)

    async def offsets_for_timestamp(self, mq: MessageQueue, timestamp: float) -> int:
        """The first offset of `mq` stored at or after `timestamp`.

        InvalidQueueError for a queue its topic does not have (see fetch_message_queues).
        """
        return await self._core.offsets_for_timestamp(mq, timestamp)

    async def __aiter__(self) -> AsyncIterator[MessageExt]:
        # Only the messages yielded count as returned: leaving the loop mid-batch, the
        # rest of the batch is not committed.
        while self._core.running:
            for message in await self._core.poll(DEFAULT_POLL_TIMEOUT):
                self._core.handed_out(message)
                yield message

    async def __aenter__(self) -> LitePullConsumer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None and self._core.running:
            self._core.abandon_last_batch()
        await self.shutdown()
