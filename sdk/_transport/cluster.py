"""The brokers a client talks to: one channel per broker, and cached topic routes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sdk._transport.broker_client import BrokerClient, QueueRoute
from sdk.errors import (
    BrokerUnavailableError,
    ClientStateError,
    InvalidArgumentError,
    OrderMQError,
    RequestTimeoutError,
)
from sdk.message import MessageQueue


def split_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """'h1:p1;h2:p2' or a list -> addresses; InvalidArgumentError when empty."""
    items = endpoints.replace(",", ";").split(";") if isinstance(endpoints, str) else endpoints
    out = [e.strip() for e in items if e.strip()]
    if not out:
        raise InvalidArgumentError("endpoints must name at least one broker as host:port")
    return out


class Cluster:
    """Channels by broker address and routes by topic; use on one event loop."""

    def __init__(self, endpoints: str | Sequence[str]) -> None:
        self.endpoints = split_endpoints(endpoints)
        self._clients: dict[str, BrokerClient] = {}
        self._routes: dict[str, list[QueueRoute]] = {}
        self._writable: dict[str, list[MessageQueue]] = {}
        self._addresses: dict[MessageQueue, str] = {}
        self._closed = False

    def client(self, address: str) -> BrokerClient:
        """The channel to `address`, opened on first use; ClientStateError once closed."""
        client = self._clients.get(address)
        if client is None:
            if self._closed:
                raise ClientStateError(f"the client is shut down; no channel to {address}")
            client = self._clients[address] = BrokerClient(address)
        return client

    def client_for(self, queue: MessageQueue) -> BrokerClient:
        """The channel to the broker serving `queue` (its route must be known)."""
        return self.client(self._addresses[queue])

    def brokers(self) -> list[BrokerClient]:
        """A channel to every known broker, endpoints first."""
        addresses = dict.fromkeys([*self.endpoints, *self._addresses.values()])
        return [self.client(a) for a in addresses]

    async def routes(
        self, topic: str, *, create: bool = False, refresh: bool = False
    ) -> list[QueueRoute]:
        """The topic's queues, sorted by (broker, queue id); cached until refreshed."""
        routes = None if refresh else self._routes.get(topic)
        if routes is None:
            routes = await self._query_route(topic, create)
            self._routes[topic] = routes
            self._writable[topic] = sorted(
                (r.queue for r in routes if r.writable), key=lambda q: (q.broker_name, q.queue_id)
            )
            for r in routes:
                self._addresses[r.queue] = r.broker_address
        return routes

    async def readable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The queues consumers may read, sorted."""
        return sorted(r.queue for r in await self.routes(topic, refresh=refresh) if r.readable)

    async def writable_queues(self, topic: str) -> list[MessageQueue]:
        """The queues producers may write, sorted by (broker, queue id); do not modify."""
        queues = self._writable.get(topic)
        if queues is None:
            await self.routes(topic, create=True)
            queues = self._writable[topic]
        if not queues:
            raise BrokerUnavailableError(f"topic {topic!r} has no writable queue")
        return queues

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

    async def close(self) -> None:
        """Close every channel; no new one is opened after this."""
        self._closed = True
        clients, self._clients = self._clients, {}
        await asyncio.gather(*(c.close() for c in clients.values()))
