"""EmbeddedBroker: a broker in a background thread, for tests, demos and small services."""

from __future__ import annotations

from mockbroker.config import BrokerConfig
from mockbroker.loop_thread import InBackground, LoopThread
from mockbroker.server import Broker
from sdk.clock import Clock


class EmbeddedBroker(InBackground):
    """Run a broker on its own event loop in a daemon thread.

    Use it as a context manager; `address` is valid inside the block::

        with EmbeddedBroker(BrokerConfig(data_dir=tmp)) as broker:
            producer = Producer(broker.address)
    """

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self._broker = Broker(config, clock=clock)
        self._runner = LoopThread("embedded broker", self._broker.start, self._broker.stop)

    @property
    def address(self) -> str:
        """'host:port' of the running broker."""
        if not self._runner.running:
            raise RuntimeError("the embedded broker is not running")
        return self._broker.address

    @property
    def remoting_address(self) -> str | None:
        """'host:port' of the RocketMQ remoting port (None when off)."""
        remoting = self._broker.remoting
        return None if remoting is None else remoting.broker_address

    @property
    def namesrv_address(self) -> str | None:
        """'host:port' of the RocketMQ name server (None when off)."""
        remoting = self._broker.remoting
        return None if remoting is None else remoting.namesrv_address

    @property
    def v2_address(self) -> str:
        """'host:port' of the RocketMQ 5 front (config.v2_port), for RocketMQ 5 clients."""
        address = self._broker.v2_address if self._runner.running else None
        if address is None:
            raise RuntimeError(
                "the embedded broker is not running"
                if not self._runner.running
                else "the RocketMQ 5 front is off (BrokerConfig.v2_port is None)"
            )
        return address

    @property
    def exchange_address(self) -> str | None:
        """'host:port' of the Exchange port (config.exchange_port; None when off)."""
        return self._broker.exchange_address

    @property
    def console_address(self) -> str | None:
        """'host:port' of the console (config.console_port; None when off)."""
        return self._broker.console_address

    @property
    def broker(self) -> Broker:
        """The broker itself (its store and counters, for inspection)."""
        return self._broker

    def expire_client(self, client_id: str) -> int:
        """Forget a client now, as the broker does one that went silent (Broker.expire_client).

        Its groups' other members take its queues at their next rebalance. Returns how many
        queue locks were released; ValueError for a client the broker does not know.
        """
        return self._runner.call(lambda: self._broker.expire_client(client_id))
