"""bench/peers' Redis 8-caller figure against a real redis-server (issue 35): the callers
have a connection each, and every message is stored once, in its key's stream."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT

PEERS = ROOT / "bench" / "peers"
sys.path.append(str(PEERS))  # the harness's own imports (install, servers, workload)

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or importlib.util.find_spec("redis") is None,
    reason="redis-server or the redis client is not installed (make bench-peers installs them)",
)


@pytest.fixture
def redis_port(tmp_path: Path) -> Iterator[int]:
    import servers

    server, port = servers.start_redis(tmp_path, "everysec")
    try:
        yield port
    finally:
        server.stop()


def test_8_callers_on_a_connection_each_store_every_message_in_its_stream(redis_port: int) -> None:
    import redis_streams as rs
    import workload as pwl

    client = rs.connect(redis_port)
    try:
        before = client.info("stats")["total_connections_received"]
        singles = pwl.arrivals(1_600)
        assert rs.produce_callers(redis_port, singles) > 0
        assert client.info("stats")["total_connections_received"] - before == pwl.CALLERS
        stored: list[tuple[str, int, bytes]] = []
        for q in range(pwl.QUEUES):
            for _, fields in client.xrange(rs.stream(q)):
                stored.append((fields[b"k"].decode(), q, fields[b"b"]))
        assert sorted(stored) == sorted(singles)  # each message once, in its key's stream
    finally:
        client.close()
