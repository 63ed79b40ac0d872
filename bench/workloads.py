"""The workloads bench/run.py times: produce, pull, the bare-gRPC floor and micro figures.

Each workload is a coroutine that does a fixed amount of work and returns how many units
(messages or payloads) it handled; run.py times it. Inputs (bodies, keys, which keys go to
which queue, frames for the backlog) are built beforehand, outside the timed part; what a
user's code would do per message (building `Message` objects, the SDK's send and pull
calls, decoding) is inside it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from sdk import Credentials, Message, MessageExt, MessageQueue, TLSConfig, shard_index
from sdk import Producer as BlockingProducer
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._transport.broker_client import BrokerClient, PullStatus
from sdk._transport.codec import MessageIdGenerator, decode_records, encode_message
from sdk._wire import GRPC_CHANNEL_OPTIONS, RECORD
from sdk.aio import Producer

BODY_BYTES = 100
BATCH = 100
KEYS = 1000
#: Concurrent callers of the keyed workload's single sends (issue 35).
CALLERS = 8
QUEUES = 8
PULL_MAX_MESSAGES = 1000
PULL_MAX_BYTES = 4 * 1024 * 1024
PULL_GROUP = "bench-readers"


# ---------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Batch:
    """One send_batch call's input: `len(keys)` messages whose keys all map to `queue_id`
    (-1: keys of every queue, as arrival order gives them)."""

    queue_id: int
    keys: list[str]
    bodies: list[bytes]


def make_keys(count: int = KEYS) -> list[str]:
    """The sharding keys: 'key-0000', 'key-0001', ..."""
    return [f"key-{i:04d}" for i in range(count)]


def keys_by_queue(keys: list[str], queues: int = QUEUES) -> list[list[str]]:
    """Keys grouped by the queue the sharding formula sends them to."""
    out: list[list[str]] = [[] for _ in range(queues)]
    for key in keys:
        out[shard_index(key, queues)].append(key)
    return out


def make_bodies(count: int, seed: int = 1) -> list[bytes]:
    """`count` distinct random bodies of BODY_BYTES bytes."""
    rng = random.Random(seed)
    return [rng.randbytes(BODY_BYTES) for _ in range(count)]


def make_batches(messages: int, batch: int = BATCH, seed: int = 1) -> list[Batch]:
    """Batches for `messages` messages: batch i goes to queue i % QUEUES (the last one
    smaller when `messages` is not a multiple of `batch`).

    Keys are taken round robin from that queue's keys, so each key's messages are spread
    over the run; bodies come from a pool of KEYS distinct bodies.
    """
    return list(iter_batches(messages, batch, seed))


def iter_batches(messages: int, batch: int = BATCH, seed: int = 1) -> Iterator[Batch]:
    """make_batches one at a time, for backlogs too large to hold as a list."""
    by_queue = keys_by_queue(make_keys())
    bodies = make_bodies(KEYS, seed)
    cursors = [0] * QUEUES
    body_at = 0
    sizes = [batch] * (messages // batch) + ([messages % batch] if messages % batch else [])
    for i, size in enumerate(sizes or [batch]):
        q = i % QUEUES
        keys = by_queue[q]
        picked = [keys[(cursors[q] + j) % len(keys)] for j in range(size)]
        cursors[q] += size
        yield Batch(q, picked, [bodies[(body_at + j) % KEYS] for j in range(size)])
        body_at += size


def make_mixed_batches(messages: int, batch: int = BATCH, seed: int = 1) -> list[Batch]:
    """Batches in arrival order: message i has key i % KEYS, so each batch of 100 spans
    every queue (queue_id -1), as a service batching what it was sent would have it."""
    keys = make_keys()
    bodies = make_bodies(KEYS, seed)
    return [
        Batch(
            -1,
            [keys[(start + j) % KEYS] for j in range(min(batch, messages - start))],
            [bodies[(start + j) % KEYS] for j in range(min(batch, messages - start))],
        )
        for start in range(0, max(messages, 1), batch)
    ]


def queues_of(topic: str, broker_name: str = "broker-a") -> list[MessageQueue]:
    """The QUEUES queues of `topic`."""
    return [MessageQueue(topic, broker_name, q) for q in range(QUEUES)]


# ---------------------------------------------------------------------- produce
async def produce(producer: Producer, topic: str, batches: list[Batch], in_flight: int) -> int:
    """Send every batch with Producer.send_batch, `in_flight` batches at a time.

    Each of `in_flight` workers takes the next batch, builds its Message objects, sends
    them and waits for the results before taking another.
    """
    todo: Iterator[Batch] = iter(batches)
    sent = 0

    async def worker() -> None:
        nonlocal sent
        for batch in todo:  # shared: each batch is taken by exactly one worker
            messages = [
                Message(topic, body, sharding_key=key)
                for key, body in zip(batch.keys, batch.bodies, strict=True)
            ]
            results = await producer.send_batch(messages)
            if len(results) != len(messages) or (
                batch.queue_id >= 0 and results[-1].queue.queue_id != batch.queue_id
            ):
                raise AssertionError(f"batch for queue {batch.queue_id} went elsewhere")
            sent += len(results)

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return sent


@dataclass(frozen=True)
class Singles:
    """Inputs of single-message sends: message i has key keys[i % KEYS], body bodies[i % KEYS]."""

    count: int
    keys: list[str]
    bodies: list[bytes]


def make_singles(count: int, seed: int = 1) -> Singles:
    """`count` single sends whose keys go round robin over the KEYS keys (all QUEUES queues)."""
    return Singles(count, make_keys(), make_bodies(KEYS, seed))


async def send_singles(producer: Producer, topic: str, singles: Singles, in_flight: int) -> int:
    """Send every message with its own `await producer.send(message)`.

    in_flight 1: one after another, the next built and sent when the previous returned.
    Otherwise each send runs in a task of its own (as `sdk.Producer.send_async` submits
    one per call), at most `in_flight` outstanding: the sender waits for a free slot
    (a semaphore) before building and starting the next. Keys go round robin over KEYS
    keys, so with in_flight <= KEYS two sends of one key never overlap.
    """
    keys, bodies = singles.keys, singles.bodies
    n = len(keys)
    if in_flight == 1:
        for i in range(singles.count):
            await producer.send(Message(topic, bodies[i % n], sharding_key=keys[i % n]))
        return singles.count
    slots = asyncio.Semaphore(in_flight)
    tasks: set[asyncio.Task[object]] = set()
    errors: list[BaseException] = []
    sent = 0

    def finished(task: asyncio.Task[object]) -> None:
        nonlocal sent
        tasks.discard(task)
        slots.release()
        if task.cancelled() or task.exception() is not None:
            errors.append(task.exception() or asyncio.CancelledError())
        else:
            sent += 1

    loop = asyncio.get_running_loop()
    for i in range(singles.count):
        await slots.acquire()
        if errors:
            break
        message = Message(topic, bodies[i % n], sharding_key=keys[i % n])
        task: asyncio.Task[object] = loop.create_task(producer.send(message))
        tasks.add(task)
        task.add_done_callback(finished)
    if tasks:
        await asyncio.wait(set(tasks))
    if errors:
        raise errors[0]
    return sent


async def send_from_callers(
    producer: Producer, topic: str, singles: Singles, callers: int = CALLERS
) -> int:
    """Send every message with its own `await producer.send(message)` from `callers` tasks.

    Message i (key i % KEYS, arrival order) belongs to caller i % `callers`, which sends
    its messages one after another: a web service's handlers, each calling `send()` per
    event. With `callers` dividing KEYS each key has one caller, so per-key order is that
    caller's order. Concurrency comes only from the callers (no task per send).
    """
    keys, bodies = singles.keys, singles.bodies
    n = len(keys)
    sent = 0

    async def caller(first: int) -> None:
        nonlocal sent
        for i in range(first, singles.count, callers):
            await producer.send(Message(topic, bodies[i % n], sharding_key=keys[i % n]))
            sent += 1

    await asyncio.gather(*(caller(c) for c in range(callers)))
    return sent


def send_from_threads(
    producer: BlockingProducer, topic: str, singles: Singles, callers: int = CALLERS
) -> int:
    """`send_from_callers` from `callers` threads calling the blocking `Producer.send`.

    The shape of a threaded web service (a WSGI server's worker threads), each handler
    calling `send()` per event and waiting for it.
    """
    keys, bodies = singles.keys, singles.bodies
    n = len(keys)

    def caller(first: int) -> int:
        sent = 0
        for i in range(first, singles.count, callers):
            producer.send(Message(topic, bodies[i % n], sharding_key=keys[i % n]))
            sent += 1
        return sent

    with concurrent.futures.ThreadPoolExecutor(callers) as threads:
        return sum(threads.map(caller, range(callers)))


# ---------------------------------------------------------------------- pull
async def fill_backlog(
    address: str,
    topic: str,
    messages: int,
    in_flight: int = 4,
    tls: TLSConfig | None = None,
    credentials: Credentials | None = None,
    batch: int = 1000,
) -> int:
    """Store `messages` keyed messages evenly over the topic's QUEUES queues (untimed).

    `tls`: how to reach a broker serving TLS (None: plain text); `credentials`: an account
    that may create the topic and send to it, for a broker with an ACL. Each request
    carries `batch` messages of one queue, the queues taking turns (so a backlog smaller
    than QUEUES batches leaves queues empty)."""
    client = BrokerClient(address, tls, credentials)
    try:
        await client.create_topic(topic, QUEUES)
        ids = MessageIdGenerator()
        now = time.time()
        # Built as the workers take them: a 10-million-message backlog would not fit.
        todo = (
            (
                part.queue_id,
                b"".join(
                    encode_message(Message(topic, body, sharding_key=key), ids.next(), now)
                    for key, body in zip(part.keys, part.bodies, strict=True)
                ),
            )
            for part in iter_batches(messages, batch=batch, seed=2)
        )
        stored = 0

        async def worker() -> None:
            nonlocal stored
            for queue_id, frames in todo:
                appended = await client.send(topic, queue_id, frames, timeout=60)
                stored += appended.count

        await asyncio.gather(*(worker() for _ in range(in_flight)))
        return stored
    finally:
        await client.close()


def _consume(offset: int, messages: list[MessageExt]) -> int:
    """What the benchmark's "consumer" does with a pull: check where it starts, count."""
    if messages[0].queue_offset != offset:
        raise AssertionError(f"a pull from offset {offset} started elsewhere")
    return len(messages)


async def pull_sequential(client: BrokerClient, queues: list[MessageQueue]) -> int:
    """Read every queue from offset 0 to its end, one queue and one pull at a time."""
    total = 0
    for queue in queues:
        offset = 0
        while True:
            r = await client.pull(
                PULL_GROUP, queue, offset, max_messages=PULL_MAX_MESSAGES, max_bytes=PULL_MAX_BYTES
            )
            if r.status is not PullStatus.FOUND:
                break
            total += _consume(offset, r.messages)
            offset = r.next_offset
            if offset >= r.max_offset:
                break
    return total


async def pull_prefetch(client: BrokerClient, queues: list[MessageQueue]) -> int:
    """Read every queue to its end, all queues at once, each with its next pull in flight.

    As a push consumer does: per queue, as soon as a pull's answer arrives the next pull
    is sent, and only then is the answer handed on. With QUEUES queues that keeps up to
    QUEUES pulls in flight on one channel.
    """

    async def one(queue: MessageQueue) -> int:
        n = 0
        offset = 0
        pending = asyncio.ensure_future(
            client.pull(
                PULL_GROUP, queue, 0, max_messages=PULL_MAX_MESSAGES, max_bytes=PULL_MAX_BYTES
            )
        )
        while True:
            r = await pending
            if r.status is not PullStatus.FOUND:
                return n
            last = r.next_offset >= r.max_offset
            if not last:
                pending = asyncio.ensure_future(
                    client.pull(
                        PULL_GROUP,
                        queue,
                        r.next_offset,
                        max_messages=PULL_MAX_MESSAGES,
                        max_bytes=PULL_MAX_BYTES,
                    )
                )
            n += _consume(offset, r.messages)
            offset = r.next_offset
            if last:
                return n

    return sum(await asyncio.gather(*(one(q) for q in queues)))


async def raw_pull(address: str, queue: MessageQueue) -> pb.PullResponse:
    """One full-size pull as protobuf (for the floor's reply size and the decode figure)."""
    async with grpc.aio.insecure_channel(address, options=GRPC_CHANNEL_OPTIONS) as channel:
        stub = pb_grpc.MessagingServiceStub(channel)
        request = pb.PullRequest(
            group=PULL_GROUP,
            topic=queue.topic,
            queue_id=queue.queue_id,
            offset=0,
            max_messages=PULL_MAX_MESSAGES,
            max_bytes=PULL_MAX_BYTES,
            tag_expression="*",
        )
        response: pb.PullResponse = await stub.Pull(request, timeout=30)
        return response


# ---------------------------------------------------------------------- floor
def send_payload(topic: str = "bench-floor") -> bytes:
    """The serialized bytes of a real SendRequest of BATCH messages, as the SDK builds it."""
    ids = MessageIdGenerator()
    now = time.time()
    batch = make_batches(BATCH)[0]
    frames = b"".join(
        encode_message(Message(topic, body, sharding_key=key), ids.next(), now)
        for key, body in zip(batch.keys, batch.bodies, strict=True)
    )
    return pb.SendRequest(topic=topic, queue_id=batch.queue_id, frames=frames).SerializeToString()


def pull_response_bytes(topic: str = "bench-pull", messages: int = PULL_MAX_MESSAGES) -> int:
    """About the serialized size of a PullResponse carrying `messages` stored records.

    Used when no broker answered a real pull: a record is the frame without its length
    prefix, plus the record header and the topic.
    """
    message = Message(topic, bytes(BODY_BYTES), sharding_key="key-0000")
    frame = encode_message(message, bytes(16), 0)
    records = messages * (len(frame) - 4 + RECORD.size + len(topic))
    return pb.PullResponse(records=bytes(records), record_count=messages).ByteSize() + 16


async def floor_calls(
    channel: grpc.aio.Channel, method: str, request: bytes, calls: int, in_flight: int
) -> int:
    """Make `calls` raw-bytes unary calls, `in_flight` at a time; returns the calls made."""
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    todo = iter(range(calls))
    made = 0

    async def worker() -> None:
        nonlocal made
        for _ in todo:
            await call(request, timeout=30)
            made += 1

    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return made


# ---------------------------------------------------------------------- micro
def micro_message_build(n: int) -> float:
    """Microseconds per message to build keyed 100-byte Message objects (n of them)."""
    batch = make_batches(BATCH)[0]
    keys, bodies = batch.keys, batch.bodies
    rounds = max(1, n // BATCH)
    start = time.perf_counter()
    for _ in range(rounds):
        for key, body in zip(keys, bodies, strict=True):
            Message("bench-micro", body, sharding_key=key)
    return (time.perf_counter() - start) / (rounds * BATCH) * 1e6


def micro_encode(n: int) -> float:
    """Microseconds per message to encode keyed 100-byte messages into frames."""
    batch = make_batches(BATCH)[0]
    messages = [
        Message("bench-micro", body, sharding_key=key)
        for key, body in zip(batch.keys, batch.bodies, strict=True)
    ]
    ids = MessageIdGenerator()
    rounds = max(1, n // BATCH)
    start = time.perf_counter()
    for _ in range(rounds):
        now = time.time()
        for m in messages:
            encode_message(m, ids.next(), now)
    return (time.perf_counter() - start) / (rounds * BATCH) * 1e6


def micro_decode(records: bytes, count: int, n: int) -> float:
    """Microseconds per message to decode stored records into MessageExt (CRC checked)."""
    rounds = max(1, n // count)
    start = time.perf_counter()
    for _ in range(rounds):
        decode_records(records, "broker-a")
    return (time.perf_counter() - start) / (rounds * count) * 1e6
