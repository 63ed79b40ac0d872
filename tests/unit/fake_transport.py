"""An in-memory broker for consumer-core tests: no sockets, every timer on a FakeClock.

It keeps messages per queue, committed offsets, group membership, and the broker's real
RebalanceLockManager (so lock, renewal, expiry and fencing follow the broker's own
rules). `FakeTransport` implements the cores' Transport over it; several cores (consumers
and producers) may share one `FakeBroker`. `restart()` forgets what a broker process keeps in
memory, as a kill -9 does, and keeps what it stores on disk.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, cast

from mockbroker.errors import BrokerError
from mockbroker.lock_manager import RebalanceLockManager
from sdk._transport.codec import encode_message
from sdk._transport.grpc_transport import GrpcTransport
from sdk._transport.protocol import (
    Appended,
    GroupInfo,
    LockResult,
    PullResult,
    PullStatus,
    SendPart,
    SentBack,
    Transport,
    Unanswered,
    UnlockResult,
    send_each,
)
from sdk._wire import FRAME_FIELDS, MAX_SEND_BYTES, decode_properties
from sdk.errors import (
    BrokerUnavailableError,
    ClientStateError,
    InvalidReceiptError,
    LockNotHeldError,
    MessageNotFoundError,
    NotSupportedError,
    OrderMQError,
    ReceiptExpiredError,
    StaleEpochError,
)
from sdk.message import Message, MessageExt, MessageQueue, Receipt
from sdk.testing import FakeClock

BROKER = "fake"
ADDRESS = "fake:1"


def fenced(exc: BrokerError) -> Exception:
    """The SDK error the real client raises for the broker's fencing refusals."""
    if exc.reason == "STALE_EPOCH":
        return StaleEpochError(str(exc))
    return LockNotHeldError(str(exc))


@dataclasses.dataclass
class Lease:
    """A received message's current delivery: its handle, attempt and deadline."""

    handle: str
    attempt: int
    until: float
    acked: bool = False


class FakeBroker:
    """One broker's state, shared by every client connected to it."""

    def __init__(self, clock: FakeClock, *, queues: int = 2, topic: str = "orders") -> None:
        self.clock = clock
        self.topic = topic
        self.queue_count = queues
        self.messages: dict[int, list[MessageExt]] = {q: [] for q in range(queues)}
        self.offsets: dict[tuple[str, int], int] = {}
        self.members: dict[str, set[str]] = {}
        self.last_seen: dict[str, float] = {}
        self.client_timeout = 120.0
        self.membership_version = 0
        self.locks = RebalanceLockManager(clock)
        self.down = False
        self.commits: list[tuple[str, int, int, int]] = []  # client, queue, offset, epoch
        self.dead_letters: list[MessageExt] = []
        self.scheduled: dict[str, MessageExt] = {}  # by msg id
        # Receives: (group, queue id, offset) -> its latest lease; handle -> that key.
        self.leases: dict[tuple[str, int, int], Lease] = {}
        self.handles: dict[str, tuple[str, int, int]] = {}
        self._arrived = asyncio.Event()
        self._membership_changed = asyncio.Event()

    def queues(self) -> list[MessageQueue]:
        """The topic's queues, sorted."""
        return [MessageQueue(self.topic, BROKER, q) for q in range(self.queue_count)]

    def append(self, queue_id: int, keys: Sequence[str]) -> None:
        """Store one message per key on `queue_id`; its body is 'key:offset'."""
        stored = self.messages[queue_id]
        for key in keys:
            offset = len(stored)
            queue = MessageQueue(self.topic, BROKER, queue_id)
            body, msg_id = f"{key}:{offset}".encode(), f"{queue_id:04X}{offset:028X}"
            stored.append(_message(self.topic, body, key, msg_id, queue, offset))
        self._arrived.set()
        self._arrived = asyncio.Event()

    def restart(self, *, keep_members: bool = False) -> None:
        """Lose what a broker keeps in memory (members); keep messages, offsets and locks.

        With keep_members, every client's next heartbeat is taken to have landed already.
        """
        # The broker writes its lock table before it answers a grant or an unlock.
        locks = RebalanceLockManager(self.clock)
        locks._restore(self.locks._snapshot())
        self.locks = locks
        if not keep_members:
            self.members.clear()
            self._change_membership()

    def join(self, group: str, client_id: str) -> None:
        """A member that takes part in the split but never pulls (another process)."""
        self.members.setdefault(group, set()).add(client_id)
        self._change_membership()

    def leave(self, group: str, client_id: str) -> None:
        """That member leaves."""
        self.members.get(group, set()).discard(client_id)
        self._change_membership()

    def _change_membership(self) -> None:
        self.membership_version += 1
        self._membership_changed.set()
        self._membership_changed = asyncio.Event()

    def _check_up(self) -> None:
        if self.down:
            raise BrokerUnavailableError("the fake broker is down")
        self._expire_silent_clients()

    def _expire_silent_clients(self) -> None:
        now = self.clock.now()
        silent = [c for c, seen in self.last_seen.items() if now - seen > self.client_timeout]
        for client_id in silent:
            del self.last_seen[client_id]
            for members in self.members.values():
                members.discard(client_id)
            self.locks.release_client(client_id)
        if silent:
            self._change_membership()


