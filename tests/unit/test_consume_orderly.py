"""The orderly consume service, driven by a fake clock and a fake host (no sockets)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import pytest

from sdk import tracing
from sdk.consumer.config import PushConsumerConfig
from sdk.consumer.consume_orderly import (
    CALLS_PER_HOP,
    THREAD_HOP_SECONDS,
    TRACING_CHECK_CALLS,
    ConsumeOrderlyService,
)
from sdk.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
)
from sdk.consumer.process_queue import ProcessQueue
from sdk.message import MessageExt, MessageQueue
from sdk.testing import FakeClock

Q = MessageQueue("orders", "b", 0)
OK, SUSPEND = ConsumeOrderlyStatus.SUCCESS, ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT


def msg(offset: int) -> MessageExt:
    return MessageExt("orders", b"m%d" % offset, None, (), {}, None, f"{offset:032X}", Q,
                      offset, 0, 0, 0)  # fmt: skip


class Host:
    def __init__(self, relock_ok: bool = True) -> None:
        self.commits: list[int] = []
        self.dead: list[tuple[int, int]] = []
        self.relocks = 0
        self.relock_ok = relock_ok

    def commit(self, queue: MessageQueue, offset: int) -> None:
        self.commits.append(offset)

    async def send_to_dead_letter(self, message: MessageExt, reconsume_times: int) -> bool:
        self.dead.append((message.queue_offset, reconsume_times))
        return True

    async def relock(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        self.relocks += 1
        return self.relock_ok


class Scripted(MessageListenerOrderly):
    """Answers from a script, then SUCCESS; records what it saw."""

    def __init__(self, script: list[Any] | None = None) -> None:
        self.script = list(script or [])
        self.seen: list[tuple[int, ...]] = []
        self.running = 0
        self.max_running = 0

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus | None:
        self.running += 1
        self.max_running = max(self.max_running, self.running)
        self.seen.append(tuple(m.queue_offset for m in msgs))
        time.sleep(0.001)
        self.running -= 1
        answer = self.script.pop(0) if self.script else OK
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


async def until(condition: Callable[[], bool], what: str = "") -> None:
    deadline = time.monotonic() + 5
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def run_service(
    test: Callable[[ConsumeOrderlyService, ProcessQueue, FakeClock], Coroutine[Any, Any, None]],
    listener: MessageListenerOrderly,
    host: Host,
    **config: Any,
) -> None:
    async def main() -> None:
        clock = FakeClock()
        with ThreadPoolExecutor(4) as pool:
            service = ConsumeOrderlyService(
                listener, host, pool, clock, PushConsumerConfig(**config)
            )
            pq = ProcessQueue()
            pq.locked, pq.last_lock_time = True, clock.now()
            await test(service, pq, clock)
            await service.shutdown(5)

    asyncio.run(main())


def test_messages_reach_the_listener_one_at_a_time_in_order_and_commit() -> None:
    listener, host = Scripted(), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        service.submit(Q, pq)  # a second submit must not start a second task
        await until(lambda: host.commits[-1:] == [5], "all committed")

    run_service(test, listener, host)
    assert listener.seen == [(0,), (1,), (2,), (3,), (4,)]
    assert host.commits[-1] == 5 and host.commits == sorted(host.commits)
    assert listener.max_running == 1


def test_batches_follow_consume_message_batch_max_size() -> None:
    listener, host = Scripted(), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(7)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [7])

    run_service(test, listener, host, consume_message_batch_max_size=3)
    assert listener.seen == [(0, 1, 2), (3, 4, 5), (6,)]


def test_suspend_exception_and_none_retry_the_same_batch_after_the_suspend_time() -> None:
    listener, host = Scripted([SUSPEND, RuntimeError("boom"), None]), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(0), msg(1)])
        service.submit(Q, pq)
        for tries in (1, 2, 3):
            await until(lambda n=tries: len(listener.seen) == n and clock.sleepers == 1)  # type: ignore[misc]
            clock.advance(0.99)
            assert clock.sleepers == 1, "the retry timer fired before the suspend time"
            assert len(listener.seen) == tries
            clock.advance(0.02)
        await until(lambda: host.commits[-1:] == [2])

    run_service(test, listener, host)
    assert listener.seen == [(0,), (0,), (0,), (0,), (1,)]
    assert host.dead == []


def test_a_message_failing_max_reconsume_times_goes_to_the_dlq_and_the_queue_moves_on() -> None:
    """RocketMQ's count: one try and max_reconsume_times retries, then the DLQ."""
    listener, host = Scripted([SUSPEND] * 4), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(0), msg(1)])
        service.submit(Q, pq)
        for _ in range(3):
            await until(lambda: clock.sleepers == 1)
            clock.advance(1.01)
        await until(lambda: host.commits[-1:] == [2])

    run_service(test, listener, host, max_reconsume_times=3)
    assert host.dead == [(0, 3)]
    assert listener.seen == [(0,), (0,), (0,), (0,), (1,)]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_batch_that_grew_between_retries_dead_letters_only_its_exhausted_front(
    asynchronous: bool,
) -> None:
    """Defect 2: messages that never succeeded are not committed with a dead-lettered one."""
    answers = [SUSPEND, SUSPEND, OK]
    listener: MessageListenerOrderly = AsyncScripted(answers) if asynchronous else Scripted(answers)
    host = Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        if isinstance(listener, AsyncScripted):
            listener.pq = pq
        pq.put([msg(0)])
        service.submit(Q, pq)
        await until(lambda: clock.sleepers == 1)
        pq.put([msg(1), msg(2), msg(3)])  # arrive while message 0 waits to be retried
        clock.advance(1.01)
        await until(lambda: clock.sleepers == 1 and len(seen()) == 2)
        clock.advance(1.01)
        await until(lambda: host.commits[-1:] == [4])

    def seen() -> list[tuple[int, ...]]:
        return listener.seen  # type: ignore[attr-defined, no-any-return]

    run_service(test, listener, host, max_reconsume_times=1, consume_message_batch_max_size=4)
    assert host.dead == [(0, 1)], "only message 0 used up its retries"
    assert seen() == [(0,), (0, 1, 2, 3), (1, 2, 3)], "1-3 were retried, not skipped"
    assert host.commits == [1, 4], "the commit passed 1-3 only once they succeeded"


