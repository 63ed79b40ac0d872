"""A job queue with a time to run: Youzan's delay queue on a SimpleConsumer.

What it shows: the job pool of Youzan's delay-queue design (after beanstalkd) on
ordermq. A job is a message: `delay_seconds` holds it back until it is due (and its
msg_id deletes it before then); a worker's receive() pops it with a time to run (TTR),
during which no other worker of the group gets it; ack() finishes it. A worker that
crashes holding jobs finishes nothing: once their TTR has passed its jobs come back, to
any worker, with `delivery_attempt` one higher. A job that keeps failing (here the
worker gives it back at once with change_invisible_duration(job, 0)) is dead-lettered
after `max_delivery_attempts` and turns up in the group's dead-letter topic
`%DLQ%<group>`. A job that needs longer than its TTR runs inside keep_invisible(), which
renews the TTR while it runs, so no other worker starts it meanwhile.

Run it:  python examples/job_queue.py
(It takes about 5 seconds: it waits for a delayed job and for a crashed worker's TTR.)
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageExt, Producer, SimpleConsumer
from sdk.errors import TopicNotFoundError

TOPIC = "order-jobs"
GROUP = "order-workers"
TTR = 1.0  # seconds a popped job is hidden from the other workers
LONG_TTR = 3.0  # the long job's TTR; it runs for one and a half of them
ATTEMPTS = 3  # deliveries before a job is dead-lettered


def worker(address: str) -> SimpleConsumer:
    """A worker of the pool, not started: it waits up to 0.5 s for a job."""
    consumer = SimpleConsumer(GROUP, address, await_duration=0.5, max_delivery_attempts=ATTEMPTS)
    consumer.subscribe(TOPIC)
    return consumer


def pop_until(consumer: SimpleConsumer, wanted: int, seconds: float) -> list[MessageExt]:
    """Pop jobs (TTR each) until `wanted` came or `seconds` passed."""
    got: list[MessageExt] = []
    deadline = time.monotonic() + seconds
    while len(got) < wanted and time.monotonic() < deadline:
        got += consumer.receive(max_messages=wanted - len(got), invisible_duration=TTR)
    return got


def main() -> int:
    checks: dict[str, bool] = {}
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-jobs-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp))) as broker,
        Producer(broker.address) as producer,
    ):
        # --- add jobs: three ready now, one due in 1.5 s, one deleted before it is due
        for n in (1, 2, 3):
            producer.send(Message(TOPIC, f"close-order-{n}".encode()))
        added_at = time.time()
        producer.send(Message(TOPIC, b"remind-buyer-7", delay_seconds=1.5))
        cancelled = producer.send(Message(TOPIC, b"refund-check-9", delay_seconds=1.5))
        checks["delete a delayed job"] = producer.cancel(cancelled.msg_id)
        print("added 3 jobs, 1 delayed by 1.5 s; deleted refund-check-9")

        # --- a worker pops two jobs and crashes without finishing them
        crashed = worker(broker.address)
        with crashed:
            held = pop_until(crashed, 2, 10)
            print("crashed worker held:", sorted(m.body.decode() for m in held))
        held_ids = {m.msg_id for m in held}

        # --- a healthy worker finishes every job, the crashed worker's once their TTR ran out
        attempts: dict[str, int] = {}
        with worker(broker.address) as healthy:
            deadline = time.monotonic() + 20
            while len(attempts) < 4 and time.monotonic() < deadline:
                for job in healthy.receive(max_messages=16, invisible_duration=TTR):
                    attempts[job.body.decode()] = job.delivery_attempt
                    if job.body == b"remind-buyer-7":
                        late = job.store_timestamp / 1000 - added_at
                        print(f"  delayed job came {late:.1f} s after it was added")
                        checks["delayed job not early"] = job.store_timestamp >= int(
                            (added_at + 1.5) * 1000
                        )
                    healthy.ack(job)  # finished
            print("finished (job: delivery attempt):", dict(sorted(attempts.items())))
            crashed_jobs = {m.body.decode() for m in held}
            checks["crashed worker's jobs came back, attempt 2"] = (
                all(attempts.get(name) == 2 for name in crashed_jobs) and len(held_ids) == 2
            )
            checks["other jobs delivered once"] = all(
                a == 1 for name, a in attempts.items() if name not in crashed_jobs
            ) and set(attempts) == {"close-order-1", "close-order-2", "close-order-3",
                                    "remind-buyer-7"}  # fmt: skip

            # --- a long job keeps its TTR renewed while it runs: nobody else starts it
            producer.send(Message(TOPIC, b"rebuild-report"))
            [long_job] = healthy.receive(max_messages=1, invisible_duration=LONG_TTR)
            seen_by_other: list[MessageExt] = []
            other = worker(broker.address)
            with other:
                with healthy.keep_invisible(long_job) as kept:
                    watcher = threading.Thread(
                        target=lambda: seen_by_other.extend(pop_until(other, 1, 1.5 * LONG_TTR))
                    )
                    watcher.start()
                    watcher.join()  # the job runs for 1.5 TTRs meanwhile
                    healthy.ack(long_job)
                print(f"long job ran 1.5 TTRs, renewed {kept.renewals} times, "
                      f"seen by another worker: {len(seen_by_other)} times")  # fmt: skip
            checks["long job never delivered twice"] = (
                not seen_by_other and kept.renewals > 0 and kept.error is None
            )

            # --- a poison job fails every time and is dead-lettered after ATTEMPTS
            producer.send(Message(TOPIC, b"charge-card-13"))
            tries = []
            deadline = time.monotonic() + 20
            while len(tries) < ATTEMPTS and time.monotonic() < deadline:
                for job in healthy.receive(max_messages=1, invisible_duration=TTR):
                    tries.append(job.delivery_attempt)
                    healthy.change_invisible_duration(job, 0)  # failed: give it back now
            print("poison job tried, attempts:", tries)

        undertaker = SimpleConsumer("dead-jobs", broker.address, await_duration=0.5)
        undertaker.subscribe(f"%DLQ%{GROUP}")
        dead: list[MessageExt] = []
        with undertaker:
            deadline = time.monotonic() + 20
            while not dead and time.monotonic() < deadline:
                try:
                    dead += undertaker.receive(max_messages=16, invisible_duration=30)
                except TopicNotFoundError:  # the first dead letter creates the topic
                    time.sleep(0.1)
            for job in dead:
                undertaker.ack(job)
        print("dead-lettered:", [m.body.decode() for m in dead])
        checks["poison job dead-lettered after 3 attempts"] = tries == [1, 2, 3] and [
            m.body for m in dead
        ] == [b"charge-card-13"]

    for name, ok in checks.items():
        print(f"  {'ok ' if ok else 'BAD'} {name}")
    ok = len(checks) == 6 and all(checks.values())
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
