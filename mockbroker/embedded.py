"""EmbeddedBroker: a broker in a background thread, for tests, demos and small services."""

from __future__ import annotations

import asyncio
import threading
from types import TracebackType

from mockbroker.config import BrokerConfig
from mockbroker.server import Broker
from sdk.clock import Clock


class EmbeddedBroker:
    """Run a broker on its own event loop in a daemon thread.

    Use it as a context manager; `address` is valid inside the block::

        with EmbeddedBroker(BrokerConfig(data_dir=tmp)) as broker:
            producer = Producer(broker.address)
    """

    def __init__(self, config: BrokerConfig, *, clock: Clock | None = None) -> None:
        self.config = config
        self._broker = Broker(config, clock=clock)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """'host:port' of the running broker."""
        if self._thread is None:
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
        address = self._broker.v2_address if self._thread is not None else None
        if address is None:
            raise RuntimeError(
                "the embedded broker is not running"
                if self._thread is None
                else "the RocketMQ 5 front is off (BrokerConfig.v2_port is None)"
            )
        return address

    @property
    def broker(self) -> Broker:
        """The broker itself (its store and counters, for inspection)."""
        return self._broker

    def start(self) -> None:
        """Start the broker and return once it serves (raises what startup raised)."""
        if self._thread is not None:
            raise RuntimeError("the embedded broker is already running")
        ready = threading.Event()
        failure: list[BaseException] = []
        loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._broker.start())
            except BaseException as exc:
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._broker.stop())
            loop.close()

        thread = threading.Thread(target=run, name="ordermq-embedded-broker", daemon=True)
        thread.start()
        ready.wait()
        if failure:
            thread.join()
            raise failure[0]
        self._loop, self._thread = loop, thread

    def stop(self) -> None:
        """Stop serving, flush and close the store, and join the thread."""
        if self._thread is None or self._loop is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._thread = self._loop = None

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