def test_an_expired_lease_stops_the_next_listener_call_until_relocked() -> None:
    listener, host = Scripted(), Host(relock_ok=False)

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(0)])
        service.submit(Q, pq)
        await until(lambda: host.commits == [1])
        clock.advance(30.01)  # no renewal for longer than the client-side lease
        pq.put([msg(1)])
        service.submit(Q, pq)
        await until(lambda: host.relocks == 1 and clock.sleepers == 1)
        assert listener.seen == [(0,)], "no listener call without a valid lease"
        pq.last_lock_time = clock.now()  # the renewal service got the lock back
        clock.advance(3)
        await until(lambda: host.commits == [1, 2])

    run_service(test, listener, host)


def test_a_dropped_queue_gets_no_further_listener_calls() -> None:
    listener, host = Scripted(), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(0), msg(1), msg(2)])
        async with pq.consume_lock:  # as rebalance does before it drops a queue
            service.submit(Q, pq)
            await until(lambda: pq.object_lock.locked(), "the consume task to start")
            pq.dropped = True
        await until(lambda: not pq.object_lock.locked(), "the consume task to finish")

    run_service(test, listener, host)
    assert listener.seen == [] and host.commits == []


def test_async_listeners_run_on_the_loop() -> None:
    seen: list[int] = []

    class AsyncListener(MessageListenerOrderly):
        async def consume_message(  # type: ignore[override]
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            await asyncio.sleep(0)
            seen.extend(m.queue_offset for m in msgs)
            return OK

    host = Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(0), msg(1)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [2])

    run_service(test, AsyncListener(), host)
    assert seen == [0, 1]


def test_a_failure_in_the_middle_of_a_hop_commits_what_came_before_it() -> None:
    listener, host = Scripted([OK, OK, SUSPEND]), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await until(lambda: host.commits == [2] and clock.sleepers == 1)
        assert listener.seen == [(0,), (1,), (2,)], "no call after the failing one"
        clock.advance(1.01)
        await until(lambda: host.commits[-1:] == [5])

    run_service(test, listener, host)
    assert listener.seen == [(0,), (1,), (2,), (2,), (3,), (4,)]


