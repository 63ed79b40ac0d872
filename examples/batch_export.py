"""A batch job with LitePullConsumer: drain a topic's backlog in a poll loop.

What it shows: the pull-style API for jobs that run, consume what is there, and stop.
The job polls, "exports" each batch (here: appends lines to a file), and commits after
every batch, so a job that crashes half-way resumes where it stopped instead of
re-exporting everything. A progress bar shows how far the backlog is drained.

Run it:  python examples/batch_export.py --messages 20000
It starts an embedded broker with a backlog of orders, runs the export once, then runs it
again to show that a second run finds nothing left to export.
Exit status 0 when every message was exported exactly once.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import ConsumeFromWhere, LitePullConsumer, Message, Producer

TOPIC = "orders"
GROUP = "nightly-export"


def fill_backlog(address: str, n: int) -> None:
    with Producer(address) as producer:
        for start in range(0, n, 1000):
            producer.send_batch(
                [
                    Message(TOPIC, f"order-{i % 500}:{i}".encode(), sharding_key=f"order-{i % 500}")
                    for i in range(start, min(start + 1000, n))
                ]
            )


def bar(done: int, total: int, width: int = 40) -> str:
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>7}/{total}"


def export(address: str, out: Path, expected: int) -> int:
    """One run of the job; returns how many messages it exported."""
    consumer = LitePullConsumer(
        GROUP, address, auto_commit=False, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    consumer.subscribe(TOPIC)
    exported = 0
    started = time.perf_counter()
    with consumer, out.open("a") as sink:
        while batch := consumer.poll(timeout=1.0):
            sink.writelines(m.body.decode() + "\n" for m in batch)
            sink.flush()
            consumer.commit()  # after the batch is safely exported
            exported += len(batch)
            print("\r" + bar(exported, expected), end="", flush=True)
    seconds = time.perf_counter() - started
    print(f"\rexported {exported} messages in {seconds:.2f}s".ljust(70))
    return exported


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-export-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp) / "broker")) as broker,
    ):
        fill_backlog(broker.address, args.messages)
        out = Path(tmp) / "export.txt"
        first = export(broker.address, out, args.messages)
        second = export(broker.address, out, 0)
        lines = out.read_text().splitlines()
    ok = first == args.messages and second == 0 and len(set(lines)) == len(lines) == first
    print(f"first run: {first}, second run: {second}, distinct lines: {len(set(lines))}")
    print("result:", "OK, every message exported once" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
