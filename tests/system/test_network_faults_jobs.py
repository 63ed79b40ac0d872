"""SimpleConsumers receiving and acking jobs through connections reset at random.

(f) SimpleConsumer workers (tests/system/job_worker.py), each behind its own fault proxy
    (tests/faultproxy.py), receiving and acking jobs while connections are reset at random
    as in test_network_faults_links.py (b): every job is finished, none is lost, an acked
    job is never delivered again, and each re-delivery is explained by a cut: the ack of
    the delivery before it failed, or the receive that took it did (its answer never
    arrived). Once the resets stop, every job settles. The test records its row of the
    fault suite's table.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sdk._transport.broker_client import BrokerClient
from tests.chaos_report import ChaosRecorder, scaled
from tests.faultproxy import FaultProxy, proxy_environment
from tests.support import wait_until
from tests.system import job_worker
from tests.system.network_faults_support import (
    RESET_LINK,
    Resetter,
)
from tests.system.test_job_queue_chaos import BATCH, PATIENCE, Events, StartBroker, Worker, produce

pytestmark = [pytest.mark.system, pytest.mark.chaos]


# ---------------------------------------------------------------------------- (f) job queue
#: (f): the jobs (a few seconds of work for the workers), and the workers.
JOBS = scaled(400, 4000)
JOB_WORKERS = 3


@dataclass
class Deliveries:
    """Every delivery the workers' logs show, by (job, delivery attempt)."""

    got: Counter[tuple[str, int]] = field(default_factory=Counter)
    acks: dict[tuple[str, int], str] = field(default_factory=dict)  # "acked" or "late"
    finished: Counter[str] = field(default_factory=Counter)
    failed_receives: int = 0

    @classmethod
    def of(cls, logs: list[Events]) -> Deliveries:
        d = cls()
        for events in logs:
            d.failed_receives += len(events.failed)
            for kind, *words in events.lines:
                if kind == "got":
                    d.got[(words[0], int(words[1]))] += 1
                elif kind in ("acked", "late"):
                    d.acks[(words[0], int(words[1]))] = kind
                elif kind == "done":
                    d.finished[words[0]] += 1
        return d

    def last(self) -> dict[str, int]:
        """Each job's last delivery attempt a worker got."""
        top: dict[str, int] = {}
        for job, attempt in self.got:
            top[job] = max(top.get(job, 0), attempt)
        return top

    def earlier(self) -> list[tuple[str, int]]:
        """The deliveries a later one of the same job followed (the re-delivered ones)."""
        return [(job, a) for job, top in self.last().items() for a in range(1, top)]


def settled(address: str) -> bool:
    """True once the job workers' committed offsets reach the end of every queue of "jobs"."""

    async def progress() -> dict[str, Any]:
        client = BrokerClient(address)
        try:
            return await client.admin("ConsumerProgress", group=job_worker.GROUP,
                                      topic=job_worker.TOPIC)  # fmt: skip
        finally:
            await client.close()

    queues = asyncio.run(progress())["queues"]
    return bool(queues) and all(q["consumer_offset"] >= 0 and q["lag"] == 0 for q in queues)


def test_simple_consumers_receive_and_ack_through_connections_reset_at_random(
    start_broker: StartBroker, tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    broker = start_broker(tmp_path / "broker")
    jobs = produce(broker.address, JOBS)
    proxies: list[FaultProxy] = []
    workers: list[Worker] = []
    try:
        for i in range(JOB_WORKERS):
            proxy = FaultProxy(seed=i, name=f"proxy-w{i}")
            proxy.start()
            proxies.append(proxy)
            proxy.set(RESET_LINK)
            env = proxy_environment(proxy)
            workers.append(Worker(f"w{i}", tmp_path, broker.address, env=env))
        resetter = Resetter(proxies, seed=36)
        resetter.start()
        try:
            wait_until(
                lambda: Deliveries.of([w.events() for w in workers]).finished.keys() >= set(jobs),
                PATIENCE,
                f"all {JOBS} jobs finished",
            )
        finally:
            resets = resetter.halt()
        # Then every job settles: those whose acks were cut before they settled come back
        # and are finished again, so the logs show every re-delivery.
        wait_until(lambda: settled(broker.address), PATIENCE, "every job settled")
        for proxy in proxies:
            assert proxy.stats().targets == {broker.address}, "a worker went around its proxy"
    finally:
        for w in workers:
            w.end()
        for proxy in proxies:
            proxy.stop()

    d = Deliveries.of([w.events() for w in workers])
    assert set(d.finished) == set(jobs), "every job finished at least once, and nothing else"
    assert all(n == 1 for n in d.got.values()), "no delivery attempt of a job handed out twice"
    top = d.last()
    came_back = [(j, a) for (j, a), kind in d.acks.items() if kind == "acked" and a < top[j]]
    assert not came_back, f"acked jobs delivered again: {came_back[:10]}"
    # Each re-delivered job's earlier delivery was cut: its ack failed (a "late" line), or
    # the receive that took it did, and no worker got it at all.
    cut_acks = [k for k in d.earlier() if d.acks.get(k) == "late"]
    cut_receives = [k for k in d.earlier() if k not in d.got]
    unexplained = sorted(set(d.earlier()) - set(cut_acks) - set(cut_receives))
    assert not unexplained, f"re-delivered with no cut to explain it: {unexplained[:10]}"
    assert len(cut_receives) <= d.failed_receives * BATCH, (
        f"{len(cut_receives)} deliveries no worker got, but only {d.failed_receives} "
        f"receives failed (of at most {BATCH} jobs each)"
    )
    late = sum(kind == "late" for kind in d.acks.values())
    assert d.failed_receives + late > 0, f"the {resets} resets cut no receive and no ack"
    note = (
        f"{resets} resets: {d.failed_receives} receives and {late} acks cut; "
        f"{len(cut_acks)} + {len(cut_receives)} jobs delivered again after a cut ack / receive"
    )
    print(note)
    chaos_report.record(
        fault="job queue: connection resets", rounds=1, acked=JOBS,
        lost=len(set(jobs) - set(d.finished)), order_violations=0,
        duplicates=sum(n - 1 for n in d.finished.values()), note=note,
    )  # fmt: skip