def test_a_lease_that_runs_out_mid_hop_stops_before_the_next_call() -> None:
    calls: list[int] = []
    clock_holder: list[FakeClock] = []

    class ExpiresTheLease(MessageListenerOrderly):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            calls.append(msgs[0].queue_offset)
            if msgs[0].queue_offset == 1:
                clock_holder[0].advance(31)  # the renewal is late while this call runs
            return OK

    host = Host(relock_ok=False)

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        clock_holder.append(clock)
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await until(lambda: host.relocks == 1)

    run_service(test, ExpiresTheLease(), host)
    assert calls == [0, 1]
    assert host.commits == [2]


def test_a_queue_dropped_during_a_call_mid_hop_gets_no_next_call() -> None:
    calls: list[int] = []
    pq_holder: list[ProcessQueue] = []

    class DropsTheQueue(MessageListenerOrderly):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            calls.append(msgs[0].queue_offset)
            if msgs[0].queue_offset == 1:
                pq_holder[0].dropped = True  # rebalance drops it while this call runs
            return OK

    host = Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq_holder.append(pq)
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await until(lambda: host.commits == [2], "the calls before the drop committed")
        await until(lambda: not pq.object_lock.locked(), "the consume task to finish")

    run_service(test, DropsTheQueue(), host)
    assert calls == [0, 1]
    assert host.commits == [2]


def test_a_hop_carries_a_long_run_and_a_suspend_in_it_holds_back_the_rest_until_retried() -> None:
    """A plain listener's hop carries more than CALLS_PER_HOP calls; SUSPEND in the
    middle of a run still commits what came before it and calls nothing after it until
    the retry."""
    total, failing = 5 * CALLS_PER_HOP, 3 * CALLS_PER_HOP + 5
    listener, host = Scripted([OK] * failing + [SUSPEND]), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(total)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [failing] and clock.sleepers == 1, "the suspend")
        assert listener.seen == [(i,) for i in range(failing + 1)], "no call after SUSPEND"
        clock.advance(0.99)
        assert clock.sleepers == 1, "the retry timer fired before the suspend time"
        clock.advance(0.02)
        await until(lambda: host.commits[-1:] == [total], "the rest")

    run_service(test, listener, host)
    expected = [*range(failing + 1), *range(failing, total)]
    assert listener.seen == [(i,) for i in expected]
    assert failing in host.commits and host.commits[-1] == total
    assert host.commits == sorted(host.commits)
    assert listener.max_running == 1


def test_a_slow_plain_listener_gives_its_thread_back_after_the_hop_time() -> None:
    """A hop ends once it has called for THREAD_HOP_SECONDS of the consumer's clock (here:
    after one slow call); what is left goes back in front and comes next, in order."""
    slow = THREAD_HOP_SECONDS + 0.02

    class Slow(Scripted):
        clock: FakeClock

        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus | None:
            if msgs[0].queue_offset == 0:
                self.clock.advance(slow)
            return super().consume_message(msgs, context)

    listener, host = Slow(), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        listener.clock = clock
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [5], "all committed")

    run_service(test, listener, host)
    assert listener.seen == [(i,) for i in range(5)]
    assert host.commits == [1, 5], "the first hop ended after its slow call"


def test_shutdown_stops_a_plain_listener_between_calls_of_a_hop() -> None:
    """Calls in flight finish; the rest of the run is not called once shutdown began."""
    entered, release = threading.Event(), threading.Event()

    class Blocks(Scripted):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus | None:
            if msgs[0].queue_offset == 0:
                entered.set()
                release.wait(5)
            return super().consume_message(msgs, context)

    listener, host = Blocks(), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(10)])
        service.submit(Q, pq)
        await until(entered.is_set, "the first call")
        stopping = asyncio.create_task(service.shutdown(5))
        await asyncio.sleep(0)  # shutdown has begun: the service is closed
        release.set()
        await stopping

    run_service(test, listener, host)
    assert listener.seen == [(0,)], "no call after shutdown began"
    assert host.commits == [1], "the call in flight finished and committed"


def test_tracing_switched_on_mid_hop_reaches_a_plain_listener_within_the_check_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switched_on = [False]
    spans: list[int] = []

    @contextmanager
    def consume_span(group: str, batch: list[MessageExt]) -> Iterator[None]:
        spans.append(batch[0].queue_offset)
        yield

    monkeypatch.setattr(tracing, "enabled", lambda: switched_on[0])
    monkeypatch.setattr(tracing, "consume_span", consume_span)

    class SwitchesOn(MessageListenerOrderly):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus:
            if msgs[0].queue_offset == 3:
                switched_on[0] = True
            return OK

    host = Host()
    total = 3 * TRACING_CHECK_CALLS

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(total)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [total])

    run_service(test, SwitchesOn(), host)
    assert spans == list(range(TRACING_CHECK_CALLS, total))


