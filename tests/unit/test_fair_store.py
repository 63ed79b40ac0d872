"""SlicedStore on a temporary directory: slices change nothing a client sees.

Sends and pulls cut into slices (each taking a turn) store and answer exactly what the
store's own append and get do: a batch is checked whole before any of it is stored, gets
consecutive offsets, keeps its order against other sends to its queue and is stored whole
even when its request is cancelled halfway; a pull answers what one read would have.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from mockbroker.errors import BrokerError
from mockbroker.fair_store import SlicedStore
from mockbroker.fairness import FairScheduler
from mockbroker.store import commitlog as commitlog_module
from mockbroker.store import message_store as message_store_module
from mockbroker.store.commitlog import CommitLog, FlushPlan
from mockbroker.store.message_store import Batch, GetResult, MessageStore, PutResult, Written
from mockbroker.store.records import CheckedFrame, CheckedFrames, check_frames
from mockbroker.topics import Topic
from sdk._accel import speedups
from sdk._wire import encode_frame, iter_records
from sdk.testing import FakeClock

T = TypeVar("T")
SLICE_MESSAGES = 16
SLICE_BYTES = 4096


class TickingTimer:
    """Every reading is 1 ms after the last: each slice costs more than the turn budget."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


def frames(
    bodies: list[bytes], tags: list[bytes] | None = None, keys: list[bytes] | None = None
) -> bytes:
    return b"".join(
        encode_frame(msg_id=i.to_bytes(16, "big"), born_timestamp_ms=1, body=body,
                     tags=tags[i] if tags else b"", keys=[keys[i]] if keys else ())
        for i, body in enumerate(bodies)
    )  # fmt: skip


def bodies_of(data: bytes) -> list[bytes]:
    return [r.body for r in iter_records(data)]


def numbered(count: int, size: int = 100, prefix: bytes = b"m") -> list[bytes]:
    return [prefix + str(i).encode().rjust(size - len(prefix), b".") for i in range(count)]


def new_store(path: Path, sync: bool = False) -> MessageStore:
    store = MessageStore(
        path,
        sync_flush=sync,
        segment_bytes=1 << 24,
        flush_interval_seconds=60,
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
    )
    store.open()
    return store


def run(
    tmp_path: Path,
    body: Callable[[MessageStore, SlicedStore, Topic], Awaitable[T]],
    *,
    sync: bool = False,
) -> T:
    """`body(store, sliced, topic)` on a fresh store whose topic "t" has 4 queues."""

    async def main() -> T:
        store = new_store(tmp_path / "store", sync)
        await store.start()
        try:
            topic, _ = store.create_topic("t", 4)
            scheduler = FairScheduler(turn_seconds=0.0005, timer=TickingTimer())
            sliced = SlicedStore(
                store, scheduler, slice_messages=SLICE_MESSAGES, slice_bytes=SLICE_BYTES
            )
            return await body(store, sliced, topic)
        finally:
            await store.close()

    return asyncio.run(main())


async def send(
    store: MessageStore, sliced: SlicedStore, client: str, topic: Topic, queue_id: int, data: bytes
) -> PutResult:
    """What MessagingService.send does with a SlicedStore (messages due now)."""
    queue = (topic.name, queue_id)

    def write_now(checked: list[CheckedFrame]) -> Written | None:
        return None if sliced.writing(queue) else store.write(topic, queue_id, data, checked)

    async with sliced.in_order(client, queue) as hold:
        checked, written = await sliced.check(client, data, write_now)
        if written is not None:
            return PutResult(written.first_offset, written.count, 0, True)
        return await sliced.append(client, hold, topic, queue_id, data, checked)


def read_all(store: MessageStore, topic: Topic, queue_id: int) -> list[bytes]:
    got = store.get(topic, queue_id, 0, max_messages=10_000, max_bytes=1 << 30)
    return bodies_of(got.records)


