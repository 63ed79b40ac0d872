"""An asyncio service: async producer, async orderly listener, async poll loop.

What it shows: `sdk.aio` clients on your own event loop. An `async def consume_message`
runs on the loop (no threads), so it can await other I/O; order per key still holds.
`sdk.aio.LitePullConsumer` supports `async for message in consumer`.

Run it:  python examples/asyncio_consumer.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import sdk.aio
from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
)


class AsyncDevices(MessageListenerOrderly):
    """Per device, readings arrive in order; the listener awaits (pretend) I/O."""

    def __init__(self) -> None:
        self.readings: dict[str, list[int]] = defaultdict(list)

    async def consume_message(  # type: ignore[override]
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        await asyncio.sleep(0)  # e.g. write to a database
        for m in msgs:
            self.readings[m.sharding_key or "?"].append(int(m.body))
        return ConsumeOrderlyStatus.SUCCESS


async def run(address: str) -> bool:
    async with sdk.aio.Producer(address) as producer:
        await producer.send_batch([Message("telemetry", b"%d" % i, sharding_key=f"dev-{i % 5}")
                                   for i in range(200)])  # fmt: skip
    listener = AsyncDevices()
    consumer = sdk.aio.PushConsumer("dashboard", address,
                                    consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    consumer.subscribe("telemetry")
    consumer.register_message_listener(listener)
    async with consumer:
        for _ in range(500):
            if sum(len(v) for v in listener.readings.values()) >= 200:
                break
            await asyncio.sleep(0.01)
    in_order = all(v == sorted(v) for v in listener.readings.values())
    print(f"push: {sum(len(v) for v in listener.readings.values())} readings, "
          f"in order per device: {in_order}")  # fmt: skip

    first = ConsumeFromWhere.FIRST_OFFSET
    archive = sdk.aio.LitePullConsumer("archiver", address, consume_from_where=first)
    archive.subscribe("telemetry")
    archived = 0
    async with archive:
        async for _message in archive:
            archived += 1
            if archived == 200:
                break
    print(f"poll loop: archived {archived} readings")
    return in_order and archived == 200


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-asyncio-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp))) as broker,
    ):
        ok = asyncio.run(run(broker.address))
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
