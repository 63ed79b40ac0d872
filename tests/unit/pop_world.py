"""A broker's pop core without a server: store, offsets, retry and PopService on a FakeClock.

`crash()` abandons the pop core as kill -9 would (no final offset commit, no journal
sync: a process killed keeps what it wrote to the page cache, loses nothing else) and
opens everything again on the same directory.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from mockbroker.long_polling import PullHolder
from mockbroker.offsets import ConsumerOffsets
from mockbroker.pop import PopService, Received
from mockbroker.retry import RetryService
from mockbroker.schedule import Scheduler
from mockbroker.store.message_store import MessageStore
from mockbroker.topic_creation import TopicCreation
from mockbroker.topics import Topic
from sdk._wire import StoredRecord, encode_frame, iter_records
from sdk.testing import FakeClock

T = TypeVar("T")
START = 1_800_000_000.0


def record_of(received: Received) -> StoredRecord:
    [record] = iter_records(received.record)
    return record


class PopWorld:
    """Everything PopService needs, on one event loop, opened on `path`."""

    def __init__(
        self, path: Path, *, max_in_flight: int = 1024, max_attempts: int = 17, queues: int = 2
    ) -> None:
        self.path = path
        self.max_in_flight = max_in_flight
        self.max_attempts = max_attempts
        self.queues = queues
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock(start=START)
        self.sent = 0
        self._open()

    def _open(self) -> None:
        self.store = MessageStore(
            self.path, sync_flush=False, segment_bytes=1 << 20, flush_interval_seconds=60,
            sync_flush_timeout_seconds=5, clock=self.clock,
        )  # fmt: skip
        self.store.open()
        self.run(self.store.start())
        self.offsets = ConsumerOffsets(self.path / "offsets.json")
        self.offsets.load()
        self.scheduler = Scheduler(self.store, self.clock)
        self.scheduler.load()
        self.holder = PullHolder(self.clock)
        self.store.on_append = self.holder.notify
        self.topics = TopicCreation(self.store, max_topics=4096, client_max_topics=256)
        self.retry = RetryService(self.store, self.scheduler, self.clock, self.topics)
        self.pop = PopService(
            self.path / "pop", store=self.store, offsets=self.offsets, retry=self.retry,
            holder=self.holder, clock=self.clock, max_in_flight=self.max_in_flight,
            max_attempts=self.max_attempts, commit_interval_seconds=0.5,
        )  # fmt: skip
        try:
            self.pop.load()
        except BaseException:
            self.run(self.store.close())
            raise

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(asyncio.wait_for(coroutine, 30))

    def topic(self, name: str = "jobs") -> Topic:
        return self.store.topics.find(name) or self.store.create_topic(name, self.queues)[0]

    def send(self, queue_id: int, *bodies: bytes, key: bytes = b"", topic: str = "jobs") -> None:
        frames = b""
        for body in bodies:
            self.sent += 1
            frames += encode_frame(
                msg_id=self.sent.to_bytes(16, "big"), born_timestamp_ms=1, body=body,
                sharding_key=key, tags=b"T",
            )  # fmt: skip
        self.run(self.store.put(self.topic(topic), queue_id, frames))

    def receive(
        self,
        group: str = "g",
        max_messages: int = 32,
        invisible: float = 10.0,
        *,
        topic: str = "jobs",
        queue_ids: Sequence[int] = (),
        **kw: Any,
    ) -> list[Received]:
        return self.run(
            self.pop.receive(
                group, topic, max_messages=max_messages, invisible_ms=int(invisible * 1000),
                queue_ids=queue_ids, **kw,
            )
        )  # fmt: skip

    def ack(self, received: Received | str, group: str = "g") -> None:
        receipt = received if isinstance(received, str) else received.receipt
        self.run(self.pop.ack(group, receipt))

    def advance(self, seconds: float) -> int:
        """Move the clock and sweep: leases end, used-up messages go to the DLQ."""
        self.clock.advance(seconds)
        return self.run(self.pop.sweep())

    def dead_letters(self, group: str = "g") -> list[StoredRecord]:
        topic = self.store.topics.find("%DLQ%" + group)
        if topic is None:
            return []
        got = self.store.get(topic, 0, 0, max_messages=10_000, max_bytes=1 << 30)
        return list(iter_records(got.records))

    def committed(self, group: str = "g", queue_id: int = 0, topic: str = "jobs") -> int | None:
        return self.offsets.get(group, topic, queue_id)

    def crash(self) -> None:
        """kill -9 and start again: the pop core is dropped as it is."""
        journal = self.pop.journal
        if journal._fd is not None:
            os.close(journal._fd)  # no sync: the page cache keeps what was written
            journal._fd = None
        self._reopen()

    def restart(self) -> None:
        """A clean stop and start."""
        self.run(self.pop.stop())
        self._reopen()

    def _reopen(self) -> None:
        self.run(self.scheduler.stop())
        self.run(self.store.close())
        self._open()

    def close(self) -> None:
        self.run(self.pop.stop())
        self.run(self.scheduler.stop())
        self.run(self.store.close())
        self.loop.close()
