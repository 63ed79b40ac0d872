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
import bisect
import contextlib
import dataclasses
import struct
from collections.abc import Callable, Iterator
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
#: Commit-log bytes read at once by the rebuild.
_READ_BYTES = 8 << 20


@dataclass(frozen=True, slots=True)
class SortedBatch:
    """A batch's messages: the new ones, to store, and the duplicates, answered."""

    keys: list[bytes]
    spans: list[tuple[int, int, bytes]]
    #: Per message: its first copy's place (an earlier send's), the index of the batch's
    #: message it repeats, (part, index) of the message it repeats in an earlier part of
    #: the same request, or None for a new message.
    firsts: list[MessagePlace | int | tuple[int, int] | None]
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

    def repeating(self, earlier: dict[int, tuple[int, int]]) -> SortedBatch:
        """The batch with some new messages made duplicates of earlier parts' messages.

        `earlier` maps such a message's index to the (part, index) it repeats; the batch's
        own later copies of it repeat that too.
        """
        firsts = [
            earlier.get(first, first) if isinstance(first, int) else earlier.get(i, first)
            for i, first in enumerate(self.firsts)
        ]
        new = [i for i in self.new if i not in earlier]
        return SortedBatch(self.keys, self.spans, firsts, new)

    def place(
        self, frames: bytes, index: int, queue_id: int, first_offset: int, store_ms: int
    ) -> MessagePlace:
        """Where new message `index` is, as its duplicates are answered.

        Its batch (`frames`) stored in `queue_id` from `first_offset`, at `store_ms`.
        """
        start, end, msg_id = self.spans[index]
        return MessagePlace(
            queue_id, first_offset + bisect.bisect_left(self.new, index), store_ms, msg_id, True,
            frame_properties(frames[start:end]),
        )  # fmt: skip

    def answer(
        self,
        frames: bytes,
        queue_id: int,
        first_offset: int,
        store_ms: int,
        earlier: Callable[[int, int], MessagePlace] | None = None,
    ) -> list[MessagePlace]:
        """Each message's place: the new ones (of `frames`) stored from `first_offset`.

        In `queue_id`, at `store_ms`; a duplicate's is its first copy's (`earlier` gives
        the place of a message of an earlier part: (part, index)).
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
            elif isinstance(first, tuple):
                if earlier is None:
                    raise ValueError("a message of an earlier part, without its place")
                places.append(earlier(*first))
            else:
                places.append(first)
        return places


def shared_keys(batches: list[SortedBatch | None], parts: list[int]) -> set[bytes]:
    """The keys new messages of more than one of `parts` (indexes into `batches`) carry."""
    seen: set[bytes] = set()
    shared: set[bytes] = set()
    for p in parts:
        batch = batches[p]
        if batch is not None:
            for key in {batch.keys[i] for i in batch.new}:
                (shared if key in seen else seen).add(key)
    return shared


def across_parts(batches: list[SortedBatch | None], parts: list[int]) -> list[SortedBatch | None]:
    """`batches` with the new messages that repeat one of an earlier part made duplicates.

    Among `parts` (indexes into `batches`), in request order; the others as they are.
    """
    out = list(batches)
    firsts: dict[bytes, tuple[int, int]] = {}
    for p in sorted(parts):
        batch = batches[p]
        if batch is None:
            continue
        earlier: dict[int, tuple[int, int]] = {}
        for i in batch.new:
            key = batch.keys[i]
            if key in firsts:
                earlier[i] = firsts[key]
            else:
                firsts[key] = (p, i)
        if earlier:
            out[p] = batch.repeating(earlier)
    return out


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
        firsts: list[MessagePlace | int | tuple[int, int] | None] = []
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
    window.refill(kept)
    return len(kept)


def _recent_records(store: MessageStore, horizon_ms: int) -> Iterator[_Record]:
    """The user topics' records stored since `horizon_ms`, read in commit-log order.

    From the first position any user queue indexes at the horizon, the log is read in
    large chunks and its records parsed in turn (recovery checked them; no CRC): only
    the fields the key needs, and only records of a user topic's queue within the offsets
    it still indexes. A record of a topic deleted and made again may name a place another
    message now holds: `DedupSends.sort` reads each place back before answering from it.
    """
    start = -1
    for topic in store.topics.all():
        if is_system_topic(topic.name):
            continue
        for queue_id in range(topic.queue_count):
            cq = store.queue(topic, queue_id)
            offset = max(store.offset_for_timestamp(topic, queue_id, horizon_ms), cq.min_offset)
            if offset < cq.max_offset:
                with contextlib.suppress(OSError, ValueError, struct.error):
                    position = cq.entry(offset)[0]
                    start = position if start < 0 else min(start, position)
    if start >= 0:
        yield from _scan(store, max(start, store.commitlog.start), horizon_ms)


def _scan(store: MessageStore, start: int, horizon_ms: int) -> Iterator[_Record]:
    """The records from `start` on, segment by segment, `_READ_BYTES` at a time."""
    log = store.commitlog
    #: topic bytes -> (name, queue id -> (min offset, max offset)), None: not a user topic
    topics: dict[bytes, tuple[str, dict[int, tuple[int, int]]] | None] = {}
    head, fields = RECORD.size, FRAME_FIELDS.size
    for base, size in list(log.segment_ranges(start)):
        pos, end = max(start, base), base + size
        while pos < end:
            try:
                chunk = log.read(pos, min(_READ_BYTES, end - pos))
            except (OSError, ValueError):
                break
            at, n = 0, len(chunk)
            while at + head <= n:
                total, _, magic, queue_id, offset, store_ms, _, topic_len = RECORD.unpack_from(
                    chunk, at
                )
                if magic != RECORD_MAGIC or total < head + topic_len + fields:
                    at = -1  # not a record: the rest of this segment cannot be followed
                    break
                if at + total > n:
                    break  # the next chunk starts with it
                if store_ms >= horizon_ms:
                    raw_topic = chunk[at + head : at + head + topic_len]
                    if raw_topic in topics:
                        known = topics[raw_topic]
                    else:
                        known = topics[raw_topic] = _user_topic(store, raw_topic)
                    if known is not None and _indexed(store, known, queue_id, offset):
                        frame_at = at + head + topic_len
                        msg_id, _, _, _, tags, shard, keys, props, _ = FRAME_FIELDS.unpack_from(
                            chunk, frame_at
                        )
                        props_at = frame_at + fields + tags + shard + keys
                        yield (
                            known[0], queue_id, offset, store_ms, msg_id,
                            chunk[props_at : props_at + props],
                        )  # fmt: skip
                at += total
            if at <= 0:
                break  # not a record, or one larger than a chunk (never written)
            pos += at


def _user_topic(store: MessageStore, raw: bytes) -> tuple[str, dict[int, tuple[int, int]]] | None:
    """A user topic's name and an empty cache of its queues' offsets; None for others."""
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        return None
    if is_system_topic(name) or store.topics.find(name) is None:
        return None
    return name, {}


def _indexed(
    store: MessageStore, known: tuple[str, dict[int, tuple[int, int]]], queue_id: int, offset: int
) -> bool:
    """True when the topic's queue still indexes `offset`."""
    name, bounds = known
    found = bounds.get(queue_id)
    if found is None:
        topic = store.topics.find(name)
        if topic is None or not 0 <= queue_id < topic.queue_count:
            found = (0, 0)
        else:
            cq = store.queue(topic, queue_id)
            found = (cq.min_offset, cq.max_offset)
        bounds[queue_id] = found
    return found[0] <= offset < found[1]


def _key_fields(raw: bytes) -> tuple[int, bytes, bytes] | None:
    """(store ms, msg id, properties) of a stored record; None if it is not one."""
    _, _, magic, _, _, store_ms, _, topic_len = RECORD.unpack_from(raw)
    if magic != RECORD_MAGIC:
        return None
    at = RECORD.size + topic_len
    msg_id, _, _, _, tags, shard, keys, props, _ = FRAME_FIELDS.unpack_from(raw, at)
    props_at = at + FRAME_FIELDS.size + tags + shard + keys
    return store_ms, msg_id, raw[props_at : props_at + props]
