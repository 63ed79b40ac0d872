"""Retention on a disk shared with other programs, and the cap on the broker's own data,
through the public API.

The disk is simulated (`disk_usage_file`): the test sets what other programs use, the
broker's own files count on top. Retention checks run on the fake clock.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.store.retention import file_probe
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk._transport.broker_client import BrokerClient, PullStatus
from sdk._wire import encode_frame
from sdk.errors import BrokerUnavailableError
from sdk.testing import FakeClock
from tests.component.coordination import join, mq, run
from tests.component.pulling import pull_once
from tests.support import wait_until

TOTAL = 64 << 20
BODY = b"s" * 20_000  # 50 of them fill a 1 MiB segment
SENT = 200  # about 4 segments, 6 % of the simulated disk
QUEUE = mq("t", 0)


def set_disk(path: Path, other_ratio: float) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"total_bytes": TOTAL, "other_used_bytes": int(TOTAL * other_ratio)}))
    os.replace(tmp, path)


def config(tmp_path: Path, max_data_bytes: int | None = None) -> BrokerConfig:
    return BrokerConfig(
        data_dir=tmp_path / "data",
        segment_bytes=1 << 20,
        flush_interval_seconds=0.05,
        disk_usage_file=tmp_path / "disk.json",
        max_data_bytes=max_data_bytes,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def broker(tmp_path: Path, clock: FakeClock) -> Iterator[EmbeddedBroker]:
    set_disk(tmp_path / "disk.json", 0.0)
    with EmbeddedBroker(config(tmp_path), clock=clock) as b:
        yield b


class Count(MessageListenerConcurrently):
    """Counts messages; `done` once `expected` arrived."""

    def __init__(self, expected: int) -> None:
        self.seen = 0
        self.expected = expected
        self.done = threading.Event()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        self.seen += len(msgs)
        if self.seen >= self.expected:
            self.done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


def consume_all(broker: EmbeddedBroker, group: str) -> None:
    """A push consumer of `group` reads the whole queue and commits it."""
    listener = Count(SENT)
    consumer = PushConsumer(
        group,
        broker.address,
        config=PushConsumerConfig(persist_interval=0.1),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
    )
    consumer.subscribe("t", "*")
    consumer.register_message_listener(listener)
    with consumer:
        assert listener.done.wait(30), f"consumed {listener.seen}"
        wait_until(
            lambda: run(broker.address, lambda c: c.query_offset(group, QUEUE)) == SENT,
            30,
            f"{group} to commit everything",
        )


def commit(broker: EmbeddedBroker, group: str, offset: int) -> None:
    async def body(c: BrokerClient) -> None:
        await join(c, f"{group}-member", group)
        await c.commit_offsets(group, f"{group}-member", [(QUEUE, offset, 0)])
        await c.unregister(f"{group}-member")

    run(broker.address, body)


def checked_at(broker: EmbeddedBroker, clock: FakeClock, disk: Path, other: float) -> float:
    """Set the disk and wait for a retention check that saw it; the used ratio it saw."""
    set_disk(disk, other)
    probe = file_probe(disk, broker.config.data_dir)
    seen: list[float] = []

    def saw() -> bool:
        clock.advance(1)  # the broker's retention check sleeps on this clock
        status = run(broker.address, lambda c: c.admin("BrokerStatus"))
        seen.append(status["disk_used_ratio"])
        return abs(seen[-1] - probe().ratio) < 0.002  # the steps here are 0.01 apart

    wait_until(saw, 30, f"a retention check to see other programs at {other:.0%}")
    return seen[-1]


def minimum(broker: EmbeddedBroker) -> int:
    got = pull_once(broker.address, QUEUE, 0)
    return got.next_offset if got.status is PullStatus.OFFSET_ILLEGAL else 0


def test_a_shared_disk_keeps_unread_messages_until_it_is_about_to_fill(
    broker: EmbeddedBroker, clock: FakeClock, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tmp_path / "disk.json"
    run(broker.address, lambda c: c.admin("CreateTopic", topic="t", queue_count=1))
    with Producer(broker.address) as p:
        for _ in range(SENT // 20):
            p.send_batch([Message("t", BODY, sharding_key="k") for _ in range(20)])
    consume_all(broker, "reader")
    commit(broker, "slow", 5)
    caplog.set_level(logging.WARNING, "mockbroker")

    # Other programs fill the disk to ~80 %: over the clean ratio, but slow has not read
    # the old segments. Several checks later nothing is gone.
    for other in (0.73, 0.74, 0.75):
        assert checked_at(broker, clock, disk, other) >= 0.75
    assert minimum(broker) == 0
    assert not [r for r in caplog.records if "before its retention time" in r.getMessage()]

    # About to fill (over the force ratio): the oldest unread segment goes, and the log
    # names the group that lost messages, with how many.
    checked_at(broker, clock, disk, 0.80)
    wait_until(lambda: minimum(broker) > 0, 30, "the oldest segment to be deleted")
    lost = minimum(broker) - 5
    warnings = [r.getMessage() for r in caplog.records if "before its retention time" in
                r.getMessage()]  # fmt: skip
    assert len(warnings) == 1, warnings
    assert "force ratio" in warnings[0] and f"slow ({lost})" in warnings[0]
    assert "reader" not in warnings[0], "reader had read everything"
    assert pull_once(broker.address, QUEUE, minimum(broker)).status is PullStatus.FOUND


def test_segments_every_group_read_go_at_the_clean_ratio_and_a_restart_keeps_the_rule(
    tmp_path: Path, clock: FakeClock
) -> None:
    disk = tmp_path / "disk.json"
    set_disk(disk, 0.0)
    with EmbeddedBroker(config(tmp_path), clock=clock) as broker:
        run(broker.address, lambda c: c.admin("CreateTopic", topic="t", queue_count=1))
        with Producer(broker.address) as p:
            for _ in range(SENT // 20):
                p.send_batch([Message("t", BODY, sharding_key="k") for _ in range(20)])
        consume_all(broker, "reader")
        commit(broker, "slow", 60)  # slow read the first segment and a bit of the next

        set_disk(disk, 0.74)
        wait_until(lambda: clock.advance(1) or minimum(broker) > 0, 30,
                   "the segment every group read to go")  # fmt: skip
        kept = minimum(broker)
        assert 0 < kept <= 60
        for other in (0.73, 0.74):  # the next one holds messages slow has not read
            checked_at(broker, clock, disk, other)
        assert minimum(broker) == kept

    with EmbeddedBroker(config(tmp_path), clock=clock) as broker:  # the offsets come back
        for other in (0.73, 0.74):
            checked_at(broker, clock, disk, other)
        assert minimum(broker) == kept
        assert pull_once(broker.address, QUEUE, kept).status is PullStatus.FOUND
        with Producer(broker.address) as p:
            assert p.send(Message("t", BODY, sharding_key="k")).queue_offset == SENT


def test_the_cap_deletes_oldest_first_refuses_sends_it_cannot_meet_and_accepts_them_after(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    cap = 3 << 20
    set_disk(tmp_path / "disk.json", 0.0)
    caplog.set_level(logging.WARNING, "mockbroker")
    with EmbeddedBroker(config(tmp_path, max_data_bytes=cap), clock=clock) as broker:
        run(broker.address, lambda c: c.admin("CreateTopic", topic="t", queue_count=1))
        due_ms = int((clock.now() + 3600) * 1000)
        later = encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=b"later",
                             deliver_at_ms=due_ms)  # fmt: skip
        run(broker.address, lambda c: c.send("t", 0, later))  # its segment is needed
        with Producer(broker.address) as p:
            for _ in range(SENT // 20):
                p.send_batch([Message("t", BODY, sharding_key="k") for _ in range(20)])
        commit(broker, "slow", 5)

        def status() -> dict[str, object]:
            return run(broker.address, lambda c: c.admin("BrokerStatus"))  # type: ignore[no-any-return]

        wait_until(lambda: clock.advance(1) or status()["sends_refused"], 30,
                   "sends to be refused: the delayed message's segment must stay")  # fmt: skip
        assert minimum(broker) == 0
        with pytest.raises(BrokerUnavailableError) as refused:
            run(broker.address, lambda c: c.send("t", 0, encode_frame(
                msg_id=os.urandom(16), born_timestamp_ms=1, body=b"refused")))  # fmt: skip
        assert refused.value.reason == "DISK_FULL" and refused.value.retriable
        assert "max_data_bytes" in str(refused.value), refused.value

        clock.advance(3600)  # delivered: the old segments may go, oldest first
        wait_until(lambda: clock.advance(1) or not status()["sends_refused"], 30,
                   "sends to be accepted again")  # fmt: skip
        status_now = status()
        assert isinstance(status_now["commit_log_bytes"], int)
        assert status_now["commit_log_bytes"] <= cap
        first = minimum(broker)
        assert first > 5
        warnings = [r.getMessage() for r in caplog.records
                    if "before its retention time" in r.getMessage()]  # fmt: skip
        assert warnings and all("max_data_bytes" in w for w in warnings)
        assert "slow (" in warnings[0], "slow had not read the first segment"
        with Producer(broker.address) as p:
            assert p.send(Message("t", BODY, sharding_key="k")).queue_offset == SENT + 1

    with EmbeddedBroker(config(tmp_path, max_data_bytes=cap), clock=clock) as broker:
        assert minimum(broker) == first, "a restart keeps what was kept"
        assert pull_once(broker.address, QUEUE, first).status is PullStatus.FOUND
        with Producer(broker.address) as p:
            assert p.send(Message("t", BODY, sharding_key="k")).queue_offset == SENT + 2
