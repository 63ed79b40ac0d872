"""One embedded broker, reached over the transport a test is parametrised with.

Component tests of the public clients run over each transport by defining their module's
`broker` fixture as `over_each_transport` does: `broker.address` is then the endpoint
the clients are given ("host:port" for gRPC, "rocketmq://<name server>" for RocketMQ
remoting), and the rest (`broker.broker`, `broker.grpc_address`) is the same broker.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.server import Broker
from sdk.clock import Clock

#: The transports the clients' component tests run over (ids of the parametrised tests).
TRANSPORTS = ("grpc", "rocketmq")


class BrokerOver:
    """An embedded broker and the transport its clients use."""

    def __init__(self, embedded: EmbeddedBroker, transport: str) -> None:
        self.embedded = embedded
        self.transport = transport

    @property
    def address(self) -> str:
        """The endpoint clients are given for this transport."""
        if self.transport == "rocketmq":
            return f"rocketmq://{self.embedded.namesrv_address}"
        return self.embedded.address

    @property
    def grpc_address(self) -> str:
        """ordermq's gRPC port, whatever the transport (admin calls, inspection)."""
        return self.embedded.address

    @property
    def config(self) -> BrokerConfig:
        """The broker's configuration."""
        return self.embedded.config

    @property
    def broker(self) -> Broker:
        """The broker itself."""
        return self.embedded.broker


@contextlib.contextmanager
def broker_over(
    transport: str, data_dir: Path, *, clock: Clock | None = None, **config: object
) -> Iterator[BrokerOver]:
    """A broker on port 0 (with its remoting port and name server), over `transport`."""
    assert transport in TRANSPORTS, transport
    cfg = BrokerConfig(data_dir=data_dir, remoting_port=0, namesrv_port=0, **config)  # type: ignore[arg-type]
    with EmbeddedBroker(cfg, clock=clock) as embedded:
        yield BrokerOver(embedded, transport)
