"""The orderly push consumer's core against an in-memory broker, on a fake clock.

Each test drives a failure path of issue 12 through the real PushConsumerCore: rebalance,
lock renewal and fencing, pull loops and the orderly consume service, with the broker's
own RebalanceLockManager behind a fake transport (tests/unit/fake_transport.py).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from sdk._transport.protocol import CreditWindow, PullResult
from sdk.consumer.allocate import AllocateMessageQueueAveragely
from sdk.consumer.config import ConsumeFromWhere, PushConsumerConfig
from sdk.consumer.core import REBALANCE_RETRY
from sdk.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
)
from sdk.consumer.process_queue import ProcessQueue
from sdk.consumer.push_core import PushConsumerCore
from sdk.errors import BrokerError, StaleEpochError
from sdk.message import MessageExt, MessageQueue
from sdk.testing import FakeClock
from tests.unit.fake_transport import FakeBroker, FakeTransport

OK = ConsumeOrderlyStatus.SUCCESS
SUSPEND = ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
GROUP = "g"
MQ = MessageQueue("orders", "fake", 0)


class Recorder(MessageListenerOrderly):
    """Records (queue, offset) per call; `gate` blocks calls while cleared."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.calls = 0
        self.in_call = threading.Event()
        self.answers: list[ConsumeOrderlyStatus] = []

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.calls += 1
        self.in_call.set()
        self.gate.wait(10)
        self.in_call.clear()
        answer = self.answers.pop(0) if self.answers else OK
        if answer is OK:
            self.seen.extend((m.queue.queue_id, m.queue_offset) for m in msgs)
        return answer


async def until(condition: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Wait (real time, the fake clock stands still) for `condition`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.002)


async def settle() -> None:
    """Let what is ready on the loop run, and what that makes ready, some turns deep.

    Counted in loop turns, not real time: a loaded machine runs as many, only slower.
    """
    for _ in range(50):
        await asyncio.sleep(0)


async def run_clock(
    clock: FakeClock, step: float, steps: int, condition: Callable[[], bool], what: str
) -> None:
    """Move `clock` on `step` at a time (at most `steps` times) until `condition`, letting
    what each step woke run before the next; then wait (real time) for `condition`."""
    for _ in range(steps):
        if condition():
            return
        clock.advance(step)
        await settle()
    await until(condition, what)


def armed(clock: FakeClock, *seconds: float) -> bool:
    """Whether timers wait for now + each of `seconds` (as many as it is repeated)."""
    now = clock.now()
    return all(clock.sleeping_until(now + s) >= seconds.count(s) for s in seconds)


def consumer(
    broker: FakeBroker,
    listener: MessageListenerOrderly,
    transport: FakeTransport | None = None,
    allocate_strategy: AllocateMessageQueueAveragely | None = None,
    **config: Any,
) -> PushConsumerCore:
    core = PushConsumerCore(
        GROUP,
        transport or FakeTransport(broker),
        consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        config=PushConsumerConfig(**config),
        clock=broker.clock,
        allocate_strategy=allocate_strategy,
    )
    core.subscribe(broker.topic)
    core.register_message_listener(listener)
    return core


def run(test: Callable[[FakeBroker], Coroutine[Any, Any, None]], queues: int = 1) -> None:
    async def main() -> None:
        broker = FakeBroker(FakeClock(), queues=queues)
        await test(broker)

    asyncio.run(main())


