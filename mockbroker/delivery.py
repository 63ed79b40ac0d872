"""Sends and pulls on the store, the same for every front (gRPC, RocketMQ remoting).

A front translates its wire into frames (sdk/_wire.py) and calls `Delivery.send`, or
asks `Delivery.pull` for records; the checks, their order, fair scheduling between clients
(mockbroker/fair_store.py), the per-client memory limit (mockbroker/limits.py) and long
polling live here once. Every refusal is a BrokerError, raised before anything changed.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

from mockbroker.errors import BrokerError, invalid
from mockbroker.state import BrokerState
from mockbroker.store.message_store import GetResult, PutResult, Written
from mockbroker.store.records import CheckedFrame
from mockbroker.topics import Topic, check_group, check_user_topic
from sdk._wire import MAX_PULL_BYTES, MAX_PULL_MESSAGES, MAX_SEND_BYTES

#: Longest a pull may be held (RocketMQ clients wait 30 s for a pull's answer).
MAX_SUSPEND_MS = 60_000

_Append = Callable[[Topic, int, bytes, list[CheckedFrame]], Awaitable[PutResult]]


@dataclass(frozen=True, slots=True)
class SendOutcome:
    """What a send stored: its first offset (-1 when scheduled), count, time, durability.

    A scheduled batch waits in the schedule queue from `schedule_offset` on.
    """

    first_offset: int
    count: int
    store_timestamp_ms: int
    durable: bool
    scheduled: bool = False
    schedule_offset: int = -1


class Delivery:
    """The broker's send and pull work for one BrokerState."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state
        self._send_seconds = state.requests.send_seconds

    async def send(self, client: str, topic_name: str, queue_id: int, frames: bytes) -> SendOutcome:
        """Store a batch of frames in one queue, or schedule it (all due later).

        `client` names the connection it came on (fairness between clients). A topic
        missing while auto-creation is on is created only once every check has passed.
        """
        started = time.perf_counter()
        check_user_topic(topic_name)
        if len(frames) > MAX_SEND_BYTES:
            raise BrokerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "BATCH_TOO_LARGE",
                f"the request carries {len(frames)} bytes of frames, "
                f"over the limit of {MAX_SEND_BYTES}",
            )
        store = self._s.store
        topic = store.topics.find(topic_name)
        if topic is None and not self._s.config.auto_create_topics:
            topic = store.topics.get(topic_name)  # TOPIC_NOT_FOUND
        (topic or Topic(topic_name, self._s.config.default_queues)).check_queue(queue_id)
        sliced = self._s.sliced
        if sliced is None:
            checked = store.check(frames)
            outcome = await self._store(
                self._accepted(client, topic_name, checked), queue_id, frames, checked,
                store.append,
            )  # fmt: skip
        else:
            queue = (topic_name, queue_id)

            def write_now(checked: list[CheckedFrame]) -> Written | None:
                found = self._accepted(client, topic_name, checked)
                if _scheduled(checked) or sliced.writing(queue):
                    return None  # append writes it, once the batch being written is whole
                return store.write(found, queue_id, frames, checked)

            async with sliced.in_order(client, queue) as hold:
                checked, written = await sliced.check(client, frames, write_now)
                if written is None:
                    append = functools.partial(sliced.append, client, hold)
                    found = self._accepted(client, topic_name, checked)
                    outcome = await self._store(found, queue_id, frames, checked, append)
            if written is not None:
                durable = await store.durable(written.end)
                outcome = SendOutcome(
                    written.first_offset, written.count, written.store_timestamp_ms, durable
                )
        self._send_seconds.observe(time.perf_counter() - started)
        return outcome

    def _accepted(self, client: str, topic_name: str, checked: list[CheckedFrame]) -> Topic:
        """The topic to store `checked` in, once the last checks passed (created if need be)."""
        _scheduled(checked)  # INVALID_DELIVERY_TIME for a mixed batch
        self._s.store.check_accepting_sends()
        return self._s.topic_creation.user_topic(
            topic_name, self._s.config.default_queues, client=client
        )

    async def _store(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: list[CheckedFrame],
        append: _Append,
    ) -> SendOutcome:
        if _scheduled(checked):
            put = await self._s.scheduler.schedule_stored(topic, queue_id, frames, checked)
            now_ms = int(self._s.clock.now() * 1000)
            return SendOutcome(-1, len(checked), now_ms, put.durable, True, put.first_offset)
        result = await append(topic, queue_id, frames, checked)
        return SendOutcome(
            result.first_offset, result.count, result.store_timestamp_ms, result.durable
        )

    async def pull(
        self,
        client: str,
        *,
        group: str,
        topic_name: str,
        queue_id: int,
        offset: int,
        max_messages: int,
        max_bytes: int,
        tags: frozenset[bytes] | None,
        suspend_ms: int,
    ) -> GetResult:
        """Read from one queue by offset; hold the pull up to `suspend_ms` for a message.

        `tags` is a parsed tag expression (None: every message).
        """
        check_group(group)
        if not 1 <= max_messages <= MAX_PULL_MESSAGES:
            raise invalid(
                "INVALID_ARGUMENT",
                f"max_messages {max_messages} is outside 1..{MAX_PULL_MESSAGES}",
            )
        if not 1 <= max_bytes <= MAX_PULL_BYTES:
            raise invalid(
                "INVALID_ARGUMENT", f"max_bytes {max_bytes} is outside 1..{MAX_PULL_BYTES}"
            )
        if not 0 <= suspend_ms <= MAX_SUSPEND_MS:
            raise invalid(
                "INVALID_ARGUMENT",
                f"suspend_timeout_ms {suspend_ms} is outside 0..{MAX_SUSPEND_MS}",
            )
        topic = self._s.topic_queue(topic_name, queue_id)
        deadline = self._s.clock.now() + suspend_ms / 1000
        limits, sliced = self._s.limits, self._s.sliced
        while True:
            if limits.over(client):
                await limits.room(client)
            if sliced is None:
                got = self._s.store.get(
                    topic, queue_id, offset, max_messages=max_messages, max_bytes=max_bytes,
                    tags=tags,
                )  # fmt: skip
            else:
                got = await sliced.get(
                    client, topic, queue_id, offset, max_messages=max_messages,
                    max_bytes=max_bytes, tags=tags,
                )  # fmt: skip
            caught_up = got.status == "NO_NEW_MESSAGE" or (
                got.status == "NO_MATCHED_MESSAGE" and got.next_offset == got.max_offset
            )
            if not caught_up or not suspend_ms:
                return got
            offset = got.next_offset
            if not await self._s.holder.wait((topic.name, queue_id), deadline):
                return got


def _scheduled(checked: list[CheckedFrame]) -> bool:
    """True for a batch of scheduled messages; INVALID_DELIVERY_TIME for a mixed one."""
    scheduled = sum(1 for f in checked if f.due_ms)
    if scheduled and scheduled != len(checked):
        raise invalid(
            "INVALID_DELIVERY_TIME",
            "a batch is either all scheduled or all for now; send them separately",
        )
    return bool(scheduled)
