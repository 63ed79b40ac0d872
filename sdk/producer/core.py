"""The producer's async core, shared by the blocking and the asyncio faces."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from sdk._transport.cluster import Cluster
from sdk._transport.codec import MessageIdGenerator, encode_message
from sdk._validation import check_group, check_topic
from sdk._wire import MAX_SEND_BYTES
from sdk.clock import Clock, SystemClock
from sdk.errors import (
    ClientStateError,
    FlushTimeoutError,
    InvalidArgumentError,
    MessageNotFoundError,
    OrderMQError,
)
from sdk.message import Message, MessageQueue, SendResult, SendStatus
from sdk.selector import MessageQueueSelector, RoundRobinSelector, shard_index

log = logging.getLogger("ordermq.producer")

#: Longer than the broker's default sync-flush wait (5 s), so that a flush timeout is
#: reported by the broker rather than hidden behind a client deadline.
DEFAULT_SEND_TIMEOUT_SECONDS = 10.0


class PartialBatchError(OrderMQError):
    """Some queues of a batch were stored and others were not.

    `results[i]` is the SendResult of message i, or None where its queue failed;
    `errors` holds the failures.
    """

    def __init__(self, results: list[SendResult | None], errors: list[OrderMQError]) -> None:
        stored = sum(r is not None for r in results)
        super().__init__(
            f"{stored} of {len(results)} messages were stored; the rest failed: {errors[0]}"
        )
        self.results = results
        self.errors = errors


class ProducerCore:
    """Routes, queue selection, encoding and sends; runs on one event loop."""

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        group: str | None = None,
        send_timeout: float = DEFAULT_SEND_TIMEOUT_SECONDS,
        clock: Clock | None = None,
    ) -> None:
        self._cluster = Cluster(endpoints)
        self.group = check_group(group) if group is not None else None
        if send_timeout <= 0:
            raise InvalidArgumentError("send_timeout must be positive")
        self._send_timeout = send_timeout
        self._clock: Clock = clock or SystemClock()
        self._ids = MessageIdGenerator()
        self._round_robin = RoundRobinSelector()
        self._state = "new"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open a channel to the configured brokers."""
        if self._state != "new":
            raise ClientStateError(f"producer cannot start: it is {self._state}")
        self._cluster.brokers()  # open the channels
        self._state = "running"

    async def shutdown(self) -> None:
        """Close every channel."""
        self._state = "shut down"
        await self._cluster.close()

    def _check_running(self) -> None:
        if self._state != "running":
            raise ClientStateError(f"producer is {self._state}; call start() first")

    # ------------------------------------------------------------------ routes
    async def writable_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues sorted by (broker, queue id); cached."""
        self._check_running()
        return await self._cluster.writable_queues(topic)

    # ------------------------------------------------------------------ send
    async def send(
        self,
        message: Message,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message and return where it was stored."""
        queues = await self.writable_queues(message.topic)
        queue = self._select(queues, message, selector, arg)
        msg_id = self._ids.next()
        frame = encode_message(message, msg_id, self._clock.now())
        return (await self._send_frames(queue, [frame], [msg_id], timeout))[0]

    async def send_batch(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[SendResult]:
        """Send many messages; one request per queue. Results follow the input order.

        Keyed messages go to their key's queue; the keyless ones of the batch share one
        queue chosen round robin.
        """
        if not messages:
            raise InvalidArgumentError("send_batch needs at least one message")
        groups: dict[tuple[MessageQueue, bool], list[int]] = {}
        keyless: dict[str, MessageQueue] = {}
        by_topic: dict[str, list[MessageQueue]] = {}
        for i, m in enumerate(messages):
            queues = by_topic.get(m.topic)
            if queues is None:
                queues = by_topic[m.topic] = await self.writable_queues(m.topic)
            if m.sharding_key is not None:
                queue = queues[shard_index(m.sharding_key, len(queues))]
            else:
                queue = keyless.get(m.topic) or self._round_robin(queues, m, None)
                keyless[m.topic] = queue
            delayed = m.delay_seconds is not None or m.deliver_at is not None
            groups.setdefault((queue, delayed), []).append(i)
        ids = [self._ids.next() for _ in messages]
        frames = [encode_message(m, ids[i], self._clock.now()) for i, m in enumerate(messages)]
        calls = []
        for (queue, _), indexes in groups.items():
            for chunk in _chunks_by_size(indexes, frames):
                calls.append((chunk, self._send_frames(
                    queue, [frames[i] for i in chunk], [ids[i] for i in chunk], timeout
                )))  # fmt: skip
        outcomes = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        results: list[SendResult | None] = [None] * len(messages)
        errors: list[OrderMQError] = []
        for (chunk, _), outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, OrderMQError):
                errors.append(outcome)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                for i, result in zip(chunk, outcome, strict=True):
                    results[i] = result
        if errors:
            if all(r is None for r in results):
                raise errors[0]
            raise PartialBatchError(results, errors)
        return [r for r in results if r is not None]

    async def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        """The queues `send` chooses among for `topic`."""
        check_topic(topic)
        return list(await self.writable_queues(topic))

    def _select(
        self,
        queues: list[MessageQueue],
        message: Message,
        selector: MessageQueueSelector | None,
        arg: Any,
    ) -> MessageQueue:
        if selector is not None:
            queue = selector(queues, message, arg)
            if queue not in queues:
                raise InvalidArgumentError(f"the selector chose {queue!r}, not a writable queue")
            return queue
        if message.sharding_key is not None:
            return queues[shard_index(message.sharding_key, len(queues))]
        return self._round_robin(queues, message, arg)

    async def _send_frames(
        self, queue: MessageQueue, frames: list[bytes], ids: list[bytes], timeout: float | None
    ) -> list[SendResult]:
        appended = await self._cluster.client_for(queue).send(
            queue.topic,
            queue.queue_id,
            b"".join(frames),
            timeout=timeout if timeout is not None else self._send_timeout,
        )
        if not appended.durable:
            raise FlushTimeoutError(
                f"{queue.topic} queue {queue.queue_id}: the broker stored {appended.count} "
                f"message(s) from offset {appended.first_offset} but its sync flush timed "
                f"out; they may not survive a power loss (a resend may duplicate them)",
                code="OK",
                reason="FLUSH_DISK_TIMEOUT",
            )
        return [
            SendResult(
                SendStatus.SEND_OK,
                msg_id.hex().upper(),
                queue,
                -1 if appended.scheduled else appended.first_offset + i,
            )
            for i, msg_id in enumerate(ids)
        ]

    async def cancel(self, msg_id: str) -> bool:
        """Cancel a scheduled message; False if it was already delivered."""
        self._check_running()
        last: OrderMQError | None = None
        for client in self._cluster.brokers():
            try:
                return await client.cancel_scheduled("", msg_id)
            except MessageNotFoundError as exc:
                last = exc  # another broker may hold it
        assert last is not None
        raise last


def _chunks_by_size(indexes: list[int], frames: list[bytes]) -> list[list[int]]:
    """Split a queue's messages into requests of at most MAX_SEND_BYTES each."""
    chunks: list[list[int]] = [[]]
    size = 0
    for i in indexes:
        n = len(frames[i])
        if chunks[-1] and size + n > MAX_SEND_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += n
    return chunks
