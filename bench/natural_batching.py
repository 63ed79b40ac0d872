"""Quick probe: single send() from 8 concurrent callers, with and without natural batching.

Runs a broker process (bench/procs.py) per figure, then 8 asyncio tasks on one
sdk.aio.Producer and 8 threads on one blocking sdk.Producer, each sending keyed messages
one after another. Prints messages a second and Send requests the broker answered.

    .venv/bin/python bench/natural_batching.py [--messages 4000] [--callers 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.procs import broker_process
from sdk import AccumulatorConfig, Message, Producer, ProducerConfig
from sdk.aio import Producer as AsyncProducer

TOPIC = "natural"
CONFIGS: dict[str, AccumulatorConfig | None] = {
    "off": None,
    "natural, 1 in flight": AccumulatorConfig(linger=0, max_requests_in_flight=1),
    "natural, 2 in flight": AccumulatorConfig(linger=0, max_requests_in_flight=2),
    "natural, 4 in flight": AccumulatorConfig(linger=0, max_requests_in_flight=4),
}


def messages(caller: int, count: int) -> list[Message]:
    """One caller's keyed messages (a few keys of its own)."""
    return [Message(TOPIC, b"x" * 200, sharding_key=f"c{caller}-k{n % 4}") for n in range(count)]


async def tasks_rate(address: str, config: ProducerConfig, callers: int, each: int) -> float:
    """Messages a second from `callers` asyncio tasks sharing one producer."""
    async with AsyncProducer(address, config=config) as producer:
        await producer.send(Message(TOPIC, b"warm-up"))

        async def caller(n: int) -> None:
            for m in messages(n, each):
                await producer.send(m)

        started = time.perf_counter()
        await asyncio.gather(*(caller(n) for n in range(callers)))
        return callers * each / (time.perf_counter() - started)


def threads_rate(address: str, config: ProducerConfig, callers: int, each: int) -> float:
    """Messages a second from `callers` threads sharing one blocking producer."""
    with Producer(address, config=config) as producer:
        producer.send(Message(TOPIC, b"warm-up"))

        def caller(n: int) -> None:
            for m in messages(n, each):
                producer.send(m)

        threads = [threading.Thread(target=caller, args=(n,)) for n in range(callers)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return callers * each / (time.perf_counter() - started)


def main() -> None:
    """Print one line per configuration and face."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=4000, help="per face, all callers")
    parser.add_argument("--callers", type=int, default=8)
    args = parser.parse_args()
    each = args.messages // args.callers
    for name, accumulator in CONFIGS.items():
        config = ProducerConfig(accumulator=accumulator)
        for face in ("tasks", "threads"):
            with (
                tempfile.TemporaryDirectory() as data,
                broker_process(Path(data), "async") as broker,
            ):
                if face == "tasks":
                    rate = asyncio.run(tasks_rate(broker.address, config, args.callers, each))
                else:
                    rate = threads_rate(broker.address, config, args.callers, each)
                cpu = broker.cpu_seconds()
            print(f"{name:24} {face:8} {rate:8.0f} msg/s  broker cpu {cpu or 0:.2f} s", flush=True)


if __name__ == "__main__":
    main()
