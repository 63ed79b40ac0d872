"""A producer killed with -9 loses nothing it accepted into its spool."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.component.pulling import read_topic
from tests.support import ROOT, BrokerProcess

pytestmark = [pytest.mark.system, pytest.mark.chaos]

SCRIPT = str(ROOT / "tests" / "system" / "spool_producer.py")
COUNT = 2000


def producer(broker: str, spool: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, SCRIPT, "--broker", broker, "--spool", str(spool), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@pytest.mark.parametrize("broker_up_before_the_kill", [False, True])
def test_a_restarted_producer_delivers_what_its_killed_predecessor_spooled(
    tmp_path: Path, broker_up_before_the_kill: bool
) -> None:
    spool = tmp_path / "spool"
    broker = BrokerProcess(tmp_path / "broker")
    address = broker.start()
    if not broker_up_before_the_kill:
        broker.terminate()  # its address stays: the producer sends into the void
    first = producer(address, spool, "--count", str(COUNT))
    try:
        assert first.stdout is not None
        assert first.stdout.readline().strip() == f"spooled {COUNT}"
    finally:
        first.kill()
        first.wait()
    if not broker_up_before_the_kill:
        broker = BrokerProcess(tmp_path / "broker", "--port", address.rsplit(":", 1)[1])
        address = broker.start()
    try:
        second = producer(address, spool, "--drain")
        out, err = second.communicate(timeout=120)
        assert second.returncode == 0 and "drained" in out, err
        messages = read_topic(address, "spooled")
    finally:
        broker.terminate()
    bodies = [m.body.decode() for m in messages]
    assert set(bodies) == {f"k{i % 11}:{i // 11}" for i in range(COUNT)}, "nothing accepted lost"
    per_key: dict[str, list[int]] = defaultdict(list)
    for body in bodies:
        key, seq = body.split(":")
        per_key[key].append(int(seq))
    for key, seqs in per_key.items():
        first_seen = list(dict.fromkeys(seqs))
        assert first_seen == sorted(first_seen), f"{key} out of order"
    print(f"duplicates: {len(bodies) - len(set(bodies))}")
