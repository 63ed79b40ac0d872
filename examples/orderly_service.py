"""An orderly push consumer inside a long-running service, with graceful shutdown.

What it shows: the shape of a real consumer service. It consumes account events in
order per account, runs until SIGINT (Ctrl+C) or SIGTERM, and then shuts down
gracefully: listener calls in flight finish, offsets are committed, the broker locks
are released and the member leaves its group, so another instance takes over at once.

Run it:  python examples/orderly_service.py            (Ctrl+C to stop)
By default it starts an embedded broker and a small producer thread so there is
something to consume; --broker HOST:PORT uses an existing broker instead.
"""

from __future__ import annotations

import argparse
import queue
import signal
import tempfile
import threading
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

TOPIC = "account-events"


class Balances(MessageListenerOrderly):
    """Applies deposits and withdrawals per account, in order."""

    def __init__(self) -> None:
        self.balance: dict[str, int] = {}
        self.applied = 0

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        for m in msgs:
            account = m.sharding_key or "?"
            self.balance[account] = self.balance.get(account, 0) + int(m.body)
            self.applied += 1
        return ConsumeOrderlyStatus.SUCCESS


def feed(address: str, stop: threading.Event) -> None:
    """Send a few hundred account events per second until told to stop."""
    with Producer(address) as producer:
        i = 0
        while not stop.wait(0.01):
            batch = [
                Message(TOPIC, str((i + n) % 7 - 3).encode(), sharding_key=f"acct-{(i + n) % 20}")
                for n in range(5)
            ]
            producer.send_batch(batch)
            i += 5


def serve(address: str) -> int:
    # A signal handler runs in the main thread between any two of its steps, so it may
    # only do what is safe at any of them: SimpleQueue.put is. (Event.set is not: it
    # takes the lock the main thread holds inside Event.wait, and the service would hang.)
    signals: queue.SimpleQueue[int] = queue.SimpleQueue()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: signals.put(signum))
    stop = threading.Event()
    listener = Balances()
    consumer = PushConsumer("balances", address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET)
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    consumer.start()
    print(f"consuming {TOPIC} as {consumer.client_id}; Ctrl+C to stop", flush=True)
    feeder = threading.Thread(target=feed, args=(address, stop), daemon=True)
    feeder.start()
    signals.get()
    stop.set()
    print("stopping: finishing in-flight work, committing offsets, releasing locks", flush=True)
    feeder.join()
    consumer.shutdown()
    print(f"stopped cleanly after applying {listener.applied} events "
          f"to {len(listener.balance)} accounts", flush=True)  # fmt: skip
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", help="HOST:PORT of a running broker (default: embedded)")
    args = parser.parse_args()
    if args.broker:
        return serve(args.broker)
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-service-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp))) as broker,
    ):
        with Producer(broker.address) as producer:
            producer.fetch_publish_message_queues(TOPIC)  # create the topic
        return serve(broker.address)


if __name__ == "__main__":
    raise SystemExit(main())
