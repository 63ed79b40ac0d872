"""bench/run.py --quick, one bench group per test (the test files test_bench_quick_*.py).

The groups used to run in one test of about 50 s, the suite's slowest, which held one
xdist worker while the other had nothing left to do. Each group now runs on its own (the
same options: --quick on 2 000 messages instead of --quick's 20 000: the figures are only
checked to be there, and the groups' fixed costs, brokers and paced latency runs, stay),
and the groups are split over four files so that --dist loadfile spreads them over both
workers. Seconds per group (bench/run.py's facts, 2 cores): remoting 14.6, latency 5.9,
tls 6.1, dedup 6.0, stream 6.0, send 5.5, produce 4.7, receive 4.0, transports 4.0,
consume 1.0, pull 0.8, poll 0.8, floor 0.6, micro 0.1.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import ROOT

#: The groups of each file test_bench_quick_<part>.py, about 10-15 s a file; together
#: every group of bench/run.py's GROUPS (tests/examples/test_examples.py checks it).
PARTS: dict[str, tuple[str, ...]] = {
    "remoting": ("remoting",),
    "produce": ("produce", "send", "receive"),
    "latency": ("latency", "pull", "consume", "keymode", "poll", "stream", "floor", "micro"),
    "tls": ("tls", "transports", "dedup"),
}


def quick_run(group: str, tmp_path: Path, *options: str) -> dict[str, Any]:
    """Runs bench/run.py --quick on `group` alone; its JSON report, checked as a whole."""
    out = tmp_path / "quick.json"
    script = str(ROOT / "bench" / "run.py")
    proc = subprocess.run(
        [sys.executable, script, "--quick", "--messages", "2000", "--quiet", "--only", group,
         "--output", str(out), *options],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["options"]["groups"] == [group]
    assert f"{group}_seconds" in report["facts"], report["facts"]  # the group ran
    check = CHECKS.get(group)
    if check is not None:
        check(report["figures"], report["facts"])
    return report


def _produce(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    produce = [f for f in figures if f["title"].startswith("produce")]
    assert len(produce) == 6 and all(f["median"] > 0 for f in produce)  # 2 of them mixed
    # the keyed workload (issue 35): mixed batches and 8 callers' single sends, sync and
    # async, each with its ratios (to the floor only when the floor group ran too: the
    # unit tests of bench/figures.py check that ratio)
    callers = [
        f
        for f in figures
        if f["key"].startswith("produce.") and ("callers" in f["key"] or "threads" in f["key"])
    ]
    assert len(callers) == 4 and all(f["median"] > 0 for f in callers)  # asyncio, threads
    keyed = facts["keyed_ratios"]
    assert len(keyed) == 6 and all(r["median"] > 0 for r in keyed.values())
    assert sum(r["vs_one_queue"] is not None for r in keyed.values()) == 2
    # Redis measured in the run (where it is installed): its 8 callers beside its pipelines,
    # and the 8-caller rows read against both
    redis = facts["keyed_redis"]
    if redis is not None and redis["source"].startswith("this run"):
        assert redis["produce"] > 0 and redis["produce_callers"] > 0
        callers_ratios = [r for key, r in keyed.items() if "callers" in key or "threads" in key]
        assert all(r["vs_redis"] and r["vs_redis_callers"] for r in callers_ratios)


def _transports(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # produce and orderly consume over gRPC and rocketmq:// (issue 33), unless skipped
    transports = [f for f in figures if f["key"].startswith("transports.")]
    if "transports_skipped" not in facts:
        assert len(transports) == 6 and all(f["median"] > 0 for f in transports)
        # a mixed-key batch against a one-queue batch, per transport (issue 35)
        costs = facts["transports_mixed_over_one_queue"]
        assert sorted(costs) == ["grpc", "rocketmq"] and all(r > 0 for r in costs.values())


def _tls(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
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


def _receive(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # receive + ack by 8 workers, both faces, and a poll loop on the same backlog (issue 36)
    receive = {f["key"]: f for f in figures if f["key"].startswith("receive.")}
    assert sorted(receive) == ["receive.aio", "receive.blocking", "receive.poll_aio"]
    assert all(f["median"] > 0 for f in receive.values())


def _consume(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # each consumer face with pull delivery and with push delivery, the runs taking turns,
    # and push's ratio to pull per face (issue 40)
    faces = ["orderly.async.batch1", "orderly.async.batch32", "orderly.threads.batch1",
             "orderly.threads.batch32", "concurrent.async.batch32"]  # fmt: skip
    consume = {f["key"]: f for f in figures if f["key"].startswith("consume.")}
    assert sorted(consume) == sorted(
        f"consume.{face}{way}" for face in faces for way in ("", ".push")
    )
    assert all(f["median"] > 0 for f in consume.values())
    assert {f["params"]["delivery"] for f in consume.values()} == {"pull", "push"}
    assert sorted(facts["consume_push_over_pull"]) == sorted(faces)
    assert all(r > 0 for r in facts["consume_push_over_pull"].values())


def _poll(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # both poll loops with push delivery (the default) and with pull, push's ratio to pull;
    # and the blocking one handing each message to the orderly figure's listener
    poll = {f["key"]: f for f in figures if f["key"].startswith("poll.")}
    assert sorted(poll) == sorted(
        [f"poll.{face}{way}" for face in ("aio", "blocking") for way in ("", ".pull")]
        + ["poll.blocking.listener"]
    )
    assert all(f["median"] > 0 for f in poll.values())
    assert {f["params"]["delivery"] for f in poll.values()} == {"pull", "push"}
    assert sorted(facts["poll_push_over_pull"]) == ["poll.aio", "poll.blocking"]
    assert all(r > 0 for r in facts["poll_push_over_pull"].values())


def _keymode(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # 5 ms listeners in queue mode and in key mode, and their ratio; each mode's send-to-call
    # latency at a paced rate, and the p99 ratio (issue 20)
    keymode = {f["key"]: f for f in figures if f["key"].startswith("keymode.")}
    assert sorted(keymode) == [
        "keymode.async.key", "keymode.async.queue",
        "keymode.latency.key.p50", "keymode.latency.key.p99",
        "keymode.latency.queue.p50", "keymode.latency.queue.p99",
        "keymode.threads.key", "keymode.threads.queue",
    ]  # fmt: skip
    assert all(f["median"] > 0 for f in keymode.values())
    assert set(facts["keymode_ratios"]) == {"async", "threads"}
    assert facts["keymode_p99_ratio"] > 0


def _latency(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # end-to-end latency through each consumer face, push delivery next to pull (issue 40)
    e2e = {f["key"] for f in figures if f["key"].startswith("latency.e2e.")}
    for face in ("blocking", "aio", "push"):
        assert {k for k in e2e if k.startswith(f"latency.e2e.{face}.")} == {
            f"latency.e2e.{face}.rate{rate}.{what}"
            for rate in (500, 2000)
            for what in ("p50", "p99", "sent")
        }, face
    # the same with the producer in a process of its own, each face at 2 000 and 20 000
    # msg/s (async flush) and the push face at 2 000 with sync flush, read against Redis
    # Streams when it is installed (issue 40)
    procs = {f["key"]: f for f in figures if f["key"].startswith("latency.e2e_procs.")}
    faces = ("push", "concurrent", "litepull")
    names = [
        f"latency.e2e_procs.{face}.async.rate{rate}" for face in faces for rate in (2000, 20000)
    ]
    names.append("latency.e2e_procs.push.sync.rate2000")
    assert sorted(procs) == sorted(f"{n}.{what}" for n in names for what in ("p50", "p99", "sent"))
    assert all(f["median"] > 0 and f["params"]["separate_processes"] for f in procs.values())
    assert list(facts["e2e_procs"]) == names
    if "e2e_procs_redis_skipped" not in facts:
        assert all(row["p99_vs_redis"] for row in facts["e2e_procs"].values())


def _stream(figures: list[dict[str, Any]], facts: dict[str, Any]) -> None:
    # ExchangeBatched against plain Exchange (issues 35 and 40): the 8 callers with and
    # without an accumulator, e2e latency through the pull and push aio consumers, each
    # both ways, the ratios of the same run and the requests each stream message carried
    workloads = ["callers8", "callers8.unbatched"] + [
        f"e2e.{face}.rate2000.{q}" for face in ("aio", "push") for q in ("p50", "p99")
    ]
    stream = {f["key"]: f for f in figures if f["key"].startswith("stream.")}
    assert sorted(stream) == sorted(
        f"stream.{m}.{w}" for m in ("batched", "plain") for w in workloads
    )
    assert all(f["median"] > 0 for f in stream.values())
    ratios = facts["stream_ratios"]
    assert sorted(ratios) == sorted(workloads)
    assert all(r["value"] and r["client_us_per_msg"] and r["broker_us_per_msg"]
               for r in ratios.values())  # fmt: skip
    carried = facts["stream_requests_per_message"]
    assert sorted(carried) == ["callers8", "callers8.unbatched", "e2e.aio", "e2e.push"]
    for modes in carried.values():
        assert modes["plain"] == 1.0 and modes["batched"] >= 1.0, carried


#: What each group's figures must show, beyond the run succeeding (the groups not named
#: here were, and are, checked by the run's success alone).
CHECKS = {
    "produce": _produce,
    "transports": _transports,
    "tls": _tls,
    "receive": _receive,
    "consume": _consume,
    "poll": _poll,
    "keymode": _keymode,
    "latency": _latency,
    "stream": _stream,
}
