"""The address a broker puts in its routes: what clients on other machines connect to."""

from __future__ import annotations

from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, Producer
from sdk._transport.broker_client import BrokerClient
from tests.component.coordination import run


def test_routes_carry_the_advertised_host_and_clients_use_it(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "b", advertised_host="localhost")
    with EmbeddedBroker(config) as broker:
        port = broker.address.rsplit(":", 1)[1]
        assert broker.address == f"localhost:{port}"

        async def routes(c: BrokerClient) -> set[str]:
            return {r.broker_address for r in await c.query_route("t", create_if_missing=True)}

        assert run(f"127.0.0.1:{port}", routes) == {f"localhost:{port}"}
        # The producer sends where the route says: through "localhost".
        with Producer(f"127.0.0.1:{port}") as producer:
            assert producer.send(Message("t", b"via localhost")).queue_offset == 0


def test_a_wildcard_listener_advertises_loopback_by_default(tmp_path: Path) -> None:
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "b", host="0.0.0.0")) as broker:
        assert broker.address.startswith("127.0.0.1:")


@pytest.mark.parametrize("host", ["", "0.0.0.0", "::", "has space", "a/b"])
def test_an_advertised_host_clients_cannot_use_is_refused(tmp_path: Path, host: str) -> None:
    with pytest.raises(ValueError, match="advertised_host"):
        BrokerConfig(data_dir=tmp_path, advertised_host=host)
