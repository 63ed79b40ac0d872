"""Many identical requests, one run each: DedupCoordinator, blocking and asyncio.

What it shows: the "highly repeated requests" case of a consumer (seed 003: many
consumer threads asked to refresh the same few cache entries at once). Threads, then
tasks, ask for the prices of a few products, each many times at once; the expensive lookup
runs once per product and every caller gets its value. A lookup that fails reaches every
caller that waited for it, and the next request runs it again. In a consumer, the
listener would call `dedup.run(key, lookup)` the same way.

Run it:  python examples/dedup_requests.py --requests 400
No broker needed: the coordinator is in-process.
Exit status 0 when each lookup ran once and every caller got its value.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import sdk
import sdk.aio

PRODUCTS = ["apple", "bread", "cheese", "dates", "eggs"]
PRICES = {"apple": 120, "bread": 250, "cheese": 730, "dates": 480, "eggs": 310}


def with_threads(requests: int) -> bool:
    dedup = sdk.DedupCoordinator(ttl_seconds=60)
    runs: Counter[str] = Counter()
    lock = threading.Lock()

    def lookup(product: str) -> int:
        with lock:
            runs[product] += 1
        time.sleep(0.2)  # the expensive part: a database, another service
        return PRICES[product]

    def request(i: int) -> tuple[str, int]:
        product = PRODUCTS[i % len(PRODUCTS)]
        return product, dedup.run(f"price:{product}", lambda: lookup(product))

    with ThreadPoolExecutor(max_workers=50) as pool:
        answers = list(pool.map(request, range(requests)))
    right = all(price == PRICES[product] for product, price in answers)
    print(f"threads: {len(answers)} requests, lookups run: {dict(sorted(runs.items()))}")
    return right and len(answers) == requests and all(runs[p] == 1 for p in PRODUCTS)


async def with_tasks(requests: int) -> bool:
    dedup = sdk.aio.DedupCoordinator(ttl_seconds=60)
    runs: Counter[str] = Counter()

    async def lookup(product: str) -> int:
        runs[product] += 1
        await asyncio.sleep(0.2)
        if product == "dates" and runs[product] == 1:
            raise ConnectionError("price service unavailable")
        return PRICES[product]

    async def request(i: int) -> tuple[str, int | Exception]:
        product = PRODUCTS[i % len(PRODUCTS)]
        try:
            return product, await dedup.run(f"price:{product}", lambda: lookup(product))
        except ConnectionError as exc:
            return product, exc

    answers = await asyncio.gather(*(request(i) for i in range(requests)))
    failed = [p for p, a in answers if isinstance(a, Exception)]
    print(f"tasks: {len(answers)} requests, lookups run: {dict(sorted(runs.items()))}, "
          f"failed: {len(failed)} (all {sorted(set(failed))})")  # fmt: skip
    # The failure was shared by the callers of "dates", and not kept: ask again.
    again = await dedup.run("price:dates", lambda: lookup("dates"))
    print(f"tasks: dates asked again: {again}, lookups of dates run: {runs['dates']}")
    right = all(a == PRICES[p] for p, a in answers if p != "dates")
    return (
        right
        and set(failed) == {"dates"}
        and len(failed) == requests // len(PRODUCTS)
        and again == PRICES["dates"]
        and runs == Counter({p: 2 if p == "dates" else 1 for p in PRODUCTS})
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="requests of each kind")
    args = parser.parse_args()
    ok = with_threads(args.requests)
    ok = asyncio.run(with_tasks(args.requests)) and ok
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