def test_a_batch_stored_in_slices_gets_consecutive_offsets_and_every_message(
    tmp_path: Path,
) -> None:
    bodies = numbered(200)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> PutResult:
        first = await send(store, sliced, "a", topic, 0, frames(bodies[:50]))
        assert (first.first_offset, first.count) == (0, 50)
        second = await send(store, sliced, "a", topic, 0, frames(bodies[50:]))
        assert read_all(store, topic, 0) == bodies
        assert sliced.scheduler.slices > 200 // SLICE_MESSAGES, "it was checked in slices"
        return second

    result = run(tmp_path, body)
    assert (result.first_offset, result.count, result.durable) == (50, 150, True)


def test_a_clients_sends_to_one_queue_keep_their_order_whatever_their_size(
    tmp_path: Path,
) -> None:
    big, small = numbered(300, prefix=b"big"), numbered(1, prefix=b"small")

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bytes]:
        # The small one would be checked and written long before the big one if it did
        # not wait for its client's earlier send to the queue.
        first = asyncio.create_task(send(store, sliced, "a", topic, 0, frames(big)))
        second = asyncio.create_task(send(store, sliced, "a", topic, 0, frames(small)))
        a, b = await asyncio.gather(first, second)
        assert (a.first_offset, b.first_offset) == (0, 300)
        return read_all(store, topic, 0)

    assert run(tmp_path, body) == big + small


def test_nothing_comes_between_the_slices_of_a_batch_being_written(tmp_path: Path) -> None:
    big, small = numbered(300, prefix=b"big"), numbered(1, prefix=b"small")

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bytes]:
        first = asyncio.create_task(send(store, sliced, "a", topic, 0, frames(big)))
        while store.queue(topic, 0).count == 0:  # until its first slice is written
            await asyncio.sleep(0)
        second = await send(store, sliced, "b", topic, 0, frames(small))
        assert second.first_offset == 300, "written after the whole batch"
        await first
        return read_all(store, topic, 0)

    assert run(tmp_path, body) == big + small


def test_writing_any_names_a_batch_being_written_in_slices_to_one_of_the_queues(
    tmp_path: Path,
) -> None:
    """What a request over several queues asks before writing in its checks' turn."""
    big = numbered(300, prefix=b"big")

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bool]:
        seen = [sliced.writing_any("t", [0, 1, 2])]
        first = asyncio.create_task(send(store, sliced, "a", topic, 1, frames(big)))
        while not sliced.writing(("t", 1)):  # until it is laid out, a slice per turn
            await asyncio.sleep(0)
        seen += [
            sliced.writing_any("t", [0, 1, 2]),
            sliced.writing_any("t", [0, 2, 3]),
            sliced.writing_any("other", [1]),
        ]
        await first
        return [*seen, sliced.writing_any("t", [1])]

    assert run(tmp_path, body) == [False, True, False, False, False]


def test_a_send_waiting_for_its_turn_does_not_hold_up_other_clients_sends_to_its_queue(
    tmp_path: Path,
) -> None:
    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> int:
        async with sliced.in_order("a", (topic.name, 0)):  # a's send, not yet written
            other = await asyncio.wait_for(send(store, sliced, "b", topic, 0, frames([b"b"])), 10)
            return other.count

    assert run(tmp_path, body) == 1


def test_batches_of_two_clients_to_two_queues_take_turns_and_are_each_written_whole(
    tmp_path: Path,
) -> None:
    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> tuple[list[int], int]:
        order: list[int] = []
        store.on_append = lambda _topic, queue_id: order.append(queue_id)
        a = numbered(5 * SLICE_MESSAGES, prefix=b"a")
        b = numbered(5 * SLICE_MESSAGES, prefix=b"b")
        await asyncio.gather(
            send(store, sliced, "a", topic, 0, frames(a)),
            send(store, sliced, "b", topic, 1, frames(b)),
        )
        assert read_all(store, topic, 0) == a and read_all(store, topic, 1) == b
        return order, sliced.scheduler.waited

    order, waited = run(tmp_path, body)
    assert sorted(order) == [0, 1], "each batch was written in one piece"
    assert waited > 0, "their checks took turns"


