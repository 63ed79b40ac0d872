"""Every example runs as a user would run it, and says it succeeded."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.example


def run_example(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_demo_processes_every_order_in_order_across_a_hand_over() -> None:
    out = run_example("demo.py", "--orders", "500")
    assert "sending 2000 events for 500 orders" in out
    assert "consumer B stopped; A took over its queues" in out
    assert "orders completed:   500 of 500" in out
    assert "order violations:   0" in out
    assert "result: OK" in out


def test_bench_quick_run_measures_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "quick.json"
    script = str(ROOT / "bench" / "run.py")
    # Every group, on 2 000 messages instead of --quick's 20 000: the figures are only
    # checked to be there, and the groups' fixed costs (brokers, paced latency runs) stay.
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--messages", "2000", "--quiet", "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    figures, facts = report["figures"], report["facts"]
    produce = [f for f in figures if f["title"].startswith("produce")]
    assert len(produce) == 6 and all(f["median"] > 0 for f in produce)  # 2 of them mixed
    # the keyed workload leads the report (issue 35): mixed batches and 8 callers' single
    # sends, sync and async, each with its ratio to the floor of the same run
    callers = [f for f in figures if f["key"].startswith("produce.") and "callers" in f["key"]]
    assert len(callers) == 2 and all(f["median"] > 0 for f in callers)
    assert len(facts["keyed_ratios"]) == 4
    assert all(r["vs_floor"] > 0 for r in facts["keyed_ratios"].values())
    assert proc.stdout.splitlines()[1].startswith("keyed workload")
    # produce and orderly consume over gRPC and rocketmq:// (issue 33), unless skipped
    transports = [f for f in figures if f["key"].startswith("transports.")]
    if "transports_skipped" not in facts:
        assert len(transports) == 4 and all(f["median"] > 0 for f in transports)
    # produce and orderly consume with TLS off, on, and on with an ACL, and the ratios
    # (issues 34, 37)
    tls = {f["key"]: f for f in figures if f["key"].startswith("tls.")}
    assert "tls_skipped" not in facts  # trustme is a development dependency
    assert sorted(tls) == [
        "tls.plain.consume", "tls.plain.produce", "tls.tls.consume", "tls.tls.produce",
        "tls.tls_acl.consume", "tls.tls_acl.produce",
    ]  # fmt: skip
    assert all(f["median"] > 0 for f in tls.values())
    assert tls["tls.tls.produce"]["params"]["tls"] and not tls["tls.plain.produce"]["params"]["tls"]
    assert (
        tls["tls.tls_acl.consume"]["params"]["acl"] and not tls["tls.tls.consume"]["params"]["acl"]
    )
    assert set(facts["tls_ratios"]) == set(facts["tls_acl_ratios"]) == {"produce", "consume"}
    # receive + ack by 8 workers, both faces, and a poll loop on the same backlog (issue 36)
    receive = {f["key"]: f for f in figures if f["key"].startswith("receive.")}
    assert sorted(receive) == ["receive.aio", "receive.blocking", "receive.poll_aio"]
    assert all(f["median"] > 0 for f in receive.values())


def test_bench_backlog_group_recovers_and_reads_back_the_whole_backlog(tmp_path: Path) -> None:
    out = tmp_path / "backlog.json"
    # A 10 s pause between the two parts instead of make bench-backlog's 30 s: the deleting
    # broker still has 5 s, and nothing checked here depends on the pause's length.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--only", "backlog",
         "--backlog-messages", "16000", "--backlog-pause", "10", "--quiet",
         "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    figures = {f["key"]: f for f in report["figures"]}
    stored = figures["backlog.fill"]["runs"][0]["units"]
    assert stored == 16000
    assert figures["backlog.read"]["runs"][0]["units"] == stored  # every message came back
    assert figures["backlog.recovery"]["median"] > 0
    for key in ("broker.rss.bigbacklog.fill", "broker.rss.bigbacklog"):
        assert 10 < figures[key]["median"] < 1000, figures[key]
    assert report["facts"]["backlog_disk_bytes"] > stored * 100


def test_batch_export_drains_the_backlog_once_and_resumes_from_commits() -> None:
    out = run_example("batch_export.py", "--messages", "3000")
    assert "first run: 3000, second run: 0, distinct lines: 3000" in out
    assert "result: OK" in out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_the_service_example_stops_cleanly_on_a_signal(sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "orderly_service.py")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        assert "Ctrl+C to stop" in proc.stdout.readline()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped cleanly after applying" in out
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "name",
    [
        "delayed_and_cancel.py",
        "retry_and_dlq.py",
        "broadcasting.py",
        "asyncio_consumer.py",
        "job_queue.py",
    ],
)
def test_scenario_examples_succeed(name: str) -> None:
    assert "result: OK" in run_example(name)


def test_bench_sizing_reports_disk_and_memory_per_message(tmp_path: Path) -> None:
    out = tmp_path / "sizing.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "sizing.py"), "--messages", "2000",
         "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = {r["shape"]: r for r in json.loads(out.read_text())["results"]}
    big, small = results["1 KB body, sharding key"], results["100 B body, sharding key"]
    for r in results.values():
        assert r["messages"] == 2000
        assert r["disk_bytes"]["total"] >= sum(
            r["disk_bytes"][p] for p in ("commit log", "consume queues", "id/key index")
        )
        assert all(mb > 0 for mb in r["rss_mb"].values())
    # The commit log holds each body once plus a fixed record overhead.
    per_message = {n: r["disk_bytes"]["commit log"] / 2000 for n, r in results.items()}
    assert per_message[big["shape"]] - per_message[small["shape"]] == 1024 - 100
    assert "MB per million messages" in proc.stdout
