"""Redis Streams: 8 streams, one per queue; the key and the body are the entry's fields.

produce: a pipeline of the batch's 100 XADDs, executed and answered before the next.
produce_callers (shown beside it): the shape of ordermq's 8-caller figure, 8 asyncio tasks
of one process (redis.asyncio, a pool of 8 connections), each doing one XADD and awaiting
its reply before its next, the keys in arrival order (workload.arrivals, per_caller).
consume (the figure compared): one consumer of a consumer group reading the backlog with
XREADGROUP COUNT over all 8 streams and acknowledging each batch with XACK, pipelined with
its next read. read_noack (shown beside it): one reader going through the same backlog with
plain XREAD, keeping its own position in each stream and acknowledging nothing.
"""

from __future__ import annotations

import asyncio
import threading
import time

import redis
import redis.asyncio
import workload as wl
from workload import QUEUES, Batch

READ_COUNT = 1000  # entries per stream per read
GROUP = "bench"


def stream(q: int) -> str:
    return f"orders-{q}"


def connect(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port)


def prepare(client: redis.Redis) -> None:
    client.delete(*(stream(q) for q in range(QUEUES)))


def produce(client: redis.Redis, batches: list[Batch]) -> float:
    """Seconds to store every batch."""
    pipe = client.pipeline(transaction=False)
    start = time.perf_counter()
    for batch in batches:
        name = stream(batch.queue)
        for key, body in zip(batch.keys, batch.bodies, strict=True):
            pipe.xadd(name, {"k": key, "b": body})
        ids = pipe.execute()
        if len(ids) != len(batch.keys):
            raise AssertionError("a pipeline lost XADDs")
    return time.perf_counter() - start


def produce_callers(port: int, singles: list[wl.Single], callers: int = wl.CALLERS) -> float:
    """Seconds for `callers` concurrent callers to XADD `singles`, one at a time each.

    Caller c sends its share (wl.per_caller) one XADD after another, the next when the
    previous was answered, all of them in one event loop over a pool of `callers`
    connections, which are opened (one PING per caller) before the clock starts.
    """
    return asyncio.run(_produce_callers(port, wl.per_caller(singles, callers)))


async def _produce_callers(port: int, shares: list[list[wl.Single]]) -> float:
    pool = redis.asyncio.ConnectionPool(host="127.0.0.1", port=port, max_connections=len(shares))
    client = redis.asyncio.Redis(connection_pool=pool)
    added = 0

    async def caller(share: list[wl.Single]) -> None:
        nonlocal added
        for key, queue, body in share:
            await client.xadd(stream(queue), {"k": key, "b": body})
            added += 1

    try:
        # concurrent PINGs: each holds a connection until answered, so all of them open
        await asyncio.gather(*(client.ping() for _ in shares))
        start = time.perf_counter()
        await asyncio.gather(*(caller(share) for share in shares))
        seconds = time.perf_counter() - start
    finally:
        await client.aclose()
        await pool.disconnect()
    if added != sum(len(share) for share in shares):
        raise AssertionError(f"{added} XADDs answered of {sum(len(s) for s in shares)}")
    return seconds


def consume_xread(client: redis.Redis, expected: int) -> float:
    """Seconds to read the whole backlog in order with XREAD, checking the count and order."""
    last = {stream(q): "0-0" for q in range(QUEUES)}
    got = 0
    start = time.perf_counter()
    while got < expected:
        reply = client.xread(last, count=READ_COUNT)
        if not reply:
            raise AssertionError(f"backlog ended after {got} of {expected} messages")
        for name, entries in reply:
            for _entry_id, fields in entries:
                if b"k" not in fields:
                    raise AssertionError("an entry lost its key")
            got += len(entries)
            last[name.decode()] = entries[-1][0].decode()
    return time.perf_counter() - start


def consume_group(client: redis.Redis, expected: int) -> float:
    """Seconds to read the backlog with XREADGROUP, XACKing each batch with the next read."""
    names = [stream(q) for q in range(QUEUES)]
    for name in names:
        client.xgroup_create(name, GROUP, id="0")
    wanted = dict.fromkeys(names, ">")
    pipe = client.pipeline(transaction=False)
    got = 0
    pending: list[tuple[str, list[bytes]]] = []
    start = time.perf_counter()
    while True:
        for name, ids in pending:
            pipe.xack(name, GROUP, *ids)
        if got < expected:
            pipe.xreadgroup(GROUP, "c1", wanted, count=READ_COUNT)
        if not pipe.command_stack:
            break
        results = pipe.execute()
        pending = []
        if got >= expected:
            break
        reply = results[-1]
        if not reply:
            raise AssertionError(f"backlog ended after {got} of {expected} messages")
        for name, entries in reply:
            got += len(entries)
            pending.append((name.decode(), [entry_id for entry_id, _ in entries]))
    seconds = time.perf_counter() - start
    left = sum(client.xpending(name, GROUP)["pending"] for name in names)
    if left:
        raise AssertionError(f"{left} entries left unacknowledged")
    return seconds


def latency(client: redis.Redis, port: int, rate: float, seconds: float) -> dict[str, float]:
    """End-to-end latency of single XADDs at `rate`/s read by a blocking XREADGROUP reader,
    and the rate the XADDs were really sent at (e2e_sent_rate, msg/s)."""
    names = [stream(q) for q in range(QUEUES)]
    for name in names:
        client.xgroup_create(name, "lat", id="$", mkstream=True)
    schedule = wl.paced(rate, seconds)
    ages: list[float] = []
    errors: list[BaseException] = []

    def reader() -> None:
        rc = connect(port)
        wanted = dict.fromkeys(names, ">")
        try:
            while len(ages) < len(schedule):
                reply = rc.xreadgroup("lat", "c1", wanted, count=READ_COUNT, block=2000)
                now = time.perf_counter()
                if not reply:
                    raise AssertionError(f"latency reader starved after {len(ages)} messages")
                for name, entries in reply:
                    ages.extend(wl.age_ms(fields[b"b"], now) for _, fields in entries)
                    rc.xack(name, "lat", *(entry_id for entry_id, _ in entries))
        except BaseException as exc:
            errors.append(exc)
        finally:
            rc.close()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    start = time.perf_counter()
    wl.pace(schedule, lambda key, q, body: client.xadd(stream(q), {"k": key, "b": body}))
    sent = time.perf_counter() - start
    thread.join(seconds + 30)
    if errors:
        raise errors[0]
    # the rate really sent: a pacer behind its schedule sends slower than `rate`
    sent_rate = (len(schedule) - 1) / sent if len(schedule) > 1 and sent > 0 else 0.0
    return {**wl.latency_figures(ages), "e2e_sent_rate": sent_rate}
