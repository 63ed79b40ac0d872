"""TestBroker: an ordermq broker inside a test's process, that the test can restart."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from sdk.clock import Clock


class TestBroker:
    """An ordermq broker in this process, on a free port and its own data directory.

    Args:
        data_dir: Where it keeps its data (None: a temporary directory, removed when the
            broker is closed).
        clock: The broker's clock (an sdk.testing.FakeClock to move leases, delays and
            expiry by hand; None: the system's).
        **config: Further mockbroker.BrokerConfig settings, such as
            `default_queues=4`, `flush_mode="sync"` or `lock_lease_seconds=10`.

    Use it as a context manager (`with TestBroker() as broker:`), or call `start()` and
    `close()`. Clients connect to `broker.address`.
    """

    __test__ = False  # a helper, not a test class for pytest to collect

    def __init__(
        self, data_dir: Path | None = None, *, clock: Clock | None = None, **config: Any
    ) -> None:
        from mockbroker import BrokerConfig  # the broker only where a test asks for one

        self._own_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="ordermq-test-")) if data_dir is None else data_dir
        )
        self.clock = clock
        self._config = BrokerConfig(data_dir=self.data_dir, port=0, **config)
        self._embedded: Any = None  # mockbroker.EmbeddedBroker while started

    @property
    def address(self) -> str:
        """The "host:port" clients are given."""
        if self._embedded is None:
            raise RuntimeError("the test broker is not started")
        return str(self._embedded.address)

    def start(self) -> Self:
        """Start serving (on the port the first start bound, after a stop)."""
        from mockbroker import EmbeddedBroker

        if self._embedded is not None:
            raise RuntimeError("the test broker is already started")
        embedded = EmbeddedBroker(self._config, clock=self.clock)
        embedded.start()
        self._embedded = embedded
        # a restart serves where the clients of the first start connect
        port = int(embedded.address.rsplit(":", 1)[1])
        self._config = dataclasses.replace(self._config, port=port)
        return self

    def stop(self) -> None:
        """Stop serving, as a broker shut down cleanly; its data stays for a restart."""
        if self._embedded is not None:
            self._embedded.stop()
            self._embedded = None

    def restart(self) -> None:
        """Stop and start again: same address, same data (clients reconnect by themselves)."""
        self.stop()
        self.start()

    def lose_client(self, client_id: str) -> int:
        """Forget a client (a consumer's `client_id`) as the broker forgets one gone silent.

        It leaves its groups, whose other members take its queues at their next rebalance,
        and its queue locks are released. A client that is in fact still running finds out
        when it next renews its locks, and sends a heartbeat that makes it a member again:
        this is what a network partition does. Returns how many locks were released.
        """
        if self._embedded is None:
            raise RuntimeError("the test broker is not started")
        return int(self._embedded.expire_client(client_id))

    def close(self) -> None:
        """Stop, and remove the data directory if the broker made it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