class AsyncScripted(MessageListenerOrderly):
    """A coroutine listener: answers from a script, then SUCCESS; records what it saw."""

    def __init__(
        self,
        script: list[Any] | None = None,
        during: Callable[[int, ConsumeOrderlyContext], None] | None = None,
    ) -> None:
        self.script = list(script or [])
        self.during = during  # runs inside each call, with the first offset and the context
        self.seen: list[tuple[int, ...]] = []
        self.contexts: list[ConsumeOrderlyContext] = []
        self.pq: ProcessQueue | None = None
        self.lock_held: list[bool] = []

    async def consume_message(  # type: ignore[override]
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus | None:
        assert self.pq is not None
        self.lock_held.append(self.pq.consume_lock.locked())
        self.seen.append(tuple(m.queue_offset for m in msgs))
        self.contexts.append(context)
        if self.during is not None:
            self.during(msgs[0].queue_offset, context)
        await asyncio.sleep(0)
        answer = self.script.pop(0) if self.script else OK
        if isinstance(answer, Exception):
            raise answer
        return answer  # type: ignore[no-any-return]


def test_async_calls_each_hold_the_consume_lock_start_from_the_suspend_time_and_commit() -> None:
    given: list[float] = []

    def keep_a_long_suspend(offset: int, context: ConsumeOrderlyContext) -> None:
        given.append(context.suspend_current_queue_time)
        context.suspend_current_queue_time = 20.0  # must not leak into the next call

    listener, host = AsyncScripted(during=keep_a_long_suspend), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        listener.pq = pq
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [5], "all committed")
        assert service.listener_calls == 5

    run_service(test, listener, host)
    assert listener.seen == [(0,), (1,), (2,), (3,), (4,)]
    assert host.commits == [5], "the calls of a turn commit once, before the lock is let go"
    assert listener.lock_held == [True] * 5
    assert given == [1.0] * 5, "each call starts from the consumer's suspend time"
    assert {c.queue for c in listener.contexts} == {Q}