def test_a_lease_expiring_during_a_call_when_the_lock_comes_back_with_a_new_epoch() -> None:
    """Defect 1: re-lock with a new epoch while the consume task holds the object lock.

    No renewal reaches the broker while a listener call runs: the client's lease runs
    out during the call, and the broker expires the client meanwhile. The consume task,
    which held the queue's object lock through the call, then re-locks and gets the lock
    back at a new epoch. It used to re-lock with the object lock held, and the reset a new
    epoch brings took that lock too: the queue was stuck for good. It re-locks with
    neither lock held, and the queue starts again from its committed offset.
    """
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        # a renewal interval of its own: its timer is the only one due at that time
        core = consumer(broker, listener, lock_renew_interval=17.0)
        await core.start()
        broker.append(0, ["a"] * 3)
        await until(lambda: listener.seen == [(0, 0), (0, 1), (0, 2)], "the first messages")
        pq = core._queues[MQ]
        epoch = pq.lock_epoch
        clock.advance(5)  # the first renewal (at 5 s) and persist: offset 3 at the broker
        renewed = clock.now()
        await until(
            lambda: broker.offsets.get((GROUP, 0)) == 3 and pq.last_lock_time == renewed,
            "offset 3 committed and the lock renewed",
        )
        relocks: list[tuple[bool, bool, bool, int]] = []  # outcome, locks held, epoch after
        relock = core.relock

        async def watched(queue: MessageQueue, queue_pq: ProcessQueue) -> bool:
            held = queue_pq.object_lock.locked(), queue_pq.consume_lock.locked()
            outcome = await relock(queue, queue_pq)
            relocks.append((outcome, *held, queue_pq.lock_epoch))
            return outcome

        core.relock = watched  # type: ignore[method-assign]
        listener.gate.clear()
        broker.append(0, ["a"] * 2)
        await until(listener.in_call.is_set, "the call on message 3 in flight")
        broker.down = True  # no renewal reaches the broker...
        clock.advance(31)  # ...and the lease (30 s from 5 s) runs out during the call
        await until(lambda: clock.sleeping_until(clock.now() + 17), "the failed renewal")
        broker.locks.release_client(core.client_id)  # the broker expired the client
        assert listener.in_call.is_set() and pq.object_lock.locked()
        assert pq.locked and pq.lock_epoch == epoch and not pq.lease_fresh(clock.now(), 30.0)
        broker.down = False
        listener.gate.set()  # the call returns; the consume task finds the lease gone
        await until(lambda: bool(relocks), "the consume task's re-lock")
        assert relocks == [(True, False, False, pq.lock_epoch)], relocks
        assert pq.lock_epoch != epoch, "the lock did not come back at a new epoch"
        assert listener.seen == [(0, 0), (0, 1), (0, 2), (0, 3)]
        # The new epoch resets the queue to the broker's committed offset: 3 and 4 again.
        await run_clock(
            clock, 0.5, 20, lambda: len(listener.seen) >= 6, "messages 3 and 4 after the re-lock"
        )
        broker.append(0, ["a"])
        await until(lambda: len(listener.seen) >= 7, "a message after the re-lock")
        assert [offset for _, offset in listener.seen] == [0, 1, 2, 3, 3, 4, 5]
        await run_clock(  # persist, at the new epoch
            clock, 0.5, 20, lambda: broker.offsets.get((GROUP, 0)) == 6, "offset 6 committed"
        )
        assert broker.commits[-1][-1] == pq.lock_epoch
        assert relocks == [(True, False, False, pq.lock_epoch)], "a second re-lock"
        await core.shutdown()

    run(test)


def test_a_renewal_that_takes_a_new_epoch_during_a_call_does_not_wait_for_the_call() -> None:
    """The lock renewal takes a new epoch while a listener call runs (the consume task
    holds the queue's object lock): the queue is reset at once, not once the call ends,
    and consumed again from its committed offset after it."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core = consumer(broker, listener)
        await core.start()
        broker.append(0, ["a"] * 3)
        await until(lambda: listener.seen == [(0, 0), (0, 1), (0, 2)], "the first messages")
        listener.gate.clear()
        broker.append(0, ["a"] * 2)
        await until(listener.in_call.is_set, "a call in flight")
        pq = core._queues[MQ]
        epoch = pq.lock_epoch
        broker.locks.release_client(core.client_id)  # as when the broker expired the client
        # (it was silent too long): the next renewal gets a new epoch
        clock.advance(20)  # the renewal runs while the call is in flight
        await until(lambda: pq.locked and pq.lock_epoch != epoch, "the lock at a new epoch")
        assert listener.in_call.is_set() and pq.object_lock.locked()
        listener.gate.set()
        await until(lambda: len(listener.seen) >= 4, "the call in flight to finish")

        def message_4() -> bool:
            return len(listener.seen) >= 5 and listener.seen[-1] == (0, 4)

        await run_clock(clock, 0.5, 50, message_4, "message 4: the queue is stuck")
        broker.append(0, ["a"])
        await until(lambda: listener.seen[-1] == (0, 5), "a message after the new epoch")
        await core.shutdown()

    run(test)


def test_a_queue_whose_lease_ran_out_is_consumed_again_once_its_consume_task_relocks() -> None:
    """The consume task re-locks a queue whose lease ran out, and retries a re-lock that
    failed (RELOCK_FAILED_DELAY later): delivery resumes as soon as the broker grants the
    lock again, not at the next lock renewal."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        # a renewal interval of its own: its timer is the only one due at that time
        core = consumer(broker, listener, lock_renew_interval=17.0)
        await core.start()
        broker.append(0, ["a"] * 2)
        await until(lambda: listener.seen == [(0, 0), (0, 1)], "the first messages")
        pq = core._queues[MQ]
        epoch = pq.lock_epoch
        relocks = count_relocks(core)
        listener.gate.clear()
        broker.append(0, ["a"] * 3)
        await until(listener.in_call.is_set, "the call on message 2 in flight, 3 and 4 taken")
        broker.down = True  # no renewal reaches the broker...
        clock.advance(31)  # ...and the lease (30 s) runs out during the call
        await until(lambda: clock.sleeping_until(clock.now() + 17), "the failed renewal")
        renewal = clock.now() + 17
        listener.gate.set()  # the call returns; the consume task finds the lease gone
        await until(lambda: relocks == [False], "a re-lock the broker did not answer")
        assert not pq.lease_fresh(clock.now(), 30.0)
        broker.down = False
        await run_clock(  # the re-lock again (3 s later), then messages 3 and 4
            clock, 0.5, 20, lambda: len(listener.seen) >= 5, "messages 3 and 4 after the re-lock"
        )
        assert clock.now() < renewal, "only the lock renewal brought the queue back"
        assert relocks == [False, True], relocks
        assert pq.lease_fresh(clock.now(), 30.0) and pq.lock_epoch == epoch
        assert listener.seen == [(0, i) for i in range(5)]
        broker.append(0, ["a"])
        await until(lambda: listener.seen[-1:] == [(0, 5)], "a message after the re-lock")
        await core.shutdown()

    run(test)


