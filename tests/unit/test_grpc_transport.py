"""Choosing the transport from the endpoints, and the gRPC transport's channels.

No sockets: nothing here makes a call, and channels open only on a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import CliRunner

import sdk
import sdk.aio
from sdk._transport import ACCEPTED_FORMS, connect
from sdk._transport.grpc_transport import GrpcTransport
from sdk.cli import cli
from sdk.errors import ClientStateError, InvalidArgumentError


def test_no_channel_is_opened_after_close() -> None:
    # A send retried after its producer shut down would otherwise open a channel that
    # nothing ever closes, and store the message after shutdown.
    transport = GrpcTransport(["127.0.0.1:1"])
    asyncio.run(transport.close())
    with pytest.raises(ClientStateError, match="shut down"):
        transport.client("127.0.0.1:1")


@pytest.mark.parametrize(
    ("endpoints", "addresses"),
    [
        ("127.0.0.1:8081", ["127.0.0.1:8081"]),
        (" h1:1 ; h2:2 ;", ["h1:1", "h2:2"]),
        ("h1:1,h2:2", ["h1:1", "h2:2"]),
        (["h1:1", " h2:2"], ["h1:1", "h2:2"]),
        (("h1:1",), ["h1:1"]),
    ],
)
def test_host_port_endpoints_get_the_grpc_transport(
    endpoints: str | list[str], addresses: list[str]
) -> None:
    transport = connect(endpoints)
    assert isinstance(transport, GrpcTransport)
    assert transport.endpoints == addresses


@pytest.mark.parametrize(
    "endpoints",
    [
        "kafka://k1:9092;k2:9092",
        "http://127.0.0.1:8081",
        ["127.0.0.1:8081", "amqp://127.0.0.1:5672"],
    ],
)
def test_an_endpoint_with_an_unknown_scheme_is_refused_naming_the_accepted_forms(
    endpoints: str | list[str],
) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown scheme") as info:
        connect(endpoints)
    assert ACCEPTED_FORMS in str(info.value)
    assert "'host:port'" in ACCEPTED_FORMS


@pytest.mark.parametrize("endpoints", ["", " ; ", [], [""], [b"h:1"], 8081, None])
def test_endpoints_that_name_no_broker_are_refused(endpoints: Any) -> None:
    with pytest.raises(InvalidArgumentError, match="accepted: "):
        connect(endpoints)


FACES: list[Callable[[str], object]] = [
    lambda e: sdk.Producer(e),
    lambda e: sdk.PushConsumer("g", e),
    lambda e: sdk.LitePullConsumer("g", e),
    lambda e: sdk.aio.Producer(e),
    lambda e: sdk.aio.PushConsumer("g", e),
    lambda e: sdk.aio.LitePullConsumer("g", e),
]


@pytest.mark.parametrize("make", FACES)
def test_every_client_chooses_its_transport_through_connect(
    make: Callable[[str], object],
) -> None:
    with pytest.raises(InvalidArgumentError, match="unknown scheme 'kafka://'"):
        make("kafka://k1:9092")


def test_the_command_chooses_its_transport_through_connect() -> None:
    result = CliRunner().invoke(cli, ["--broker", "kafka://k1:9092", "topics", "list"])
    assert result.exit_code == 1
    assert "unknown scheme 'kafka://'" in result.output
