"""NATS JetStream: one file-backed stream with 8 subjects, one per queue; default settings.

produce: a batch's 100 messages published with publish_async (the key in a header), then
every acknowledgement awaited before the next batch.
consume: one durable pull consumer on the whole stream fetching FETCH messages at a time,
acknowledging each fetch with one ack of its last message (AckPolicy.ALL). The stream keeps
each subject's messages in order; the consumer checks each fetch's stream sequences.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import nats
import workload as wl
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from workload import QUEUES, Batch

STREAM = "ORDERS"
FETCH = 1000


def subject(q: int) -> str:
    return f"orders.{q}"


async def _connect(port: int) -> nats.NATS:
    return await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)


async def _prepare(port: int) -> None:
    nc = await _connect(port)
    try:
        js = nc.jetstream()
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await js.delete_stream(STREAM)
        await js.add_stream(name=STREAM, subjects=[subject(q) for q in range(QUEUES)])
    finally:
        await nc.close()


async def _produce(port: int, batches: list[Batch]) -> float:
    nc = await _connect(port)
    try:
        js = nc.jetstream()
        start = time.perf_counter()
        for batch in batches:
            name = subject(batch.queue)
            acks = [
                await js.publish_async(name, body, headers={"k": key})
                for key, body in zip(batch.keys, batch.bodies, strict=True)
            ]
            for ack in acks:
                await ack
        return time.perf_counter() - start
    finally:
        await nc.close()


async def _consume(port: int, expected: int) -> float:
    nc = await _connect(port)
    try:
        js = nc.jetstream()
        config = ConsumerConfig(
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=FETCH * 2,
        )
        sub = await js.pull_subscribe("orders.*", durable="reader", stream=STREAM, config=config)
        got = 0
        last_seq = 0
        start = time.perf_counter()
        while got < expected:
            msgs = await sub.fetch(min(FETCH, expected - got), timeout=10)
            # The stream holds exactly this backlog, numbered 1..expected: a fetch in order
            # starts right after the previous one and spans as many numbers as messages.
            first = msgs[0].metadata.sequence.stream
            last = msgs[-1].metadata.sequence.stream
            if first != last_seq + 1 or last - first + 1 != len(msgs):
                raise AssertionError(f"fetch of {len(msgs)} went {first}..{last} after {last_seq}")
            last_seq = last
            got += len(msgs)
            await msgs[-1].ack()
        seconds = time.perf_counter() - start
        return seconds
    finally:
        await nc.close()


def prepare(port: int) -> None:
    asyncio.run(_prepare(port))


def produce(port: int, batches: list[Batch]) -> float:
    return asyncio.run(_produce(port, batches))


def consume(port: int, expected: int) -> float:
    return asyncio.run(_consume(port, expected))


async def _latency(port: int, rate: float, seconds: float) -> dict[str, float]:
    schedule = wl.paced(rate, seconds)
    ages: list[float] = []
    nc = await _connect(port)
    try:
        js = nc.jetstream()
        config = ConsumerConfig(ack_policy=AckPolicy.ALL, deliver_policy=DeliverPolicy.NEW)
        sub = await js.pull_subscribe("orders.*", durable="lat", stream=STREAM, config=config)

        async def reader() -> None:
            while len(ages) < len(schedule):
                try:
                    msgs = await sub.fetch(100, timeout=1)
                except nats.errors.TimeoutError:
                    continue
                now = time.perf_counter()
                ages.extend(wl.age_ms(m.data, now) for m in msgs)
                await msgs[-1].ack()

        task = asyncio.create_task(reader())
        await asyncio.sleep(0.2)  # let the first pull request reach the server
        t0 = time.perf_counter()
        for at, key, q, body in schedule:
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await js.publish(subject(q), wl.stamped(body), headers={"k": key})
        await asyncio.wait_for(task, seconds + 30)
        return wl.latency_figures(ages)
    finally:
        await nc.close()


def latency(port: int, rate: float, seconds: float) -> dict[str, float]:
    """End-to-end latency of single acknowledged publishes at `rate`/s to a pull consumer."""
    return asyncio.run(_latency(port, rate, seconds))
