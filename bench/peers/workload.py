"""The one workload every peer runs, built the same way ordermq's benchmark builds its own.

100-byte bodies, 1 000 sharding keys, 8 queues; a key goes to queue
`sdk.shard_index(key, 8)` (ordermq's mmh3 formula). Messages are sent in batches of 100,
every message of a batch for the same queue: batch i is for queue i % 8, its keys taken
round robin from that queue's keys. The single sends of CALLERS concurrent callers (the
shape of bench/run.py's 8-caller figure) take the keys in arrival order instead: message
i has key i % 1 000, and caller i % CALLERS sends it. Inputs are built before any timing
starts.
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
#: Concurrent callers of the single-send figure (bench/workloads.py's CALLERS) and the
#: messages it sends (bench/run.py's CALLERS_MESSAGES, at most --messages).
CALLERS = 8
CALLERS_MESSAGES = 20_000


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


#: One single send: (key, its queue, body).
Single = tuple[str, int, bytes]


def arrivals(messages: int, seed: int = 7) -> list[Single]:
    """`messages` single sends in arrival order: message i has key i % KEYS (so consecutive
    messages go to different queues) and body i % KEYS of a pool of KEYS bodies."""
    keys = [f"key-{i:04d}" for i in range(KEYS)]
    queues = [shard_index(k, QUEUES) for k in keys]
    rng = random.Random(seed)
    pool = [rng.randbytes(BODY_BYTES) for _ in range(KEYS)]
    return [(keys[i % KEYS], queues[i % KEYS], pool[i % KEYS]) for i in range(messages)]


def per_caller(singles: list[Single], callers: int = CALLERS) -> list[list[Single]]:
    """What each of `callers` callers sends, in its order: message i goes to caller
    i % `callers` (as bench/workloads.py's send_from_callers deals them). With `callers`
    dividing KEYS each key has one caller, so per-key order is that caller's order."""
    return [singles[c::callers] for c in range(callers)]


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
    singles = arrivals(max(1, int(rate * seconds)), seed=5)
    return [(i / rate, key, queue, body) for i, (key, queue, body) in enumerate(singles)]


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
