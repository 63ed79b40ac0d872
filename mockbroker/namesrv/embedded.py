"""EmbeddedNameServer: a name server in a background thread, for tests and small clusters."""

from __future__ import annotations

from mockbroker.loop_thread import InBackground, LoopThread
from mockbroker.namesrv.server import NameServer
from sdk.clock import Clock


class EmbeddedNameServer(InBackground):
    """Run a name server on its own event loop in a daemon thread.

    Use it as a context manager; `address` is valid inside the block::

        with EmbeddedNameServer() as ns:
            config = BrokerConfig(data_dir=tmp, remoting_port=0, namesrv_addr=ns.address)
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, clock: Clock | None = None
    ) -> None:
        self.server = NameServer(clock=clock)
        self._runner = LoopThread(
            "embedded name server", lambda: self.server.start(host, port), self.server.stop
        )

    @property
    def address(self) -> str:
        """host:port of the running name server."""
        return self.server.address
