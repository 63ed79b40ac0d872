"""A call sent on a connection that then goes silent fails by its deadline.

Acks, offset commits and queries, locks and the other calls a client makes without a
deadline of their own get CALL_DEADLINE (sdk/_transport/broker_client.py): without it,
one sent just before its connection went silent (a cut cable, a peer gone without a
reset) waited for good, and with it whatever waited on it, such as a worker's ack.
"""

from __future__ import annotations

import asyncio

import pytest

from mockbroker import EmbeddedBroker
from sdk._transport import broker_client
from sdk._transport.broker_client import BrokerClient
from sdk.errors import RequestTimeoutError
from sdk.message import MessageQueue
from tests.faultproxy import FaultProxy

DEADLINE = 1.0


def test_a_call_on_a_connection_gone_silent_fails_by_its_deadline_not_never(
    broker: EmbeddedBroker, process_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(broker_client, "CALL_DEADLINE", DEADLINE)

    async def main() -> None:
        client = BrokerClient(broker.address)
        try:
            await client.create_topic("t", 1)
            queue = MessageQueue("t", "", 0)
            assert await client.query_offset("g", queue) is None  # connected, answered
            process_proxy.partition("both")
            with pytest.raises(RequestTimeoutError) as timed_out:
                async with asyncio.timeout(DEADLINE + 9):  # without the deadline: it hangs
                    await client.query_offset("g", queue)
            # The call's own deadline ended it, not the guard above.
            assert f"no answer from the broker at {broker.address} within 1s" in str(
                timed_out.value
            )
            process_proxy.heal()
            assert await client.query_offset("g", queue) is None, "answered again once healed"
        finally:
            await client.close()

    asyncio.run(main())
    assert process_proxy.stats().connections >= 1, "the client went through the proxy"
