"""Power cuts: what the broker promises survives losing everything that was not fsynced.

kill -9 (tests/system/test_crash_recovery.py) keeps the page cache, so it cannot tell a
write that reached the disk from one that did not. Here the broker runs traced by
tools/powerloss (tests/system/powerloss.py) and each kill is a power cut: the data directory
is rebuilt as a disk would hold it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from mockbroker.store.checkpoint import read_checkpoint
from sdk import Message, Producer, ProducerConfig
from tests.support import BrokerProcess, wait_until
from tests.system.powerloss import PowerGrid, bad_log_lines
from tests.system.test_crash_recovery import QUEUES, TOPIC, read_topic

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]


def check_clean(broker: BrokerProcess) -> None:
    bad = bad_log_lines(broker.stderr())
    assert not bad, "the broker logged errors:\n" + "\n".join(bad[:20])


def test_a_new_topics_queues_survive_a_power_cut_after_a_checkpoint(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    # A checkpoint says every index entry below it is durable, so recovery replays only the
    # commit log after it: the index files must then exist, with their names synced.
    grid = PowerGrid(tmp_path)
    args = ("--flush-mode", "sync", "--default-queues", str(QUEUES))
    broker = start_broker(grid.data, *args, env=grid.arm())
    with Producer(broker.address, config=ProducerConfig(retry_times=0)) as producer:
        sent = [producer.send(Message(TOPIC, f"m{i}".encode(), keys=f"m{i}")) for i in range(8)]
    checkpoint = grid.data / "checkpoint"
    wait_until(lambda: read_checkpoint(checkpoint).position > 0, 10, "a checkpoint after the sends")
    grid.cut(broker, "synced", random.Random(0))
    broker = start_broker(grid.data, *args)
    queues, recovered = read_topic(broker.address)
    assert recovered
    stored = {(q, m.queue_offset): m.body for q, c in queues.items() for m in c.messages}
    for i, result in enumerate(sent):
        assert stored.get((result.queue.queue_id, result.queue_offset)) == f"m{i}".encode()
    check_clean(broker)
