"""The lite pull consumer: every call, against an in-process broker."""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

import sdk.aio
from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    MessageExt,
    MessageQueue,
    Producer,
    shard_index,
)
from sdk.errors import (
    ClientStateError,
    InvalidArgumentError,
    InvalidOffsetError,
    InvalidQueueError,
    TopicNotFoundError,
)
from sdk.testing import FakeClock
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over
from tests.support import wait_until


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    """The broker, reached over each transport in turn (tests/component/transports.py)."""
    with broker_over(request.param, tmp_path / "broker") as b:
        yield b


def fill(broker: BrokerOver, n: int, keys: int = 8, start: int = 0) -> list[MessageQueue]:
    with Producer(broker.address) as p:
        msgs = [Message("orders", f"{i % keys}:{i // keys}".encode(), sharding_key=f"k{i % keys}")
                for i in range(start, start + n)]  # fmt: skip
        for i in range(0, n, 500):
            p.send_batch(msgs[i : i + 500])
        return p.fetch_publish_message_queues("orders")


def drain(c: LitePullConsumer, n: int, timeout: float = 20) -> list[MessageExt]:
    out: list[MessageExt] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += c.poll(timeout=0.5)
    return out


def new(broker: BrokerOver, **kw: object) -> LitePullConsumer:
    kw.setdefault("consume_from_where", ConsumeFromWhere.FIRST_OFFSET)
    return LitePullConsumer("batch", broker.address, **kw)  # type: ignore[arg-type]


def test_poll_returns_every_message_once_in_queue_order(broker: BrokerOver) -> None:
    fill(broker, 2000)
    c = new(broker)
    c.subscribe("orders")
    with c:
        got = drain(c, 2000)
        assert c.poll(timeout=0.05) == []
    assert len(got) == 2000 and len({m.msg_id for m in got}) == 2000
    per_queue: dict[MessageQueue, list[int]] = defaultdict(list)
    for m in got:
        per_queue[m.queue].append(m.queue_offset)
    assert all(offsets == list(range(len(offsets))) for offsets in per_queue.values())


def test_committed_offsets_survive_a_restart(broker: BrokerOver) -> None:
    queues = fill(broker, 400)
    c = new(broker, auto_commit=False)
    c.subscribe("orders")
    with c:
        first = drain(c, 400)
        c.commit()
        assert sum(c.committed(q) for q in queues) == 400
    fill(broker, 16, start=400)
    again = new(broker, auto_commit=False)
    again.subscribe("orders")
    with again:
        rest = drain(again, 16)
    assert len(first) == 400 and len(rest) == 16
    assert {m.body for m in rest}.isdisjoint({m.body for m in first})


def test_without_commit_a_restart_sees_the_messages_again(broker: BrokerOver) -> None:
    queues = fill(broker, 80)
    c = new(broker, auto_commit=False)
    c.assign(queues)
    with c:
        assert len(drain(c, 80)) == 80
    again = new(broker, auto_commit=False)
    again.assign(queues)
    with again:
        assert len(drain(again, 80)) == 80, "nothing was committed, so everything comes again"
        assert all(again.committed(q) <= 0 for q in queues)


def test_commit_with_explicit_offsets_and_its_bounds(broker: BrokerOver) -> None:
    queues = fill(broker, 16)
    c = new(broker, auto_commit=False)
    c.assign(queues)
    with c:
        end = c.offsets_for_timestamp(queues[0], time.time() + 3600)
        c.commit({queues[0]: 1})
        assert c.committed(queues[0]) == 1
        with pytest.raises(InvalidOffsetError, match=rf"\[0, {end}\]"):
            c.commit({queues[0]: end + 1})
        assert c.committed(queues[0]) == 1