def test_a_batch_checked_in_one_slice_goes_on_in_the_same_turn_a_larger_one_does_not(
    tmp_path: Path,
) -> None:
    async def body(
        store: MessageStore, sliced: SlicedStore, topic: Topic
    ) -> tuple[list[int], list[int], int]:
        calls: list[int] = []

        def then(checked: list[CheckedFrame]) -> Written:
            calls.append(len(checked))
            return store.write(topic, 0, small, checked)

        small = frames(numbered(SLICE_MESSAGES))
        checked, written = await sliced.check("a", small, then)
        assert written is not None and written.count == len(checked) == SLICE_MESSAGES
        one_turn = sliced.scheduler.slices
        large = frames(numbered(SLICE_MESSAGES + 1))
        _checked, not_written = await sliced.check("a", large, then)
        assert not_written is None
        return calls, [one_turn], sliced.scheduler.slices

    calls, one_turn, turns = run(tmp_path, body)
    assert calls == [SLICE_MESSAGES], "only the batch checked in one slice went on"
    assert one_turn == [1] and turns == 3


def test_a_bad_frame_in_a_later_slice_stores_nothing_of_the_batch(tmp_path: Path) -> None:
    good = frames(numbered(5 * SLICE_MESSAGES))
    empty = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"")

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> int:
        with pytest.raises(BrokerError) as caught:
            await send(store, sliced, "a", topic, 0, good + empty)
        assert caught.value.reason == "EMPTY_BODY"
        assert f"frame {5 * SLICE_MESSAGES}" in caught.value.message, "numbered as one batch"
        return store.queue(topic, 0).count

    assert run(tmp_path, body) == 0


def test_a_batch_whose_request_is_cancelled_while_it_is_checked_stores_nothing(
    tmp_path: Path,
) -> None:
    bodies = numbered(10 * SLICE_MESSAGES)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bytes]:
        task = asyncio.create_task(send(store, sliced, "a", topic, 0, frames(bodies)))
        while sliced.scheduler.slices < 2:  # until it is part-way through its checks
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = asyncio.create_task(send(store, sliced, "b", topic, 0, frames([b"after"])))
        assert (await after).first_offset == 0, "nothing of the batch took an offset"
        return read_all(store, topic, 0)

    assert run(tmp_path, body) == [b"after"]


def test_a_send_waiting_for_its_fsync_does_not_hold_its_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsync = threading.Event()
    execute = CommitLog.execute_flush

    def held_back(plan: FlushPlan) -> None:
        fsync.wait(10)
        execute(plan)

    monkeypatch.setattr(CommitLog, "execute_flush", staticmethod(held_back))

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bool]:
        first = asyncio.create_task(send(store, sliced, "a", topic, 0, frames(numbered(3))))
        second = asyncio.create_task(send(store, sliced, "b", topic, 0, frames(numbered(40))))
        for _ in range(1000):  # loop passes, not time: the fsync is held back throughout
            if store.queue(topic, 0).count == 43:
                break
            await asyncio.sleep(0)
        written_during_the_fsync = store.queue(topic, 0).count
        fsync.set()
        results = await asyncio.gather(first, second)
        assert written_during_the_fsync == 43, "the second send waited for the first's fsync"
        return [r.durable for r in results]

    assert run(tmp_path, body, sync=True) == [True, True]


# ---------------------------------------------------------------------- pulls
SIZES = [100, 3000, 100, 100, 9000, 100] * 20  # some larger than a slice's bytes


