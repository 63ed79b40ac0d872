"""One consumer process of the orderly chaos test (tests/system/test_orderly_chaos.py).

    python tests/system/orderly_worker.py --broker HOST:PORT --log FILE --id w1

`--broker` may also be endpoints such as "rocketmq://ns1:9876;ns2:9876" (a cluster: the
topic's queues on several brokers); then `--queue-base broker-a=0 --queue-base broker-b=8`
numbers the queues across the brokers (a queue's number in the log is its broker's base
plus its queue id: its index in the topic's queues sorted by broker name and queue id).

An orderly PushConsumer of group "chaos" on topic "orderly-chaos", from the first offset.
Every message it processes becomes one line of FILE, written and fsynced inside the
listener before it answers SUCCESS, so the file holds everything this process ever
processed, even when it is killed the moment after:

    <worker id> <key> <seq> <queue id> <queue offset> <start ns> <end ns>

`start ns` is taken when the listener call begins, `end ns` when the line is written (under
the file's lock, so the lines of one file are in `end ns` order). Both come from
time.monotonic_ns(), which on Linux is one clock for every process of the machine, so the
files of several workers merge into one history.

`--delivery push` has the broker push each held queue's batches within credits
(PushConsumerConfig.delivery) instead of the consumer pulling them.

Prints `ready <client id>` once started, a line per rebalance hook call, and runs until
SIGTERM or SIGINT; then it shuts the consumer down and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable

from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageListenerOrderly,
    MessageQueue,
    ProcessingOrder,
    PushConsumer,
    PushConsumerConfig,
)

TOPIC = "orderly-chaos"
GROUP = "chaos"

#: Short client-side lease and intervals, to match a broker started with a short lease.
#: The client's lease (3 s) must be shorter than the broker's (the test uses 4 s): a paused
#: process then stops calling its listener before the broker may give its queues away,
#: as RocketMQ does with 30 s against 60 s.
CONFIG = PushConsumerConfig(
    consume_message_batch_max_size=1,
    pull_batch_size=64,
    pull_threshold_for_queue=256,
    suspend_current_queue_time=0.05,
    pull_suspend=2.0,
    pull_timeout=5.0,
    pull_error_backoff=0.5,
    rebalance_interval=2.0,
    lock_renew_interval=1.0,
    lock_lease=3.0,
    persist_interval=0.5,
    heartbeat_interval=1.0,
    shutdown_timeout=5.0,
)


class LoggingListener(MessageListenerOrderly):
    """Appends one fsynced line per processed message to the log file."""

    def __init__(
        self, worker: str, path: str, delay: float, queue_base: dict[str, int] | None = None
    ) -> None:
        self._worker = worker
        self._delay = delay
        self._queue_base = queue_base or {}
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        started = time.monotonic_ns()
        if self._delay:
            time.sleep(self._delay)  # the "work": keeps each queue busy for a moment
        records = []
        for m in msgs:
            key, seq = m.body.decode().split(":")
            queue = self._queue_base.get(m.queue.broker_name, 0) + m.queue.queue_id
            records.append((key, int(seq), queue, m.queue_offset))
        with self._lock:
            ended = time.monotonic_ns()
            text = "".join(
                f"{self._worker} {key} {seq} {queue} {offset} {started} {ended}\n"
                for key, seq, queue, offset in records
            )
            os.write(self._fd, text.encode())  # one write: a kill -9 cannot cut a line
            os.fsync(self._fd)
        return ConsumeOrderlyStatus.SUCCESS

    def close(self) -> None:
        os.close(self._fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True, help="broker address host:port")
    parser.add_argument("--log", required=True, help="file to append processed messages to")
    parser.add_argument("--id", required=True, help="this worker's name in the log lines")
    parser.add_argument("--delay-ms", type=float, default=1.0, help="work per message")
    parser.add_argument(
        "--queue-base", action="append", default=[], metavar="BROKER=N",
        help="log BROKER's queue ids plus N (repeat per broker of a cluster)",
    )  # fmt: skip
    parser.add_argument(
        "--ordering", choices=[o.value for o in ProcessingOrder], default="queue",
        help="what the listener keeps in order: the queue (default) or each key",
    )  # fmt: skip
    parser.add_argument(
        "--delivery", choices=["pull", "push"], default="pull",
        help="how messages come: pulled (default), or pushed by the broker within credits",
    )  # fmt: skip
    args = parser.parse_args(argv)
    queue_base = {name: int(n) for name, _, n in (b.partition("=") for b in args.queue_base)}
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s {args.id} %(levelname)s %(name)s %(message)s",
    )

    # Not a threading.Event: a handler's set() that lands while this thread is inside the
    # Event's wait() (holding its lock) blocks for good. SimpleQueue.put is safe there.
    stop: queue.SimpleQueue[int] = queue.SimpleQueue()
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.put(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stop.put(signum))

    def hook(what: str) -> Callable[[list[MessageQueue]], None]:
        def report(queues: list[MessageQueue]) -> None:
            ids = ",".join(str(queue_base.get(q.broker_name, 0) + q.queue_id) for q in queues)
            print(f"{time.monotonic_ns()} {what} {ids}", flush=True)

        return report

    listener = LoggingListener(args.id, args.log, args.delay_ms / 1000, queue_base)
    consumer = PushConsumer(
        GROUP,
        args.broker,
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        ordering=ProcessingOrder(args.ordering),
        config=dataclasses.replace(CONFIG, delivery=args.delivery),
        on_queues_assigned=hook("assigned"),
        on_queues_revoked=hook("revoked"),
    )
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    consumer.start()
    print(f"ready {consumer.client_id}", flush=True)
    stop.get()
    consumer.shutdown()
    listener.close()
    print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
