"""The consume and latency workloads bench/run.py times.

- consume: one sdk.aio.PushConsumer (a fresh group per run) reading a stored backlog with
  a no-op listener that only counts (ConsumeTrial);
- poll: one lite pull consumer (sdk.aio or blocking) draining a stored backlog with a
  plain `while batch := poll(timeout)` loop (PollTrial);
- long-poll wake-up: a pull held on a caught-up queue, woken by one send
  (longpoll_wakeups);
- end-to-end latency: single messages sent on a fixed schedule, each carrying its send
  time, received by an orderly push consumer in the same process (e2e_latency).

Inputs and sizes (BODY_BYTES, KEYS, QUEUES) are those of workloads.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import statistics
import threading
import time

from workloads import BODY_BYTES, PULL_GROUP

import sdk.aio
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    Credentials,
    LitePullConsumer,
    LitePullConsumerConfig,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageQueue,
    ProcessingOrder,
    PushConsumerConfig,
    TLSConfig,
)
from sdk._transport.broker_client import BrokerClient, PullResult, PullStatus
from sdk.aio import Producer
from sdk.clock import SystemClock
from sdk.consumer.consume_orderly import CALLS_PER_HOP, ConsumeOrderlyService
from sdk.consumer.process_queue import ProcessQueue

# ---------------------------------------------------------------------- consume
#: A consume run fails when its listener sees nothing new for this long (a stall).
CONSUME_STALL_SECONDS = 30.0


class Tally:
    """How many messages a listener was handed; `done` is set once `target` arrived.

    Listeners on the event loop call `add`; listeners on the consumer's thread pool call
    `add_threadsafe`.
    """

    def __init__(self, target: int) -> None:
        self.target = target
        self.count = 0
        self.done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        self.count += n
        if self.count >= self.target:
            self.done.set()

    def add_threadsafe(self, n: int) -> None:
        with self._lock:
            self.count += n
            reached = self.count >= self.target
        if reached:
            self._loop.call_soon_threadsafe(self.done.set)

    async def wait(self, stall: float = CONSUME_STALL_SECONDS) -> int:
        """Wait for `target` messages; RuntimeError if none arrive for `stall` seconds."""
        seen, quiet_since = -1, time.monotonic()
        while not self.done.is_set():
            if self.count != seen:
                seen, quiet_since = self.count, time.monotonic()
            elif time.monotonic() - quiet_since > stall:
                raise RuntimeError(
                    f"the consumer stalled: {self.count} of {self.target} messages seen, "
                    f"nothing new for {stall:.0f} s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 1.0)
        return self.count


class AsyncOrderlyCounter(MessageListenerOrderly):
    """A no-op `async def` orderly listener: it only counts (runs on the event loop)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.tally.add(len(msgs))
        return ConsumeOrderlyStatus.SUCCESS


class SyncOrderlyCounter(MessageListenerOrderly):
    """A no-op plain-function orderly listener: it only counts (runs on the thread pool)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        self.tally.add_threadsafe(len(msgs))
        return ConsumeOrderlyStatus.SUCCESS


class AsyncConcurrentCounter(MessageListenerConcurrently):
    """A no-op `async def` concurrent listener: it only counts."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        self.tally.add(len(msgs))
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


LISTENERS: dict[
    str, type[AsyncOrderlyCounter] | type[SyncOrderlyCounter] | type[AsyncConcurrentCounter]
] = {
    "orderly-async": AsyncOrderlyCounter,
    "orderly-sync": SyncOrderlyCounter,
    "concurrent-async": AsyncConcurrentCounter,
}

_consumer_groups = itertools.count(1)


class WorkingOrderlyListener(MessageListenerOrderly):
    """A plain orderly listener that works `work` seconds per message (time.sleep: I/O
    such as a database call, which lets other threads run) and counts."""

    def __init__(self, tally: Tally, work: float) -> None:
        self.tally, self.work = tally, work

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        time.sleep(self.work * len(msgs))
        self.tally.add_threadsafe(len(msgs))
        return ConsumeOrderlyStatus.SUCCESS


