"""ordermq demo: order lifecycles processed strictly in order by two orderly consumers.

What it shows: every order's events (created -> paid -> shipped -> completed) share the
order id as sharding key, so they land on one queue and an orderly listener sees them in
order, while different orders are processed in parallel. Half-way through, one of the two
consumers shuts down; the other takes over its queues (rebalance) and carries on from the
committed offsets, without breaking any order's sequence.

It runs an embedded broker in a temporary directory, sends the events of 2 500 orders
(10 000 messages, orders interleaved), shows live progress, and ends with a report.
Exit status 0 when every order completed with no order violation, 1 otherwise.

Run it:  make demo        (or: python examples/demo.py --orders 2500)
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Message,
    MessageExt,
    MessageListenerOrderly,
    Producer,
    PushConsumer,
)

STEPS = ("created", "paid", "shipped", "completed")
TOPIC = "order-events"
GROUP = "order-processor"


class OrderBook:
    """The 'database' the consumers update: each order's last step, checked on the way."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.step: dict[str, int] = {}
        self.violations: list[str] = []
        self.duplicates = 0
        self.processed: Counter[str] = Counter()

    def apply(self, consumer: str, order: str, step: int) -> None:
        with self._lock:
            last = self.step.get(order, -1)
            if step <= last:
                self.duplicates += 1  # a re-delivery after a hand-over: already applied
            elif step != last + 1:
                self.violations.append(
                    f"{order}: {STEPS[step]} after {STEPS[last] if last >= 0 else 'nothing'}"
                )
            else:
                self.step[order] = step
            self.processed[consumer] += 1

    def completed(self) -> int:
        with self._lock:
            return sum(1 for s in self.step.values() if s == len(STEPS) - 1)


class OrderListener(MessageListenerOrderly):
    """Applies each event to the order book."""

    def __init__(self, name: str, book: OrderBook) -> None:
        self.name = name
        self.book = book

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        for m in msgs:
            order, step = m.body.decode().split(":")
            self.book.apply(self.name, order, int(step))
        return ConsumeOrderlyStatus.SUCCESS


def lifecycle_events(orders: int, rng: random.Random) -> list[Message]:
    """Every order's events in order, orders interleaved at random."""
    pending = {f"order-{i:05d}": 0 for i in range(orders)}
    out: list[Message] = []
    while pending:
        order = rng.choice(list(pending))
        step = pending[order]
        out.append(Message(TOPIC, f"{order}:{step}".encode(), tags=STEPS[step], sharding_key=order))
        if step + 1 == len(STEPS):
            del pending[order]
        else:
            pending[order] = step + 1
    return out


def start_consumer(
    address: str, name: str, book: OrderBook, assigned: threading.Event
) -> PushConsumer:
    consumer = PushConsumer(
        GROUP,
        address,
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        on_queues_assigned=lambda queues: assigned.set(),
    )
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(OrderListener(name, book))
    consumer.start()
    return consumer


def progress(book: OrderBook, total: int, started: float, note: str) -> None:
    done = sum(book.processed.values())
    rate = done / max(time.perf_counter() - started, 1e-9)
    line = f"processed {done:>6}/{total}  {rate:>8,.0f} msg/s  {note}"
    if sys.stdout.isatty():
        print("\r" + line.ljust(78), end="", flush=True)
    else:
        print(line, flush=True)


def send(producer: Producer, events: list[Message]) -> float:
    """Send `events` in batches of 500; the seconds it took."""
    sent_at = time.perf_counter()
    for i in range(0, len(events), 500):
        producer.send_batch(events[i : i + 500])
    return time.perf_counter() - sent_at


def wait_for(
    book: OrderBook, count: int, total: int, started: float, note: str, deadline: float
) -> None:
    """Show progress until `count` distinct events are processed (or the deadline)."""
    while sum(book.processed.values()) - book.duplicates < count and time.monotonic() < deadline:
        progress(book, total, started, note)
        time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=2500)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    events = lifecycle_events(args.orders, random.Random(args.seed))
    total = len(events)
    book = OrderBook()

    with (
        tempfile.TemporaryDirectory(prefix="ordermq-demo-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp))) as broker,
        Producer(broker.address) as producer,
    ):
        producer.fetch_publish_message_queues(TOPIC)  # create the topic
        print(f"broker on {broker.address}; two orderly consumers share {TOPIC}'s queues")
        a_ready, b_ready = threading.Event(), threading.Event()
        a = start_consumer(broker.address, "consumer-A", book, a_ready)
        b = start_consumer(broker.address, "consumer-B", book, b_ready)
        if not (a_ready.wait(30) and b_ready.wait(30)):
            print("the consumers did not get their queues")
            return 1
        print(f"sending {total} events for {args.orders} orders")
        started = time.perf_counter()
        half = total // 2
        send_seconds = send(producer, events[:half])
        note = "consumers A and B"
        deadline = time.monotonic() + 120
        # B leaves once half the events are processed; the rest is sent after, so A's
        # take-over of B's queues always happens, however fast the first half went.
        wait_for(book, half, total, started, note, deadline)
        b.shutdown()  # graceful: finishes its calls, commits, unlocks, leaves
        note = "consumer B stopped; A took over its queues"
        if not sys.stdout.isatty():
            print(note, flush=True)
        send_seconds += send(producer, events[half:])
        wait_for(book, total, total, started, note, deadline)
        consume_seconds = time.perf_counter() - started
        progress(book, total, started, note)
        if sys.stdout.isatty():
            print()
        a.shutdown()

    processed = sum(book.processed.values())
    completed = book.completed()
    print("\nreport")
    print(f"  orders completed:   {completed} of {args.orders}")
    print(f"  order violations:   {len(book.violations)}")
    print(f"  duplicates:         {book.duplicates} (re-deliveries after the hand-over)")
    print(f"  processed by A / B: {book.processed['consumer-A']} / {book.processed['consumer-B']}")
    print(f"  send throughput:    {total / send_seconds:,.0f} msg/s")
    print(f"  consume throughput: {processed / consume_seconds:,.0f} msg/s (two orderly consumers)")
    for v in book.violations[:5]:
        print("  violation:", v)
    ok = completed == args.orders and not book.violations
    print("result:", "OK, every order processed in order" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