def test_a_context_changed_by_a_successful_plain_call_is_not_passed_again() -> None:
    """Contexts left as given may be passed again; a changed one never is."""
    given: list[float] = []

    class Changing(Scripted):
        def consume_message(
            self, msgs: list[MessageExt], context: ConsumeOrderlyContext
        ) -> ConsumeOrderlyStatus | None:
            given.append(context.suspend_current_queue_time)
            if msgs[0].queue_offset % 2:
                context.suspend_current_queue_time = 20.0
            return super().consume_message(msgs, context)

    listener, host = Changing(), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq.put([msg(i) for i in range(6)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [6], "all committed")

    run_service(test, listener, host, suspend_current_queue_time=2.5)
    assert listener.seen == [(i,) for i in range(6)]
    assert given == [2.5] * 6


def test_async_suspend_exception_and_a_changed_suspend_time_retry_the_same_batch() -> None:
    def shorten(offset: int, context: ConsumeOrderlyContext) -> None:
        context.suspend_current_queue_time = 0.5

    listener, host = AsyncScripted([SUSPEND, RuntimeError("boom")], during=shorten), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        listener.pq = pq
        pq.put([msg(0), msg(1)])
        service.submit(Q, pq)
        for tries in (1, 2):
            await until(lambda n=tries: len(listener.seen) == n and clock.sleepers == 1)  # type: ignore[misc]
            clock.advance(0.49)
            assert clock.sleepers == 1, "the retry timer fired before the suspend time"
            clock.advance(0.02)
        await until(lambda: host.commits[-1:] == [2])
        assert pq.count == 0

    run_service(test, listener, host, consume_message_batch_max_size=2)
    assert listener.seen == [(0, 1), (0, 1), (0, 1)]
    assert host.commits == [2]


def test_async_a_message_failing_max_reconsume_times_goes_to_the_dlq() -> None:
    listener, host = AsyncScripted([SUSPEND] * 3), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        listener.pq = pq
        pq.put([msg(0), msg(1)])
        service.submit(Q, pq)
        for _ in range(2):
            await until(lambda: clock.sleepers == 1)
            clock.advance(1.01)
        await until(lambda: host.commits[-1:] == [2])

    run_service(test, listener, host, max_reconsume_times=2)
    assert host.dead == [(0, 2)]
    assert listener.seen == [(0,), (0,), (0,), (1,)]
    assert host.commits == [1, 2]


def test_async_a_lease_that_runs_out_during_a_call_stops_before_the_next_call() -> None:
    clock_holder: list[FakeClock] = []

    def late_renewal(offset: int, context: ConsumeOrderlyContext) -> None:
        if offset == 1:
            clock_holder[0].advance(31)

    listener, host = AsyncScripted(during=late_renewal), Host(relock_ok=False)

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        clock_holder.append(clock)
        listener.pq = pq
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await until(lambda: host.relocks == 1 and clock.sleepers == 1)
        assert listener.seen == [(0,), (1,)]
        assert not pq.consume_lock.locked(), "no consume lock held while waiting to re-lock"
        pq.last_lock_time = clock.now()  # the renewal service got the lock back
        clock.advance(3)
        await until(lambda: host.commits[-1:] == [5])

    run_service(test, listener, host)
    assert listener.seen == [(0,), (1,), (2,), (3,), (4,)]
    assert host.commits == [2, 5], "the calls made before the lease ran out committed"


def test_async_rebalance_waiting_on_the_consume_lock_gets_it_before_the_next_call() -> None:
    order: list[str] = []
    pq_holder: list[ProcessQueue] = []
    release_started = asyncio.Event()

    async def release(pq: ProcessQueue) -> None:
        pq.dropped = True  # as core.release does, then it waits for the call in flight
        release_started.set()
        async with pq.consume_lock:
            order.append(f"rebalance after commit {host.commits}")

    def start_a_rebalance(offset: int, context: ConsumeOrderlyContext) -> None:
        order.append(f"call {offset}")
        if offset == 1:
            asyncio.get_running_loop().create_task(release(pq_holder[0]))

    listener, host = AsyncScripted(during=start_a_rebalance), Host()

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        pq_holder.append(pq)
        listener.pq = pq
        pq.put([msg(i) for i in range(5)])
        service.submit(Q, pq)
        await release_started.wait()
        await until(lambda: len(order) == 3 and not pq.object_lock.locked())

    run_service(test, listener, host)
    assert order == ["call 0", "call 1", "rebalance after commit [2]"], (
        "the call in flight committed before rebalance went on"
    )


def test_async_tracing_switched_on_mid_run_is_picked_up_within_the_check_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    switched_on = [False]
    spans: list[int] = []

    @contextmanager
    def consume_span(group: str, batch: list[MessageExt]) -> Iterator[None]:
        spans.append(batch[0].queue_offset)
        yield

    monkeypatch.setattr(tracing, "enabled", lambda: switched_on[0])
    monkeypatch.setattr(tracing, "consume_span", consume_span)

    def switch_on(offset: int, context: ConsumeOrderlyContext) -> None:
        if offset == 3:
            switched_on[0] = True

    listener, host = AsyncScripted(during=switch_on), Host()
    total = 3 * TRACING_CHECK_CALLS

    async def test(service: ConsumeOrderlyService, pq: ProcessQueue, clock: FakeClock) -> None:
        listener.pq = pq
        pq.put([msg(i) for i in range(total)])
        service.submit(Q, pq)
        await until(lambda: host.commits[-1:] == [total])

    run_service(test, listener, host)
    assert spans == list(range(TRACING_CHECK_CALLS, total))


def test_a_thread_pool_shut_down_under_the_service_stops_it_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    listener, host = Scripted(), Host()

    async def main() -> None:
        clock = FakeClock()
        pool = ThreadPoolExecutor(1)
        service = ConsumeOrderlyService(listener, host, pool, clock, PushConsumerConfig())
        pq = ProcessQueue()
        pq.locked, pq.last_lock_time = True, clock.now()
        pool.shutdown()  # as interpreter exit does to every pool
        pq.put([msg(0), msg(1)])
        service.submit(Q, pq)
        await until(lambda: service._tasks[Q][0].done(), "the consume task to end")
        service.submit(Q, pq)  # no further task once the pool refused work
        assert service._tasks[Q][0].done()

    asyncio.run(main())
    assert listener.seen == [] and host.commits == []
    assert not [r for r in caplog.records if r.exc_info], "a traceback per attempt"