class AsyncWorkingOrderlyListener(MessageListenerOrderly):
    """An `async def` orderly listener that awaits `work` seconds per message (I/O on the
    event loop) and counts."""

    def __init__(self, tally: Tally, work: float) -> None:
        self.tally, self.work = tally, work

    async def consume_message(  # type: ignore[override]
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        await asyncio.sleep(self.work * len(msgs))
        self.tally.add(len(msgs))
        return ConsumeOrderlyStatus.SUCCESS


class ConsumeTrial:
    """Consume runs over one backlog: each run is one fresh sdk.aio.PushConsumer.

    `prepare` (untimed) builds a consumer in a group of its own, so that with
    ConsumeFromWhere.FIRST_OFFSET it reads every queue from offset 0; `run` (timed) starts
    it and returns once its listener has been handed `expected` messages; `close`
    (untimed) shuts it down. `endpoint` is any the SDK takes: the broker's gRPC
    "host:port" or "rocketmq://<name server>"; `tls` how to reach a broker serving TLS;
    `credentials` how to sign for one with an ACL; `delivery` PushConsumerConfig.delivery
    ("pull", or "push": the broker sends batches within the consumer's credit).
    """

    def __init__(
        self,
        endpoint: str,
        topic: str,
        expected: int,
        listener: str,
        batch: int,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
        delivery: str = "pull",
    ):
        self.endpoint = endpoint
        self.tls = tls
        self.credentials = credentials
        self.topic = topic
        self.expected = expected
        self.listener = LISTENERS[listener]
        self.config = PushConsumerConfig(consume_message_batch_max_size=batch, delivery=delivery)
        self.consumer: sdk.aio.PushConsumer | None = None
        self.tally: Tally | None = None

    async def prepare(self) -> None:
        self.tally = Tally(self.expected)
        consumer = self._consumer()
        consumer.subscribe(self.topic)
        consumer.register_message_listener(self.listener(self.tally))
        self.consumer = consumer

    def _consumer(self, **options: object) -> sdk.aio.PushConsumer:
        return sdk.aio.PushConsumer(
            f"bench-consume-{next(_consumer_groups)}",
            self.endpoint,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            config=self.config,
            tls=self.tls,
            credentials=self.credentials,
            **options,  # type: ignore[arg-type]
        )

    async def run(self) -> int:
        assert self.consumer is not None and self.tally is not None
        await self.consumer.start()
        return await self.tally.wait()

    async def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if consumer is not None:
            await consumer.shutdown()


class KeyModeTrial(ConsumeTrial):
    """Consume runs with a listener that works `work` seconds per message (a plain one,
    or an `async def` one with `on_loop`), its queues kept in order per queue or per key
    (`ordering`), at most `threads` calls at once."""

    def __init__(
        self,
        endpoint: str,
        topic: str,
        expected: int,
        ordering: ProcessingOrder,
        work: float,
        threads: int,
        on_loop: bool,
    ) -> None:
        super().__init__(endpoint, topic, expected, "orderly-sync", 1)
        self.ordering, self.work, self.on_loop = ordering, work, on_loop
        self.config = PushConsumerConfig(consume_threads=threads)

    async def prepare(self) -> None:
        self.tally = Tally(self.expected)
        consumer = self._consumer(ordering=self.ordering)
        consumer.subscribe(self.topic)
        kind = AsyncWorkingOrderlyListener if self.on_loop else WorkingOrderlyListener
        consumer.register_message_listener(kind(self.tally, self.work))
        self.consumer = consumer


# ---------------------------------------------------------------------- poll
#: poll(timeout): how long one poll may wait; a poll that returns nothing before the
#: whole backlog was read is a stall and fails the run.
POLL_TIMEOUT_SECONDS = 5.0


class _NoOrderlyHost:
    """The host of a service that only dispatches: nothing commits, parks or re-locks."""

    def commit(self, queue: MessageQueue, offset: int) -> None:
        raise AssertionError("the dispatch micro-benchmark commits nothing")

    async def send_to_dead_letter(self, message: MessageExt, reconsume_times: int) -> bool:
        raise AssertionError("the dispatch micro-benchmark dead-letters nothing")

    async def relock(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        raise AssertionError("the dispatch micro-benchmark re-locks nothing")

    async def park_key(self, message: MessageExt, pq: ProcessQueue, reason: str) -> int | None:
        raise AssertionError("the dispatch micro-benchmark parks nothing")


class _NoOpOrderly(MessageListenerOrderly):
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS


class _AsyncNoOpOrderly(MessageListenerOrderly):
    async def consume_message(  # type: ignore[override]
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        return ConsumeOrderlyStatus.SUCCESS


def micro_orderly_dispatch(n: int, listener: str = "thread-pool") -> float:
    """Microseconds per call to dispatch a no-op orderly listener at batch size 1.

    What the orderly consumer does for each call and a poll loop does not: the checks
    before the call, the call, its answer. `listener` "thread-pool": a plain `def`
    listener, one hop of the thread-pool path run in this thread over 352 messages at a
    time (what a hop carried in the consume figure's thread-pool run at batch size 1);
    "async": an `async def` listener on an event loop, CALLS_PER_HOP calls a turn (the
    loop's time to start and stop is in the figure: well under 1%).
    """
    clock = SystemClock()
    asynchronous = listener == "async"
    service = ConsumeOrderlyService(
        _AsyncNoOpOrderly() if asynchronous else _NoOpOrderly(),
        _NoOrderlyHost(),
        concurrent.futures.ThreadPoolExecutor(1),
        clock,
        PushConsumerConfig(consume_message_batch_max_size=1),
    )
    queue = MessageQueue("bench-micro", "broker-a", 0)
    message = MessageExt(
        "bench-micro", b"x" * BODY_BYTES, None, (), {}, "k", "0" * 32, queue, 0, 0, 0, 0
    )
    pq = ProcessQueue()
    pq.locked, pq.last_lock_time = True, clock.now()
    taken = [message] * (CALLS_PER_HOP if asynchronous else 352)

    async def hops(rounds: int) -> int:
        calls = 0
        for _ in range(rounds):
            done, _failed = await service._call(queue, pq, taken, pq.generation, clock.now())
            calls += done
        return calls

    rounds = max(1, n // len(taken))
    start = time.perf_counter()
    if asynchronous:  # a loop of its own: the caller's may be running (bench/run.py's)
        with concurrent.futures.ThreadPoolExecutor(1) as thread:
            calls = thread.submit(asyncio.run, hops(rounds)).result()
    else:
        calls = sum(
            service._calls_in_thread(queue, pq, taken, pq.generation, clock.now())[0]
            for _ in range(rounds)
        )
    took = time.perf_counter() - start
    if calls != rounds * len(taken):
        raise RuntimeError(f"the dispatch stopped after {calls} of {rounds * len(taken)} calls")
    return took / calls * 1e6


class PollTrial:
    """Poll-loop runs over one backlog: each run is one fresh lite pull consumer.

    `blocking` False: `sdk.aio.LitePullConsumer` polled from this event loop; True:
    `sdk.LitePullConsumer` (its own loop thread) polled from a worker thread, as a plain
    blocking program would. Either way `auto_commit` is on and the consumer starts at
    ConsumeFromWhere.FIRST_OFFSET in a group of its own, with `delivery` ("push", the
    default, or "pull"). `prepare` (untimed) builds and
    subscribes it; `run` (timed) starts it and runs
    `while batch := poll(POLL_TIMEOUT_SECONDS)`, counting, until `expected` messages
    came back (so the final empty poll's wait is not timed); `close` (untimed) shuts it
    down, which commits.
    """

    def __init__(
        self,
        address: str,
        topic: str,
        expected: int,
        blocking: bool,
        delivery: str = "push",
        listener: bool = False,
    ) -> None:
        self.address = address
        self.topic = topic
        self.expected = expected
        self.blocking = blocking
        self.delivery = delivery
        #: Hand each message polled to the orderly thread-pool figure's listener
        #: (SyncOrderlyCounter, batch size 1), as a poll loop that processes what it polls
        #: does: the blocking loop only.
        self.listener = listener
        self.tally: Tally | None = None
        self.consumer: sdk.aio.LitePullConsumer | LitePullConsumer | None = None

    async def prepare(self) -> None:
        if self.listener and not self.blocking:
            raise ValueError("a poll loop with the listener is the blocking one")
        self.tally = Tally(self.expected)
        cls = LitePullConsumer if self.blocking else sdk.aio.LitePullConsumer
        consumer = cls(
            f"bench-poll-{next(_consumer_groups)}",
            self.address,
            auto_commit=True,
            consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
            config=LitePullConsumerConfig(delivery=self.delivery),
        )
        consumer.subscribe(self.topic)
        self.consumer = consumer

    async def run(self) -> int:
        consumer = self.consumer
        if isinstance(consumer, LitePullConsumer):
            return await asyncio.to_thread(self._blocking_loop, consumer)
        assert consumer is not None
        await consumer.start()
        seen = 0
        while seen < self.expected and (batch := await consumer.poll(POLL_TIMEOUT_SECONDS)):
            seen += len(batch)
        return self._check(seen)

    def _blocking_loop(self, consumer: LitePullConsumer) -> int:
        consumer.start()
        seen = 0
        if not self.listener:
            while seen < self.expected and (batch := consumer.poll(POLL_TIMEOUT_SECONDS)):
                seen += len(batch)
            return self._check(seen)
        assert self.tally is not None
        consume = SyncOrderlyCounter(self.tally).consume_message
        context = ConsumeOrderlyContext(MessageQueue(self.topic, "", 0), 1.0)
        while seen < self.expected and (batch := consumer.poll(POLL_TIMEOUT_SECONDS)):
            for message in batch:
                consume([message], context)
            seen += len(batch)
        return self._check(seen)

    def _check(self, seen: int) -> int:
        if seen < self.expected:
            raise RuntimeError(
                f"poll() returned nothing for {POLL_TIMEOUT_SECONDS:.0f} s after "
                f"{seen} of {self.expected} messages"
            )
        return seen

    async def close(self) -> None:
        consumer, self.consumer = self.consumer, None
        if isinstance(consumer, LitePullConsumer):
            await asyncio.to_thread(consumer.shutdown)
        elif consumer is not None:
            await consumer.shutdown()


# ---------------------------------------------------------------------- latency
def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of `values`, nearest rank."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n * q / 100), at least 1
    return ordered[int(rank) - 1]


async def until_held(client: BrokerClient, pulls: int, timeout: float = 10.0) -> int:
    """Wait until the broker holds at least `pulls` pulls (asks its status in a loop).

    Returns how many status calls that took.
    """
    deadline = time.monotonic() + timeout
    calls = 1
    while (await client.broker_status()).held_pulls < pulls:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the broker did not hold {pulls} pulls within {timeout} s")
        calls += 1
    return calls


async def _pull_stamped(
    client: BrokerClient, queue: MessageQueue, offset: int, suspend: float
) -> tuple[PullResult, int]:
    result = await client.pull(
        PULL_GROUP, queue, offset, suspend_timeout=suspend, timeout=suspend + 5
    )
    return result, time.perf_counter_ns()


async def longpoll_wakeups(
    client: BrokerClient,
    producer: Producer,
    queue: MessageQueue,
    key: str,
    count: int,
    suspend: float,
) -> tuple[list[float], dict[str, float]]:
    """`count` times, one after another: hold a pull on the caught-up `queue`, then send
    it one message (whose `key` maps to `queue`).

    A sample is the time in ms from just before `producer.send` to the held pull's
    return (decoded). The pull is sent first and the send waits until the broker reports
    it held. Also returns the send calls' own p50/p99 (a round trip, for comparison) and
    how many status calls that waiting took per wake-up.
    """
    _low, offset, _at = await client.queue_offsets(queue)
    body = bytes(BODY_BYTES)
    wakes: list[float] = []
    sends: list[float] = []
    status_calls = 0
    for _ in range(count):
        held = asyncio.ensure_future(_pull_stamped(client, queue, offset, suspend))
        status_calls += await until_held(client, 1)
        message = Message(queue.topic, body, sharding_key=key)
        start = time.perf_counter_ns()
        await producer.send(message)
        sent = time.perf_counter_ns()
        result, returned = await held
        if result.status is not PullStatus.FOUND or len(result.messages) != 1:
            raise AssertionError(f"a held pull returned {result.status} {len(result.messages)}")
        wakes.append((returned - start) / 1e6)
        sends.append((sent - start) / 1e6)
        offset = result.next_offset
    detail = {
        "send_call_p50_ms": percentile(sends, 50),
        "send_call_p99_ms": percentile(sends, 99),
        "status_calls_per_wakeup": status_calls / count,
        "max_ms": max(wakes),
    }
    return wakes, detail


class LatencyRecorder(MessageListenerOrderly):
    """An `async def` orderly listener recording, per message, receive - send time.

    The send time is the first 8 bytes of the body (time.perf_counter_ns, little endian),
    so producer and consumer must share a process.
    """

    def __init__(self) -> None:
        self.samples: list[int] = []
        self.expected = 0
        self.done = asyncio.Event()

    def expect(self, count: int) -> None:
        self.samples = []
        self.expected = count
        self.done.clear()

    def record(self, msgs: list[MessageExt]) -> bool:
        """Note each message's latency; True once the expected count arrived."""
        now = time.perf_counter_ns()
        samples = self.samples
        for m in msgs:
            samples.append(now - int.from_bytes(m.body[:8], "little"))
        return len(samples) >= self.expected

    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        if self.record(msgs):
            self.done.set()
        return ConsumeOrderlyStatus.SUCCESS


class WorkingLatencyRecorder(LatencyRecorder):
    """A LatencyRecorder whose `async def` listener then awaits `work` seconds a message
    (I/O on the event loop): the latency is from send to the start of the message's call,
    so it holds the wait behind earlier messages of its queue (queue mode) or its key."""

    def __init__(self, work: float) -> None:
        super().__init__()
        self.work = work

    async def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        done = self.record(msgs)
        await asyncio.sleep(self.work * len(msgs))
        if done:
            self.done.set()
        return ConsumeOrderlyStatus.SUCCESS


class BlockingLatencyRecorder(MessageListenerOrderly):
    """The plain `def` face of a LatencyRecorder, for the blocking sdk.PushConsumer.

    It runs on the consumer's thread pool; build it on the loop that waits on the
    recorder.
    """

    def __init__(self, recorder: LatencyRecorder) -> None:
        self._recorder = recorder
        self._loop = asyncio.get_running_loop()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        if self._recorder.record(msgs):
            self._loop.call_soon_threadsafe(self._recorder.done.set)
        return ConsumeOrderlyStatus.SUCCESS


async def paced_send(
    producer: Producer, topic: str, keys: list[str], rate: float, count: int, in_flight: int
) -> dict[str, float]:
    """Send `count` single keyed messages at `rate` per second, on a fixed schedule.

    Message i is due at start + i / rate (monotonic clock; a late producer catches up
    instead of drifting). When it is due, its body gets the current perf_counter_ns and
    it is sent with `producer.send` in a task of its own, so sends overlap when one takes
    longer than the interval; at most `in_flight` are outstanding. Keys go round robin,
    so two sends of one key are len(keys) / rate seconds apart and never overlap.
    """
    pad = bytes(BODY_BYTES - 8)
    slots = asyncio.Semaphore(in_flight)
    tasks: set[asyncio.Future[object]] = set()
    errors: list[BaseException] = []
    lags: list[int] = []
    peak = 0

    def finished(task: asyncio.Future[object]) -> None:
        tasks.discard(task)
        slots.release()
        if not task.cancelled() and task.exception() is not None:
            errors.append(task.exception())  # type: ignore[arg-type]

    period = 1e9 / rate
    start = time.perf_counter_ns()
    now = start
    for i in range(count):
        due = start + int(i * period)
        if due > time.perf_counter_ns():
            await asyncio.sleep((due - time.perf_counter_ns()) / 1e9)
        await slots.acquire()
        now = time.perf_counter_ns()
        lags.append(now - due)
        message = Message(topic, now.to_bytes(8, "little") + pad, sharding_key=keys[i % len(keys)])
        task: asyncio.Future[object] = asyncio.ensure_future(producer.send(message))
        tasks.add(task)
        task.add_done_callback(finished)
        peak = max(peak, len(tasks))
    if tasks:
        await asyncio.wait(set(tasks))
    if errors:
        raise errors[0]
    lag_ms = [x / 1e6 for x in lags]
    return {
        "sent_rate": count / max(1e-9, (now - start) / 1e9) if count > 1 else 0.0,
        "producer_lag_p99_ms": percentile(lag_ms, 99),
        "producer_lag_max_ms": max(lag_ms),
        "peak_sends_in_flight": peak,
    }


async def e2e_latency(
    producer: Producer,
    recorder: LatencyRecorder,
    topic: str,
    keys: list[str],
    rate: float,
    count: int,
    in_flight: int,
) -> tuple[list[float], dict[str, float]]:
    """Send `count` messages at `rate` (paced_send) and wait for the consumer to see them.

    Returns the end-to-end latencies in ms (receive - send, per message) and details.
    """
    recorder.expect(count)
    detail = await paced_send(producer, topic, keys, rate, count, in_flight)
    try:
        await asyncio.wait_for(recorder.done.wait(), CONSUME_STALL_SECONDS)
    except TimeoutError:
        raise RuntimeError(
            f"the consumer saw {len(recorder.samples)} of {count} messages "
            f"{CONSUME_STALL_SECONDS:.0f} s after the last send"
        ) from None
    samples = [ns / 1e6 for ns in recorder.samples]
    detail.update(max_ms=max(samples), mean_ms=statistics.fmean(samples))
    return samples, detail
