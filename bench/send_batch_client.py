"""The client's own CPU per message of send_batch, without a broker or a socket.

A producer core sends profile_shares' produce batches (100 keyed messages, one queue
per batch) and produce-mixed batches (keys over every queue: one request in parts) to a
transport that answers at once, so what is timed is the SDK's Python work alone:
encoding, grouping by queue, the parts, the results. Process CPU time; the least of
several rounds, the two workloads taken in turn, so that a busy machine shows less.

    PYTHONPATH=. python bench/send_batch_client.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

import workloads as wl

from sdk import Message, MessageQueue
from sdk._transport.codec import encode_message, encode_messages
from sdk._transport.protocol import Appended, SendPart
from sdk._wire import MAX_SEND_BYTES
from sdk.errors import OrderMQError
from sdk.producer.core import ProducerCore

TOPIC = "bench"
#: Messages per round of one workload.
MESSAGES = 10_000


class AnsweringTransport:
    """What a producer's send_batch uses of a Transport; every send is stored at once."""

    prepare = staticmethod(encode_message)
    prepare_many = staticmethod(encode_messages)
    max_send_bytes = MAX_SEND_BYTES

    def __init__(self) -> None:
        self._queues = [MessageQueue(TOPIC, "broker-a", q) for q in range(wl.QUEUES)]
        self._offsets = [0] * wl.QUEUES

    async def writable_queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        return self._queues

    def _append(self, queue: MessageQueue, count: int) -> Appended:
        first = self._offsets[queue.queue_id]
        self._offsets[queue.queue_id] += count
        return Appended(True, first, count)

    async def send(
        self, queue: MessageQueue, prepared: Sequence[bytes], *, timeout: float | None = None
    ) -> Appended:
        return self._append(queue, len(prepared))

    async def send_parts(
        self, parts: Sequence[SendPart], *, timeout: float | None = None
    ) -> list[Appended | OrderMQError]:
        return [self._append(queue, len(prepared)) for queue, prepared in parts]

    async def close(self) -> None:
        pass


async def one_round(mixed: bool) -> float:
    """Client CPU microseconds per message of one round of send_batch calls."""
    make = wl.make_mixed_batches if mixed else wl.make_batches
    batches = [
        [Message(TOPIC, body, sharding_key=key) for key, body in zip(b.keys, b.bodies, strict=True)]
        for b in make(MESSAGES)
    ]
    core = ProducerCore(AnsweringTransport())  # type: ignore[arg-type]  # send_batch's part
    await core.start()
    started = time.process_time()
    for batch in batches:
        await core.send_batch(batch)
    elapsed = time.process_time() - started
    await core.shutdown()
    return elapsed / MESSAGES * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15, help="rounds of each workload")
    args = ap.parse_args()
    best = {"produce": float("inf"), "produce-mixed": float("inf")}
    for _ in range(args.rounds):
        for name in best:
            best[name] = min(best[name], asyncio.run(one_round(name == "produce-mixed")))
    for name, us in best.items():
        print(f"{name}: client CPU {us:.2f} us/msg (least of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
