"""Delayed messages survive kill -9: none lost, none early, none twice."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from sdk import Message, Producer
from tests.component.pulling import read_topic
from tests.support import BrokerProcess, wait_until

pytestmark = [pytest.mark.system, pytest.mark.chaos]


def test_a_thousand_pending_delayed_messages_survive_kill_9(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    broker = BrokerProcess(tmp_path, "--flush-mode", "sync")
    address = broker.start()
    due_ms: dict[str, int] = {}
    with Producer(address) as producer:
        producer.fetch_publish_message_queues("later")
        for start in range(0, 1000, 100):
            delays = [rng.uniform(2.0, 4.0) for _ in range(100)]
            now = time.time()
            batch = [
                Message("later", b"m%d" % (start + i), sharding_key=f"k{i % 20}", delay_seconds=d)
                for i, d in enumerate(delays)
            ]
            for result, delay in zip(producer.send_batch(batch), delays, strict=True):
                due_ms[result.msg_id] = int((now + delay) * 1000)
    assert len(due_ms) == 1000
    broker.kill9()
    (tmp_path / "checkpoint").unlink(missing_ok=True)  # recovery replays the whole log

    restarted = BrokerProcess(tmp_path)
    address = restarted.start()
    try:
        early = [m for m in read_topic(address, "later") if m.store_timestamp < due_ms[m.msg_id]]
        assert not early, f"seed {seed}: delivered before due: {early[:3]}"
        wait_until(lambda: len(read_topic(address, "later")) >= 1000, timeout=30, what="deliveries")
        got = read_topic(address, "later")
        ids = [m.msg_id for m in got]
        assert len(ids) == len(set(ids)) == 1000, f"seed {seed}: {len(ids)} delivered"
        assert set(ids) == set(due_ms)
        late = [m for m in got if m.store_timestamp < due_ms[m.msg_id]]
        assert not late, f"seed {seed}: early deliveries {late[:3]}"
    finally:
        restarted.terminate()


def test_kill_9_right_after_the_start_up_mark_is_written_loses_and_repeats_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker dies as kill -9 would just after its first schedule-mark write, which
    # follows the first deliveries; the rest are delivered after the restart, once each.
    monkeypatch.setenv("ORDERMQ_FAULT_POINT", "schedule-mark-written")
    broker = BrokerProcess(tmp_path)
    address = broker.start()
    sent: set[str] = set()
    with Producer(address) as producer:
        producer.fetch_publish_message_queues("later")
        for delay in (0.5, 3.0, 6.0):
            batch = [Message("later", b"m%d" % i, delay_seconds=delay) for i in range(100)]
            sent.update(r.msg_id for r in producer.send_batch(batch))
    assert broker.proc is not None
    wait_until(lambda: broker.proc is not None and broker.proc.poll() is not None, 60,
               "the broker to die after writing the mark")  # fmt: skip
    assert broker.proc.returncode == -9
    assert (tmp_path / "schedule-mark").exists()
    monkeypatch.delenv("ORDERMQ_FAULT_POINT")
    address = broker.restart()
    try:
        wait_until(lambda: len(read_topic(address, "later")) >= 300, timeout=60, what="deliveries")
        ids = [m.msg_id for m in read_topic(address, "later")]
        assert len(ids) == len(set(ids)), "none delivered twice"
        assert set(ids) == sent, "none lost"
    finally:
        assert broker.terminate() == 0, broker.stderr()
