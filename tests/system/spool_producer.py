"""A producer process for the spool crash test.

python tests/system/spool_producer.py --broker ADDR --spool DIR --count N
    sends N keyed messages through the spool, prints "spooled N", then waits to be
    killed (it never shuts down by itself, so nothing is drained on the way out);
python tests/system/spool_producer.py --broker ADDR --spool DIR --count 0 --drain
    starts on the same spool, waits until it is delivered, prints "drained", exits.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sdk import Message, Producer, ProducerConfig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--spool", type=Path, required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--drain", action="store_true")
    args = parser.parse_args()
    producer = Producer(args.broker, config=ProducerConfig(spool_dir=args.spool, retry_times=0))
    producer.start()
    for i in range(args.count):
        producer.send(
            Message("spooled", f"k{i % 11}:{i // 11}".encode(), sharding_key=f"k{i % 11}")
        )
    print(f"spooled {args.count}", flush=True)
    if args.drain:
        producer.flush(timeout=60)
        producer.shutdown()
        print("drained", flush=True)
        return
    threading.Event().wait()  # until kill -9


if __name__ == "__main__":
    main()