def count_rounds(core: PushConsumerCore) -> list[bool]:
    """The outcome of every rebalance round from now on (True: complete)."""
    outcomes: list[bool] = []
    rebalance = core._rebalancer.rebalance

    async def counted() -> bool:
        outcome = await rebalance()
        outcomes.append(outcome)
        return outcome

    core._rebalancer.rebalance = counted  # type: ignore[method-assign]
    return outcomes


def count_relocks(core: PushConsumerCore) -> list[bool]:
    """The outcome of every re-lock a consume task asks for from now on (True: locked)."""
    outcomes: list[bool] = []
    relock = core.relock

    async def counted(queue: MessageQueue, pq: ProcessQueue) -> bool:
        outcome = await relock(queue, pq)
        outcomes.append(outcome)
        return outcome

    core.relock = counted  # type: ignore[method-assign]
    return outcomes


def assert_no_gap(offsets: list[int]) -> None:
    """Per key (one key per queue here): never past a message not yet processed."""
    highest = -1
    for offset in offsets:
        assert offset <= highest + 1, f"jumped from {highest} to {offset}: {offsets}"
        highest = max(highest, offset)


def test_a_pull_in_flight_when_the_queue_changes_owner_does_not_skip_messages() -> None:
    """Defect 3: the reset after an epoch change races a pull issued from the old offset."""
    listener = Recorder()
    listener.answers = [OK, OK, OK, SUSPEND]

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        broker.offsets[(GROUP, 0)] = 0
        core = consumer(
            broker, listener, suspend_current_queue_time=30.0, persist_interval=1000,
            pull_suspend=60.0, pull_timeout=90.0,
        )  # fmt: skip
        await core.start()
        broker.append(0, ["a"] * 10)
        await until(lambda: listener.calls == 4 and clock.sleepers >= 5, "message 3 suspended")
        broker.locks.release_client(core.client_id)  # as when the broker expired the client
        clock.advance(21)  # the renewal gets a new epoch and resets to the committed 0
        pq = core._queues[broker.queues()[0]]
        await until(lambda: pq.next_offset == 0, "the reset")
        broker.append(0, ["a"])  # answers the pull that was waiting at offset 10
        await until(  # the pull from the reset offset has messages 0-10 and waits for more
            lambda: pq.next_offset == 11 and clock.sleeping_until(clock.now() + 60),
            "messages 0-10 pulled again",
        )
        clock.advance(30)  # the suspended retry
        await until(lambda: (0, 10) in listener.seen, "message 10")
        await core.shutdown()

    run(test)
    assert_no_gap([offset for _, offset in listener.seen])