@pytest.mark.parametrize(
    ("offset", "max_messages", "max_bytes"),
    [
        (0, 1000, 1 << 30),  # everything
        (0, 50, 1 << 30),  # cut by count
        (3, 1000, 40_000),  # cut by bytes, mid-way
        (4, 1000, 5_000),  # the first message alone is over max_bytes: served anyway
        (0, 1, 1 << 30),
        (110, 1000, 1 << 30),  # up to the end of the queue
    ],
)
def test_a_pull_read_in_slices_answers_what_one_read_would(
    tmp_path: Path, offset: int, max_messages: int, max_bytes: int
) -> None:
    bodies = [str(i).encode().ljust(size, b"x") for i, size in enumerate(SIZES)]

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> None:
        store.write(topic, 0, data := frames(bodies), store.check(data))
        whole = store.get(topic, 0, offset, max_messages=max_messages, max_bytes=max_bytes)
        got = await sliced.get(
            "a", topic, 0, offset, max_messages=max_messages, max_bytes=max_bytes, tags=None
        )
        assert same(got, whole)
        if max_bytes < 1 << 30 and got.count > 1:
            assert len(got.records) <= max_bytes, "never more than asked"

    run(tmp_path, body)


def test_while_another_client_is_active_a_pull_answers_one_slice(tmp_path: Path) -> None:
    bodies = numbered(5 * SLICE_MESSAGES)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[int]:
        store.write(topic, 0, data := frames(bodies), store.check(data))
        alone = await sliced.get("a", topic, 0, 0, max_messages=1000, max_bytes=1 << 30, tags=None)
        await send(store, sliced, "b", topic, 1, frames([b"another client's send"]))
        shared = await sliced.get("a", topic, 0, 0, max_messages=1000, max_bytes=1 << 30, tags=None)
        assert bodies_of(shared.records) == bodies[:SLICE_MESSAGES]
        assert shared.next_offset == SLICE_MESSAGES, "the next pull goes on from there"
        return [alone.count, shared.count]

    assert run(tmp_path, body) == [5 * SLICE_MESSAGES, SLICE_MESSAGES]


def test_a_tag_filtered_pull_read_in_slices_answers_what_one_read_would(
    tmp_path: Path,
) -> None:
    bodies = numbered(100)
    tags = [b"even" if i % 2 == 0 else b"odd" for i in range(100)]

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> None:
        store.write(topic, 0, data := frames(bodies, tags), store.check(data))
        for offset in (0, 1, 57):
            whole = store.get(
                topic, 0, offset, max_messages=40, max_bytes=1 << 30, tags=frozenset({b"odd"})
            )
            got = await sliced.get(
                "a", topic, 0, offset, max_messages=40, max_bytes=1 << 30,
                tags=frozenset({b"odd"}),
            )  # fmt: skip
            assert same(got, whole)

    run(tmp_path, body)


