"""The Transport over ordermq's gRPC protocol: a channel per broker, and cached routes.

Messages travel as ordermq's message frames (sdk/_wire.py), built once per message by
`prepare`; the spool keeps the same layout, so a spooled message is sent as it was kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from sdk._transport.broker_client import BrokerClient, QueueRoute
from sdk._transport.codec import encode_message, encode_messages
from sdk._transport.protocol import (
    Appended,
    GroupInfo,
    HalfSent,
    LockResult,
    PullResult,
    SendPart,
    SentBack,
    Subscription,
    TransactionCheck,
    Unanswered,
    UnlockResult,
    send_each,
)
from sdk._wire import FRAME_LEN_PREFIX, MAX_SEND_BYTES
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.errors import (
    BrokerUnavailableError,
    ClientStateError,
    MessageNotFoundError,
    OrderMQError,
    RequestTimeoutError,
)
from sdk.message import MessageExt, MessageQueue, Receipt
from sdk.selector import queue_order
from sdk.tls import TLSConfig

T = TypeVar("T")


class GrpcTransport:
    """Channels by broker address and routes by topic; use on one event loop.

    `endpoints`: the brokers asked for routes ("host:port" each); the routes name the
    brokers that serve each queue.
    """

    #: The most frame bytes one Send request carries (the broker's limit).
    max_send_bytes = MAX_SEND_BYTES
    #: A message's frame (see Transport.prepare).
    prepare = staticmethod(encode_message)
    #: Each message's frame, in one call (see Transport.prepare_many).
    prepare_many = staticmethod(encode_messages)

    def __init__(
        self,
        endpoints: Sequence[str],
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.endpoints = list(endpoints)
        self.tls = tls
        #: The account every call is signed for (None: unsigned calls).
        self.credentials = credentials
        self._clock = clock
        if tls is not None:
            tls.grpc_credentials()  # a file that cannot be read: InvalidArgumentError now
        self._clients: dict[str, BrokerClient] = {}
        self._routes: dict[str, list[QueueRoute]] = {}
        self._writable: dict[str, list[MessageQueue]] = {}
        self._takes_parts: dict[str, bool] = {}  # topic -> its brokers take SendRequest.parts
        self._addresses: dict[MessageQueue, str] = {}
        self._receive_turns: dict[str, int] = {}  # topic -> receives sent, to rotate brokers
        self._closed = False

    # ------------------------------------------------------------------ channels
    def client(self, address: str) -> BrokerClient:
        """The channel to `address`, opened on first use; ClientStateError once closed."""
        client = self._clients.get(address)
        if client is None:
            if self._closed:
                raise ClientStateError(f"the client is shut down; no channel to {address}")
            client = self._clients[address] = BrokerClient(
                address, self.tls, self.credentials, self._clock
            )
        return client

    def client_for(self, queue: MessageQueue) -> BrokerClient:
        """The channel to the broker serving `queue` (its route must be known)."""
        return self.client(self._addresses[queue])

    def brokers(self) -> list[BrokerClient]:
        """A channel to every known broker, endpoints first."""
        addresses = dict.fromkeys([*self.endpoints, *self._addresses.values()])
        return [self.client(a) for a in addresses]

    async def close(self) -> None:
        """Close every channel; no new one is opened after this."""
        self._closed = True
        clients, self._clients = self._clients, {}
        await asyncio.gather(*(c.close() for c in clients.values()))

    # ------------------------------------------------------------------ routes
    async def routes(
        self, topic: str, *, create: bool = False, refresh: bool = False
    ) -> list[QueueRoute]:
        """The topic's queues, sorted by (broker, queue id); cached until refreshed."""
        routes = None if refresh else self._routes.get(topic)
        if routes is None:
            routes = await self._query_route(topic, create)
            self._routes[topic] = routes
            self._writable[topic] = sorted((r.queue for r in routes if r.writable), key=queue_order)
            for r in routes:
                self._addresses[r.queue] = r.broker_address
                client = self.client(r.broker_address)
                client.use_exchange_port(r.exchange_address, r.exchange_broker_id)
            self._takes_parts[topic] = bool(routes) and all(r.takes_send_parts for r in routes)
        return routes

    async def readable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues consumers may read, sorted."""
        return sorted(r.queue for r in await self.routes(topic, refresh=refresh) if r.readable)

    async def writable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues producers may write, sorted by (broker, queue id); do not modify."""
        queues = None if refresh else self._writable.get(topic)
        if queues is None:
            await self.routes(topic, create=True, refresh=refresh)
            queues = self._writable[topic]
        if not queues:
            raise BrokerUnavailableError(f"topic {topic!r} has no writable queue")
        return queues

    def known_writable_queues(self, topic: str) -> list[MessageQueue] | None:
        """See Transport.known_writable_queues (cached until a refresh)."""
        return self._writable.get(topic) or None

    async def _query_route(self, topic: str, create: bool) -> list[QueueRoute]:
        """Ask the endpoints in turn; each waits up to CONNECT_TIMEOUT for its broker.

        With several endpoints, a first pass skips those that cannot be reached now.
        """
        last: OrderMQError | None = None
        for wait in (False, True) if len(self.endpoints) > 1 else (True,):
            for address in self.endpoints:
                try:
                    return await self.client(address).query_route(
                        topic, create_if_missing=create, wait=wait
                    )
                except (BrokerUnavailableError, RequestTimeoutError) as exc:
                    last = exc
        assert last is not None
        raise last

    # ------------------------------------------------------------------ producing
    @staticmethod
    def prepare_spooled(record: bytes) -> bytes:
        """The spool keeps frames without their length prefix: put it back."""
        return FRAME_LEN_PREFIX.pack(len(record)) + record

    def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Coroutine[Any, Any, Appended]:
        """Append frames to one queue, in one Send request.

        The broker client's coroutine itself, not one awaiting it, and its client found
        inline: this runs for every request (as pull does).
        """
        address = self._addresses[queue]
        client = self._clients.get(address) or self.client(address)
        return client.send(queue.topic, queue.queue_id, b"".join(prepared), timeout=timeout)

    async def send_parts(
        self, parts: Sequence[SendPart], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        """One Send per broker and topic for brokers that take parts; else one per part."""
        requests: dict[tuple[str, str], list[int]] = {}
        for index, (queue, _) in enumerate(parts):
            if not self._takes_parts.get(queue.topic, False):
                return await send_each(self, parts, timeout)
            requests.setdefault((self._addresses[queue], queue.topic), []).append(index)
        outcomes: list[Appended | OrderMQError | None] = [None] * len(parts)

        async def one_request(address: str, topic: str, indexes: list[int]) -> None:
            client = self.client(address)
            frames = [(parts[i][0].queue_id, b"".join(parts[i][1])) for i in indexes]
            try:
                answers = await client.send_parts(topic, frames, timeout=timeout)
            except ClientStateError:
                raise
            except OrderMQError as exc:
                answers = [exc] * len(indexes)
            for i, answer in zip(indexes, answers, strict=True):
                outcomes[i] = answer

        if len(requests) == 1:  # the usual case: one broker, awaited here (no task)
            [((address, topic), indexes)] = requests.items()
            await one_request(address, topic, indexes)
        else:
            await asyncio.gather(*(one_request(a, t, ix) for (a, t), ix in requests.items()))
        return [o for o in outcomes if o is not None]

    async def cancel_scheduled(self, msg_id: str) -> bool:
        """Ask each broker in turn: the one that scheduled the message answers."""
        last: OrderMQError | None = None
        for client in self.brokers():
            try:
                return await client.cancel_scheduled("", msg_id)
            except MessageNotFoundError as exc:
                last = exc  # another broker may hold it
        assert last is not None
        raise last

    # ------------------------------------------------------------------ consuming
    def pull(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        max_messages: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        tag_expression: str = "*",
        suspend_timeout: float = 0.0,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, PullResult]:
        """Read `queue` from `offset` at its broker (its coroutine, as for send)."""
        address = self._addresses[queue]
        client = self._clients.get(address) or self.client(address)
        return client.pull(
            group,
            queue,
            offset,
            max_messages=max_messages,
            max_bytes=max_bytes,
            tag_expression=tag_expression,
            suspend_timeout=suspend_timeout,
            timeout=timeout,
        )

    async def subscribe(
        self,
        group: str,
        queue: MessageQueue,
        offset: int,
        *,
        client_id: str,
        lock_epoch: int,
        credit_messages: int,
        credit_bytes: int,
        max_messages: int = 1000,
        max_bytes: int = 4 * 1024 * 1024,
        tag_expression: str = "*",
    ) -> Subscription:
        """Push delivery of `queue` at its broker (Transport.subscribe)."""
        address = self._addresses[queue]
        client = self._clients.get(address) or self.client(address)
        return await client.subscribe(
            group,
            queue,
            offset,
            client_id=client_id,
            lock_epoch=lock_epoch,
            credit_messages=credit_messages,
            credit_bytes=credit_bytes,
            max_messages=max_messages,
            max_bytes=max_bytes,
            tag_expression=tag_expression,
        )

    async def queue_offsets(
        self, queue: MessageQueue, timestamp_ms: int = 0
    ) -> tuple[int, int, int]:
        """(min offset, max offset, first offset stored at or after timestamp_ms)."""
        return await self.client_for(queue).queue_offsets(queue, timestamp_ms)

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        """The group's committed offset for `queue`, or None if it never committed."""
        return await self.client_for(queue).query_offset(group, queue)

    async def commit_offsets(
        self, group: str, client_id: str, offsets: Sequence[tuple[MessageQueue, int, int]]
    ) -> None:
        """Commit at each queue's broker (all or nothing per broker)."""
        for address, part in self._by_broker(offsets, lambda o: o[0]).items():
            await self.client(address).commit_offsets(group, client_id, part)

    async def park_key(
        self, group: str, client_id: str, message: MessageExt, *, epoch: int, reason: str
    ) -> int:
        """Park at the broker that stores the message's queue."""
        return await self.client_for(message.queue).park_key(
            group,
            client_id,
            message.queue,
            message.sharding_key or "",
            message.queue_offset,
            epoch=epoch,
            reason=reason,
        )

    async def send_back(
        self,
        group: str,
        message: MessageExt,
        *,
        delay_level: int = 0,
        max_reconsume_times: int = 0,
        reconsume_times: int = 0,
    ) -> SentBack:
        """Send-back by the message's queue and offset, at the broker that stores it."""
        return await self.client_for(message.queue).send_back(
            group,
            message.queue,
            message.queue_offset,
            delay_level=delay_level,
            max_reconsume_times=max_reconsume_times,
            reconsume_times=reconsume_times,
        )

    # ------------------------------------------------------------------ receiving (pop)
    async def receive(
        self,
        group: str,
        topic: str,
        *,
        max_messages: int,
        invisible_duration: float,
        await_duration: float,
        tag_expression: str = "*",
        fifo: bool = False,
        max_delivery_attempts: int = 0,
    ) -> list[MessageExt]:
        """One Receive at a broker of `topic`, the brokers taken in turn, its readable queues.

        A pop holds no queue, so any broker serving the topic may answer; taking them in
        turn keeps one broker's backlog from waiting behind another's empty long polls.
        """
        by_broker: dict[str, list[QueueRoute]] = {}
        for route in await self.routes(topic):
            if route.readable:
                by_broker.setdefault(route.broker_address, []).append(route)
        if not by_broker:
            raise BrokerUnavailableError(f"topic {topic!r} has no readable queue")
        turn = self._receive_turns.get(topic, 0)
        self._receive_turns[topic] = turn + 1
        address = sorted(by_broker)[turn % len(by_broker)]
        routes = by_broker[address]
        return await self.client(address).receive(
            group,
            topic,
            [r.queue.queue_id for r in routes],
            routes[0].queue.broker_name,
            max_messages=max_messages,
            invisible_duration=invisible_duration,
            await_duration=await_duration,
            tag_expression=tag_expression,
            fifo=fifo,
            max_delivery_attempts=max_delivery_attempts,
        )

    async def ack(self, receipt: Receipt) -> None:
        """Ack at the broker that issued the receipt."""
        await self.client(receipt.broker).ack(receipt)

    async def change_invisible_duration(self, receipt: Receipt, seconds: float) -> Receipt:
        """Change at the broker that issued the receipt."""
        return await self.client(receipt.broker).change_invisible_duration(receipt, seconds)

    # ------------------------------------------------------------------ membership
    async def heartbeat(self, client_id: str, groups: Sequence[GroupInfo]) -> None:
        """Heartbeat every known broker in turn; the first failure stops it."""
        for client in self.brokers():
            await client.heartbeat(client_id, groups)

    async def unregister(self, client_id: str) -> None:
        """Unregister at every known broker; the first failure is raised at the end."""
        first: OrderMQError | None = None
        for client in self.brokers():
            try:
                await client.unregister(client_id)
            except OrderMQError as exc:
                first = first or exc
        if first is not None:
            raise first

    async def consumer_list(self, group: str, topic: str) -> list[str]:
        """The group's members as the first endpoint knows them (brokers share no state)."""
        members, _version = await self.brokers()[0].consumer_list(group)
        return members

    async def watch_membership(self, group: str, known_version: int) -> AsyncIterator[int]:
        """The first endpoint's membership versions of `group`."""
        async for version, _members in self.brokers()[0].watch_membership(group, known_version):
            yield version

    # ------------------------------------------------------------------ transactions
    async def send_half(
        self, queue: MessageQueue, prepared: bytes, group: str, *, timeout: float | None = None
    ) -> HalfSent:
        """Store a half message at the queue's broker."""
        address = self._addresses[queue]
        txn_id, durable = await self.client(address).send_half(
            queue.topic, queue.queue_id, prepared, group, timeout=timeout
        )
        return HalfSent(txn_id, address, durable)

    async def end_transaction(
        self, broker: str, group: str, transaction_id: str, commit: bool, *, from_check: bool
    ) -> None:
        """Commit or roll back at the broker holding the half message."""
        await self.client(broker).end_transaction(
            group, transaction_id, commit, from_check=from_check
        )

    def transaction_brokers(self) -> list[str]:
        """The endpoints: each broker checks back its own half messages."""
        return list(self.endpoints)

    async def watch_transaction_checks(
        self, broker: str, group: str, client_id: str
    ) -> AsyncIterator[TransactionCheck]:
        """The check-backs one broker sends."""
        stream = self.client(broker).watch_transaction_checks(group, client_id)
        async for txn_id, messages, times in stream:
            for message in messages:
                yield TransactionCheck(txn_id, broker, message, times)

    # ------------------------------------------------------------------ locks
    async def lock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> LockResult:
        """One LockBatch per broker, in turn."""
        locked: dict[MessageQueue, int] = {}
        unanswered = await self._per_broker(
            queues, lambda client, part: client.lock_batch(group, client_id, part), locked.update
        )
        return LockResult(locked, unanswered)

    async def unlock_batch(
        self, group: str, client_id: str, queues: Sequence[MessageQueue]
    ) -> UnlockResult:
        """One UnlockBatch per broker, in turn."""
        not_held: list[MessageQueue] = []
        unanswered = await self._per_broker(
            queues,
            lambda client, part: client.unlock_batch(group, client_id, part),
            not_held.extend,
        )
        return UnlockResult(not_held, unanswered)

    async def _per_broker(
        self,
        queues: Sequence[MessageQueue],
        call: Callable[[BrokerClient, list[MessageQueue]], Awaitable[T]],
        take: Callable[[T], object],
    ) -> list[Unanswered]:
        """`call` each broker with its queues and `take` its answer; the brokers that failed."""
        unanswered: list[Unanswered] = []
        for address, part in self._by_broker(queues, lambda q: q).items():
            try:
                take(await call(self.client(address), part))
            except OrderMQError as exc:
                unanswered.append(Unanswered(address, part, exc))
        return unanswered

    def _by_broker(
        self, items: Sequence[T], queue_of: Callable[[T], MessageQueue]
    ) -> dict[str, list[T]]:
        """`items` grouped by the address of their queue's broker, in order."""
        out: dict[str, list[T]] = {}
        for item in items:
            out.setdefault(self._addresses[queue_of(item)], []).append(item)
        return out