def test_a_queue_given_back_while_its_release_waits_for_a_call_is_consumed_again() -> None:
    """Defect 4: released while the listener runs, then allocated back."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core = consumer(broker, listener)
        await core.start()
        broker.append(0, ["a"] * 2)
        await until(lambda: len(listener.seen) == 2, "the first messages")
        listener.gate.clear()
        broker.append(0, ["a"])
        await until(listener.in_call.is_set, "a call in flight")
        rounds = count_rounds(core)
        broker.join(GROUP, "0-another-member")  # sorts first: it gets the only queue
        await until(lambda: bool(core._releasing_since), "a release waiting for the call")
        clock.advance(0.5)  # the release gives up waiting for the call: postponed
        await until(lambda: rounds[-1:] == [False], "the round that postponed it")
        broker.leave(GROUP, "0-another-member")  # and the queue is ours again
        listener.gate.set()
        await until(lambda: len(rounds) == 2, "the next round")
        await until(lambda: len(listener.seen) == 3, "the call in flight")
        broker.append(0, ["a"])
        await run_clock(clock, 0.5, 60, lambda: len(listener.seen) >= 4, "message 3")
        assert listener.seen[-1] == (0, 3), f"the queue is dead: {listener.seen}"
        assert broker.locks.is_locked_by(GROUP, ("orders", 0), core.client_id)
        await core.shutdown()

    run(test)


def test_a_queue_taken_back_while_its_old_consume_task_sleeps_gets_a_consume_task() -> None:
    """Defect 5: submit was keyed by queue, so the new process queue waited for the old."""
    listener = Recorder()
    listener.answers = [OK, SUSPEND]

    async def test(broker: FakeBroker) -> None:
        core = consumer(broker, listener, suspend_current_queue_time=30.0)
        await core.start()
        broker.append(0, ["a"] * 2)
        await until(lambda: listener.calls == 2, "message 1 suspended for 30 s")
        broker.join(GROUP, "0-another-member")
        await until(lambda: not core.held(), "the queue released")
        broker.leave(GROUP, "0-another-member")
        await until(lambda: bool(core.held()), "the queue taken back")
        await until(lambda: listener.seen[-1:] == [(0, 1)], "message 1, with no 30 s wait")
        await core.shutdown()

    run(test)


def test_a_broker_restart_that_forgets_the_members_does_not_make_consumers_give_up_queues() -> None:
    """Until its heartbeat lands, a member missing from its group keeps what it holds."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        core = consumer(broker, listener)
        await core.start()
        broker.append(0, ["a"] * 2)
        await until(lambda: len(listener.seen) == 2, "the first messages")
        [(queue, pq)] = core._queues.items()
        rounds = count_rounds(core)
        broker.restart()  # members forgotten, and the watch sees a new membership
        await until(lambda: bool(rounds), "the rebalance round the restart triggers")
        assert core._queues.get(queue) is pq and not pq.dropped, "the queue was given up"
        broker.clock.advance(10)  # the next heartbeat lands
        await until(lambda: len(rounds) >= 2 and rounds[-1], "a complete round")
        assert core._queues.get(queue) is pq and not pq.dropped
        broker.append(0, ["a"])
        await until(lambda: listener.seen[-1:] == [(0, 2)], "a message after the restart")
        await core.shutdown()
        assert not core.held(), "a shut-down consumer holds no queue"

    run(test)


def test_a_consumer_whose_commit_is_fenced_stops_calling_its_listener_at_once() -> None:
    """Defect 7, the consumer's side: a refused commit means the queue is someone else's."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core = consumer(broker, listener, persist_interval=0.5)
        await core.start()
        broker.append(0, ["a"] * 2)
        await until(lambda: len(listener.seen) == 2, "the first messages")
        key = ("orders", 0)
        broker.locks.release_client(core.client_id)  # it was expired while paused...
        assert broker.locks.lock_batch(GROUP, "another", [key])  # ...and another took over
        listener.gate.clear()  # (a call that starts now would show up as a call in flight)
        broker.append(0, ["a"] * 2)
        await until(lambda: listener.calls == 3, "the call that was under way")
        clock.advance(0.5)  # the periodic commit, refused (before any renewal): LOCK_NOT_HELD
        await until(lambda: not core._queues[MQ].locked, "the queue marked as not locked")
        pq = core._queues[MQ]
        listener.gate.set()
        # The consume task's turn ends (it gives the queue's object lock back) when the
        # check before its next call fails; a call after the fencing would come first.
        await until(lambda: not pq.object_lock.locked(), "the end of the consume turn")
        assert listener.calls == 3, "a listener call after the queue was fenced"
        assert broker.offsets.get((GROUP, 0)) is None, "the fenced consumer moved the offset"
        await core.shutdown()

    run(test)


def test_a_renewal_that_cannot_reach_the_broker_leaves_the_lease_running() -> None:
    """A broker that did not answer took nothing: consumption goes on within the lease."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core = consumer(broker, listener)
        await core.start()
        listener.gate.clear()
        broker.append(0, ["a"] * 3)
        await until(listener.in_call.is_set, "a call in flight, two more buffered")
        broker.down = True  # a restart under way
        clock.advance(20)  # the renewal fails: 20 s into a 30 s lease
        await until(lambda: clock.sleeping_until(clock.now() + 20), "the next renewal's timer")
        listener.gate.set()
        await until(lambda: len(listener.seen) == 3, "the buffered messages, broker or not")
        broker.down = False
        await core.shutdown()

    run(test)


class OffsetReadFails(FakeTransport):
    """Its committed-offset reads of the queues in `failing` fail (not retriably)."""

    def __init__(self, broker: FakeBroker) -> None:
        super().__init__(broker)
        self.failing: set[MessageQueue] = set()

    async def query_offset(self, group: str, queue: MessageQueue) -> int | None:
        if queue in self.failing:
            raise BrokerError("the fake broker failed to read the offset", code="INTERNAL")
        return await super().query_offset(group, queue)


