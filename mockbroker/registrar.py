"""Registering the broker with its name servers (`namesrv_addr`), as a RocketMQ broker does.

At start, every `register_seconds` (30 s) and at once when a topic is created, changed or
deleted, the broker sends REGISTER_BROKER with its topics to every name server, each on a
connection of its own and in parallel, so one name server that is down or slow holds up
neither the others nor the broker. A name server that cannot be reached is logged once
(WARNING) until it answers again (INFO), and tried again at the next round. At shutdown
the broker sends UNREGISTER_BROKER to each (bounded by `REQUEST_SECONDS`), so clients stop
routing to it at once rather than after the name servers' 120 s timeout.

The routes name the broker's remoting port (RocketMQ clients reach the broker there); the
topics are the registry's, plus RocketMQ's default topic `TBW102` while topics are created
on first send (RocketMQ's producers route a new topic to the brokers that have it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from mockbroker.namesrv.registration import TopicQueues, register_request, unregister_request
from mockbroker.state import BrokerState
from mockbroker.topics import DEFAULT_TOPIC
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingCommand
from sdk._remoting.connection import RemotingConnection
from sdk.clock import Clock, wait_within
from sdk.errors import OrderMQError
from sdk.log import log_event

log = logging.getLogger("mockbroker.registrar")

#: RocketMQ's broker: a registration waits at most 6 s for its answer.
REQUEST_SECONDS = 6.0


class BrokerRegistrar:
    """Keeps the broker registered with every name server in `name_servers`."""

    def __init__(
        self,
        state: BrokerState,
        name_servers: list[str],
        broker_address: Callable[[], str],
        clock: Clock,
        *,
        cluster: str,
        register_seconds: float,
    ) -> None:
        self._state = state
        self._name_servers = list(name_servers)
        self._address = broker_address
        self._clock = clock
        self._cluster = cluster
        self._interval = register_seconds
        self._boot_ms = int(clock.now() * 1000)
        self._connections: dict[str, RemotingConnection] = {}
        self._unreachable: set[str] = set()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: Registrations answered SUCCESS, by name server (for status and tests).
        self.registered: dict[str, int] = {}

    async def start(self) -> None:
        """Register once with every name server, then keep registering in the background."""
        self._state.store.topics.on_change = self._changed.set
        await self.register_all()
        self._task = asyncio.create_task(self._run(), name="namesrv-registrar")

    async def stop(self) -> None:
        """Stop registering and unregister from every name server."""
        self._state.store.topics.on_change = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        request = unregister_request(
            cluster=self._cluster, broker_name=self._state.config.broker_name,
            address=self._address(),
        )  # fmt: skip
        await asyncio.gather(*(self._send(ns, request) for ns in self._name_servers))
        for connection in self._connections.values():
            await connection.close()
        self._connections.clear()

    async def register_all(self) -> None:
        """One REGISTER_BROKER to every name server, in parallel; failures are logged."""
        self._changed.clear()
        topics = {
            t.name: TopicQueues(t.queue_count, t.queue_count)
            for t in self._state.store.topics.all()
        }
        config = self._state.config
        if config.auto_create_topics and DEFAULT_TOPIC not in topics:
            topics[DEFAULT_TOPIC] = TopicQueues(config.default_queues, config.default_queues)
        request = register_request(
            cluster=self._cluster, broker_name=config.broker_name, address=self._address(),
            data_version=(self._state.store.topics.version, self._boot_ms), topics=topics,
        )  # fmt: skip
        answers = await asyncio.gather(*(self._send(ns, request) for ns in self._name_servers))
        for ns, ok in zip(self._name_servers, answers, strict=True):
            if ok:
                self.registered[ns] = self.registered.get(ns, 0) + 1

    async def _run(self) -> None:
        while True:
            await wait_within(self._clock, self._changed.wait(), self._interval)
            await self.register_all()

    async def _send(self, name_server: str, request: RemotingCommand) -> bool:
        """Send `request` to one name server; True when it answered SUCCESS."""
        try:
            connection = self._connections.get(name_server)
            if connection is None or connection.closed:
                connection = await RemotingConnection.open(name_server, timeout=REQUEST_SECONDS)
                self._connections[name_server] = connection
            answer = await connection.request(_copy(request), REQUEST_SECONDS)
            if answer.code != ResponseCode.SUCCESS:
                raise OrderMQError(f"answered code {answer.code}: {answer.remark}")
        except OrderMQError as exc:
            dropped = self._connections.pop(name_server, None)
            if dropped is not None:
                await dropped.close()
            if name_server not in self._unreachable:
                self._unreachable.add(name_server)
                log_event(
                    log, logging.WARNING, "namesrv.unreachable",
                    f"name server {name_server}: {exc} (tried again every "
                    f"{self._interval:g} s)",
                    name_server=name_server,
                )  # fmt: skip
            return False
        if name_server in self._unreachable:
            self._unreachable.discard(name_server)
            log.info("name server %s answers again", name_server)
        return True


def _copy(request: RemotingCommand) -> RemotingCommand:
    """A request of its own for each connection (each sets its own opaque)."""
    return RemotingCommand(code=request.code, ext_fields=dict(request.ext_fields or {}),
                           body=request.body)  # fmt: skip
