"""Orderly consumption through delay, jitter and resets on every link.

The network (tests/system/network_faults_support.py): a broker with a short lock lease, a
producer in this process and orderly consumer processes, each client behind its own
fault proxy.

(a) delay and jitter (and a bandwidth limit) on every link, while a worker joins and
    another leaves: order holds, nothing is lost, planned hand-overs re-deliver nothing;
(b) connections reset at random while they carry requests or answers (every link 20 ms
    slow, so that they do), the producer's too: order holds, nothing acknowledged is lost,
    and once the resets stop every queue is consumed again (none stuck);
(e) a proxy cannot reorder or drop packets (TCP is a byte stream); where the kernel has
    netem, (a) runs again with packet delay, loss and reordering on the loopback of a
    private network namespace, and is skipped otherwise.

The histories are checked as in test_orderly_chaos.py (`verify`): every key in order
(never n+1 before n), nothing acknowledged lost, nothing invented, no two listener calls
on a queue at the same time; duplicates and extra stored copies are counted. Each test
records its row of the fault suite's table. (c) and (d), the partitions, are in
test_network_faults_partitions.py; (f), the job queue, in test_network_faults_jobs.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos_report import REPORT_PATH_ENV, ChaosRecorder
from tests.faultproxy import LinkFaults
from tests.support import ROOT
from tests.system.network_faults_support import (
    FAULT_ROUNDS,
    KEYS,
    QUEUES,
    RESET_LINK,
    ROUND_INTERVAL,
    Resetter,
    check,
    network,
)
from tests.system.orderly_history import (
    REJOIN_TIMEOUT,
    verify,
    verify_handovers,
)

pytestmark = [pytest.mark.system, pytest.mark.chaos]


#: (a): 30 +- 20 ms each way, and 2 MB/s each way, on every link.
SLOW_LINK = LinkFaults(delay=0.03, jitter=0.02, rate=2_000_000)

#: (e): the qdisc put on the namespace's loopback (ORDERMQ_NETEM_QDISC to change it).
QDISC = os.environ.get(
    "ORDERMQ_NETEM_QDISC", "netem delay 10ms 5ms loss 0.5% reorder 5% 50%"
).split()
#: Set (to the qdisc) inside the namespace, for the inner run of (a).
INNER_NETEM = os.environ.get("ORDERMQ_NETEM", "")


# ---------------------------------------------------------------------------- (a) delay
def test_delay_jitter_and_a_bandwidth_limit_on_every_link(
    tmp_path: Path, chaos_report: ChaosRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    faults = LinkFaults() if INNER_NETEM else SLOW_LINK
    with network(tmp_path, monkeypatch) as net:
        scene, history = net.scene, net.history
        for name in ("producer", "w1", "w2", "w3"):
            net.proxy(name).set(faults)
        net.start_producer()
        net.spawn("w1", "w2")
        scene.until(lambda: history.frontier() >= 2, REJOIN_TIMEOUT, "w1 and w2 consuming")
        joined = scene.mark("w3 joins")
        net.spawn("w3")
        scene.until(lambda: history.started_after("w3", joined), REJOIN_TIMEOUT, "w3 consuming")
        scene.stop_workers(["w1"])  # a planned hand-over, every message of it delayed
        left = scene.mark("w1 left")
        scene.until(
            lambda: not history.queues_idle_since(left, QUEUES),
            REJOIN_TIMEOUT,
            "every queue consumed after w1 left",
        )
        rounds = net.finish(["w2", "w3"])
        net.check_traffic_went_through_the_proxies()
    entries = history.entries()
    revokes = [r for w in scene.workers.values() for r in w.revokes()]
    report = verify(entries, rounds, {}, KEYS, QUEUES)
    fault = f"packet level: {' '.join(QDISC)}" if INNER_NETEM else "delay 30±20 ms, 2 MB/s"
    report.record(chaos_report, fault, rounds, "a worker joins, one leaves")
    check(report, net)
    errors = verify_handovers(entries, revokes, {})
    assert not errors, "\n".join(errors[:30]) + "\n" + net.timeline()


# ---------------------------------------------------------------------------- (b) resets
@pytest.mark.parametrize("front", ["grpc", "exchange-port"])
def test_connections_reset_at_random(
    tmp_path: Path, chaos_report: ChaosRecorder, monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    """On the Exchange port, the clients' sends and push subscriptions go over framed TCP
    through their proxies (as gRPC's channels do), and are reset there too."""
    port = ("--exchange-port", "0" if front == "exchange-port" else "off")
    with network(tmp_path, monkeypatch, *port) as net:
        scene, history = net.scene, net.history
        for name in ("producer", "w1", "w2", "w3"):
            net.proxy(name).set(RESET_LINK)
        producer = net.start_producer()
        net.spawn("w1", "w2", "w3")
        scene.until(lambda: history.frontier() >= 1, REJOIN_TIMEOUT, "the workers consuming")
        resetter = Resetter(list(net.proxies.values()), seed=21)
        resetter.start()
        scene.mark("resets begin")
        target = scene.sent() + FAULT_ROUNDS
        scene.until(lambda: scene.sent() >= target, FAULT_ROUNDS * ROUND_INTERVAL + 60, "rounds")
        resets = resetter.halt()
        calm = scene.mark(f"resets end: {resets} connections reset")
        # No queue stays stuck: each is consumed again after the last reset.
        scene.until(
            lambda: not history.queues_idle_since(calm, QUEUES),
            REJOIN_TIMEOUT,
            "every queue consumed after the resets",
        )
        scene.mark("every queue consumed again")
        rounds = net.finish(["w1", "w2", "w3"])
        net.check_traffic_went_through_the_proxies()
    report = verify(history.entries(), rounds, {}, KEYS, QUEUES, resends=True)
    note = f"{resets} resets, {report.copies} copies from retried sends"
    fault = "connection resets" + (", Exchange port" if port else "")
    report.record(chaos_report, fault, rounds, note)
    check(report, net, f"; {producer.failed_sends} failed sends retried")
    assert resets >= FAULT_ROUNDS // 4, f"only {resets} resets"


# ---------------------------------------------------------------------------- (e) netem
def netem_unavailable() -> str | None:
    """Why packet-level faults cannot run here (None when they can)."""
    if INNER_NETEM:
        return "this is the run inside the namespace"
    missing = [tool for tool in ("unshare", "ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"packet-level faults need {', '.join(missing)}"
    probe = subprocess.run(
        ["unshare", "-n", "sh", "-c", "ip link set lo up && exec tc qdisc add dev lo root \"$@\"",
         "sh", *QDISC],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if probe.returncode:
        why = (probe.stderr or probe.stdout).strip().splitlines()
        return (
            f"packet-level faults need netem in a network namespace; "
            f"`unshare -n tc qdisc add dev lo root {' '.join(QDISC)}` failed: "
            f"{why[-1] if why else probe.returncode}"
        )
    return None


def test_packet_delay_loss_and_reordering_under_netem(
    tmp_path: Path, chaos_report: ChaosRecorder
) -> None:
    reason = netem_unavailable()
    if reason:
        pytest.skip(reason)
    report = tmp_path / "rows.json"
    inner = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
        f"{Path(__file__).relative_to(ROOT)}::test_delay_jitter_and_a_bandwidth_limit_on_every_link",
    ]  # fmt: skip
    env = {**os.environ, "ORDERMQ_NETEM": " ".join(QDISC), REPORT_PATH_ENV: str(report)}
    done = subprocess.run(
        ["unshare", "-n", "sh", "-c",
         'ip link set lo up && tc qdisc add dev lo root $ORDERMQ_NETEM && exec "$@"', "sh",
         *inner],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    print(done.stdout[-5000:])
    for row in json.loads(report.read_text()) if report.exists() else []:
        chaos_report.record(
            fault=row["fault"], rounds=row["rounds"], acked=row["acked"], lost=row["lost"],
            order_violations=row["order_violations"], duplicates=row["duplicates"],
            note=f"{row['note']}; in a network namespace",
        )  # fmt: skip
    assert done.returncode == 0, f"the run under netem failed:\n{done.stdout}\n{done.stderr}"
