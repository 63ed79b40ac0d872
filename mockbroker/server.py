"""The broker's lifecycle: open the store, serve gRPC, shut down cleanly."""

from __future__ import annotations

import asyncio
import logging

import grpc

from mockbroker.config import BrokerConfig
from mockbroker.offsets import ConsumerOffsets
from mockbroker.service import AdminService, BrokerState, MessagingService
from mockbroker.store.message_store import MessageStore
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import GRPC_CHANNEL_OPTIONS
from sdk.clock import Clock, SystemClock

log = logging.getLogger("mockbroker")

_WILDCARDS = ("0.0.0.0", "::", "[::]", "")


class Broker:
    """One broker: a message store served over gRPC on the running event loop."""

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self._clock: Clock = clock or SystemClock()
        clock = self._clock
        self.store = MessageStore(
            config.data_dir,
            sync_flush=config.flush_mode == "sync",
            segment_bytes=config.segment_bytes,
            flush_interval_seconds=config.flush_interval_seconds,
            sync_flush_timeout_seconds=config.sync_flush_timeout_seconds,
            clock=clock,
        )
        self.offsets = ConsumerOffsets(config.data_dir / "offsets.json")
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def address(self) -> str:
        """'host:port' clients connect to (loopback when listening on every interface)."""
        host = "127.0.0.1" if self.config.host in _WILDCARDS else self.config.host
        return f"{host}:{self.port}"

    async def start(self) -> None:
        """Open (and if need be recover) the store, then start serving."""
        await asyncio.to_thread(self.store.open)  # raises OSError if the directory is in use
        self.offsets.load()
        await self.store.start()
        state = BrokerState(self.config, self.store, self.offsets, self._clock)
        # Without so_reuseport=0 a second broker could bind the same port and share it.
        server = grpc.aio.server(options=(*GRPC_CHANNEL_OPTIONS, ("grpc.so_reuseport", 0)))
        pb_grpc.add_MessagingServiceServicer_to_server(MessagingService(state), server)
        pb_grpc.add_AdminServiceServicer_to_server(AdminService(state), server)
        try:
            self.port = server.add_insecure_port(f"{self.config.host}:{self.config.port}")
        except RuntimeError as exc:
            await self.store.close()
            raise OSError(f"cannot listen on {self.config.host}:{self.config.port}: {exc}") from exc
        state.address = self.address
        await server.start()
        self._server = server
        log.info("broker %s serving on %s", self.config.broker_name, self.address)

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Stop accepting calls, let running ones finish (bounded), then close the store."""
        if self._server is not None:
            await self._server.stop(grace_seconds)
            self._server = None
        await self.store.close()
        log.info("broker %s stopped", self.config.broker_name)
