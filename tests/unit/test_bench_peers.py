"""bench/peers (make bench-peers): the callers' inputs and the peers table (issue 35)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from sdk import shard_index
from tests.support import ROOT

sys.path.append(str(ROOT / "bench" / "peers"))  # the harness's imports (workload, servers)

import workload as pwl

PEERS = ROOT / "bench" / "peers"


def peers_run() -> ModuleType:
    """bench/peers/run.py, by path: bench/run.py is the module `run` of other tests."""
    spec = importlib.util.spec_from_file_location("bench_peers_run", PEERS / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_single_sends_take_the_keys_in_arrival_order_over_every_queue() -> None:
    singles = pwl.arrivals(2_500)
    assert len(singles) == 2_500
    assert [key for key, _, _ in singles[:3]] == ["key-0000", "key-0001", "key-0002"]
    assert singles[1_000][0] == "key-0000" and singles[1_000][2] == singles[0][2]
    assert all(queue == shard_index(key, pwl.QUEUES) for key, queue, _ in singles)
    assert len({queue for _, queue, _ in singles[: pwl.QUEUES * 4]}) > 1  # not one queue
    assert all(len(body) == pwl.BODY_BYTES for _, _, body in singles)


def test_each_caller_sends_its_keys_and_no_key_has_two_callers() -> None:
    singles = pwl.arrivals(2_000)
    shares = pwl.per_caller(singles)
    assert len(shares) == pwl.CALLERS == 8
    assert sorted(s for share in shares for s in share) == sorted(singles)
    assert shares[1][:2] == [singles[1], singles[9]]  # message i is caller i % 8's
    owners: dict[str, set[int]] = {}
    for c, share in enumerate(shares):
        for key, _, _ in share:
            owners.setdefault(key, set()).add(c)
    assert all(len(callers) == 1 for callers in owners.values())


def test_the_peers_table_shows_redis_8_callers_beside_its_produce() -> None:
    run = peers_run()
    redis, nats = run.peers()[0], run.peers()[3]
    redis.runs = [
        {"produce": 70_000.0, "produce_callers": 6_000.0, "consume": 1.0, "rss_mb": 20.0},
        {"produce": 72_000.0, "produce_callers": 7_000.0, "consume": 1.0, "rss_mb": 20.0},
    ]
    nats.runs = [{"produce": 30_000.0, "consume": 1.0}]
    lines = run.table([redis, nats], latency=False).splitlines()
    head = lines[0].split("  ")
    assert [c.strip() for c in head if c.strip()][2:4] == ["produce/s", "8 callers/s"]
    redis_row, nats_row = lines[2], lines[3]
    assert "71,000" in redis_row and "6,500" in redis_row  # medians of the two runs
    column_end = lines[0].index("8 callers/s") + len("8 callers/s")
    assert redis_row[:column_end].endswith("6,500")
    assert nats_row[:column_end].endswith("-")  # not measured for the others
