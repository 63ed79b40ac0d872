"""A consumer process written the way the README shows it: `start()`, and nothing else.

    python tests/system/start_consumer.py --broker HOST:PORT --log FILE [--delay-ms N]
        [--exit-after N | --wait-for-signal blocking|asyncio]

An orderly PushConsumer of group "signals" on topic "signals", from the first offset. It
installs no signal handler and never calls shutdown(). Every message it processes becomes
one line "<queue id> <queue offset>" of FILE, written (unbuffered) inside the listener
before it answers SUCCESS.

Prints `ready <client id>` once started and `consumed <queue ids>` the first time it
processes a message of a queue. Then the main thread sleeps until the process is
interrupted (Ctrl+C, SIGTERM, ...), or with --exit-after N returns once N messages were
processed, leaving the consumer running.

With --wait-for-signal it is written the way PushConsumer's docstrings recommend instead:
`with consumer: wait_for_shutdown_signal()` (blocking), or `async with` an
sdk.aio.PushConsumer and `await sdk.aio.wait_for_shutdown_signal()` (asyncio); it prints
`signal <name>` when the wait returns and `stopped` once the consumer has shut down, then
exits with status 0.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import signal
import threading
import time

import sdk.aio
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageListenerOrderly,
    PushConsumer,
    PushConsumerConfig,
    wait_for_shutdown_signal,
)

TOPIC = "signals"
GROUP = "signals"


class LoggingListener(MessageListenerOrderly):
    """One line per processed message; counts them and reports each queue's first."""

    def __init__(self, path: str, delay: float) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._delay = delay
        self._lock = threading.Lock()
        self._queues: set[int] = set()
        self.count = 0
        self.enough = threading.Event()
        self.exit_after = 0

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        time.sleep(self._delay)
        text = "".join(f"{m.queue.queue_id} {m.queue_offset}\n" for m in msgs)
        with self._lock:
            os.write(self._fd, text.encode())
            new = {m.queue.queue_id for m in msgs} - self._queues
            if new:
                self._queues |= new
                print("consumed", *sorted(new), flush=True)
            self.count += len(msgs)
            if self.exit_after and self.count >= self.exit_after:
                self.enough.set()
        return ConsumeOrderlyStatus.SUCCESS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--broker", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--exit-after", type=int, default=0)
    parser.add_argument("--wait-for-signal", choices=["blocking", "asyncio"])
    args = parser.parse_args()
    # The test sends SIGUSR1 to a process that does not end in time: every thread's stack.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # Ctrl+C as a program started from a terminal has it. Started under a shell's background
    # job (a CI script's `make test &`), SIGINT comes ignored, and Python keeps it ignored:
    # the test's SIGINT would then do nothing and the process never end.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    listener = LoggingListener(args.log, args.delay_ms / 1000)
    listener.exit_after = args.exit_after
    if args.wait_for_signal == "asyncio":
        asyncio.run(until_signal_asyncio(args.broker, listener))
        return
    consumer = PushConsumer(GROUP, args.broker, consume_from_where=FROM, config=CONFIG)
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    if args.wait_for_signal == "blocking":
        with consumer:
            print("ready", consumer.client_id, flush=True)
            print("signal", wait_for_shutdown_signal().name, flush=True)
        print("stopped", flush=True)
        return
    consumer.start()
    print("ready", consumer.client_id, flush=True)
    if args.exit_after:
        listener.enough.wait()
        print("main thread ends", flush=True)
        return
    while True:
        time.sleep(1)


FROM = ConsumeFromWhere.FIRST_OFFSET
CONFIG = PushConsumerConfig(consume_message_batch_max_size=1)


async def until_signal_asyncio(broker: str, listener: LoggingListener) -> None:
    """The asyncio face: consume until Ctrl+C or SIGTERM, then shut down."""
    consumer = sdk.aio.PushConsumer(GROUP, broker, consume_from_where=FROM, config=CONFIG)
    consumer.subscribe(TOPIC)
    consumer.register_message_listener(listener)
    async with consumer:
        print("ready", consumer.client_id, flush=True)
        print("signal", (await sdk.aio.wait_for_shutdown_signal()).name, flush=True)
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
