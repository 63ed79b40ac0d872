"""ordermq demo: keyed order events through an embedded broker, read back in order.

What it shows: messages with the same sharding key (an order id) land on one queue and are
read back in the order they were sent, while different orders spread over the queues.

It starts a broker in a temporary directory, sends the lifecycle events of 2 500 orders
(created -> paid -> shipped -> completed: 10 000 messages, interleaved across orders),
reads every queue back, checks per-order and per-queue order, and prints a summary.
Exit status 0 when everything is in order, 1 otherwise.

Run it:  make demo        (or: python examples/demo.py --orders 2500)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageExt, MessageQueue, Producer
from sdk._transport.broker_client import BrokerClient, PullStatus

STEPS = ("created", "paid", "shipped", "completed")
TOPIC = "order-events"


def lifecycle_events(orders: int, rng: random.Random) -> list[Message]:
    """Every order's events in order, orders interleaved at random."""
    pending = {f"order-{i:05d}": 0 for i in range(orders)}
    out: list[Message] = []
    while pending:
        order = rng.choice(list(pending))
        step = pending[order]
        body = f"{order}:{step}:{STEPS[step]}".encode()
        out.append(Message(TOPIC, body, tags=STEPS[step], sharding_key=order))
        if step + 1 == len(STEPS):
            del pending[order]
        else:
            pending[order] = step + 1
    return out


async def read_back(
    address: str, queues: list[MessageQueue]
) -> dict[MessageQueue, list[MessageExt]]:
    """Every message of every queue, pulled from offset 0 to the end."""
    client = BrokerClient(address)
    got: dict[MessageQueue, list[MessageExt]] = {}
    try:
        for queue in queues:
            got[queue] = []
            offset = 0
            while True:
                result = await client.pull("demo-readers", queue, offset, max_messages=1000)
                if result.status is not PullStatus.FOUND:
                    break
                got[queue] += result.messages
                offset = result.next_offset
    finally:
        await client.close()
    return got


def check(got: dict[MessageQueue, list[MessageExt]]) -> tuple[int, int, Counter[str]]:
    """(order violations, offset gaps, completed orders by count)."""
    violations = gaps = 0
    next_step: dict[str, int] = defaultdict(int)
    for messages in got.values():
        for expected_offset, m in enumerate(messages):
            gaps += m.queue_offset != expected_offset
            order, step, _ = m.body.decode().split(":")
            if int(step) != next_step[order]:
                violations += 1
            next_step[order] = int(step) + 1
    return (
        violations,
        gaps,
        Counter("completed" if s == len(STEPS) else "open" for s in next_step.values()),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=2500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    events = lifecycle_events(args.orders, random.Random(args.seed))

    with tempfile.TemporaryDirectory(prefix="ordermq-demo-") as tmp:
        config = BrokerConfig(data_dir=Path(tmp), flush_mode="async")
        with EmbeddedBroker(config) as broker, Producer(broker.address) as producer:
            print(f"broker on {broker.address}, data in {tmp}")
            started = time.perf_counter()
            for i in range(0, len(events), 500):
                producer.send_batch(events[i : i + 500])
            send_seconds = time.perf_counter() - started
            queues = producer.fetch_publish_message_queues(TOPIC)
            started = time.perf_counter()
            got = asyncio.run(read_back(broker.address, queues))
            read_seconds = time.perf_counter() - started

    received = sum(len(v) for v in got.values())
    violations, gaps, states = check(got)
    print(
        f"\nsent {len(events)} events for {args.orders} orders "
        f"in {send_seconds:.2f}s ({len(events) / send_seconds:,.0f} msg/s)"
    )
    print(f"read {received} back in {read_seconds:.2f}s ({received / read_seconds:,.0f} msg/s)")
    print("\nqueue  messages  orders")
    for queue, messages in sorted(got.items()):
        orders = len({m.sharding_key for m in messages})
        print(f"{queue.queue_id:>5}  {len(messages):>8}  {orders:>6}")
    print(f"\norders completed: {states['completed']} of {args.orders}")
    print(f"order violations: {violations}")
    print(f"offset gaps:      {gaps}")
    ok = received == len(events) and violations == 0 and gaps == 0
    print("result:", "OK, every order read back in order" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
