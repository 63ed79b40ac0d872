"""The v2 front's listener: its own grpc.aio server, started and stopped with the broker."""

from __future__ import annotations

import grpc

from mockbroker.fronts.v2.auth import V2Auth
from mockbroker.fronts.v2.pop import PopCore
from mockbroker.fronts.v2.service import RocketMQ5Service, add_to
from mockbroker.state import BrokerState
from sdk._wire import GRPC_SERVER_OPTIONS, GrpcOptions


class V2Front:
    """apache.rocketmq.v2.MessagingService on a port of its own."""

    def __init__(
        self, state: BrokerState, pop: PopCore | None = None, auth: V2Auth | None = None
    ) -> None:
        self.service = RocketMQ5Service(state, pop, auth)
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(
        self,
        host: str,
        port: int,
        advertised_host: str,
        credentials: grpc.ServerCredentials | None = None,
        options: GrpcOptions = GRPC_SERVER_OPTIONS,
    ) -> int:
        """Listen on host:port (0: a free port); clients are sent to advertised_host.

        With `credentials`, over TLS only; `options`: the gRPC server's (the broker's
        listener's, keepalive included).

        OSError when the port cannot be taken.
        """
        server = grpc.aio.server(options=options)
        add_to(server, self.service)
        try:
            self.port = (
                server.add_secure_port(f"{host}:{port}", credentials)
                if credentials is not None
                else server.add_insecure_port(f"{host}:{port}")
            )
        except RuntimeError as exc:
            raise OSError(f"cannot listen on {host}:{port} (RocketMQ 5 port): {exc}") from exc
        self.service.listening_on(advertised_host, self.port)
        await server.start()
        self._server = server
        return self.port

    def close(self) -> None:
        """Stop taking new work: Telemetry streams end (the broker is stopping)."""
        self.service.close()

    async def stop(self, grace_seconds: float) -> None:
        """Stop serving; running calls get `grace_seconds` to finish."""
        self.close()
        if self._server is not None:
            await self._server.stop(grace_seconds)
            self._server = None


__all__ = ["V2Front"]
