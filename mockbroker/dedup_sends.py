"""Deduplicated sends: what Delivery asks before storing a batch, and tells after.

`sort` tells, once `settle` waited for the writes of the same keys, which messages of a
batch are duplicates (of an earlier send, or of an earlier message of the same batch):
those are answered with their first copy's place, and only the new ones are stored
(`storing`, then `stored`), in their order. A message whose first copy is
still being written is answered only once that write is done, and only as durable as a
flush then makes it: a duplicate never reports stored what could still be lost.

The window is refilled at start from the commit log (`rebuild`), not from a file of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from mockbroker.dedup import (
    DedupWindow,
    MessagePlace,
    Placed,
    digest,
    frame_keys,
    frame_properties,
    frame_spans,
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


@dataclass(frozen=True, slots=True)
class SortedBatch:
    """A batch's messages: the new ones, to store, and the duplicates, answered."""

    keys: list[bytes]
    spans: list[tuple[int, int, bytes]]
    #: Per message: its first copy's place (an earlier send's), the index of the batch's
    #: message it repeats, or None for a new message.
    firsts: list[MessagePlace | int | None]
    #: The new messages' indexes, in order.
    new: list[int]

    @property
    def duplicates(self) -> int:
        """How many messages of the batch are duplicates."""
        return len(self.keys) - len(self.new)

    def new_keys(self) -> list[bytes]:
        """The new messages' keys, in order."""
        return [self.keys[i] for i in self.new]

    def new_frames(self, frames: bytes) -> bytes:
        """The new messages' frames, in order."""
        spans = self.spans
        return b"".join(frames[spans[i][0] : spans[i][1]] for i in self.new)

    def answer(
        self, frames: bytes, queue_id: int, first_offset: int, store_ms: int
    ) -> list[MessagePlace]:
        """Each message's place: the new ones (of `frames`) stored from `first_offset`.

        In `queue_id`, at `store_ms`; a duplicate's is its first copy's.
        """
        stored = {
            i: MessagePlace(queue_id, first_offset + n, store_ms, self.spans[i][2], False)
            for n, i in enumerate(self.new)
        }
        places: list[MessagePlace] = []
        for i, first in enumerate(self.firsts):
            if first is None:
                places.append(stored[i])
            elif isinstance(first, int):
                start, end, _ = self.spans[first]
                props = frame_properties(frames[start:end])
                places.append(dataclasses.replace(stored[first], duplicate=True, properties=props))
            else:
                places.append(first)
        return places


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

    def sort(self, topic: str, frames: bytes, keys: list[bytes]) -> SortedBatch | None:
        """The batch's messages sorted into new ones and duplicates; None if unparsed.

        A duplicate repeats an earlier send (its first copy read back: one no longer there,
        its topic deleted and made again or retention deleted it, or another there after a
        restart that lost an unsynced tail, makes the message new) or an earlier message of
        the same batch.
        """
        if not keys:
            return None
        firsts: list[MessagePlace | int | None] = []
        new: list[int] = []
        seen: dict[bytes, int] = {}
        for i, (key, place) in enumerate(zip(keys, self.window.find_many(keys), strict=True)):
            held = None if place is None else self._held(topic, key, place)
            if place is not None and held is not None:
                firsts.append(
                    MessagePlace(
                        place.queue_id,
                        place.offset,
                        place.store_timestamp_ms,
                        held[0],
                        True,
                        held[1],
                    )
                )
            elif (j := seen.get(key)) is not None:
                firsts.append(j)
            else:
                seen[key] = i
                new.append(i)
                firsts.append(None)
        return SortedBatch(keys, frame_spans(frames), firsts, new)

    def _held(self, topic_name: str, key: bytes, place: Placed) -> tuple[bytes, bytes] | None:
        """(message id, properties) of the message at `place` when it has `key`, else None."""
        store = self._store
        topic = store.topics.find(topic_name)
        if topic is None or not 0 <= place.queue_id < topic.queue_count:
            return None
        cq = store.queue(topic, place.queue_id)
        if not cq.min_offset <= place.offset < cq.max_offset:
            return None
        try:
            position, size, _ = cq.entry(place.offset)
            found = _key_fields(store.commitlog.read(position, size))
        except (OSError, ValueError, struct.error):
            return None
        if found is None or digest(topic_name, message_key(found[1], found[2])) != key:
            return None
        return bytes(found[1]), bytes(found[2])

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
