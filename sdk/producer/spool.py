"""The producer's local spool: accepted messages kept on disk until the broker has them.

One append-only file of CRC-guarded records: a *message* record (sequence number, topic,
sharding key, frame) when a message is accepted (the frame is the message in ordermq's
message layout, sdk/_wire.py, without its length prefix: whatever transport delivers
it, the file holds the same), an *ack* record (sequence numbers) once
the broker stored it. Appends are fsync-ed before the sender hears "accepted", and
concurrent appends share one fsync. On open, a torn tail is cut off and the messages
without an ack are pending again, in the order they were accepted. When everything is
acknowledged the file is emptied. A crash between a delivery and its ack delivers that
message again: at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from sdk._transport.codec import encode_message
from sdk._wire import FRAME_FIELDS, FRAME_LEN_PREFIX
from sdk.message import Message

_HEAD = struct.Struct("<II")  # payload size, CRC32 of the payload
_MESSAGE = struct.Struct("<BqHH")  # kind, seq, topic length, sharding key length
_ACK_KIND = 2
_MESSAGE_KIND = 1
#: Empty the file once everything in it is acknowledged and it is at least this big.
COMPACT_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Spooled:
    """A message waiting in the spool."""

    seq: int
    topic: str
    sharding_key: str | None
    frame: bytes

    @property
    def msg_id(self) -> bytes:
        """The message's id."""
        return self.frame[:16]

    @property
    def deliver_at_ms(self) -> int:
        """When the message is due (epoch ms); 0: now."""
        deliver_at: int = FRAME_FIELDS.unpack_from(self.frame)[2]
        return deliver_at


def spool_frame(
    message: Message, msg_id: bytes, now_s: float, extra_properties: dict[str, str] | None = None
) -> bytes:
    """How the spool keeps `message` sent at `now_s`: the `frame` of its Spooled."""
    return encode_message(message, msg_id, now_s, extra_properties)[FRAME_LEN_PREFIX.size :]


