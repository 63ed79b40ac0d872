"""The broker's lifecycle: open the store, serve gRPC, shut down cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc

from mockbroker.admin_service import AdminService
from mockbroker.config import BrokerConfig
from mockbroker.errors import BrokerError
from mockbroker.fair_store import SlicedStore
from mockbroker.fairness import FairScheduler
from mockbroker.groups import ConsumerGroups
from mockbroker.limits import ClientLimits
from mockbroker.lock_manager import LOCK_FILE, RebalanceLockManager
from mockbroker.long_polling import PullHolder
from mockbroker.metrics import MetricsServer
from mockbroker.offsets import ConsumerOffsets
from mockbroker.retry import RetryService
from mockbroker.schedule import Scheduler
from mockbroker.service import MessagingService
from mockbroker.state import BrokerState
from mockbroker.store.message_store import MessageStore
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import GRPC_CHANNEL_OPTIONS
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.log import log_event

log = logging.getLogger("mockbroker")

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")
#: How often silent clients are looked for.
_EXPIRY_SWEEP_SECONDS = 1.0


class Broker:
    """One broker: a message store served over gRPC on the running event loop."""

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.store = MessageStore(
            config.data_dir,
            sync_flush=config.flush_mode == "sync",
            segment_bytes=config.segment_bytes,
            flush_interval_seconds=config.flush_interval_seconds,
            sync_flush_timeout_seconds=config.sync_flush_timeout_seconds,
            clock=self.clock,
        )
        self.offsets = ConsumerOffsets(config.data_dir / "offsets.json")
        self.state: BrokerState | None = None
        self._server: grpc.aio.Server | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._metrics: MetricsServer | None = None
        self._messaging: MessagingService | None = None
        self.port = 0

    @property
    def metrics_port(self) -> int | None:
        """The port /metrics is served on, when enabled."""
        return self._metrics.port if self._metrics is not None else None

    @property
    def exchange_streams(self) -> int:
        """How many clients' Exchange streams (their Send and Pull) are being served."""
        return self._messaging.exchanges.open_streams if self._messaging is not None else 0

    @property
    def address(self) -> str:
        """'host:port' clients connect to: advertised_host, else host (loopback for 0.0.0.0)."""
        host = self.config.advertised_host
        if host is None:
            host = "127.0.0.1" if self.config.host in _WILDCARDS else self.config.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Open (and if need be recover) the store, then start serving."""
        await asyncio.to_thread(self.store.open)  # raises OSError if the directory is in use
        try:
            await self._start_serving()
        except BaseException:
            await self.store.close()
            raise

    async def _start_serving(self) -> None:
        self.offsets.load()
        locks = RebalanceLockManager(
            self.clock, self.config.lock_lease_seconds, self.config.data_dir / LOCK_FILE
        )
        await asyncio.to_thread(locks.load, previous_run=bool(self.offsets.groups()))
        await self.store.start()
        scheduler = Scheduler(self.store, self.clock)
        scheduler.load()
        holder = PullHolder(self.clock)
        self.store.on_append = holder.notify
        state = BrokerState(
            config=self.config,
            clock=self.clock,
            store=self.store,
            offsets=self.offsets,
            locks=locks,
            groups=ConsumerGroups(
                self.clock,
                self.config.client_timeout_seconds,
                self.config.disconnect_grace_seconds,
            ),
            holder=holder,
            scheduler=scheduler,
            retry=RetryService(self.store, scheduler, self.clock),
            started=self.clock.now(),
            sliced=self._sliced_store(),
            limits=ClientLimits(self.config.client_max_in_flight_bytes),
        )
        # Without so_reuseport=0 a second broker could bind the same port and share it.
        server = grpc.aio.server(options=(*GRPC_CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)))
        self._messaging = MessagingService(state)
        pb_grpc.add_MessagingServiceServicer_to_server(self._messaging, server)
        pb_grpc.add_AdminServiceServicer_to_server(AdminService(state), server)
        try:
            self.port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}: {exc}") from exc
        state.address = self.address
        await server.start()
        scheduler.start()
        self._sweeper = asyncio.create_task(self._expire_clients(state), name="client-expiry")
        if self.config.metrics_port is not None:
            self._metrics = MetricsServer(state, self.config.host, self.config.metrics_port)
            log.info("metrics on http://%s:%d/metrics", self.config.host, self._metrics.port)
        self.state, self._server = state, server
        log.info("broker %s serving on %s", self.config.broker_name, self.address)

    def _sliced_store(self) -> SlicedStore | None:
        config = self.config
        if not config.fair_scheduling:
            return None
        scheduler = FairScheduler(
            turn_seconds=config.fair_turn_ms / 1000, timer=self.clock.monotonic
        )
        return SlicedStore(
            self.store,
            scheduler,
            slice_messages=config.fair_slice_messages,
            slice_bytes=config.fair_slice_bytes,
        )

    async def _expire_clients(self, state: BrokerState) -> None:
        while True:
            await sleep_for(self.clock, _EXPIRY_SWEEP_SECONDS)
            stats = state.store.stats
            state.rates.sample(self.clock.now(), stats.messages_stored, stats.messages_served)
            for client_id, why in state.groups.expire().items():
                dropped = state.locks.release_client(client_id)
                log_event(log, logging.WARNING, "client.expired",
                          f"client {client_id} expired ({why}); {dropped} lock(s) released",
                          client_id=client_id, locks_released=dropped)  # fmt: skip
            try:
                await state.locks.save()
            except BrokerError as exc:
                log.error("%s (retried with the next change)", exc.message)

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Answer held pulls, stop serving (running calls get a bounded grace), close."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        if self._messaging is not None:
            self._messaging.exchanges.close()  # each ends once its requests are answered
        if self.state is not None:
            self.state.holder.close()
            self.state.groups.close()
            await self.state.scheduler.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._server is not None:
            await self._server.stop(grace_seconds)
            self._server = None
        await self.store.close()
        log.info("broker %s stopped", self.config.broker_name)