def test_a_pull_read_in_slices_stops_before_a_corrupt_record(tmp_path: Path) -> None:
    bodies = numbered(5 * SLICE_MESSAGES)
    bad = 2 * SLICE_MESSAGES  # the first message of the third slice

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> None:
        store.write(topic, 0, data := frames(bodies), store.check(data))
        position, size, _ = store.queue(topic, 0).entry(bad)
        segment = next((store.data_dir / "commitlog").iterdir())
        fd = os.open(segment, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xff", position + size - 1)  # the last body byte: CRC fails
        finally:
            os.close(fd)
        got = await sliced.get("a", topic, 0, 0, max_messages=1000, max_bytes=1 << 30, tags=None)
        assert (got.status, got.count, got.next_offset) == ("FOUND", bad, bad)
        assert bodies_of(got.records) == bodies[:bad]
        with pytest.raises(BrokerError) as caught:
            await sliced.get("a", topic, 0, bad, max_messages=1000, max_bytes=1 << 30, tags=None)
        assert caught.value.reason == "CORRUPT_RECORD"

    run(tmp_path, body)


def same(a: GetResult, b: GetResult) -> bool:
    return (a.status, a.next_offset, a.min_offset, a.max_offset, a.records, a.count) == (
        b.status,
        b.next_offset,
        b.min_offset,
        b.max_offset,
        b.records,
        b.count,
    )


def test_a_queue_handed_to_a_send_cancelled_meanwhile_goes_on_to_the_next(
    tmp_path: Path,
) -> None:
    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[str]:
        got: list[str] = []

        async def take(name: str) -> None:
            async with sliced.in_order("a", (topic.name, 0)):
                got.append(name)

        first = sliced.in_order("a", (topic.name, 0))
        hold = await first.__aenter__()
        second = asyncio.create_task(take("second"))
        third = asyncio.create_task(take("third"))
        await asyncio.sleep(0)  # both wait
        hold.release()  # handed to the second, which is cancelled before it runs
        second.cancel()
        await asyncio.wait_for(third, 10)
        with pytest.raises(asyncio.CancelledError):
            await second
        assert not sliced.writing((topic.name, 0))
        return got

    assert run(tmp_path, body) == ["third"]


def test_a_full_disk_in_the_middle_of_a_large_batch_stores_nothing_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = numbered(5 * SLICE_MESSAGES)
    real_pwrite = os.pwrite

    def half_then_full(fd: int, data: bytes | memoryview, offset: int) -> int:
        if len(data) > 2 * SLICE_BYTES:  # the batch's records: cut short half-way
            real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, data, offset)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bytes]:
        await send(store, sliced, "a", topic, 0, frames([b"before"]))
        with monkeypatch.context() as patched:
            patched.setattr(commitlog_module.os, "pwrite", half_then_full)
            with pytest.raises(BrokerError) as full:
                await send(store, sliced, "a", topic, 0, frames(bodies))
        assert full.value.reason == "DISK_FULL"
        store.refusing_sends = False  # the next disk check would say so
        after = await send(store, sliced, "a", topic, 0, frames([b"after"]))
        assert after.first_offset == 1, "the batch's offsets were given back"
        return read_all(store, topic, 0)

    assert run(tmp_path, body) == [b"before", b"after"]


def test_a_requests_small_parts_are_checked_in_one_turn_a_large_one_in_slices(
    tmp_path: Path,
) -> None:
    half = SLICE_MESSAGES // 2
    empty = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"")

    async def body(
        store: MessageStore, sliced: SlicedStore, topic: Topic
    ) -> tuple[list[object], list[object], int]:
        small = [frames(numbered(half)), frames(numbered(half - 1)) + empty, frames([b"x"])]
        got_small = await sliced.check_parts("a", small)
        assert sliced.scheduler.slices == 1, "three parts within one slice: one turn"
        large = frames(numbered(2 * SLICE_MESSAGES))
        got_large = await sliced.check_parts("a", [frames([b"y"]), large, large + empty])
        return got_small, got_large, sliced.scheduler.slices

    got_small, got_large, turns = run(tmp_path, body)
    first, refused, last = got_small
    assert isinstance(first, CheckedFrames) and len(first) == half
    assert isinstance(refused, BrokerError) and refused.reason == "EMPTY_BODY"
    assert f"frame {half - 1}" in refused.message, "the refusal names the part's own frame"
    assert isinstance(last, CheckedFrames) and len(last) == 1
    one, large, large_refused = got_large
    assert isinstance(one, CheckedFrames) and len(one) == 1
    assert isinstance(large, CheckedFrames) and len(large) == 2 * SLICE_MESSAGES
    assert large == CheckedFrames(check_frames(frames(numbered(2 * SLICE_MESSAGES)), 0))
    assert isinstance(large_refused, BrokerError) and large_refused.reason == "EMPTY_BODY"
    assert f"frame {2 * SLICE_MESSAGES}" in large_refused.message, "numbered across slices"
    # 1 + 32 frames, then 32 + 1: at most a slice's 16 frames a turn, a part's rest next
    assert turns == 1 + 5