@pytest.mark.parametrize("offset", [True, 1.0, "1", None], ids=["bool", "float", "str", "none"])
def test_an_offset_that_is_not_an_int_is_refused_and_changes_nothing(
    broker: BrokerOver, offset: object
) -> None:
    """Before: True and 1.0 passed the range check and were kept as the queue's offset; the
    next pull or commit to the broker failed, and shutdown() raised TypeError."""
    queues = fill(broker, 8)
    c = new(broker, auto_commit=False)
    c.assign(queues)
    with c:
        c.commit({queues[0]: 1})
        with pytest.raises(InvalidOffsetError, match="must be an int"):
            c.commit({queues[0]: offset})  # type: ignore[dict-item]
        with pytest.raises(InvalidOffsetError, match="must be an int"):
            c.seek(queues[0], offset)  # type: ignore[arg-type]
        assert c.committed(queues[0]) == 1
    # Leaving the block shut the consumer down cleanly: nothing bad was kept to persist.


@pytest.mark.parametrize(
    ("broker_name", "queue_id"), [("broker-a", 99), ("broker-zz", 0)], ids=["queue", "broker"]
)
def test_a_queue_the_topic_does_not_have_is_refused_by_name(
    broker: BrokerOver, broker_name: str, queue_id: int
) -> None:
    """committed() and offsets_for_timestamp() check the queue as assign() does.

    Before: over gRPC a KeyError from the transport's route table; over rocketmq:// an
    answer of 0 (RocketMQ's broker answers 0 for a queue it does not have) or "no route
    names broker".
    """
    queues = fill(broker, 8)
    stranger = MessageQueue("orders", broker_name, queue_id)
    named = rf"{re.escape(str(stranger))} is not one of the \d+ readable queues of 'orders'"
    c = new(broker)
    c.assign(queues)
    with c:
        with pytest.raises(InvalidQueueError, match=named):
            c.committed(stranger)
        with pytest.raises(InvalidQueueError, match=named):
            c.offsets_for_timestamp(stranger, time.time())
        with pytest.raises(TopicNotFoundError):
            c.committed(MessageQueue("no-such-topic", "broker-a", 0))
        assert c.committed(queues[0]) in (-1, 0)  # nothing committed yet; the check passes


def test_auto_commit_happens_in_poll_on_the_interval(broker: BrokerOver) -> None:
    clock = FakeClock()
    queues = fill(broker, 40)
    c = new(broker, clock=clock, config=LitePullConsumerConfig(auto_commit_interval=5))
    c.assign(queues)
    with c:
        drain(c, 40)
        c.poll(timeout=0)
        # at most the starting offsets (0) are recorded before the first auto commit
        assert all(c.committed(q) <= 0 for q in queues)
        clock.advance(4.9)
        c.poll(timeout=0)
        assert all(c.committed(q) <= 0 for q in queues), "not before the interval"
        clock.advance(0.2)
        c.poll(timeout=0)
        assert sum(c.committed(q) for q in queues) == 40


def test_seek_within_bounds_replays_and_outside_names_min_and_max(broker: BrokerOver) -> None:
    queues = fill(broker, 80)  # 8 keys, 10 messages each
    q = queues[shard_index("k3", 8)]
    others = [x for x in queues if x != q]
    c = new(broker)
    c.assign([q])
    with c:
        n = c.offsets_for_timestamp(q, time.time() + 3600)  # the queue's max offset
        first = drain(c, n)
        c.seek(q, 4)
        assert [m.queue_offset for m in drain(c, n - 4)] == list(range(4, n))
        with pytest.raises(InvalidOffsetError, match=rf"\[0, {n}\]"):
            c.seek(q, n + 1)
        with pytest.raises(InvalidOffsetError, match=rf"\[0, {n}\]"):
            c.seek(q, -1)
        c.seek_to_begin(q)
        assert drain(c, 1)[0].queue_offset == 0
        c.seek_to_end(q)
        assert c.poll(timeout=0.1) == []
        with pytest.raises(InvalidArgumentError, match="not assigned"):
            c.seek(others[0], 0)
    assert [m.queue_offset for m in first] == list(range(n))


