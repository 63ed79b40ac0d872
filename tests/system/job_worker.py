"""One worker process of the job-queue chaos test (tests/system/test_job_queue_chaos.py).

    python tests/system/job_worker.py --broker HOST:PORT --log FILE
        [--invisible SECONDS] [--batch N] [--stall-after N --release FILE]

A sdk.SimpleConsumer of group "job-workers" on topic "jobs". It receives up to `--batch`
jobs at a time, each invisible to the other workers for `--invisible` seconds, and writes
one line per event to FILE (opened O_APPEND, one write() per line, so every line is on
its way to the file before the next step, even when the process is killed the moment
after):

    got <job> <attempt>     for each job of a batch, as soon as the receive answered,
                            before any of the batch is processed (what this worker holds)
    done <job> <attempt>    the job is finished, before it is acked
    acked <job> <attempt>   the ack succeeded
    late <job> <attempt> <error>    the ack raised: refused (its invisible time had
                            passed), or cut off on its way (it may have settled the job)
    stall <job>             see --stall-after
    failed <error>          a receive raised (cut off on its way: the jobs it took, if
                            any, come back once their invisible time passes)

`<attempt>` is the job's delivery attempt (1 on the first delivery).

With --stall-after N, once N jobs are done the worker stops before the next job (holding
it and the rest of its batch) and writes `stall <job>`, then waits until the file
--release exists: a fixed point at which the test kills or SIGSTOPs it while it
certainly holds jobs, whatever the machine's speed. It stalls once.

Prints `ready` once started; runs until killed (SIGTERM, SIGKILL).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from sdk import SimpleConsumer
from sdk.errors import OrderMQError

TOPIC = "jobs"
GROUP = "job-workers"
#: How often a stalled worker looks for its release file.
RELEASE_POLL_SECONDS = 0.05


class Log:
    """Append-only event lines, one write() each."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(self, *words: str) -> None:
        os.write(self._fd, (" ".join(words) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--invisible", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--stall-after", type=int, default=-1)
    parser.add_argument("--release", default="")
    a = parser.parse_args()
    log = Log(a.log)
    done = 0
    stall_after = a.stall_after
    with SimpleConsumer(GROUP, a.broker, await_duration=1) as consumer:
        consumer.subscribe(TOPIC)
        print("ready", flush=True)
        while True:
            try:
                jobs = consumer.receive(max_messages=a.batch, invisible_duration=a.invisible)
            except OrderMQError as exc:
                log.write("failed", type(exc).__name__)
                continue
            for job in jobs:
                log.write("got", job.body.decode(), str(job.delivery_attempt))
            for job in jobs:
                name, attempt = job.body.decode(), str(job.delivery_attempt)
                if done == stall_after:
                    stall_after = -1
                    log.write("stall", name)
                    while not Path(a.release).exists():
                        time.sleep(RELEASE_POLL_SECONDS)
                log.write("done", name, attempt)
                done += 1
                try:
                    consumer.ack(job)
                except OrderMQError as exc:
                    log.write("late", name, attempt, type(exc).__name__)
                else:
                    log.write("acked", name, attempt)


if __name__ == "__main__":
    main()
