"""ProcessQueue: the messages of one queue between pulling and committing.

It holds the pulled messages in offset order, the batch a listener is working on, counts
and byte sizes for flow control, and the flags rebalance and the orderly service use.

Pulled messages come decoded for a buffer (`codec.decode_records(..., buffered=True)`):
outside the cycle collector's generations, where thousands of them would be traversed by
every collection while the consumer decodes more. They stay so while a listener or a
poll has them, and go back to the collector once done with (committed, settled,
finished), when the queue is cleared or let go, and a poll's once a later poll hands out
its batch (LitePullConsumerCore.batches_lent: the next one, or for the blocking face the
one after) or the consumer shuts down: a reference cycle a user's code made through one
is collected from then on. Tracking them at hand-out instead would put a whole run back in
the youngest generation at once, which costs most of what this saves.

Every method is synchronous and touches only this object: callers on one event loop need
no lock around it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from sdk._accel import hand_out
from sdk.message import MessageExt


class CachedCount:
    """The messages cached over a consumer's process queues, kept as each one changes.

    Flow control asks for it before every pull: a sum over the queues would cost a
    consumer of many queues more the more it holds.
    """

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


class ProcessQueue:
    """One queue's buffer and consumption state.

    `cached`: the consumer's count over all its queues, which this one's `count` is part
    of until `detach`.
    """

    def __init__(self, cached: CachedCount | None = None) -> None:
        self._buffer: deque[MessageExt] = deque()  # pulled, not yet taken; offset order
        self._consuming: list[MessageExt] = []  # taken by the listener, not yet committed
        self._inflight: dict[int, MessageExt] = {}  # concurrent mode: handed out, unfinished
        self._cached = CachedCount() if cached is None else cached
        self.count = 0
        self.size = 0
        self.max_offset_pulled = -1
        self.dropped = False
        self.locked = False
        self.lock_epoch = 0
        self.last_lock_time = 0.0
        self.object_lock = asyncio.Lock()  # one consume task at a time (orderly)
        self.consume_lock = asyncio.Lock()  # held around a listener call (orderly)
        self.generation = 0  # bumped by reset(): pulls and batches of an older one are stale
        self.more = False  # messages arrived while a consume task was running
        self.next_offset = 0  # where the next pull starts
        # Set when messages leave the cache, while a pull loop held back by flow control
        # waits for room (None otherwise: nothing to tell).
        self.room: asyncio.Event | None = None
        # With `room`: what room is worth waking for (None: any message leaving). Asked
        # each time messages leave, so that a waiter wakes once, not once per message.
        self.room_when: Callable[[], bool] | None = None

    # ------------------------------------------------------------------ pulling
    def put(self, messages: Sequence[MessageExt]) -> int:
        """Add pulled messages (offset order); how many were new."""
        pulled, start = self.max_offset_pulled, 0
        # A re-pull after a seek or retry overlaps what is buffered only at its front:
        # never buffer those twice. The rest goes in at once (a pull is hundreds).
        while start < len(messages) and messages[start].queue_offset <= pulled:
            start += 1
        fresh = messages[start:] if start else messages
        if not fresh:
            return 0
        self._buffer.extend(fresh)
        self.max_offset_pulled = fresh[-1].queue_offset
        self.count += len(fresh)
        self._cached.count += len(fresh)
        self.size += sum([len(m.body) for m in fresh])
        return len(fresh)

    def clear(self) -> None:
        """Forget everything buffered (after a seek); pulled offsets restart."""
        self.let_go()
        self._buffer.clear()
        self._consuming.clear()
        self._inflight.clear()
        self._cached.count -= self.count
        self.count = self.size = 0
        self.max_offset_pulled = -1
        self.generation += 1
        if self.room is not None:
            self.room.set()

    def reset(self, offset: int) -> None:
        """Forget everything buffered and pull again from `offset`.

        Results of pulls issued before, and batches taken before, belong to an older
        generation: callers drop them.
        """
        self.clear()
        self.next_offset = offset

    def detach(self) -> None:
        """Leave the consumer's count: the queue was given up.

        What it still holds, and whatever happens to it from now on, counts only here.
        """
        self._cached.count -= self.count
        self._cached = CachedCount()
        self._cached.count = self.count

    def lease_fresh(self, now: float, lease: float) -> bool:
        """True when the broker lock is held and was renewed at most `lease` seconds ago."""
        return self.locked and now - self.last_lock_time <= lease

    @property
    def buffered(self) -> int:
        """Messages pulled and not yet handed to a listener."""
        return len(self._buffer)

    # ------------------------------------------------------------------ orderly
    def take(self, n: int) -> list[MessageExt]:
        """Move up to `n` of the oldest buffered messages into the consuming batch."""
        buffer = self._buffer
        if n == 1:  # the default batch size: skip the comprehension
            batch = [buffer.popleft()] if buffer else []
        elif n >= len(buffer):  # usual for a whole run or a poll: no pop per message
            batch = list(buffer)
            buffer.clear()
        else:
            batch = [buffer.popleft() for _ in range(n)]
        self._consuming.extend(batch)
        return batch

    def commit(self, *, lent: bool = False) -> int:
        """Drop the consuming batch as done; the offset to commit next (-1: nothing).

        `lent`: the caller still has the batch (a poll's, handed out just now) and gives it
        back to the cycle collector (`sdk._accel.hand_out`) once it is done with it.
        """
        if not self._consuming:
            return -1
        offset = self._consuming[-1].queue_offset + 1
        self._forget(self._consuming, lent)
        self._consuming = []
        return offset

    def settle(self, done: int) -> int:
        """Commit the first `done` messages taken; put the rest back in front.

        Returns the offset to commit next (-1: nothing committed).
        """
        finished, rest = self._consuming[:done], self._consuming[done:]
        self._buffer.extendleft(reversed(rest))
        self._consuming = []
        if not finished:
            return -1
        self._forget(finished)
        return finished[-1].queue_offset + 1

    # ------------------------------------------------------------------ concurrent
    def take_all(self, n: int) -> list[MessageExt]:
        """Hand out up to `n` buffered messages to run in parallel."""
        batch = [self._buffer.popleft() for _ in range(min(n, len(self._buffer)))]
        for m in batch:
            self._inflight[m.queue_offset] = m
        return batch

    def finish(self, messages: Iterable[MessageExt]) -> int:
        """Mark messages done; the offset safe to commit (the lowest unfinished one)."""
        done = [
            self._inflight.pop(m.queue_offset) for m in messages if m.queue_offset in self._inflight
        ]
        self._forget(done)
        candidates = [min(self._inflight)] if self._inflight else []
        if self._buffer:
            candidates.append(self._buffer[0].queue_offset)
        return min(candidates) if candidates else self.max_offset_pulled + 1

    def let_go(self) -> None:
        """Give every message held back to the cycle collector.

        For a queue the consumer gives up: a listener may still hold some of its messages.
        """
        hand_out(list(self._buffer))
        hand_out(self._consuming)
        hand_out(list(self._inflight.values()))

    def _forget(self, messages: list[MessageExt], lent: bool = False) -> None:
        if not lent:
            hand_out(messages)  # done with: a listener may keep them
        self.count -= len(messages)
        self._cached.count -= len(messages)
        self.size -= sum([len(m.body) for m in messages])
        room = self.room
        if room is not None and (self.room_when is None or self.room_when()):
            room.set()