class Spool:
    """The spool file of one producer; use on one event loop."""

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "spool.log"
        self._messages: dict[int, Spooled] = {}
        self._queue: deque[int] = deque()  # pending, in acceptance order
        self._in_flight: set[int] = set()
        self._next_seq = 1
        self._fd = -1
        self._size = 0
        self._writes: list[tuple[bytes, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._new = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._truncate_requested = False
        self.recovered = 0

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> None:
        """Read the file (cutting a torn tail) and make the unacknowledged pending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        data = os.pread(self._fd, os.fstat(self._fd).st_size, 0)
        acked: set[int] = set()
        pos = 0
        while pos + _HEAD.size <= len(data):
            size, crc = _HEAD.unpack_from(data, pos)
            payload = data[pos + _HEAD.size : pos + _HEAD.size + size]
            if len(payload) < size or zlib.crc32(payload) != crc:
                break
            record = _decode(payload)
            if record is None:
                break  # e.g. zeros a file system left after a crash (empty, CRC 0): torn
            if isinstance(record, Spooled):
                self._messages[record.seq] = record
                self._next_seq = max(self._next_seq, record.seq + 1)
            else:
                acked.update(record)
            pos += _HEAD.size + size
        if pos < len(data):
            os.ftruncate(self._fd, pos)
            os.fsync(self._fd)
        self._size = pos
        for seq in acked:
            self._messages.pop(seq, None)
        self._queue.extend(sorted(self._messages))
        self.recovered = len(self._queue)

    def start(self) -> None:
        """Start the writer (call on the loop that will use the spool)."""
        self._writer = asyncio.create_task(self._write_loop(), name="spool-writer")

    async def close(self) -> None:
        """Finish pending writes and close the file; undelivered messages stay in it."""
        if self._writer is not None:
            while self._writes:
                await asyncio.sleep(0)
                self._wake.set()
                await asyncio.gather(*(f for _, f in list(self._writes)), return_exceptions=True)
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    # ------------------------------------------------------------------ writing
    async def append(self, items: list[tuple[str, str | None, bytes]]) -> list[int]:
        """Durably record accepted messages (topic, sharding key, frame); their seqs."""
        seqs: list[int] = []
        parts: list[bytes] = []
        for topic, key, frame in items:
            seq = self._next_seq
            self._next_seq += 1
            t, k = topic.encode(), (key or "").encode()
            payload = _MESSAGE.pack(
                _MESSAGE_KIND, seq, len(t), len(k) if key is not None else 0xFFFF
            )
            parts.append(_frame(payload + t + (k if key is not None else b"") + frame))
            seqs.append(seq)
        await self._write(b"".join(parts))
        for (topic, key, frame), seq in zip(items, seqs, strict=True):
            self._messages[seq] = Spooled(seq, topic, key, frame)
            self._queue.append(seq)
        self._new.set()
        return seqs

    async def ack(self, seqs: list[int]) -> None:
        """Record that the broker stored these messages."""
        if not seqs:
            return
        await self._write(_frame(struct.pack(f"<B{len(seqs)}q", _ACK_KIND, *seqs)))
        for seq in seqs:
            self._messages.pop(seq, None)
            self._in_flight.discard(seq)
        if not self._messages and self._size >= COMPACT_BYTES:
            await self._write(b"", truncate=True)

    async def _write(self, data: bytes, *, truncate: bool = False) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writes.append((data, future))
        self._truncate_requested |= truncate
        self._wake.set()
        await future

    async def _write_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            writes, self._writes = self._writes, []
            if not writes:
                continue
            truncate, self._truncate_requested = self._truncate_requested, False
            data = b"".join(d for d, _ in writes)
            try:
                await asyncio.to_thread(self._write_sync, data, truncate)
            except OSError as exc:
                for _, f in writes:
                    if not f.done():
                        f.set_exception(exc)
                continue
            for _, f in writes:
                if not f.done():
                    f.set_result(None)

    def _write_sync(self, data: bytes, truncate: bool) -> None:
        if data:
            view = memoryview(data)
            written = 0
            while written < len(data):
                written += os.pwrite(self._fd, view[written:], self._size + written)
            self._size += len(data)
        if truncate and not self._messages:
            os.ftruncate(self._fd, 0)
            self._size = 0
        os.fsync(self._fd)

    # ------------------------------------------------------------------ delivery
    @property
    def pending(self) -> int:
        """Messages not yet acknowledged by the broker."""
        return len(self._messages)

    def take(self, limit: int) -> list[Spooled]:
        """The oldest pending messages not being delivered already (marks them)."""
        out: list[Spooled] = []
        while self._queue and len(out) < limit:
            seq = self._queue.popleft()
            if seq in self._messages:
                out.append(self._messages[seq])
                self._in_flight.add(seq)
        return out

    def give_back(self, messages: list[Spooled]) -> None:
        """Put messages whose delivery failed back in front, in order."""
        for m in sorted(messages, key=lambda m: m.seq, reverse=True):
            self._in_flight.discard(m.seq)
            self._queue.appendleft(m.seq)

    async def wait_for_new(self) -> None:
        """Return when something was appended since the last call."""
        await self._new.wait()
        self._new.clear()


def _frame(payload: bytes) -> bytes:
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _decode(payload: bytes) -> Spooled | tuple[int, ...] | None:
    """A message record, an ack record's sequence numbers, or None when it does not parse."""
    if payload[:1] == bytes((_ACK_KIND,)) and len(payload) % 8 == 1:
        return struct.unpack_from(f"<{len(payload) // 8}q", payload, 1)
    if payload[:1] != bytes((_MESSAGE_KIND,)) or len(payload) < _MESSAGE.size:
        return None
    _kind, seq, tl, kl = _MESSAGE.unpack_from(payload)
    p = _MESSAGE.size
    end = p + tl + (kl if kl != 0xFFFF else 0)
    if end > len(payload):
        return None
    try:
        topic = payload[p : p + tl].decode()
        key = payload[p + tl : end].decode() if kl != 0xFFFF else None
    except UnicodeDecodeError:
        return None
    return Spooled(seq, topic, key, payload[end:])