def test_a_renewal_whose_offset_read_fails_for_one_queue_takes_the_others_grants() -> None:
    """Both queues come back at new epochs; re-reading the first one's committed offset
    fails. The second is taken at its new epoch in the same renewal (it was skipped, its
    lease left to run out, while the first failed); the first waits for the next one."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        transport = OffsetReadFails(broker)
        core = consumer(broker, listener, transport)
        await core.start()
        await until(lambda: len(core._queues) == 2, "both queues held")
        first, second = core._queues
        epochs = {q: pq.lock_epoch for q, pq in core._queues.items()}
        transport.failing.add(first)
        broker.locks.release_client(core.client_id)  # the next renewal gets new epochs
        clock.advance(20)
        pq = core._queues[second]
        await until(lambda: pq.lock_epoch != epochs[second], "the second queue's new epoch")
        assert pq.locked
        assert core._queues[first].lock_epoch == epochs[first], "taken without its offset"
        assert not core._queues[first].locked
        transport.failing.clear()
        await run_clock(
            clock, 1.0, 60, lambda: core._queues[first].locked, "the first queue, next time"
        )
        assert core._queues[first].lock_epoch != epochs[first]
        await core.shutdown()

    run(test, queues=2)


def test_a_queue_moves_only_once_its_listener_call_returns_however_long_it_takes() -> None:
    """RocketMQ forces the release after 20 s, and two consumers then call on one queue."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core = consumer(broker, listener)
        await core.start()
        listener.gate.clear()
        broker.append(0, ["a"])
        await until(listener.in_call.is_set, "a call in flight")
        rounds = count_rounds(core)
        broker.join(GROUP, "0-another-member")  # sorts first: the queue is now its
        # 30 s and more of rounds that find the call still running
        await run_clock(clock, 0.5, 120, lambda: len(rounds) >= 30, "30 rebalance rounds")
        assert broker.locks.is_locked_by(GROUP, ("orders", 0), core.client_id)
        assert MQ in core.held()
        listener.gate.set()
        await until(lambda: listener.seen == [(0, 0)], "the call to return")
        # the next round releases it
        await run_clock(clock, 0.5, 40, lambda: not core.held(), "the queue released")
        assert not broker.locks.is_locked_by(GROUP, ("orders", 0), core.client_id)
        await core.shutdown()

    run(test)


def test_a_lock_answer_that_arrives_late_does_not_extend_the_clients_lease() -> None:
    """A lease starts when its request was sent, not when its answer arrived.

    A partition that cuts the way back first: a renewal reaches the broker and its answer
    waits out the partition, during which the broker expires the client and another one
    takes the queue. The answer, arriving at the heal, must not count as a fresh lease.
    """
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core = consumer(broker, listener)
        link = core._transport
        assert isinstance(link, FakeTransport)
        await core.start()
        broker.append(0, ["a"] * 2)
        await until(lambda: len(listener.seen) == 2, "the first messages")
        pq = core._queues[MQ]
        clock.advance(1)  # the first renewal
        await until(lambda: clock.sleeping_until(clock.now() + 20), "the next renewal's timer")
        link.lock_answers_held = True  # the way back is cut...
        clock.advance(20)  # ...as the next renewal reaches the broker
        await until(lambda: link.answers_waiting == 1, "the renewal to be held")
        link.partitioned = True  # then the way there
        clock.advance(61)  # beyond both leases: the broker expires the client
        # Every loop that woke meets the partition and sleeps again: the missing-topic
        # poll, the rebalance retry, the pull's backoff, persist and heartbeat.
        await until(lambda: armed(clock, 0.5, 0.5, 3.0, 5.0, 10.0), "the loops cut off")
        key = (broker.topic, 0)
        broker.locks.release_client(core.client_id)
        assert broker.locks.lock_batch(GROUP, "another", [key])  # which takes the queue
        link.partitioned = False  # the heal: the held answer arrives
        link.lock_answers_held = False
        await until(lambda: clock.sleeping_until(clock.now() + 20), "the renewal's answer")
        relocks = count_relocks(core)
        broker.append(0, ["a"])  # a message for the queue's new owner
        # Pulls, re-lock attempts: a few seconds, not a renewal period. A listener call must
        # not come: each step's wait is a bounded number of loop turns (settle), then the
        # message buffered and two re-locks refused prove the consume task had its chances.
        for _ in range(20):
            clock.advance(0.5)
            await settle()
        await until(
            lambda: len(listener.seen) > 2 or (pq.count == 1 and len(relocks) >= 2),
            "the message buffered and re-locks refused",
        )
        assert listener.seen == [(0, 0), (0, 1)], "a listener call on another's queue"
        await core.shutdown()

    run(test)


