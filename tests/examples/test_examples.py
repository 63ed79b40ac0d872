"""Every example runs as a user would run it, and says it succeeded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples.bench_quick import PARTS
from tests.support import ROOT

pytestmark = pytest.mark.example


def run_example(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120, env=env,
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


def test_the_demo_runs_alike_without_the_c_paths() -> None:
    # What an install without a C compiler runs: every per-message path in Python.
    env = {**os.environ, "ORDERMQ_NO_SPEEDUPS": "1"}
    probe = subprocess.run(
        [sys.executable, "-c", "from sdk._accel import speedups; print(speedups)"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert probe.stdout.strip() == "None", probe.stdout + probe.stderr
    out = run_example("demo.py", "--orders", "200", env=env)
    assert "orders completed:   200 of 200" in out
    assert "order violations:   0" in out
    assert "result: OK" in out


def test_the_quick_run_tests_cover_every_bench_group() -> None:
    # bench/run.py --quick's groups run one per test, in tests/examples/test_bench_quick_*.py
    sys.path.insert(0, str(ROOT / "bench"))
    import run as bench_run

    groups = [g for part in PARTS.values() for g in part]
    assert sorted(groups) == sorted(bench_run.GROUPS)
    for part in PARTS:
        assert (ROOT / "tests" / "examples" / f"test_bench_quick_{part}.py").is_file()


def test_the_testing_kit_example_passes_as_an_application_s_own_tests() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         str(ROOT / "examples" / "testing_kit.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passed" in proc.stdout


def test_batch_export_drains_the_backlog_once_and_resumes_from_commits() -> None:
    out = run_example("batch_export.py", "--messages", "3000")
    assert "first run: 3000, second run: 0, distinct lines: 3000" in out
    assert "result: OK" in out


def test_dedup_requests_runs_each_lookup_once_and_shares_a_failure() -> None:
    out = run_example("dedup_requests.py", "--requests", "200")
    runs_once = "lookups run: {'apple': 1, 'bread': 1, 'cheese': 1, 'dates': 1, 'eggs': 1}"
    assert f"threads: 200 requests, {runs_once}" in out
    assert f"tasks: 200 requests, {runs_once}, failed: 40 (all ['dates'])" in out
    assert "tasks: dates asked again: 480, lookups of dates run: 2" in out
    assert "result: OK" in out


def test_singleton_job_has_one_holder_at_a_time_through_pause_kill_and_hand_over() -> None:
    out = run_example("singleton_job.py")
    assert "paused (SIGSTOP): " in out and "inaugurated with a higher epoch" in out
    assert "killed (kill -9): " in out and "inaugurated within the broker's lease" in out
    assert "stopped (SIGTERM): handed over;" in out
    assert "terms 4, epochs only grow: True" in out
    assert "result: OK" in out


def test_transactional_outbox_ships_exactly_the_orders_written_through_two_deaths() -> None:
    out = run_example("transactional_outbox.py")
    assert "placed: {'o-1': 'COMMIT_MESSAGE', 'o-2': 'ROLLBACK_MESSAGE', " in out
    assert "order service died after commit of o-3 (exit status 3)" in out
    assert "checked back o-3: COMMIT_MESSAGE" in out
    assert "checked back o-4: ROLLBACK_MESSAGE" in out
    assert "orders the shipping service got: ['o-1', 'o-3']" in out
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
