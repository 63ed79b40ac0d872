"""Broadcasting: every member of a group receives every message.

What it shows: with MessageModel.BROADCASTING each member consumes all queues (no
sharing, no locks), and keeps its own offsets in a local file, so a restarted member
continues where it stopped. Use it for cache invalidation, configuration pushes and the
like; ordering per key still holds within each member.

Run it:  python examples/broadcasting.py
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    MessageModel,
    Producer,
    PushConsumer,
)


class Cache(MessageListenerOrderly):
    def __init__(self, name: str) -> None:
        self.name = name
        self.invalidated: list[str] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.invalidated += [m.body.decode() for m in msgs]
        return ConsumeOrderlyStatus.SUCCESS


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-broadcast-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp) / "broker")) as broker,
        Producer(broker.address) as producer,
    ):
        producer.fetch_publish_message_queues("cache-invalidation")
        caches = [Cache(f"web-{i}") for i in range(3)]
        members = []
        for cache in caches:
            member = PushConsumer(
                "web-caches", broker.address, message_model=MessageModel.BROADCASTING,
                consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                offset_dir=Path(tmp) / "offsets" / cache.name,
            )  # fmt: skip
            member.subscribe("cache-invalidation")
            member.register_message_listener(cache)
            member.start()
            members.append(member)
        keys = [f"user:{i}" for i in range(50)]
        producer.send_batch([Message("cache-invalidation", k.encode(), sharding_key=k)
                             for k in keys])  # fmt: skip
        deadline = time.monotonic() + 15
        while any(len(c.invalidated) < len(keys) for c in caches) and time.monotonic() < deadline:
            time.sleep(0.05)
        for member in members:
            member.shutdown()
    for cache in caches:
        print(f"{cache.name} invalidated {len(cache.invalidated)} keys")
    ok = all(sorted(c.invalidated) == sorted(keys) for c in caches)
    print("result:", "OK, every member got every message" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