class CountingWindow(CreditWindow):
    """A credit window that counts the consumer's looks at what to grant, and its grants."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0
        self.grants: list[tuple[int, int]] = []

    def to_grant(
        self, limit_messages: int, limit_bytes: int, count: int, size: int, min_messages: int
    ) -> tuple[int, int]:
        self.looks += 1
        return super().to_grant(limit_messages, limit_bytes, count, size, min_messages)


class ScriptedSubscription:
    """A push subscription whose batches, and the error that ends it, the test hands it."""

    def __init__(self, offset: int, lock_epoch: int) -> None:
        self.offset = offset
        self.lock_epoch = lock_epoch
        self.credit = CountingWindow()
        self.items: asyncio.Queue[PullResult | Exception] = asyncio.Queue()
        self.handler: Callable[[PullResult], bool] | None = None
        self.closed = False

    def arrive(self, batch: PullResult) -> None:
        """A batch arrives: to the handler, as a stream's reader hands it, or to next()."""
        handler = self.handler
        if handler is not None:
            if handler(batch):
                self.credit.received(len(batch.messages), 0)
                return
            self.handler = None  # this batch and the rest: through next()
        self.items.put_nowait(batch)

    def on_batch(self, handler: Callable[[PullResult], bool] | None) -> None:
        self.handler = handler

    async def next(self) -> PullResult:
        item = await self.items.get()
        if isinstance(item, Exception):
            raise item
        self.credit.received(len(item.messages), 0)
        return item

    def grant(self, messages: int, size: int) -> None:
        self.credit.grants.append((messages, size))
        self.credit.granted(messages, size)

    def close(self) -> None:
        self.closed = True


class PushTransport(FakeTransport):
    """The fake transport with push subscriptions the test scripts (every one kept)."""

    def __init__(self, broker: FakeBroker) -> None:
        super().__init__(broker)
        self.subscriptions: list[ScriptedSubscription] = []

    async def subscribe(
        self, group: str, queue: MessageQueue, offset: int, *, lock_epoch: int,
        credit_messages: int, credit_bytes: int, **_: Any,
    ) -> ScriptedSubscription:  # fmt: skip
        subscription = ScriptedSubscription(offset, lock_epoch)
        subscription.credit.granted(credit_messages, credit_bytes)
        self.subscriptions.append(subscription)
        return subscription


async def push_core(
    broker: FakeBroker, listener: Recorder, **config: Any
) -> tuple[PushConsumerCore, PushTransport]:
    """An orderly core with push delivery (`config`: more PushConsumerConfig), started on
    `broker`'s topic, once its queue's subscription is open."""
    transport = PushTransport(broker)
    core = PushConsumerCore(
        GROUP, transport, consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
        config=PushConsumerConfig(delivery="push", **config), clock=broker.clock,
    )  # fmt: skip
    core.subscribe(broker.topic)
    core.register_message_listener(listener)
    await core.start()
    await until(lambda: len(transport.subscriptions) == 1, "a subscription")
    return core, transport


def test_a_push_subscription_the_old_lock_ended_after_a_relock_does_not_fence_the_queue() -> None:
    """The broker ends a subscription at once when its lock changes; when the consumer has
    taken the lock again at a new epoch by the time that end arrives, the queue is its own:
    it subscribes again at the new epoch. Fenced instead, it would call no listener until
    the next renewal (here: never, the clock stands still)."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core, transport = await push_core(broker, listener)
        first = transport.subscriptions[0]
        assert first.lock_epoch
        broker.append(0, ["a"] * 2)
        first.items.put_nowait(await transport.pull(GROUP, MQ, first.offset))
        await until(lambda: listener.seen == [(0, 0), (0, 1)], "the first batch")
        pq = core._queues[MQ]
        broker.locks.release_client(core.client_id)  # the next renewal gets a new epoch
        clock.advance(20)  # lock_renew_interval: the renewal runs
        await until(
            lambda: pq.locked and pq.lock_epoch != first.lock_epoch, "the relock at a new epoch"
        )
        # Only now does the end of the subscription at the old epoch come.
        first.items.put_nowait(StaleEpochError("the lock of orders:0 is at a later epoch"))
        await until(lambda: len(transport.subscriptions) == 2, "a subscription at the new epoch")
        second = transport.subscriptions[1]
        assert pq.locked and second.lock_epoch == pq.lock_epoch
        broker.append(0, ["a"])
        second.items.put_nowait(await transport.pull(GROUP, MQ, second.offset))
        await until(lambda: listener.seen[-1:] == [(0, 2)], "a message at the new epoch")
        await core.shutdown()

    run(test)


def test_the_credit_granter_wakes_per_grant_not_per_consumed_message() -> None:
    """Push delivery: the granter sleeps until the cache has a grant's worth of room (a
    pull batch of messages, or half its bytes). It used to wake for each message the
    listener consumed and find nothing to grant: a look per message, as here, where
    each message comes alone (a stream at a low rate) and is consumed before the next."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        core, transport = await push_core(
            broker, listener, pull_threshold_for_queue=64, pull_batch_size=32
        )
        sub = transport.subscriptions[0]
        assert sub.credit.messages == 64  # the whole cache, granted at subscribing
        for offset in range(128):
            broker.append(0, ["k"])
            sub.items.put_nowait(await transport.pull(GROUP, MQ, offset))
            await until(lambda offset=offset: len(listener.seen) == offset + 1, "the message")
        await until(lambda: sub.credit.messages == 64, "the credit back")
        # Consumed one at a time (batch size 1): a grant once 32 or more are freed.
        grants = sub.credit.grants
        assert sum(m for m, _ in grants) == 128 and all(m >= 32 for m, _ in grants), grants
        assert sub.credit.looks <= 1 + 2 * len(grants), (sub.credit.looks, grants)
        await core.shutdown()

    run(test)


