"""bench/run.py's report leads with the keyed workload (issue 35): its table and ratios."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run
import workloads as wl
from figures import (
    KEYED_KEYS,
    Figure,
    PeerFigure,
    Run,
    consume_line,
    consume_ratios,
    keyed_ratios,
    keyed_table,
    peer_produce,
)


def figure(key: str, *values: float, server_cpu: float | None = None) -> Figure:
    f = Figure(key, f"title of {key}", "msg/s", {})
    f.runs = [Run(v, 1.0, int(v), client_cpu=0.5, server_cpu=server_cpu) for v in values]
    return f


def figures() -> list[Figure]:
    return [
        figure("produce.async.inflight1", 50_000, 40_000, 60_000),
        figure("produce.async.mixed.inflight1", 45_000, 40_000, 50_000, server_cpu=0.9),
        figure("produce.sync.mixed.inflight1", 30_000, server_cpu=0.6),
        figure("produce.async.mixed.callers8", 8_000, 6_000, 10_000, server_cpu=0.8),
        figure("floor.send.inflight1", 1_000, 900, 1_100),
    ]


def test_the_keyed_figures_read_against_the_floor_redis_and_the_one_queue_batch() -> None:
    redis = PeerFigure("redis-everysec", 90_000, "peers.json (then)", callers=6_400)
    ratios = keyed_ratios(figures(), redis)
    assert list(ratios) == [
        "produce.async.mixed.inflight1",
        "produce.sync.mixed.inflight1",
        "produce.async.mixed.callers8",
    ]
    batch = ratios["produce.async.mixed.inflight1"]
    assert batch["median"] == 45_000
    assert batch["vs_floor"] == 0.45  # the floor moves 1 000 payloads x 100 messages a second
    assert batch["vs_redis"] == 0.5
    assert batch["vs_one_queue"] == 0.9
    assert batch["server_cpu_us_per_msg"] == 20.0  # 0.9 of a core over 45 000 msg/s
    assert ratios["produce.sync.mixed.inflight1"]["vs_one_queue"] is None  # not measured
    callers = ratios["produce.async.mixed.callers8"]
    assert callers["vs_one_queue"] is None
    # 8 callers read against Redis's 8 callers (same shape) and its pipelined batches
    assert callers["vs_redis_callers"] == 1.25
    assert callers["vs_redis"] == 0.089
    assert batch["vs_redis_callers"] is None  # a batch is not the callers' shape
    without = keyed_ratios(figures(), PeerFigure("redis-everysec", 90_000, "old peers.json"))
    assert without["produce.async.mixed.callers8"]["vs_redis_callers"] is None


def test_the_table_lists_the_keyed_figures_with_their_ratios_and_sources() -> None:
    redis = PeerFigure("redis-everysec", 90_000, "peers.json (then)", callers=6_400)
    lines = keyed_table(figures(), redis).splitlines()
    assert lines[0].split()[:2] == ["keyed", "workload"]
    assert "vs gRPC floor" in lines[0]
    assert "vs Redis pipelined" in lines[0] and "vs Redis 8 callers" in lines[0]
    rows = {line.split("  ")[0]: line for line in lines[2:5]}
    batch = rows["title of produce.async.mixed.inflight1"]
    assert "45,000" in batch and "20.00 us/msg" in batch
    assert batch.split()[-3:] == ["0.45x", "0.50x", "0.90x"]
    callers = rows["title of produce.async.mixed.callers8"]
    assert callers.split()[-3:] == ["0.08x", "0.09x", "1.25x"]
    # each ratio under its own column: the same-shape one under "vs Redis 8 callers"
    assert callers.index("1.25x") + 5 == lines[0].index("vs Redis 8 callers") + 18
    assert "100,000 msg/s" in lines[5]  # the floor, in messages
    assert lines[6] == (
        "Redis Streams (AOF everysec), from peers.json (then): pipelines of 100 XADD "
        "90,000 msg/s; 8 callers (redis.asyncio, one process, each XADD awaiting its reply "
        "before the caller's next) 6,400 msg/s"
    )


def test_redis_results_without_the_callers_figure_say_so_under_the_callers_rows() -> None:
    old = PeerFigure("redis-everysec", 90_000, "peers.json (then)")
    lines = keyed_table(figures(), old).splitlines()
    rows = {line.split("  ")[0]: line for line in lines[2:5]}
    assert rows["title of produce.async.mixed.callers8"].endswith("0.09x  - (make bench-peers)")
    assert "- (make bench-peers)" not in rows["title of produce.async.mixed.inflight1"]
    assert lines[6].endswith("not in those results (measured since: `make bench-peers`)")


def test_without_redis_or_floor_the_table_says_where_to_get_them() -> None:
    only_keyed = [f for f in figures() if f.key in KEYED_KEYS]
    text = keyed_table(only_keyed, None)
    assert "- (make bench-peers)" in text.splitlines()[2]
    assert "floor group did not run" in text
    assert "`make bench-peers` installs and measures it" in text
    assert keyed_table([figure("produce.async.inflight1", 1)], None) == ""


def test_redis_comes_from_a_peers_results_file(tmp_path: Path) -> None:
    path = tmp_path / "peers.json"
    peers = {
        "redis-everysec": {"skipped": None, "median": {"produce": 104_000.0}},
        "redis-always": {"skipped": None, "median": {"produce": 80_000.0}},
        "nats": {"skipped": "missing nats-server", "median": {}},
    }
    path.write_text(json.dumps({"timestamp": "2026-11-27T07:00:00", "peers": peers}))
    assert peer_produce(path) == PeerFigure(
        "redis-everysec", 104_000.0, "peers.json (2026-11-27T07:00:00)"
    )
    # what bench/peers/run.py writes: its time under "when", the 8 callers' figure too
    peers["redis-everysec"]["median"]["produce_callers"] = 6_400.0
    peers["redis-everysec"]["median"]["consume"] = 150_000.0
    path.write_text(json.dumps({"when": "2026-11-27T08:00:00+00:00", "peers": peers}))
    assert peer_produce(path) == PeerFigure(
        "redis-everysec", 104_000.0, "peers.json (2026-11-27T08:00:00+00:00)", 6_400.0, 150_000.0
    )
    assert peer_produce(path, "nats") is None
    assert peer_produce(tmp_path / "missing.json") is None


def test_the_run_falls_back_to_the_last_peers_results_without_redis_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    peers = {"redis-everysec": {"median": {"produce": 100_000.0}}}
    (results / "peers.json").write_text(json.dumps({"timestamp": "t", "peers": peers}))
    monkeypatch.setattr(bench_run, "RESULTS", results)
    monkeypatch.setattr(bench_run.shutil, "which", lambda name: None)
    args = bench_run.parse_args(["--only", "produce"])
    said: list[str] = []
    found = bench_run.redis_reference(args, tmp_path, said.append)
    assert found == PeerFigure("redis-everysec", 100_000.0, "peers.json (t)")
    (results / "peers.json").unlink()
    assert bench_run.redis_reference(args, tmp_path, said.append) is None


def test_eight_callers_send_their_keys_in_arrival_order_one_after_another() -> None:
    class Recorder:
        def __init__(self) -> None:
            self.sent: list[str] = []
            self.outstanding = 0
            self.most = 0

        async def send(self, message: Any) -> None:
            self.outstanding += 1
            self.most = max(self.most, self.outstanding)
            await asyncio.sleep(0)
            self.outstanding -= 1
            self.sent.append(message.sharding_key)

    producer = Recorder()
    singles = wl.make_singles(2_000)
    assert asyncio.run(wl.send_from_callers(producer, "t", singles)) == 2_000  # type: ignore[arg-type]
    assert producer.most == wl.CALLERS  # one send in flight per caller
    assert sorted(producer.sent) == sorted(singles.keys[i % wl.KEYS] for i in range(2_000))
    for key in ("key-0000", "key-0007", "key-0999"):
        assert producer.sent.count(key) == 2  # each key twice, from its one caller


def test_the_consume_figures_read_against_redis_group_read() -> None:
    """Issue 40 asks for consume rates as ratios to Redis Streams, from one run."""
    measured = [
        figure("consume.orderly.async.batch1", 60_000, 50_000),
        figure("consume.orderly.async.batch1.push", 240_000),  # push delivery's face
        figure("poll.aio", 90_000),
        figure("produce.async.mixed.inflight1", 45_000),
    ]
    redis = PeerFigure("redis-everysec", 90_000, "this run", consume=120_000)
    assert consume_ratios(measured, redis) == {
        "consume.orderly.async.batch1": 0.458,  # the median of 60 000 and 50 000
        "consume.orderly.async.batch1.push": 2.0,
        "poll.aio": 0.75,
    }
    line = consume_line(measured, redis)
    assert "120,000 msg/s" in line and "title of poll.aio 0.75x" in line
    assert consume_ratios(measured, PeerFigure("redis-everysec", 90_000, "old")) == {}
    assert consume_line(measured, None) == ""
