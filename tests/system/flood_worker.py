"""A flooding client for the flood chaos test: sends, or pulls, as fast as it can.

python tests/system/flood_worker.py --broker ADDR --mode send --out FILE
    WORKERS tasks on one sdk.aio.Producer (one connection), each with a key of its own
    ("w00", "w01", ...), send_batch BATCH messages of that key again and again, the next
    as soon as the last returned; body "key:seq". On SIGTERM they finish the batches in
    flight and FILE gets {key: messages acknowledged} (seq 0 .. n-1 of each key).
python tests/system/flood_worker.py --broker ADDR --mode pull --out FILE
    One BrokerClient pulls every queue of the topic from offset 0 to its end (as it was
    at start), PULL messages at a time, every queue's next pull in flight, and checks each
    key's sequence (to the end, even past a SIGTERM); then reads it all again, and again,
    until SIGTERM. FILE gets what the first pass saw: {"seen": {key: highest seq + 1},
    "order_violations": n, "duplicates": n, "messages": n, "passes": n}.

It prints "flooding" once its first answer arrived. It runs at nice 10: a flooder on a
machine of its own is modelled by leaving the cores to the broker and the normal clients
whenever they want them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sdk import Message, MessageQueue  # noqa: E402
from sdk._transport.broker_client import BrokerClient, PullStatus  # noqa: E402
from sdk.aio import Producer  # noqa: E402

TOPIC = "flood"
QUEUES = 8
WORKERS = 16
BATCH = 1000
PULL = 10_000
PULL_BYTES = 32 * 1024 * 1024


async def send(broker: str, stop: asyncio.Event, started: asyncio.Event) -> dict[str, int]:
    acked: dict[str, int] = {}
    async with Producer(broker) as producer:

        async def worker(key: str) -> None:
            seq = 0
            while not stop.is_set():
                batch = [
                    Message(TOPIC, f"{key}:{seq + i}".encode(), sharding_key=key)
                    for i in range(BATCH)
                ]
                await producer.send_batch(batch)
                seq += BATCH
                acked[key] = seq
                started.set()

        await asyncio.gather(*(worker(f"w{w:02d}") for w in range(WORKERS)))
    return acked


async def pull(broker: str, stop: asyncio.Event, started: asyncio.Event) -> dict[str, object]:
    client = BrokerClient(broker)
    seen: dict[str, int] = {}
    violations = duplicates = messages = passes = 0
    try:
        queues = [MessageQueue(TOPIC, "broker-a", q) for q in range(QUEUES)]
        ends = [(await client.queue_offsets(q))[1] for q in queues]

        async def read(queue: MessageQueue, end: int, check: bool) -> None:
            nonlocal violations, duplicates, messages
            offset = 0
            # The first (checking) pass reads everything even after SIGTERM: what it did
            # not read would count as lost.
            while offset < end and not (stop.is_set() and not check):
                r = await client.pull(
                    "flood-reader", queue, offset, max_messages=PULL, max_bytes=PULL_BYTES,
                    timeout=60,
                )  # fmt: skip
                started.set()
                if r.status is not PullStatus.FOUND:
                    raise AssertionError(f"{queue}: {r.status} at {offset} of {end}")
                for m in r.messages if check else ():
                    key, seq = m.body.decode().split(":")
                    expected = seen.get(key, 0)
                    if int(seq) == expected:
                        seen[key] = expected + 1
                    elif int(seq) < expected:
                        duplicates += 1
                    else:
                        violations += 1
                        seen[key] = int(seq) + 1
                if check:
                    messages += len(r.messages)
                offset = r.next_offset

        check = True
        while not stop.is_set():
            await asyncio.gather(*(read(q, e, check) for q, e in zip(queues, ends, strict=True)))
            passes += 1
            check = False
    finally:
        await client.close()
    return {
        "seen": seen,
        "order_violations": violations,
        "duplicates": duplicates,
        "messages": messages,
        "passes": passes,
    }


async def main(args: argparse.Namespace) -> None:
    stop, started = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    flood = send if args.mode == "send" else pull
    work: asyncio.Future[object] = asyncio.ensure_future(flood(args.broker, stop, started))
    await asyncio.wait([work, asyncio.ensure_future(started.wait())], return_when="FIRST_COMPLETED")
    print("flooding", flush=True)
    args.out.write_text(json.dumps(await work))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--mode", choices=("send", "pull"), required=True)
    parser.add_argument("--out", type=Path, required=True)
    os.nice(10)
    asyncio.run(main(parser.parse_args()))