def test_a_pushed_batch_is_buffered_as_it_arrives_without_a_hand_off_to_the_push_loop() -> None:
    """Push delivery: a batch is in the queue's cache, and a consume task on its way, as
    soon as the transport's reader hands it over. It used to be queued for the push loop,
    a task wake-up per batch before the consume task's own (issue 40: most of the
    client's CPU per pushed message went on such hops)."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        core, transport = await push_core(broker, listener)
        sub = transport.subscriptions[0]
        pq = core._queues[MQ]
        broker.append(0, ["a"] * 3)
        sub.arrive(await transport.pull(GROUP, MQ, sub.offset))
        # No await since: nothing else ran on the loop.
        assert (pq.count, pq.next_offset, sub.items.qsize()) == (3, 3, 0)
        await until(lambda: listener.seen == [(0, 0), (0, 1), (0, 2)], "the batch")
        await core.shutdown()

    run(test)


def test_a_batch_pushed_after_the_lock_changed_epoch_is_not_buffered() -> None:
    """Handed over in the transport's reader, a batch still passes the push loop's checks:
    one of a subscription at an old lock epoch is not buffered, the subscription is
    closed and the queue subscribed again at the new epoch, from its offset."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        core, transport = await push_core(broker, listener)
        first = transport.subscriptions[0]
        pq = core._queues[MQ]
        broker.locks.release_client(core.client_id)
        clock.advance(20)  # lock_renew_interval: the renewal takes a new epoch
        await until(lambda: pq.locked and pq.lock_epoch != first.lock_epoch, "a new epoch")
        broker.append(0, ["a"] * 2)
        first.arrive(await transport.pull(GROUP, MQ, first.offset))
        assert pq.count == 0
        await until(lambda: len(transport.subscriptions) == 2, "a subscription at the new epoch")
        second = transport.subscriptions[1]
        assert first.closed and second.lock_epoch == pq.lock_epoch and second.offset == 0
        second.arrive(await transport.pull(GROUP, MQ, second.offset))
        await until(lambda: listener.seen == [(0, 0), (0, 1)], "the batch, once")
        await core.shutdown()

    run(test)


def logged_errors(
    caplog: pytest.LogCaptureFixture, test: Callable[[FakeBroker], Coroutine[Any, Any, None]]
) -> int:
    """Runs `test`; how many errors it logged with a traceback."""
    with caplog.at_level("ERROR", logger="ordermq"):
        run(test)
    return sum(1 for r in caplog.records if r.levelname == "ERROR" and r.exc_info)


class FailingOnce(PushTransport):
    """Push subscriptions whose first `subscribe` (or, with `pulls`, first pull) raises an
    error no transport should: a bug below the consumer, not an OrderMQError."""

    def __init__(self, broker: FakeBroker, *, pulls: bool = False) -> None:
        super().__init__(broker)
        self.failures = 1
        self.pulls = pulls

    def _fail_once(self) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("a transport bug")

    async def subscribe(self, *args: Any, **kwargs: Any) -> ScriptedSubscription:
        if not self.pulls:
            self._fail_once()
        return await super().subscribe(*args, **kwargs)

    async def pull(self, *args: Any, **kwargs: Any) -> PullResult:
        if self.pulls and args[0] == GROUP and kwargs.get("suspend_timeout"):
            self._fail_once()
        return await super().pull(*args, **kwargs)


#: The tests' pull_error_backoff: no other timer of the consumer is due at that time.
BACKOFF = 2.75


