"""Deduplicated sends: what Delivery asks before storing a batch, and tells after.

`placed` finds, once `settle` waited for the writes of the same keys, a batch whose every
message is a duplicate of one earlier send stored in one queue in that order (a retried
request): it is answered with that send's place. Any other batch is stored whole
(`storing`, then `stored`). A message whose first copy is
still being written is answered only once that write is done, and only as durable as a
flush then makes it: a duplicate never reports stored what could still be lost.

The window is refilled at start from the commit log (`rebuild`), not from a file of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from mockbroker.dedup import DedupWindow, Placed, frame_keys, recent_keys
from mockbroker.errors import BrokerError
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import is_system_topic
from sdk._wire import iter_records
from sdk.errors import CorruptRecordError

#: A record as the rebuild reads it: topic, queue id, offset, store ms, msg id, properties.
_Record = tuple[str, int, int, int, bytes, bytes]


class DedupSends:
    """The broker's dedup window and the batches being written, for Delivery."""

    def __init__(self, window: DedupWindow, store: MessageStore) -> None:
        self.window = window
        self._store = store
        self._pending: dict[bytes, asyncio.Future[None]] = {}

    def keys(self, topic: str, frames: bytes) -> list[bytes]:
        """The digests of the frames' keys; none for frames that do not parse (refused later)."""
        return frame_keys(topic, frames) or []

    async def settle(self, keys: list[bytes]) -> None:
        """Wait until no batch with any of `keys` is being written."""
        while waits := {self._pending[k] for k in keys if k in self._pending}:
            await asyncio.wait(waits)

    def placed(self, keys: list[bytes]) -> Placed | None:
        """The place of the earlier send `keys` all repeat, in its order; None if none does."""
        places = [self.window.find(k) for k in keys]
        first = places[0] if places else None
        if first is None or any(
            p is None or p.queue_id != first.queue_id or p.offset != first.offset + i
            for i, p in enumerate(places)
        ):
            return None
        return first

    async def durable(self, count: int) -> bool:
        """Count `count` duplicates answered; whether what is written now is durable."""
        self.window.duplicates += count
        return await self._store.durable(self._store.commitlog.end)

    @contextlib.contextmanager
    def storing(self, keys: list[bytes]) -> Iterator[None]:
        """While a batch with `keys` is written: duplicates of it wait for the write."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        mine = [k for k in dict.fromkeys(keys) if k not in self._pending]
        for k in mine:
            self._pending[k] = done
        try:
            yield
        finally:
            for k in mine:
                del self._pending[k]
            done.set_result(None)

    def stored(self, keys: list[bytes], queue_id: int, first_offset: int, store_ms: int) -> None:
        """Keep the places of a batch just stored.

        A key kept already (a batch that repeats some earlier messages, stored whole) now
        names this copy: so the batch, sent again, is answered from the window.
        """
        for i, key in enumerate(keys):
            self.window.add(key, queue_id, first_offset + i, store_ms)


def rebuild(window: DedupWindow, store: MessageStore, now_ms: int) -> int:
    """Refill `window` from the user topics' records stored within it; how many kept."""
    kept = recent_keys(_recent_records(store, now_ms - window.window_ms), window.max_keys)
    for store_ms, key, queue_id, offset in kept:
        window.add(key, queue_id, offset, store_ms, added_ms=store_ms)
    return len(kept)


def _recent_records(store: MessageStore, horizon_ms: int) -> Iterator[_Record]:
    for topic in store.topics.all():
        if is_system_topic(topic.name):
            continue
        for queue_id in range(topic.queue_count):
            first = store.offset_for_timestamp(topic, queue_id, horizon_ms)
            for offset in range(first, store.queue(topic, queue_id).max_offset):
                try:
                    raw = store.read_record(topic, queue_id, offset)
                    for r in iter_records(raw):
                        yield (
                            topic.name, queue_id, offset, r.store_timestamp_ms, r.msg_id,
                            r.properties,
                        )  # fmt: skip
                except (BrokerError, CorruptRecordError):
                    continue
