"""The remoting front: a name server and a broker port, both over the broker's core."""

from __future__ import annotations

import asyncio
import ssl

from mockbroker.acl import Acl
from mockbroker.fronts.remoting.admin_handlers import admin_handlers
from mockbroker.fronts.remoting.auth import RemotingAuth
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.fronts.remoting.coordination import RemotingClients, coordination_handlers
from mockbroker.fronts.remoting.data_handlers import data_handlers, resolve_store_host
from mockbroker.fronts.remoting.namesrv import namesrv_handlers
from mockbroker.fronts.remoting.offset_handlers import offset_handlers
from mockbroker.fronts.remoting.server import (
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_HOST,
    RemotingServer,
)
from mockbroker.fronts.remoting.transaction_handlers import check_request, transaction_handlers
from mockbroker.state import BrokerState
from sdk._remoting.command import RemotingCommand
from sdk._remoting.message_ids import SocketAddress


class RemotingFront:
    """RocketMQ 4.x remoting for one broker: its name server and its broker port.

    Either may be off (port None); 0 picks a free port. With `acl` the broker port checks
    every request's signature and permissions first (auth.py); the name server stays open,
    as RocketMQ's has no ACL.
    """

    def __init__(
        self,
        state: BrokerState,
        advertised_host: str,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_connections_per_host: int = MAX_CONNECTIONS_PER_HOST,
        acl: Acl | None = None,
    ) -> None:
        self._state = state
        self._auth = RemotingAuth(acl) if acl is not None else None
        self._host = advertised_host
        self._max_connections = max_connections
        self._max_connections_per_host = max_connections_per_host
        self.clients = RemotingClients(
            state, check_request=lambda check: check_request(check, self._store_address())
        )
        self._resolved: tuple[str, SocketAddress] | None = None
        self.broker: RemotingServer | None = None
        self.namesrv: RemotingServer | None = None

    @property
    def broker_address(self) -> str | None:
        """host:port of the broker port, as routes name it (None when off)."""
        return None if self.broker is None else f"{self._host}:{self.broker.port}"

    @property
    def namesrv_address(self) -> str | None:
        """host:port of the name server (None when off)."""
        return None if self.namesrv is None else f"{self._host}:{self.namesrv.port}"

    def broker_handlers(self) -> dict[int, Handler]:
        """Every request code the broker port serves."""
        state = self._state
        handlers = {
            **data_handlers(state, self.clients, store_host=self._store_host),
            **offset_handlers(state),
            **admin_handlers(state),
            **coordination_handlers(state, self.clients),
            **transaction_handlers(state),
        }
        return {code: self._alive(handler) for code, handler in handlers.items()}

    def _alive(self, handler: Handler) -> Handler:
        """`handler`, once the connection's clients count as alive on it."""
        clients = self.clients

        async def answer(
            request: RemotingCommand, channel: ClientChannel
        ) -> RemotingCommand | None:
            clients.touch(channel)
            return await handler(request, channel)

        return answer

    async def start(
        self,
        listen_host: str,
        broker_port: int | None,
        namesrv_port: int | None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """Start the ports that are on, over TLS with `tls`."""
        state = self._state
        if broker_port is not None:
            self.broker = RemotingServer(
                "broker", self.broker_handlers(), state.clock,
                on_close=self.clients.connection_closed, limits=state.limits,
                max_connections=self._max_connections,
                max_connections_per_host=self._max_connections_per_host,
                guard=self._auth.check if self._auth is not None else None,
            )  # fmt: skip
            await self.broker.start(listen_host, broker_port, tls)
        if namesrv_port is not None:
            handlers = namesrv_handlers(state, self._store_host)
            self.namesrv = RemotingServer(
                "namesrv", handlers, state.clock, limits=state.limits,
                max_connections=self._max_connections,
                max_connections_per_host=self._max_connections_per_host,
            )  # fmt: skip
            await self.namesrv.start(listen_host, namesrv_port, tls)

    async def stop(self, grace_seconds: float = 0.0) -> None:
        """Close both ports and every connection (requests in flight get the grace)."""
        self.clients.close()
        servers = [server for server in (self.namesrv, self.broker) if server is not None]
        await asyncio.gather(*(server.stop(grace_seconds) for server in servers))

    def _store_host(self) -> str:
        return self.broker_address or self._state.address

    def _store_address(self) -> SocketAddress:
        text = self._store_host()
        if self._resolved is None or self._resolved[0] != text:
            self._resolved = (text, resolve_store_host(text))
        return self._resolved[1]