@pytest.mark.skipif(speedups is None, reason="without sdk._speedups every part is checked alone")
def test_a_requests_usual_parts_are_checked_in_one_call_as_part_by_part(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parts = [frames(numbered(3, prefix=f"q{q}-".encode())) for q in range(4)]
    within = [frames(numbered(SLICE_MESSAGES // 4, prefix=b"w"))] * 4  # a slice's frames
    over = [*within, frames([b"one more"])]
    calls: list[int] = []

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[object]:
        check = store.check

        def counted(frames: bytes, **kw: Any) -> CheckedFrames:
            calls.append(len(frames))
            return check(frames, **kw)

        monkeypatch.setattr(store, "check", counted)
        got = [await sliced.check_parts("a", request) for request in (parts, within)]
        assert calls == [], "usual parts within a slice: no check of a part on its own"
        assert sliced.scheduler.slices == 2, "a turn each"
        got.append(await sliced.check_parts("a", over))
        assert len(calls) == len(over), "over a slice: part by part"
        return got

    got_parts, got_within, got_over = run(tmp_path, body)
    for request, got in ((parts, got_parts), (within, got_within), (over, got_over)):
        assert got == [check_frames(part, 0) for part in request]


def test_holds_on_several_queues_are_all_let_go_when_waiting_for_one_is_cancelled(
    tmp_path: Path,
) -> None:
    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> int:
        queues = [(topic.name, q) for q in range(3)]
        [busy] = await sliced.in_order_all("a", queues[2:])
        waiting = asyncio.create_task(sliced.in_order_all("a", queues))
        await asyncio.sleep(0)  # holds queues 0 and 1, waits for 2
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        async with asyncio.timeout(5):  # queues 0 and 1 are free again
            got = await sliced.in_order_all("a", queues[:2])
        busy.release()
        async with asyncio.timeout(5):
            again = await sliced.in_order_all("a", queues[2:])
        return len(got) + len(again)

    assert run(tmp_path, body) == 3


class CountedLayouts:
    """Counts the slices and batches the store lays out (lay_out_records, one each;
    lay_out_parts, each batch of the call)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = message_store_module.lay_out_records
        real_parts = message_store_module.lay_out_parts

        def counted(*args: Any, **kwargs: Any) -> bytes:
            self.calls += 1
            return real(*args, **kwargs)

        def counted_parts(parts: Any, *args: Any, **kwargs: Any) -> list[bytes]:
            self.calls += len(parts)
            return real_parts(parts, *args, **kwargs)

        monkeypatch.setattr(message_store_module, "lay_out_records", counted)
        monkeypatch.setattr(message_store_module, "lay_out_parts", counted_parts)


def stored_as_one_write(tmp_path: Path, batches: list[tuple[int, bytes]]) -> list[bytes]:
    """What a fresh store holds in queues 0 and 1 of "t" after one write_parts of `batches`."""

    async def main() -> list[bytes]:
        store = new_store(tmp_path)
        await store.start()
        try:
            topic, _ = store.create_topic("t", 4)
            store.write_parts(topic, [Batch(q, data, store.check(data)) for q, data in batches])
            return [store.get(topic, q, 0, max_messages=10_000, max_bytes=1 << 30).records
                    for q in (0, 1)]  # fmt: skip
        finally:
            await store.close()

    return asyncio.run(main())


def test_a_large_batch_is_laid_out_a_slice_per_turn_and_written_as_one_write_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 5 * SLICE_MESSAGES + 3
    data = frames(numbered(count), keys=[b"key-%d" % i for i in range(count)])
    layouts = CountedLayouts(monkeypatch)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> tuple[bytes, int]:
        result = await send(store, sliced, "a", topic, 0, data)
        assert (result.first_offset, result.count) == (0, count)
        by_key = store.find_by_key("t", "key-70")
        assert by_key == store.find_by_id((70).to_bytes(16, "big")), "indexed where it lies"
        assert [r.body for r in iter_records(by_key[0])] == [numbered(count)[70]]
        got = store.get(topic, 0, 0, max_messages=10_000, max_bytes=1 << 30).records
        return got, sliced.scheduler.slices

    stored, turns = run(tmp_path, body)
    assert turns == 6 + 6 + 1, "checked in 6 slices, laid out in 6, written in one turn"
    assert layouts.calls == 6, "the write laid nothing out again"
    assert stored == stored_as_one_write(tmp_path / "one", [(0, data)])[0]


def test_a_requests_parts_laid_out_in_slices_take_their_queues_next_offsets_in_order(
    tmp_path: Path,
) -> None:
    a, b, c = (frames(numbered(20, prefix=p)) for p in (b"a", b"b", b"c"))

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bytes]:
        await send(store, sliced, "x", topic, 0, frames([b"first"]))
        parts = [
            Batch(0, a, store.check(a)),
            Batch(1, b, store.check(b)),
            Batch(0, c, store.check(c)),
        ]
        written = await sliced.write_parts("x", [], topic, parts)
        assert [(w.first_offset, w.count) for w in written] == [(1, 20), (0, 20), (21, 20)]
        assert sliced.scheduler.slices == 1 + 2 + 2 + 2 + 1
        return [store.get(topic, q, 0, max_messages=10_000, max_bytes=1 << 30).records
                for q in (0, 1)]  # fmt: skip

    expected = stored_as_one_write(
        tmp_path / "one", [(0, frames([b"first"])), (0, a), (1, b), (0, c)]
    )
    assert run(tmp_path, body) == expected


def test_a_batch_whose_queue_moved_on_while_it_was_laid_out_is_laid_out_again_by_its_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = numbered(3 * SLICE_MESSAGES)
    layouts = CountedLayouts(monkeypatch)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[int]:
        real = store.lay_out
        due = frames([b"due"])

        def lay_out_then_a_message_falls_due(*args: Any, **kwargs: Any) -> Any:
            laid = real(*args, **kwargs)
            if laid.count == SLICE_MESSAGES:  # past the sliced store, as the schedule writes
                store.write(topic, 0, due, store.check(due))
            return laid

        monkeypatch.setattr(store, "lay_out", lay_out_then_a_message_falls_due)
        result = await send(store, sliced, "a", topic, 0, frames(bodies))
        assert (result.first_offset, result.count) == (1, len(bodies))
        assert read_all(store, topic, 0) == [b"due", *bodies]
        got = store.get(topic, 0, 0, max_messages=10_000, max_bytes=1 << 30).records
        return [r.queue_offset for r in iter_records(got)]

    assert run(tmp_path, body) == list(range(1 + 3 * SLICE_MESSAGES))
    assert layouts.calls == 3 + 1 + 1, "3 slices, the message due, the batch again"


def test_a_batch_whose_request_is_cancelled_while_it_is_laid_out_stores_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = numbered(3 * SLICE_MESSAGES)

    async def body(store: MessageStore, sliced: SlicedStore, topic: Topic) -> list[bytes]:
        real, laid_out = store.lay_out, asyncio.Event()

        def lay_out(*args: Any, **kwargs: Any) -> Any:
            laid_out.set()
            return real(*args, **kwargs)

        monkeypatch.setattr(store, "lay_out", lay_out)
        task = asyncio.create_task(send(store, sliced, "a", topic, 0, frames(bodies)))
        await laid_out.wait()  # its first slice is laid out, the rest wait for their turns
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not sliced.writing((topic.name, 0)), "its hold on the queue was let go"
        after = await asyncio.wait_for(send(store, sliced, "b", topic, 0, frames([b"after"])), 10)
        assert after.first_offset == 0, "nothing of the cancelled batch took an offset"
        return read_all(store, topic, 0)

    assert run(tmp_path, body) == [b"after"]