def test_a_paused_queue_yields_nothing_until_resumed(broker: BrokerOver) -> None:
    queues = fill(broker, 16)
    used = sorted({queues[shard_index(f"k{i}", 8)] for i in range(8)})
    paused, running = used[0], used[1]
    c = new(broker)
    c.assign([paused, running])
    with c:
        c.pause([paused])
        got = drain(c, 100, timeout=1)
        assert got and {m.queue for m in got} == {running}
        assert c.poll(timeout=0.1) == []
        c.resume([paused])
        assert {m.queue for m in drain(c, 1)} == {paused}


def test_pulling_resumes_once_poll_makes_room_not_after_the_backoff(broker: BrokerOver) -> None:
    # The clock never moves, so a pull loop held back by the full cache would wait out
    # flow_control_backoff forever: only poll() taking messages out can wake it (issue 40).
    queues = fill(broker, 100, keys=1)
    q = queues[shard_index("k0", 8)]
    config = LitePullConsumerConfig(
        pull_batch_size=10, pull_threshold_for_queue=10, flow_control_backoff=3600.0
    )
    c = new(broker, clock=FakeClock(), config=config)
    c.assign([q])
    with c:
        got = drain(c, 100, timeout=10)
    assert [m.queue_offset for m in got] == list(range(100))


def test_two_orderly_workers_never_hold_one_queue_at_the_same_time(broker: BrokerOver) -> None:
    fill(broker, 1600, keys=64)
    seen: dict[MessageQueue, list[tuple[float, str]]] = defaultdict(list)
    stop = threading.Event()
    total = [0]
    lock = threading.Lock()
    fast = LitePullConsumerConfig(rebalance_interval=1, lock_renew_interval=1, lock_lease=3)

    state = broker.broker.state
    assert state is not None
    foreign: list[str] = []

    def worker(name: str) -> None:
        c = new(broker, orderly=True, config=fast)
        c.subscribe("orders")
        with c:
            while not stop.is_set():
                for m in c.poll(timeout=0.2):
                    owner = state.locks.locks("batch").get((m.topic, m.queue.queue_id))
                    if owner is None or not owner.live or owner.client_id != c.client_id:
                        foreign.append(f"{name} got {m.queue} offset {m.queue_offset}: {owner}")
                    with lock:
                        seen[m.queue].append((time.monotonic(), name))
                        total[0] += 1
                    time.sleep(0.0005)

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    threads[0].start()
    wait_until(lambda: total[0] > 100, 20)
    threads[1].start()
    wait_until(lambda: total[0] >= 1600, 30)
    stop.set()
    for t in threads:
        t.join(30)
    assert not foreign, foreign[:5]
    for queue, events in seen.items():
        owners = [name for _, name in sorted(events)]
        switches = sum(1 for x, y in itertools.pairwise(owners) if x != y)
        assert switches <= 1, f"{queue} went back and forth between workers: {switches} switches"


def test_assign_and_subscribe_are_exclusive_and_bad_input_is_refused(
    broker: BrokerOver,
) -> None:
    queues = fill(broker, 8)
    c = new(broker)
    c.subscribe("orders")
    with pytest.raises(ClientStateError, match="exclusive"):
        c.assign(queues)
    d = new(broker)
    d.assign(queues)
    with pytest.raises(ClientStateError, match="exclusive"):
        d.subscribe("orders")
    with pytest.raises(ClientStateError, match="start"):
        d.poll(1)
    with d:
        with pytest.raises(InvalidArgumentError, match="negative"):
            d.poll(timeout=-1)
        assert d.assignment() == set(queues)
        assert d.fetch_message_queues("orders") == queues
    with pytest.raises(InvalidArgumentError, match="auto_commit_interval"):
        LitePullConsumerConfig(auto_commit_interval=0.5)


def test_asyncio_face_polls_and_iterates(broker: BrokerOver) -> None:
    fill(broker, 50)

    async def main() -> list[bytes]:
        c = sdk.aio.LitePullConsumer("batch", broker.address,
                                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        c.subscribe("orders")
        out: list[bytes] = []
        async with c:
            out += [m.body for m in await c.poll(5)]
            async for m in c:
                out.append(m.body)
                if len(out) >= 50:
                    break
        return out

    assert len(set(asyncio.run(main()))) == 50
