"""Send-back: a failed message goes to its group's retry topic, or dead-letter topic.

It goes to the retry topic, delayed, until it has been retried enough, then to the
dead-letter topic.

Retry topic `%RETRY%<group>` and dead-letter topic `%DLQ%<group>` have one queue each and
are created on first use (mockbroker/topic_creation.py). A retried copy keeps the message
id and gains the properties ORIGIN_TOPIC, ORIGIN_QUEUE_ID and ORIGIN_QUEUE_OFFSET (kept
from the first failure on).
"""

from __future__ import annotations

from dataclasses import dataclass

from mockbroker.errors import invalid
from mockbroker.schedule import Scheduler, frame_of
from mockbroker.store.message_store import MessageStore
from mockbroker.store.records import check_frames
from mockbroker.topic_creation import TopicCreation
from mockbroker.topics import Topic
from sdk._validation import DLQ_PREFIX, RETRY_PREFIX
from sdk._wire import (
    DELAY_LEVEL_SECONDS,
    FRAME_FIELDS,
    RECORD,
    decode_properties,
    encode_frame,
    encode_properties,
)
from sdk.clock import Clock

#: RocketMQ's default: a message is retried 16 times before it is dead-lettered.
DEFAULT_MAX_RECONSUME_TIMES = 16


@dataclass(frozen=True)
class SentBack:
    """Where a failed message went."""

    dead_letter: bool
    topic: str
    reconsume_times: int


class RetryService:
    """Decides between retry and dead letter, and stores the copy."""

    def __init__(
        self, store: MessageStore, scheduler: Scheduler, clock: Clock, topics: TopicCreation
    ) -> None:
        self._store = store
        #: Where the retry and dead-letter topics are created (under the broker's limits).
        self.topics = topics
        self._scheduler = scheduler
        self._clock = clock
        #: Messages stored in each group's retry topic, and in its dead-letter topic.
        self.retried: dict[str, int] = {}
        self.dead_lettered: dict[str, int] = {}

    async def send_back(
        self,
        group: str,
        topic: Topic,
        queue_id: int,
        queue_offset: int,
        *,
        delay_level: int,
        max_reconsume_times: int,
        reconsume_times: int,
    ) -> SentBack:
        """Store a retry or dead-letter copy of the message at (topic, queue, offset)."""
        if not 0 <= delay_level <= len(DELAY_LEVEL_SECONDS):
            raise invalid(
                "INVALID_ARGUMENT",
                f"delay level {delay_level} is outside 0..{len(DELAY_LEVEL_SECONDS)}",
            )
        if max_reconsume_times < 0 or reconsume_times < 0:
            raise invalid("INVALID_ARGUMENT", "reconsume counts must not be negative")
        record = self._store.read_record(topic, queue_id, queue_offset)
        stored_times = RECORD.unpack_from(record)[6]
        times = max(stored_times, reconsume_times)
        limit = max_reconsume_times or DEFAULT_MAX_RECONSUME_TIMES
        if times >= limit:
            return await self._dead_letter(group, topic, queue_id, queue_offset, record, times)
        retry = await self._system_topic(RETRY_PREFIX + group)
        level = min(delay_level or 3 + times, len(DELAY_LEVEL_SECONDS))
        frame = copy_frame(record, topic.name, queue_id, queue_offset, delay_level=level)
        checked = self._store.check(frame)
        await self._scheduler.schedule(retry, 0, frame, checked, reconsume_times=times + 1)
        self.retried[group] = self.retried.get(group, 0) + 1
        return SentBack(False, retry.name, times + 1)

    async def dead_letter(
        self, group: str, topic: Topic, queue_id: int, queue_offset: int, *, reconsume_times: int
    ) -> SentBack:
        """Store a dead-letter copy of the message at (topic, queue, offset) at once.

        Receives (mockbroker/pop) send a message here once it was delivered as often as
        the group allows, or when the client forwards it.
        """
        record = self._store.read_record(topic, queue_id, queue_offset)
        times = max(RECORD.unpack_from(record)[6], reconsume_times)
        return await self._dead_letter(group, topic, queue_id, queue_offset, record, times)

    async def _dead_letter(
        self, group: str, topic: Topic, queue_id: int, queue_offset: int, record: bytes, times: int
    ) -> SentBack:
        dlq = await self._system_topic(DLQ_PREFIX + group)
        frame = copy_frame(record, topic.name, queue_id, queue_offset, delay_level=0)
        checked = check_frames(frame, int(self._clock.now() * 1000))
        await self._store.append(dlq, 0, frame, checked, reconsume_times=times)
        self.dead_lettered[group] = self.dead_lettered.get(group, 0) + 1
        return SentBack(True, dlq.name, times)

    async def _system_topic(self, name: str) -> Topic:
        return await self.topics.system_topic(name)


def copy_frame(
    record: bytes,
    topic: str,
    queue_id: int,
    queue_offset: int,
    *,
    delay_level: int,
    extra: dict[str, str] | None = None,
) -> bytes:
    """The record's message as a new frame: origin properties, `extra` ones, a delay level."""
    frame = frame_of(record)
    msg_id, born, _at, _level, tl, sl, kl, pl, bl = FRAME_FIELDS.unpack_from(frame)
    p = FRAME_FIELDS.size
    tags, p = bytes(frame[p : p + tl]), p + tl
    sharding, p = bytes(frame[p : p + sl]), p + sl
    keys, p = bytes(frame[p : p + kl]), p + kl
    props = decode_properties(frame[p : p + pl]) if pl else {}
    body = bytes(frame[p + pl : p + pl + bl])
    if "ORIGIN_TOPIC" not in props:
        props.update(
            ORIGIN_TOPIC=topic, ORIGIN_QUEUE_ID=str(queue_id), ORIGIN_QUEUE_OFFSET=str(queue_offset)
        )
    props.update(extra or {})
    return encode_frame(
        msg_id=msg_id,
        born_timestamp_ms=born,
        body=body,
        tags=tags,
        sharding_key=sharding,
        keys=keys.split(b"\x00") if keys else (),
        properties=encode_properties(props),
        delay_level=delay_level,
    )
