"""A standalone RocketMQ name server: brokers register with it, clients ask it for routes.

It serves REGISTER_BROKER, UNREGISTER_BROKER, GET_ROUTEINFO_BY_TOPIC and
GET_BROKER_CLUSTER_INFO over RocketMQ remoting (the route table is routes.py). Every
`scan_seconds` (10 s, the first after 5 s, as RocketMQ's) it drops the brokers that have
not registered within their timeout. It keeps nothing on disk: brokers register again
within 30 s of its restart. It has no ACL, as RocketMQ's has none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl

from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.fronts.remoting.server import RemotingServer
from mockbroker.namesrv.registration import parse_registration, parse_unregistration
from mockbroker.namesrv.routes import RouteTable, no_route, route_json
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import Fields, RemotingCommand, RemotingError
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.log import log_event

log = logging.getLogger("mockbroker.namesrv")

#: RocketMQ's name server: the first scan for silent brokers after 5 s, then every 10 s.
FIRST_SCAN_SECONDS, SCAN_SECONDS = 5.0, 10.0


class NameServer:
    """Route table plus its remoting port."""

    def __init__(self, *, clock: Clock | None = None, scan_seconds: float = SCAN_SECONDS) -> None:
        self.clock: Clock = clock or SystemClock()
        self.routes = RouteTable(self.clock)
        self.scan_seconds = scan_seconds
        self.host = "127.0.0.1"
        self._server: RemotingServer | None = None
        self._scanner: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """The port it listens on (after start)."""
        if self._server is None:
            raise RuntimeError("the name server is not running")
        return self._server.port

    @property
    def address(self) -> str:
        """host:port, as brokers and clients name it (after start)."""
        return f"{self.host}:{self.port}"

    def handlers(self) -> dict[int, Handler]:
        """The request codes it serves."""
        return {
            RequestCode.REGISTER_BROKER: self._register,
            RequestCode.UNREGISTER_BROKER: self._unregister,
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._cluster_info,
        }

    async def start(
        self, host: str = "127.0.0.1", port: int = 9876, tls: ssl.SSLContext | None = None
    ) -> None:
        """Listen on host:port (0: a free port) and start scanning for silent brokers."""
        self.host = host
        self._server = RemotingServer("namesrv", self.handlers(), self.clock)
        await self._server.start(host, port, tls)
        self._scanner = asyncio.create_task(self._scan(), name="namesrv-scan")
        log.info("name server on %s", self.address)

    async def stop(self) -> None:
        """Stop scanning and close the port and every connection."""
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
            self._scanner = None
        if self._server is not None:
            await self._server.stop()

    async def _scan(self) -> None:
        await sleep_for(self.clock, min(FIRST_SCAN_SECONDS, self.scan_seconds))
        while True:
            for address in self.routes.expire():
                log_event(log, logging.WARNING, "namesrv.broker_expired",
                          f"broker {address} has not registered in time: its routes are dropped",
                          address=address)  # fmt: skip
            await sleep_for(self.clock, self.scan_seconds)

    async def _register(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        reg = parse_registration(request)
        if self.routes.register(reg):
            log_event(
                log, logging.INFO, "namesrv.broker_registered",
                f"broker {reg.broker_name} (id {reg.broker_id}) at {reg.address} in "
                f"cluster {reg.cluster}: {len(reg.topics)} topics",
                broker=reg.broker_name, address=reg.address, topics=len(reg.topics),
            )  # fmt: skip
        return request.response()

    async def _unregister(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand:
        unreg = parse_unregistration(request)
        if self.routes.unregister(unreg):
            log_event(log, logging.INFO, "namesrv.broker_unregistered",
                      f"broker {unreg.broker_name} at {unreg.address} unregistered",
                      broker=unreg.broker_name, address=unreg.address)  # fmt: skip
        return request.response()

    async def _route(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        topic = Fields.of(request).string("topic")
        route = self.routes.route(topic)
        if route is None:
            raise RemotingError(ResponseCode.TOPIC_NOT_EXIST, no_route(topic))
        return request.response(body=route_json(route))

    async def _cluster_info(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand:
        return request.response(body=route_json(self.routes.cluster_info()))
