"""bench/e2e_procs.py: end-to-end latency with the producer in a process of its own
(issue 40): the clock the processes share, the orders to the producer process and its
answers, and the figures read against Redis Streams'."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import e2e_procs as ep


def test_a_child_process_reads_the_same_perf_counter_as_its_parent() -> None:
    # the body's send time is taken in the producer's process and read in the consumer's
    before = time.perf_counter_ns()
    out = subprocess.run(
        [sys.executable, "-c", "import time; print(time.perf_counter_ns())"],
        capture_output=True,
        text=True,
        check=True,
    )
    after = time.perf_counter_ns()
    assert before < int(out.stdout) < after


def test_an_order_is_one_json_line_the_producer_reads_back() -> None:
    line = ep.command("bench-e2e-procs-push-async", 20000, 100_000)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {
        "topic": "bench-e2e-procs-push-async",
        "rate": 20000,
        "count": 100_000,
    }


def test_the_producer_s_answer_is_its_details_as_floats() -> None:
    answer = json.dumps({"sent_rate": 14258.2, "peak_sends_in_flight": 64, "producer_cpu": 0.9})
    assert ep.parse_answer(answer.encode() + b"\n") == {
        "sent_rate": 14258.2,
        "peak_sends_in_flight": 64.0,
        "producer_cpu": 0.9,
    }


@pytest.mark.parametrize(
    ("line", "says"),
    [(b"", "ended without answering"), (b'{"error": "x"}\n', "not a producer answer")],
)
def test_anything_but_an_answer_is_an_error(line: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        ep.parse_answer(line)


def test_the_plan_has_every_face_at_both_rates_async_and_the_push_face_sync() -> None:
    plan = ep.plan()
    assert len(plan) == len(set(plan))
    assert {(f, r) for f, flush, r in plan if flush == "async"} == {
        (face, rate) for face in ("push", "concurrent", "litepull") for rate in (2000, 20000)
    }
    assert [(f, r) for f, flush, r in plan if flush == "sync"] == [("push", 2000)]


REDIS = {
    "everysec": {
        2000: {"e2e_p50_ms": 0.5, "e2e_p99_ms": 2.0, "e2e_sent_rate": 1999.0},
        20000: {"e2e_p50_ms": 1.0, "e2e_p99_ms": 4.0, "e2e_sent_rate": 12000.0},
    },
    "always": {2000: {"e2e_p50_ms": 2.0, "e2e_p99_ms": 8.0, "e2e_sent_rate": 1100.0}},
}


def _medians(name: str, p50: float, p99: float, sent: float) -> dict[str, float]:
    return {f"{name}.p50": p50, f"{name}.p99": p99, f"{name}.sent": sent}


def test_each_figure_reads_against_redis_at_its_rate_and_flush_setting() -> None:
    medians = {
        **_medians("latency.e2e_procs.push.async.rate2000", 1.0, 3.0, 2001.0),
        **_medians("latency.e2e_procs.litepull.async.rate20000", 5.0, 12.0, 9000.0),
        **_medians("latency.e2e_procs.push.sync.rate2000", 4.0, 8.0, 1998.0),
    }
    rows = ep.ratios(medians, REDIS)
    assert list(rows) == [  # plan order; figures not measured are left out
        "latency.e2e_procs.push.async.rate2000",
        "latency.e2e_procs.litepull.async.rate20000",
        "latency.e2e_procs.push.sync.rate2000",
    ]
    assert rows["latency.e2e_procs.push.async.rate2000"] == {
        "sent_rate": 2001.0,
        "p50": 1.0,
        "p50_vs_redis": 2.0,
        "p99": 3.0,
        "p99_vs_redis": 1.5,
        "redis_sent_rate": 1999.0,
    }
    litepull = rows["latency.e2e_procs.litepull.async.rate20000"]
    assert (litepull["p50_vs_redis"], litepull["p99_vs_redis"]) == (5.0, 3.0)
    sync = rows["latency.e2e_procs.push.sync.rate2000"]  # against appendfsync always
    assert (sync["p50_vs_redis"], sync["p99_vs_redis"], sync["redis_sent_rate"]) == (
        2.0,
        1.0,
        1100.0,
    )


def test_without_redis_the_figures_stay_and_the_ratios_are_none() -> None:
    medians = _medians("latency.e2e_procs.concurrent.async.rate20000", 6.0, 9.0, 12000.0)
    row = ep.ratios(medians, {})["latency.e2e_procs.concurrent.async.rate20000"]
    assert (row["p50"], row["p99"], row["sent_rate"]) == (6.0, 9.0, 12000.0)
    assert row["p50_vs_redis"] is row["p99_vs_redis"] is row["redis_sent_rate"] is None


def test_the_table_shows_each_figure_redis_beside_and_why_redis_is_missing() -> None:
    medians = _medians("latency.e2e_procs.push.async.rate20000", 2.0, 8.0, 14258.0)
    lines = ep.comparison(ep.ratios(medians, REDIS), REDIS, None).splitlines()
    assert lines[2].split() == ["push", "async", "20,000", "14,258", "2.00", "8.00", "2.00", "2.00"]
    assert lines[3].split() == ["redis", "everysec", "2,000", "1,999", "0.50", "2.00"]
    assert len(lines) == 6
    missing = ep.comparison(ep.ratios(medians, {}), {}, "redis-server is not installed")
    assert missing.splitlines()[2].split()[-2:] == ["-", "-"]
    assert (
        missing.splitlines()[-1]
        == "note: Redis Streams not measured: redis-server is not installed"
    )
    assert ep.comparison({}, REDIS, None) == ""
