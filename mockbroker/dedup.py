"""Broker-side deduplication: a window of (topic, idempotency key) -> the first send's place.

A message's idempotency key is its user property `IDEMPOTENCY_KEY` when it has one, else
its message id (the frame's 16-byte id: the SDK's id, a RocketMQ UNIQ_KEY or a RocketMQ 5
message id, as the fronts store them). A second message with the same key on the same
topic within the window is answered with the first one's place and not stored again
(mockbroker/dedup_sends.py does that for Delivery).

Memory is bounded by `max_keys` whatever the number of keys sent: each key costs one dict
entry (a 16-byte digest of topic and key, a sequence number) and 44 bytes in ring arrays
(its digest, queue id, offset, store time and the time it was added): 210-230 bytes
allocated in all, under 300 of RSS (docs/dedup.md; bench/dedup.py measures it). The
oldest keys go first: once they are older than the window, or when a new key comes at
the bound. Nothing is written: at start the window is
refilled from the commit log's records of the last window (`rebuild`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from sdk._remoting.translate import UNIQ_KEY
from sdk._wire import FRAME_FIELDS, FRAME_LEN_PREFIX, decode_properties
from sdk.clock import Clock
from sdk.message import IDEMPOTENCY_KEY_PROPERTY

_PROPERTY_BYTES = IDEMPOTENCY_KEY_PROPERTY.encode()
DIGEST_BYTES = 16
#: Bytes per key in the ring arrays: digest, queue id, offset, store time, added time.
RING_BYTES_PER_KEY = DIGEST_BYTES + 4 + 8 + 8 + 8


@dataclass(frozen=True, slots=True)
class Placed:
    """Where the first message with a key was stored."""

    queue_id: int
    offset: int
    store_timestamp_ms: int


@dataclass(frozen=True, slots=True)
class MessagePlace:
    """Where one message of a send is: stored now, or its first copy's (a duplicate)."""

    queue_id: int
    offset: int
    store_timestamp_ms: int
    #: The message id of the copy at that place (a duplicate's: its first copy's).
    msg_id: bytes
    duplicate: bool
    #: A duplicate's: its first copy's properties (encoded), for a front to read its id.
    properties: bytes = b""


def digest(topic: str, key: bytes) -> bytes:
    """The 16-byte digest a (topic, key) is kept under."""
    h = hashlib.blake2b(digest_size=DIGEST_BYTES, person=b"ordermq-dedup")
    h.update(topic.encode())
    h.update(b"\0")
    h.update(key)
    return h.digest()


def message_key(msg_id: bytes, properties: bytes | memoryview) -> bytes:
    """A message's idempotency key: its IDEMPOTENCY_KEY property, else its message id."""
    if properties and _PROPERTY_BYTES in (props := bytes(properties)):
        try:
            user = decode_properties(props).get(IDEMPOTENCY_KEY_PROPERTY)
        except (ValueError, UnicodeDecodeError):
            user = None
        if user:
            return b"u:" + user.encode()
    return b"i:" + bytes(msg_id)


def frame_keys(topic: str, frames: bytes) -> list[bytes] | None:
    """The digest of each frame's key, in order; None when the frames do not parse.

    Frames that do not parse are the store's to refuse: the caller then skips dedup.
    """
    keys: list[bytes] = []
    view = memoryview(frames)
    pos, end = 0, len(frames)
    head = FRAME_LEN_PREFIX.size + FRAME_FIELDS.size
    while pos < end:
        if pos + head > end:
            return None
        (length,) = FRAME_LEN_PREFIX.unpack_from(frames, pos)
        fields = FRAME_FIELDS.unpack_from(frames, pos + FRAME_LEN_PREFIX.size)
        msg_id, tags_len, shard_len, keys_len, props_len = (
            fields[0], fields[4], fields[5], fields[6], fields[7],
        )  # fmt: skip
        props_at = pos + head + tags_len + shard_len + keys_len
        nxt = pos + FRAME_LEN_PREFIX.size + length
        if props_at + props_len > nxt or nxt > end:
            return None
        keys.append(digest(topic, message_key(msg_id, view[props_at : props_at + props_len])))
        pos = nxt
    return keys or None


def frame_spans(frames: bytes) -> list[tuple[int, int, bytes]]:
    """(start, end, message id) of each frame; call only on frames `frame_keys` parsed."""
    spans: list[tuple[int, int, bytes]] = []
    pos, end = 0, len(frames)
    while pos < end:
        (length,) = FRAME_LEN_PREFIX.unpack_from(frames, pos)
        nxt = pos + FRAME_LEN_PREFIX.size + length
        msg_id = frames[pos + FRAME_LEN_PREFIX.size : pos + FRAME_LEN_PREFIX.size + 16]
        spans.append((pos, nxt, msg_id))
        pos = nxt
    return spans


def frame_properties(frame: bytes) -> bytes:
    """The encoded properties of one frame (which `frame_keys` parsed)."""
    head = FRAME_LEN_PREFIX.size + FRAME_FIELDS.size
    fields = FRAME_FIELDS.unpack_from(frame, FRAME_LEN_PREFIX.size)
    at = head + fields[4] + fields[5] + fields[6]
    return bytes(frame[at : at + fields[7]])