def test_an_unexpected_error_in_a_push_or_pull_loop_is_logged_and_the_queue_served_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A transport error that is not an OrderMQError (a bug) while subscribing, ending a
    subscription, or pulling is logged with its traceback and the queue subscribed to or
    pulled again after pull_error_backoff. It used to end that queue's task: the queue was
    held and never consumed again, and nothing said why."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        # subscribe raises once
        transport = FailingOnce(broker)
        core = consumer(broker, listener, transport, delivery="push", pull_error_backoff=BACKOFF)
        await core.start()
        await until(lambda: clock.sleeping_until(clock.now() + BACKOFF), "the backoff")
        assert transport.failures == 0
        clock.advance(BACKOFF)
        await until(lambda: len(transport.subscriptions) == 1, "a subscription after the error")
        # the subscription ends with a non-OrderMQError
        first = transport.subscriptions[0]
        first.items.put_nowait(RuntimeError("a reader bug"))
        await until(lambda: clock.sleeping_until(clock.now() + BACKOFF), "the backoff again")
        clock.advance(BACKOFF)
        await until(lambda: len(transport.subscriptions) == 2, "a subscription again")
        assert first.closed
        second = transport.subscriptions[1]
        broker.append(0, ["a"])
        second.arrive(await transport.pull(GROUP, MQ, second.offset))
        await until(lambda: listener.seen == [(0, 0)], "the message")
        await core.shutdown()

    assert logged_errors(caplog, test) == 2


def test_an_unexpected_error_in_a_pull_is_logged_and_the_queue_pulled_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As above, for a consumer that pulls."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        transport = FailingOnce(broker, pulls=True)
        core = consumer(broker, listener, transport, delivery="pull", pull_error_backoff=BACKOFF)
        await core.start()
        await until(lambda: clock.sleeping_until(clock.now() + BACKOFF), "the backoff")
        assert transport.failures == 0
        clock.advance(BACKOFF)
        broker.append(0, ["a", "b"])
        await until(lambda: listener.seen == [(0, 0), (0, 1)], "the messages")
        await core.shutdown()

    assert logged_errors(caplog, test) == 1


class RenewalFailingOnce(FakeTransport):
    """A transport whose lock call raises, once when told to, an error no transport
    should (a bug, not an OrderMQError), and counts the calls after it."""

    def __init__(self, broker: FakeBroker) -> None:
        super().__init__(broker)
        self.fail = False
        self.calls_after = 0

    async def lock_batch(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail:
            self.fail = False
            raise RuntimeError("a transport bug")
        self.calls_after += 1
        return await super().lock_batch(*args, **kwargs)


def test_an_unexpected_error_in_a_lock_renewal_is_logged_and_the_next_renewal_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Lock renewal (like heartbeats, offset persistence and the membership watch) goes on
    after an error that is not an OrderMQError: it used to end the loop, and the consumer
    lost its locks at the lease's end for good."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        clock = broker.clock
        transport = RenewalFailingOnce(broker)
        # an interval of its own: its timer is then the only one due at that time
        core = consumer(broker, listener, transport, delivery="pull", lock_renew_interval=17.0)
        await core.start()
        await until(lambda: MQ in core._queues and core._queues[MQ].locked, "the lock")
        transport.fail, transport.calls_after = True, 0
        await until(lambda: clock.sleeping_until(clock.now() + 1.0), "the first renewal's timer")
        clock.advance(1.0)  # FIRST_LOCK_RENEWAL: this renewal raises
        await until(lambda: clock.sleeping_until(clock.now() + 17.0), "the next renewal's timer")
        assert not transport.fail
        clock.advance(17.0)
        await until(lambda: transport.calls_after > 0, "the next renewal")
        await core.shutdown()

    assert logged_errors(caplog, test) >= 1


class FailingOnceStrategy(AllocateMessageQueueAveragely):
    """The usual allocation, but its first answer is an exception (a user's bug)."""

    def __init__(self) -> None:
        self.failures = 1

    def allocate(self, *args: Any, **kwargs: Any) -> list[MessageQueue]:
        if self.failures:
            self.failures -= 1
            raise ValueError("a bug in the user's strategy")
        return super().allocate(*args, **kwargs)


def test_an_allocate_strategy_that_raises_is_logged_and_the_rebalance_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A custom allocate strategy raising is logged with its traceback and the rebalance
    tried again (as RocketMQ does). It used to end the consumer's rebalance loop: the
    consumer never took a queue."""
    listener = Recorder()

    async def test(broker: FakeBroker) -> None:
        strategy = FailingOnceStrategy()
        core = consumer(broker, listener, allocate_strategy=strategy, delivery="pull")
        await core.start()
        await until(lambda: strategy.failures == 0, "the failed allocation")
        broker.append(0, ["a"])
        # REBALANCE_RETRY's timer shares its deadline with the missing-topic watch's: move
        # time on a retry at a time (at most 20, 10 s: no lease or interval runs out) until
        # the rebalance tried again has taken the queue and its message arrived
        steps = 0

        def retried() -> bool:
            nonlocal steps
            if listener.seen == [(0, 0)]:
                return True
            if steps < 20:
                broker.clock.advance(REBALANCE_RETRY)
                steps += 1
            return False

        await until(retried, "the message after the rebalance tried again")
        await core.shutdown()

    assert logged_errors(caplog, test) >= 1
