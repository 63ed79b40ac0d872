"""A flooding client for the `flood` figures: one process sending or pulling flat out.

    python bench/flooder.py --address HOST:PORT --mode send --topic T --stats FILE
    python bench/flooder.py --address HOST:PORT --mode pull --topic T --stats FILE

It runs in a process of its own (so that its client-side work does not compete with the
normal clients' event loop) and does as little client work as it can, so that the broker,
not the flooder, is the bottleneck:

- send: pre-encoded requests of `--batch` 100-byte messages, one per queue of the topic,
  sent again and again by `--in-flight` workers on one BrokerClient (one connection, one
  Exchange stream), each sending its next request as soon as the previous one returned;
- pull: `--in-flight` workers per queue read the topic's backlog with raw Exchange pulls
  (`--pull-messages` / `--pull-bytes` per pull, nothing decoded), from offset 0 to the end
  and over again.

It runs at a lower CPU priority (nice 10): on a machine with as few cores as this
benchmark's, a flooder on a machine of its own is modelled by leaving the cores to the
broker and the normal clients whenever they want them (its rate is reported).

A request the broker refuses as busy (RESOURCE_EXHAUSTED, sdk.BrokerBusyError) is counted
and retried after the SDK producer's back-off (50 ms doubling to 2 s); any other error
ends the flooder. It prints "flooder ready" once its first answer arrived, floods until
SIGTERM or SIGINT, then writes what it did as JSON to `--stats` and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from workloads import BODY_BYTES, PULL_GROUP, QUEUES, make_bodies

from sdk import Message
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.broker_client import BrokerClient
from sdk._transport.codec import MessageIdGenerator, encode_message
from sdk._wire import MAX_PULL_BYTES, MAX_PULL_MESSAGES
from sdk.errors import BrokerBusyError

#: The SDK producer's default retry back-off (ProducerConfig.retry_backoff, _max).
BACKOFF, BACKOFF_MAX = 0.05, 2.0
REQUEST_TIMEOUT = 60.0
NICE = 10


class Flood:
    """What the workers share: counters, the stop signal and the first-answer signal."""

    def __init__(self) -> None:
        self.stop = asyncio.Event()
        self.first_answer = asyncio.Event()
        self.requests = 0
        self.messages = 0
        self.bytes = 0
        self.refused = 0
        self.pull_statuses: collections.Counter[str] = collections.Counter()
        self.started = time.perf_counter()

    def answered(self, messages: int, size: int) -> None:
        self.requests += 1
        self.messages += messages
        self.bytes += size
        self.first_answer.set()

    async def refused_wait(self, backoff: float) -> float:
        """Count a refusal; wait `backoff` (or until stopped); the next back-off."""
        self.refused += 1
        self.first_answer.set()  # the broker is answering: the flood is under way
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), backoff)
        return min(backoff * 2, BACKOFF_MAX)

    def stats(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self.started
        return {
            "seconds": round(seconds, 3),
            "requests": self.requests,
            "messages": self.messages,
            "bytes": self.bytes,
            "refused": self.refused,
            "messages_per_second": round(self.messages / seconds, 1) if seconds else 0.0,
            "pull_statuses": dict(self.pull_statuses),
        }


def send_requests(topic: str, batch: int) -> list[tuple[int, bytes]]:
    """One pre-encoded request of `batch` messages per queue: (queue id, frames)."""
    ids = MessageIdGenerator()
    bodies = make_bodies(batch, seed=3)
    now = time.time()
    return [
        (q, b"".join(encode_message(Message(topic, body), ids.next(), now) for body in bodies))
        for q in range(QUEUES)
    ]


async def send_worker(
    flood: Flood, client: BrokerClient, topic: str, requests: list[tuple[int, bytes]], n: int
) -> None:
    backoff = BACKOFF
    i = n
    while not flood.stop.is_set():
        queue_id, frames = requests[i % len(requests)]
        try:
            appended = await client.send(topic, queue_id, frames, timeout=REQUEST_TIMEOUT)
        except BrokerBusyError:
            backoff = await flood.refused_wait(backoff)
            continue
        backoff = BACKOFF
        flood.answered(appended.count, len(frames))
        i += 1


async def pull_worker(
    flood: Flood, client: BrokerClient, topic: str, queue_id: int, args: argparse.Namespace
) -> None:
    """Read the queue from 0 to its end and over again, raw (no decoding)."""
    exchange = client._exchange  # raw answers: decoding would make the client the bottleneck
    offset = 0
    backoff = BACKOFF
    while not flood.stop.is_set():
        request = pb.ExchangeRequest(
            pull=pb.PullRequest(
                group=PULL_GROUP,
                topic=topic,
                queue_id=queue_id,
                offset=offset,
                max_messages=args.pull_messages,
                max_bytes=args.pull_bytes,
                tag_expression="*",
            )
        )
        try:
            answer = (await exchange.call(request, REQUEST_TIMEOUT)).pull
        except BrokerBusyError:
            backoff = await flood.refused_wait(backoff)
            continue
        backoff = BACKOFF
        flood.answered(answer.record_count, len(answer.records))
        flood.pull_statuses[pb.PullStatus.Name(answer.status)] += 1
        offset = next_pull_offset(answer)


def next_pull_offset(answer: pb.PullResponse) -> int:
    """Where a pull worker reads next: on from `answer`, and back to the oldest message
    still stored at the end or when the answer did not find its offset. (Offset 0 is not
    that once retention deleted the backlog's start, as it may while a send flood fills
    the disk: every pull then asked for an offset no longer stored and read nothing.)"""
    moved_on = answer.status in (pb.FOUND, pb.NO_MATCHED_MESSAGE)
    if moved_on and answer.next_offset < answer.max_offset:
        return answer.next_offset
    return answer.min_offset


async def flood(args: argparse.Namespace) -> dict[str, Any]:
    state = Flood()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, state.stop.set)
    client = BrokerClient(args.address)
    try:
        if args.mode == "send":
            await client.create_topic(args.topic, QUEUES)
            requests = send_requests(args.topic, args.batch)
            workers = [
                send_worker(state, client, args.topic, requests, n) for n in range(args.in_flight)
            ]
        else:
            workers = [
                pull_worker(state, client, args.topic, q, args)
                for q in range(QUEUES)
                for _ in range(args.in_flight)
            ]
        tasks = [asyncio.create_task(w) for w in workers]
        await asyncio.wait(
            [asyncio.ensure_future(state.first_answer.wait()), *tasks],
            return_when=asyncio.FIRST_COMPLETED,
        )
        for task in tasks:
            if task.done():
                task.result()  # a worker that failed before any answer: say why
        print(f"flooder ready ({args.mode})", flush=True)
        state.started = time.perf_counter()
        state.requests = state.messages = state.bytes = state.refused = 0
        await state.stop.wait()
        await asyncio.gather(*tasks)
        return state.stats()
    finally:
        await client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Flood a broker with sends or pulls.")
    p.add_argument("--address", required=True)
    p.add_argument("--mode", choices=("send", "pull"), required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--stats", type=Path, required=True, help="JSON file written at the end")
    p.add_argument("--batch", type=int, default=1000, help="messages per send request")
    p.add_argument(
        "--in-flight",
        type=int,
        default=None,
        help="send: requests in flight (default 32); pull: pulls in flight per queue (default 2)",
    )
    p.add_argument("--pull-messages", type=int, default=MAX_PULL_MESSAGES)
    p.add_argument("--pull-bytes", type=int, default=MAX_PULL_BYTES)
    a = p.parse_args(argv)
    if a.in_flight is None:
        a.in_flight = 32 if a.mode == "send" else 2
    return a


def main() -> int:
    args = parse_args()
    os.nice(NICE)
    stats = asyncio.run(flood(args))
    stats.update(mode=args.mode, batch=args.batch, in_flight=args.in_flight,
                 body_bytes=BODY_BYTES)  # fmt: skip
    args.stats.write_text(json.dumps(stats) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
