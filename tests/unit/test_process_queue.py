"""ProcessQueue accounting: counts, bytes, take / commit / settle, concurrent finish; its
messages kept out of the cycle collector while buffered."""

from __future__ import annotations

import gc
import weakref

import pytest

from mockbroker.store.records import build_records, check_frames
from sdk._accel import speedups
from sdk._transport.codec import decode_records
from sdk._wire import encode_frame
from sdk.consumer.process_queue import CachedCount, ProcessQueue
from sdk.message import MessageExt, MessageQueue

Q = MessageQueue("t", "b", 0)


def msg(offset: int, size: int = 10) -> MessageExt:
    return MessageExt("t", b"x" * size, None, (), {}, None, f"{offset:032X}", Q, offset, 0, 0, 0)


def test_put_counts_messages_and_bytes_and_ignores_repeats() -> None:
    pq = ProcessQueue()
    assert pq.put([msg(0), msg(1, 20)]) == 2
    assert pq.put([msg(1), msg(2)]) == 1  # offset 1 again after a re-pull
    assert (pq.count, pq.size, pq.max_offset_pulled) == (3, 40, 2)


def test_orderly_take_commit_and_settle() -> None:
    pq = ProcessQueue()
    pq.put([msg(i) for i in range(5)])
    assert [m.queue_offset for m in pq.take(2)] == [0, 1]
    assert pq.settle(0) == -1, "nothing done: all of it goes back"
    assert [m.queue_offset for m in pq.take(3)] == [0, 1, 2], "rolled back in front, in order"
    assert pq.settle(2) == 2, "the first two done, offset 2 goes back in front"
    assert [m.queue_offset for m in pq.take(1)] == [2]
    assert pq.commit() == 3
    assert (pq.count, pq.size, pq.buffered) == (2, 20, 2)
    assert pq.commit() == -1, "nothing taken, nothing to commit"


def test_concurrent_finish_commits_only_up_to_the_lowest_unfinished() -> None:
    pq = ProcessQueue()
    pq.put([msg(i) for i in range(6)])
    first, second = pq.take_all(2), pq.take_all(2)
    assert pq.finish(second) == 0, "0 and 1 are still running"
    assert pq.finish(first) == 4, "4 and 5 are still buffered"
    rest = pq.take_all(10)
    assert pq.finish(rest) == 6
    assert (pq.count, pq.size) == (0, 0)


def test_clear_forgets_everything_for_a_seek() -> None:
    pq = ProcessQueue()
    pq.put([msg(5), msg(6)])
    pq.take(1)
    pq.clear()
    assert (pq.count, pq.size, pq.buffered, pq.max_offset_pulled) == (0, 0, 0, -1)
    assert pq.put([msg(5)]) == 1


def test_orderly_take_one_at_a_time() -> None:
    pq = ProcessQueue()
    assert pq.take(1) == [], "nothing buffered"
    pq.put([msg(0), msg(1)])
    first = pq.take(1)
    assert [m.queue_offset for m in first] == [0]
    first.clear()  # the listener's list is its own: the taken batch is unchanged
    assert pq.commit() == 1
    assert [m.queue_offset for m in pq.take(1)] == [1]
    assert pq.settle(0) == -1 and pq.buffered == 1
    assert (pq.count, pq.size) == (1, 10)


def test_a_whole_run_is_taken_at_once_and_a_repeated_pull_adds_nothing() -> None:
    pq = ProcessQueue()
    pq.put([msg(i, 10 + i) for i in range(4)])
    assert pq.put([msg(2), msg(3)]) == 0, "all of it buffered already"
    assert [m.queue_offset for m in pq.take(1024)] == [0, 1, 2, 3]
    assert (pq.buffered, pq.take(5)) == (0, [])
    assert pq.settle(3) == 3, "the first three done, the last back in front"
    assert (pq.count, pq.size, pq.buffered) == (1, 13, 1)


def buffered(n: int) -> list[MessageExt]:
    """n messages decoded as a pull's are, for a consumer's buffer."""
    frames = b"".join(
        encode_frame(msg_id=bytes([i]) * 16, born_timestamp_ms=1, body=b"x") for i in range(n)
    )
    records, _ = build_records(
        frames, check_frames(frames, 2), topic=b"t", queue_id=0, first_offset=0,
        store_timestamp_ms=2, base_position=0,
    )  # fmt: skip
    return decode_records(records, "b", buffered=True)


class Holder:
    def __init__(self, message: MessageExt) -> None:
        self.message = message


@pytest.mark.parametrize("done_with", ["commit", "settle", "finish", "clear", "let_go"])
def test_a_cycle_made_through_a_message_is_collected_once_the_queue_is_done_with_it(
    done_with: str,
) -> None:
    pq = ProcessQueue()
    pq.put(buffered(3))
    taken = pq.take_all(3) if done_with == "finish" else pq.take(3)
    if speedups is not None:
        assert not any(gc.is_tracked(m) for m in taken)  # out of the collector while held
    holder = Holder(taken[1])
    taken[1].properties["holder"] = holder  # type: ignore[assignment]  # as a user might
    ref = weakref.ref(holder)
    if done_with == "commit":
        pq.commit()
    elif done_with == "settle":
        pq.settle(3)
    elif done_with == "finish":
        pq.finish(taken)
    elif done_with == "clear":
        pq.clear()
    else:
        pq.let_go()
    assert all(gc.is_tracked(m) for m in taken)
    del taken, holder, pq
    gc.collect()
    assert ref() is None


def test_messages_settled_back_into_the_buffer_stay_out_of_the_collector_until_done() -> None:
    pq = ProcessQueue()
    pq.put(buffered(3))
    taken = pq.take(3)
    assert pq.settle(1) == 1
    assert gc.is_tracked(taken[0])
    if speedups is not None:
        assert not gc.is_tracked(taken[1]) and not gc.is_tracked(taken[2])
    assert pq.take(2) == taken[1:] and pq.commit() == 3
    assert all(gc.is_tracked(m) for m in taken)


def test_messages_decoded_for_anything_but_a_buffer_are_tracked() -> None:
    frames = encode_frame(msg_id=bytes(16), born_timestamp_ms=1, body=b"x")
    records, _ = build_records(
        frames, check_frames(frames, 2), topic=b"t", queue_id=0, first_offset=0,
        store_timestamp_ms=2, base_position=0,
    )  # fmt: skip
    assert all(gc.is_tracked(m) for m in decode_records(records, "b"))


def test_the_consumers_count_follows_its_queues_and_lets_go_of_one_given_up() -> None:
    """LitePull's flow control reads one count before every pull instead of summing its
    queues' (11.8 us a pull with 800 queues); it must stay their sum."""
    cached = CachedCount()
    a, b = ProcessQueue(cached), ProcessQueue(cached)

    def check() -> None:
        assert cached.count == a.count + b.count

    a.put([msg(i) for i in range(5)])
    b.put([msg(i) for i in range(3)])
    check()
    a.take(2)
    a.commit()  # two done
    b.take_all(2)
    b.finish([msg(0)])  # one done
    check()
    a.take(3)
    a.settle(1)
    check()
    a.clear()  # a seek: all of it forgotten
    check()
    assert cached.count == b.count == 2
    b.detach()  # given up: its messages no longer count for the consumer ...
    assert cached.count == 0
    b.finish([msg(1)])  # ... nor what becomes of them after
    b.put([msg(9)])
    assert cached.count == 0 and b.count == 2
    a.put([msg(7)])
    assert cached.count == a.count == 1