class FakeTransport:
    """A Transport (sdk/_transport/protocol.py) served by a FakeBroker: no sockets.

    Set `partitioned` to cut this transport (and only it) off from the broker. While
    `lock_answers_held` is set, lock calls reach the broker and take effect there, but
    their answers wait until it is cleared (the way back is cut, then heals).

    Producers' messages are prepared in a layout of its own (pickled fields, not
    ordermq's frames): a core that peeked into them would not work with it.
    """

    max_send_bytes = 1024 * 1024

    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker
        self.partitioned = False
        self.closed = False
        self._answers = asyncio.Event()
        self._answers.set()
        self.answers_waiting = 0

    def _check_up(self) -> None:
        """Raise as a transport that cannot reach its broker would."""
        if self.closed:
            raise ClientStateError("the transport is closed")
        if self.partitioned:
            raise BrokerUnavailableError("the client is cut off from the fake broker")
        self.broker._check_up()

    @property
    def lock_answers_held(self) -> bool:
        return not self._answers.is_set()

    @lock_answers_held.setter
    def lock_answers_held(self, held: bool) -> None:
        if held:
            self._answers.clear()
        else:
            self._answers.set()

    # ------------------------------------------------------------------ routes
    async def readable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        self._check_up()
        return self.broker.queues()

    async def writable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        self._check_up()
        return self.broker.queues()

    def known_writable_queues(self, topic: str) -> list[MessageQueue] | None:
        return None  # asked on every call

    # ------------------------------------------------------------------ producing
    def prepare(
        self,
        message: Message,
        msg_id: bytes,
        now_s: float,
        extra_properties: dict[str, str] | None = None,
    ) -> bytes:
        deliver_at = 0.0
        if message.delay_seconds is not None:
            deliver_at = now_s + message.delay_seconds
        elif message.deliver_at is not None:
            deliver_at = message.deliver_at
        properties = {**message.properties, **(extra_properties or {})}
        fields = (message.body, message.tags, message.keys, properties, message.sharding_key,
                  msg_id, int(now_s * 1000), int(deliver_at * 1000))  # fmt: skip
        return pickle.dumps(fields)

    def prepare_many(
        self, messages: Sequence[Message], ids: Sequence[bytes], now_s: float
    ) -> list[bytes]:
        return [self.prepare(m, i, now_s) for m, i in zip(messages, ids, strict=True)]

    def prepare_spooled(self, record: bytes) -> bytes:
        """What a transport of another layout does: read the spool's frame, prepare anew."""
        msg_id, born, deliver_at, _level, tl, sl, kl, pl, bl = FRAME_FIELDS.unpack_from(record)
        parts, p = [], FRAME_FIELDS.size
        for length in (tl, sl, kl, pl, bl):
            parts.append(record[p : p + length])
            p += length
        tags, sharding, keys, props, body = parts
        fields = (body, tags.decode() or None,
                  tuple(keys.decode().split("\0")) if keys else (), decode_properties(props),
                  sharding.decode() or None, msg_id, born, deliver_at)  # fmt: skip
        return pickle.dumps(fields)

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        self._check_up()
        b = self.broker
        messages = [pickle.loads(p) for p in prepared]
        if any(m[-1] for m in messages):
            for body, tags, keys, props, key, msg_id, born, deliver_at in messages:
                b.scheduled[msg_id.hex().upper()] = MessageExt(
                    queue.topic, body, tags, keys, props, key, msg_id.hex().upper(), queue, -1, 0,
                    born, 0, deliver_at,
                )  # fmt: skip
            return Appended(True, -1, len(messages), scheduled=True)
        stored = b.messages[queue.queue_id]
        first = len(stored)
        for body, tags, keys, props, key, msg_id, born, _ in messages:
            stored.append(
                MessageExt(queue.topic, body, tags, keys, props, key, msg_id.hex().upper(), queue,
                           len(stored), 0, born, int(b.clock.now() * 1000))
            )  # fmt: skip
        b._arrived.set()
        b._arrived = asyncio.Event()
        return Appended(True, first, len(messages))

    async def send_parts(
        self, parts: Sequence[SendPart], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        return await send_each(self, parts, timeout)

    async def cancel_scheduled(self, msg_id: str) -> bool:
        self._check_up()
        if self.broker.scheduled.pop(msg_id, None) is None:
            raise MessageNotFoundError(f"no scheduled message {msg_id}")
        return True

    # ------------------------------------------------------------------ consuming
    async def pull(
        self, group: str, queue: MessageQueue, offset: int, *, max_messages: int = 32,
        suspend_timeout: float = 0.0, **_: Any,
    ) -> PullResult:  # fmt: skip
        b = self.broker
        deadline = b.clock.now() + suspend_timeout
        while True:
            self._check_up()
            stored = b.messages[queue.queue_id]
            if offset > len(stored):
                return PullResult(PullStatus.OFFSET_ILLEGAL, len(stored), 0, len(stored), [])
            if offset < len(stored):
                found = stored[offset : offset + max_messages]
                copies = [_copy(m) for m in found]
                return PullResult(PullStatus.FOUND, offset + len(found), 0, len(stored), copies)
            if b.clock.now() >= deadline:
                return PullResult(PullStatus.NO_NEW_MESSAGE, offset, 0, len(stored), [])
            arrived = asyncio.ensure_future(b._arrived.wait())
            timer = asyncio.ensure_future(b.clock.sleep_until(deadline))
            try:
                await asyncio.wait((arrived, timer), return_when=asyncio.FIRST_COMPLETED)
            finally:
                arrived.cancel()
                timer.cancel()

    async def subscribe(self, group: str, queue: MessageQueue, offset: int, **_: Any) -> Any:
        """The fake broker serves pulls only: a push consumer pulls, as with a broker
        without push delivery."""
        self._check_up()
        raise NotSupportedError("the fake broker has no push delivery")

    async def queue_offsets(
        self, queue: MessageQueue, timestamp_ms: int = 0
    ) -> tuple[int, int, int]:
        self._check_up()
        high = len(self.broker.messages[queue.queue_id])
        return 0, high, 0

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        self._check_up()
        return self.broker.offsets.get((group, queue.queue_id))

    async def commit_offsets(
        self, group: str, client_id: str, offsets: Sequence[tuple[MessageQueue, int, int]]
    ) -> None:
        b = self.broker
        self._check_up()
        try:
            for q, _offset, epoch in offsets:
                b.locks.check_commit(group, (q.topic, q.queue_id), client_id, epoch)
        except BrokerError as exc:
            raise fenced(exc) from None
        for q, offset, epoch in offsets:
            b.offsets[(group, q.queue_id)] = offset
            b.commits.append((client_id, q.queue_id, offset, epoch))

    async def send_back(self, group: str, message: MessageExt, **_: Any) -> SentBack:
        self._check_up()
        stored = self.broker.messages[message.queue.queue_id][message.queue_offset]
        self.broker.dead_letters.append(stored)
        return SentBack(True, "%DLQ%" + group, 0)

    # ------------------------------------------------------------------ membership
    async def heartbeat(self, client_id: str, groups: Sequence[GroupInfo]) -> None:
        b = self.broker
        self._check_up()
        b.last_seen[client_id] = b.clock.now()
        for g in groups:
            members = b.members.setdefault(g.group, set())
            if client_id not in members:
                members.add(client_id)
                b._change_membership()

    async def unregister(self, client_id: str) -> None:
        b = self.broker
        self._check_up()
        for members in b.members.values():
            members.discard(client_id)
        b.locks.release_client(client_id)
        b._change_membership()

    async def consumer_list(self, group: str, topic: str) -> list[str]:
        self._check_up()
        return sorted(self.broker.members.get(group, ()))

    async def watch_membership(self, group: str, known_version: int) -> AsyncIterator[int]:
        b = self.broker
        while True:
            self._check_up()
            if b.membership_version != known_version:
                known_version = b.membership_version
                yield known_version
            await b._membership_changed.wait()

    # ------------------------------------------------------------------ locks
    async def lock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> LockResult:
        try:
            self._check_up()
        except OrderMQError as exc:
            return LockResult({}, [Unanswered(ADDRESS, list(queues), exc)])
        keys = {(q.topic, q.queue_id): q for q in queues}
        held = self.broker.locks.lock_batch(group, client_id, keys)
        self.answers_waiting += 1
        try:
            await self._answers.wait()
        finally:
            self.answers_waiting -= 1
        return LockResult({keys[k]: epoch for k, epoch in held.items()}, [])

    async def unlock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> UnlockResult:
        try:
            self._check_up()
        except OrderMQError as exc:
            return UnlockResult([], [Unanswered(ADDRESS, list(queues), exc)])
        keys = {(q.topic, q.queue_id): q for q in queues}
        kept = self.broker.locks.unlock_batch(group, client_id, keys) or {}  # (None: before 9)
        return UnlockResult([keys[k] for k in kept], [])

    # ------------------------------------------------------------------ receiving (pop)
    async def receive(
        self, group: str, topic: str, *, max_messages: int, invisible_duration: float,
        **_: Any,
    ) -> list[MessageExt]:  # fmt: skip
        """Messages not acked whose lease ran out, oldest first; no waiting, no dead letters."""
        self._check_up()
        b, now, out = self.broker, self.broker.clock.now(), []
        for queue_id, stored in sorted(b.messages.items()):
            for message in stored:
                key = (group, queue_id, message.queue_offset)
                lease = b.leases.get(key)
                if len(out) == max_messages or (lease and (lease.acked or lease.until > now)):
                    continue
                attempt = (lease.attempt if lease else 0) + 1
                lease = b.leases[key] = self._lease(key, attempt, now + invisible_duration)
                copy = _copy(message)
                copy.delivery_attempt = attempt
                copy.receipt = Receipt(
                    lease.handle, ADDRESS, group, invisible_duration, lease.until
                )
                out.append(copy)
        return out

    def _lease(self, key: tuple[str, int, int], attempt: int, until: float) -> Lease:
        handle = f"{key}#{len(self.broker.handles)}"
        self.broker.handles[handle] = key
        return Lease(handle, attempt, until)

    def _current(self, receipt: Receipt) -> tuple[tuple[str, int, int], Lease]:
        self._check_up()
        key = self.broker.handles.get(receipt.handle)
        if key is None or key[0] != receipt.group:
            raise InvalidReceiptError(f"not a receipt of this broker: {receipt.handle!r}")
        lease = self.broker.leases[key]
        if lease.handle != receipt.handle:
            raise InvalidReceiptError(f"receipt {receipt.handle!r} was replaced")
        if not lease.acked and lease.until <= self.broker.clock.now():
            raise ReceiptExpiredError(f"receipt {receipt.handle!r} expired")
        return key, lease

    async def ack(self, receipt: Receipt) -> None:
        _key, lease = self._current(receipt)
        lease.acked = True

    async def change_invisible_duration(self, receipt: Receipt, seconds: float) -> Receipt:
        key, lease = self._current(receipt)
        if lease.acked:
            raise InvalidReceiptError(f"receipt {receipt.handle!r}: the message was acked")
        until = self.broker.clock.now() + seconds
        new = self.broker.leases[key] = self._lease(key, lease.attempt, until)
        return Receipt(new.handle, ADDRESS, receipt.group, seconds, until)

    async def close(self) -> None:
        self.closed = True


def _message(
    topic: str, body: bytes, key: str | None, msg_id: str, queue: MessageQueue, offset: int
) -> MessageExt:
    return MessageExt(topic, body, None, (), {}, key, msg_id, queue, offset, 0, 0, 0)


def _copy(m: MessageExt) -> MessageExt:
    """Each pull decodes fresh objects, as the real client does."""
    return dataclasses.replace(m, properties=dict(m.properties))


class FrameSender(Protocol):
    """A scripted broker that takes a Send request's frames."""

    async def send(
        self, topic: str, queue_id: int, frames: bytes, *, timeout: float | None = None
    ) -> Appended: ...


class FramesTransport:
    """A producer's Transport that prepares ordermq's frames, as the gRPC transport does.

    Sends go to a scripted broker as one request's frames; routes come from
    `writable_queues(topic)`, asked on every call (a refresh asks it too), or with
    `remember_routes` once per topic until a refresh.
    """

    prepare = staticmethod(encode_message)
    prepare_spooled = staticmethod(GrpcTransport.prepare_spooled)
    prepare_many = staticmethod(GrpcTransport.prepare_many)

    def __init__(
        self,
        broker: FrameSender,
        writable_queues: Callable[[str], Awaitable[list[MessageQueue]]],
        max_send_bytes: int = MAX_SEND_BYTES,
        *,
        remember_routes: bool = False,
    ) -> None:
        self.broker = broker
        self._writable_queues = writable_queues
        self.max_send_bytes = max_send_bytes
        # With remember_routes, the last answer per topic is known (as the gRPC
        # transport's cache), and asked again only on a refresh.
        self._known: dict[str, list[MessageQueue]] | None = {} if remember_routes else None
        # The requests the producer made, send or send_parts: (queue id, messages) per part.
        self.requests: list[list[tuple[int, int]]] = []
        self.refreshes = 0  # the route lookups that asked for a refresh

    async def writable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        self.refreshes += refresh
        known = self.known_writable_queues(topic)
        if known is not None and not refresh:
            return known
        queues = await self._writable_queues(topic)
        if self._known is not None:
            self._known[topic] = queues
        return queues

    def known_writable_queues(self, topic: str) -> list[MessageQueue] | None:
        return None if self._known is None else self._known.get(topic)

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        self.requests.append([(queue.queue_id, len(prepared))])
        return await self._send(queue, prepared, timeout=timeout)

    async def _send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        return await self.broker.send(
            queue.topic, queue.queue_id, b"".join(prepared), timeout=timeout
        )

    async def send_parts(
        self, parts: Sequence[SendPart], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        """One request: the scripted broker gets each part as a request of its own."""
        self.requests.append([(queue.queue_id, len(prepared)) for queue, prepared in parts])
        return await send_each(cast(Transport, _PartSender(self)), parts, timeout)

    async def close(self) -> None:
        pass


class _PartSender:
    """What send_each needs of a FramesTransport: send, without noting a request."""

    def __init__(self, transport: FramesTransport) -> None:
        self._transport = transport

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        return await self._transport._send(queue, prepared, timeout=timeout)
