"""The one workload every peer runs, built the same way ordermq's benchmark builds its own.

100-byte bodies, 1 000 sharding keys, 8 queues; a key goes to queue
`sdk.shard_index(key, 8)` (ordermq's mmh3 formula). Messages are sent in batches of 100,
every message of a batch for the same queue: batch i is for queue i % 8, its keys taken
round robin from that queue's keys. Inputs are built before any timing starts.
"""

from __future__ import annotations

import random
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass

from sdk import shard_index

BODY_BYTES = 100
KEYS = 1000
QUEUES = 8
BATCH = 100


@dataclass(frozen=True)
class Batch:
    queue: int
    keys: list[str]
    bodies: list[bytes]


def build(messages: int, seed: int = 7) -> list[Batch]:
    """Batches holding `messages` messages (rounded down to whole batches, at least one)."""
    keys = [f"key-{i:04d}" for i in range(KEYS)]
    per_queue: list[list[str]] = [[] for _ in range(QUEUES)]
    for key in keys:
        per_queue[shard_index(key, QUEUES)].append(key)
    rng = random.Random(seed)
    pool = [rng.randbytes(BODY_BYTES) for _ in range(KEYS)]
    cursor = [0] * QUEUES
    batches: list[Batch] = []
    for n in range(max(1, messages // BATCH)):
        q = n % QUEUES
        mine = per_queue[q]
        start = cursor[q]
        cursor[q] += BATCH
        batch_keys = [mine[(start + j) % len(mine)] for j in range(BATCH)]
        first = n * BATCH
        batch_bodies = [pool[(first + j) % KEYS] for j in range(BATCH)]
        batches.append(Batch(q, batch_keys, batch_bodies))
    return batches


def total(batches: list[Batch]) -> int:
    return sum(len(b.keys) for b in batches)


# ---------------------------------------------------------------------- latency
#: Messages sent in the first LATENCY_WARMUP of a latency run are not counted.
LATENCY_WARMUP = 0.1


def stamped(body: bytes) -> bytes:
    """`body` with its first 8 bytes replaced by the current time.perf_counter()."""
    return struct.pack("<d", time.perf_counter()) + body[8:]


def age_ms(body: bytes, now: float) -> float:
    """How long ago a stamped body was stamped, in milliseconds."""
    return (now - struct.unpack_from("<d", body)[0]) * 1000.0


def paced(rate: float, seconds: float) -> list[tuple[float, str, int, bytes]]:
    """(send at, key, queue, body) for `seconds` at `rate` messages per second.

    Message i has key i % KEYS, so consecutive messages go to different queues.
    """
    keys = [f"key-{i:04d}" for i in range(KEYS)]
    queues = [shard_index(k, QUEUES) for k in keys]
    rng = random.Random(5)
    pool = [rng.randbytes(BODY_BYTES) for _ in range(KEYS)]
    count = max(1, int(rate * seconds))
    return [(i / rate, keys[i % KEYS], queues[i % KEYS], pool[i % KEYS]) for i in range(count)]


def latency_figures(ages_ms: list[float]) -> dict[str, float]:
    """p50, p99 and max of the ages after the warm-up share, in milliseconds."""
    kept = sorted(ages_ms[int(len(ages_ms) * LATENCY_WARMUP) :])
    if not kept:
        return {}

    def pct(p: float) -> float:
        return kept[min(len(kept) - 1, int(p * len(kept)))]

    return {"e2e_p50_ms": pct(0.50), "e2e_p99_ms": pct(0.99), "e2e_max_ms": kept[-1]}


def pace(
    schedule: list[tuple[float, str, int, bytes]], send: Callable[[str, int, bytes], None]
) -> None:
    """Call send(key, queue, stamped body) for each message at its time from now."""
    t0 = time.perf_counter()
    for at, key, queue, body in schedule:
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        send(key, queue, stamped(body))
