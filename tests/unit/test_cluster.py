"""The client's channels by broker: none is opened once the client is shut down."""

from __future__ import annotations

import asyncio

import pytest

from sdk._transport.cluster import Cluster
from sdk.errors import ClientStateError


def test_no_channel_is_opened_after_close() -> None:
    # A send retried after its producer shut down would otherwise open a channel that
    # nothing ever closes, and store the message after shutdown.
    cluster = Cluster("127.0.0.1:1")
    asyncio.run(cluster.close())
    with pytest.raises(ClientStateError, match="shut down"):
        cluster.client("127.0.0.1:1")
