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
import struct
from collections.abc import Iterator

from mockbroker.dedup import (
    DedupWindow,
    Placed,
    digest,
    frame_keys,
    message_key,
    recent_keys,
)
from mockbroker.store.message_store import MessageStore
from mockbroker.topics import is_system_topic
from sdk._wire import FRAME_FIELDS, RECORD, RECORD_MAGIC

#: A record as the rebuild reads it: topic, queue id, offset, store ms, msg id, properties.
_Record = tuple[str, int, int, int, bytes, bytes]
#: Index entries read at once by the rebuild.
_READ_ENTRIES = 4096


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

    def placed(self, topic: str, keys: list[bytes]) -> Placed | None:
        """The place of the earlier send `keys` all repeat, in its order; None if none does.

        Each place is read back: a message no longer there (its topic deleted and made
        again, or retention deleted it) or another there (after a restart that lost an
        unsynced tail) makes the batch a new one.
        """
        places = self.window.find_many(keys)
        first = places[0] if places else None
        if first is None or any(
            p is None or p.queue_id != first.queue_id or p.offset != first.offset + i
            for i, p in enumerate(places)
        ):
            return None
        if not all(self._holds(topic, key, p) for key, p in zip(keys, places, strict=True)):
            return None
        return first

    def _holds(self, topic_name: str, key: bytes, place: Placed | None) -> bool:
        """True when the message at `place` has `key`."""
        store = self._store
        topic = store.topics.find(topic_name)
        if place is None or topic is None or not 0 <= place.queue_id < topic.queue_count:
            return False
        cq = store.queue(topic, place.queue_id)
        if not cq.min_offset <= place.offset < cq.max_offset:
            return False
        try:
            position, size, _ = cq.entry(place.offset)
            found = _key_fields(store.commitlog.read(position, size))
        except (OSError, ValueError, struct.error):
            return False
        return found is not None and digest(topic_name, message_key(found[1], found[2])) == key

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
        self.window.add_run(keys, queue_id, first_offset, store_ms)


def rebuild(window: DedupWindow, store: MessageStore, now_ms: int) -> int:
    """Refill `window` from the user topics' records stored within it; how many kept."""
    kept = recent_keys(_recent_records(store, now_ms - window.window_ms), window.max_keys)
    for store_ms, key, queue_id, offset in kept:
        window.add(key, queue_id, offset, store_ms, added_ms=store_ms)
    return len(kept)


def _recent_records(store: MessageStore, horizon_ms: int) -> Iterator[_Record]:
    """The user topics' records stored since `horizon_ms`, read entry by entry.

    Only the fields the key needs are parsed, without the CRC (recovery checked the
    records); a record that cannot be read or does not parse is passed over.
    """
    log = store.commitlog
    for topic in store.topics.all():
        if is_system_topic(topic.name):
            continue
        for queue_id in range(topic.queue_count):
            cq = store.queue(topic, queue_id)
            offset = max(store.offset_for_timestamp(topic, queue_id, horizon_ms), cq.min_offset)
            while entries := cq.read(offset, min(_READ_ENTRIES, cq.max_offset - offset)):
                for position, size, _ in entries:
                    with contextlib.suppress(OSError, ValueError, struct.error):
                        found = _key_fields(log.read(position, size))
                        if found is not None:
                            yield (topic.name, queue_id, offset, *found)
                    offset += 1


def _key_fields(raw: bytes) -> tuple[int, bytes, bytes] | None:
    """(store ms, msg id, properties) of a stored record; None if it is not one."""
    _, _, magic, _, _, store_ms, _, topic_len = RECORD.unpack_from(raw)
    if magic != RECORD_MAGIC:
        return None
    at = RECORD.size + topic_len
    msg_id, _, _, _, tags, shard, keys, props, _ = FRAME_FIELDS.unpack_from(raw, at)
    props_at = at + FRAME_FIELDS.size + tags + shard + keys
    return store_ms, msg_id, raw[props_at : props_at + props]