def first_id(place: MessagePlace) -> str:
    """The message id a RocketMQ client sees for a duplicate's first copy (its UNIQ_KEY)."""
    props = decode_properties(place.properties) if place.properties else {}
    return props.get(UNIQ_KEY) or place.msg_id.hex().upper()


class DedupWindow:
    """The keys of the last `window_seconds`, at most `max_keys`; not thread-safe.

    A ring of fixed-size slots in insertion order (so the oldest is at its head) and a
    dict from digest to the slot's sequence number.
    """

    def __init__(self, window_seconds: float, max_keys: int, clock: Clock) -> None:
        if window_seconds <= 0:
            raise ValueError("window_seconds must be positive")
        if max_keys < 1:
            raise ValueError("max_keys must be positive")
        self.window_ms = int(window_seconds * 1000)
        self.max_keys = max_keys
        self._clock = clock
        self._index: dict[bytes, int] = {}
        self._digests = bytearray()
        self._queues = array("i")
        self._offsets = array("q")
        self._stored = array("q")
        self._added = array("q")
        self._head = 0  # sequence number of the oldest slot kept
        self._next = 0  # sequence number of the next slot
        #: Messages answered with an earlier one's place instead of stored.
        self.duplicates = 0

    def __len__(self) -> int:
        return len(self._index)

    def _now_ms(self) -> int:
        return int(self._clock.now() * 1000)

    def find(self, key: bytes) -> Placed | None:
        """The place of the first message with `key` within the window, if any."""
        return self.find_many([key])[0]

    def find_many(self, keys: list[bytes]) -> list[Placed | None]:
        """`find` of each key, with one look at the clock."""
        now = self._now_ms()
        self._expire(now)
        index, added, window_ms, max_keys = self._index, self._added, self.window_ms, self.max_keys
        found: list[Placed | None] = []
        for key in keys:
            seq = index.get(key)
            slot = -1 if seq is None else seq % max_keys
            if slot < 0 or now - added[slot] > window_ms:
                found.append(None)
            else:
                found.append(Placed(self._queues[slot], self._offsets[slot], self._stored[slot]))
        return found

    def add(
        self, key: bytes, queue_id: int, offset: int, store_timestamp_ms: int, added_ms: int = -1
    ) -> None:
        """Keep `key`'s place; `added_ms` is when (now unless given, as at a rebuild)."""
        now = self._now_ms()
        self._expire(now)
        self._add(key, queue_id, offset, store_timestamp_ms, now if added_ms < 0 else added_ms)

    def refill(self, kept: list[tuple[int, bytes, int, int]]) -> None:
        """`add` of (store ms, key, queue id, offset) each, added when stored (a rebuild's)."""
        self._expire(self._now_ms())
        for store_ms, key, queue_id, offset in kept:
            self._add(key, queue_id, offset, store_ms, store_ms)

    def add_run(self, keys: list[bytes], queue_id: int, first_offset: int, store_ms: int) -> None:
        """`add` of a batch stored in one queue from `first_offset`, with one look at the clock."""
        now = self._now_ms()
        self._expire(now)
        for i, key in enumerate(keys):
            self._add(key, queue_id, first_offset + i, store_ms, now)

    def _add(self, key: bytes, queue_id: int, offset: int, store_ms: int, when: int) -> None:
        if self._next - self._head == self.max_keys:
            self._drop_oldest()
        seq, slot = self._next, self._next % self.max_keys
        if seq < self.max_keys:  # still growing
            self._digests += key
            self._queues.append(queue_id)
            self._offsets.append(offset)
            self._stored.append(store_ms)
            self._added.append(when)
        else:
            at = slot * DIGEST_BYTES
            self._digests[at : at + DIGEST_BYTES] = key
            self._queues[slot] = queue_id
            self._offsets[slot] = offset
            self._stored[slot] = store_ms
            self._added[slot] = when
        self._index[key] = seq
        self._next += 1

    def _expire(self, now_ms: int) -> None:
        horizon = now_ms - self.window_ms
        while self._head < self._next and self._added[self._head % self.max_keys] < horizon:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        slot = self._head % self.max_keys
        at = slot * DIGEST_BYTES
        key = bytes(self._digests[at : at + DIGEST_BYTES])
        if self._index.get(key) == self._head:  # not since added again
            del self._index[key]
        self._head += 1


def recent_keys(
    records: Iterator[tuple[str, int, int, int, bytes, bytes]], max_keys: int
) -> list[tuple[int, bytes, int, int]]:
    """The newest `max_keys` of (topic, queue id, offset, store ms, msg id, properties) records.

    As (store ms, digest, queue id, offset), oldest first: the order to refill a window in.
    """
    kept = sorted(
        (store_ms, digest(topic, message_key(msg_id, props)), queue_id, offset)
        for topic, queue_id, offset, store_ms, msg_id, props in records
    )
    return kept[-max_keys:]
