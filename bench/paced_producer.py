"""The producer of the separate-process end-to-end figures, in a process of its own.

    python bench/paced_producer.py --address HOST:PORT [--in-flight 64]

It starts one sdk.aio.Producer (default ProducerConfig), prints "paced producer ready",
then reads commands from stdin, one JSON object a line ({"topic": T, "rate": R,
"count": N}, see e2e_procs.command). For each it sends N single keyed messages to T at R
msg/s with consuming.paced_send (each body starts with its send time,
time.perf_counter_ns: CLOCK_MONOTONIC on Linux, one clock for every process of the
machine) and answers one JSON line: paced_send's details (sent_rate is the rate it
really sent) plus producer_cpu, this process's CPU over the sending as a share of one
core. It shuts the producer down and exits at the end of its input; an error ends it with
a traceback on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import consuming as cw  # noqa: E402 (needs ROOT on the path for sdk)
import workloads as wl  # noqa: E402

from sdk.aio import Producer  # noqa: E402

READY = "paced producer ready"


async def serve(address: str, in_flight: int) -> None:
    producer = Producer(address)
    await producer.start()
    keys = wl.make_keys()
    loop = asyncio.get_running_loop()
    try:
        print(READY, flush=True)
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            order = json.loads(line)
            cpu_before, start = time.process_time(), time.perf_counter()
            detail = await cw.paced_send(
                producer, order["topic"], keys, order["rate"], order["count"], in_flight
            )
            seconds = time.perf_counter() - start
            detail["producer_cpu"] = (time.process_time() - cpu_before) / seconds
            print(json.dumps(detail), flush=True)
    finally:
        await producer.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--address", required=True, help="the broker's HOST:PORT")
    ap.add_argument("--in-flight", type=int, default=64, help="most sends outstanding")
    args = ap.parse_args()
    asyncio.run(serve(args.address, args.in_flight))


if __name__ == "__main__":
    main()
