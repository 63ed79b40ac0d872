"""Orderly consumption as a state machine: random interleavings, checked invariants.

Two real PushConsumerCores (rebalance, lock renewal and fencing, pull loops, the orderly
consume service, the offset store) share an in-memory broker that runs the broker's own
RebalanceLockManager, all on one FakeClock. Hypothesis interleaves sends, listener calls
ending in success, suspension or an exception, time passing, broker restarts, a client
cut off from the broker and healed, and rolling restarts of a client. After every step:
- no listener call starts on a queue while another client's call on it is in flight;
- a call starts only at a message whose predecessors were all processed (no skip);
- a committed offset never passes a message nobody processed, and the offsets and the
  epochs the broker accepts for a queue never go down;
and at the end, once the network heals and time passes, every message is processed.

CI runs a bounded, derandomized search (HYPOTHESIS_PROFILE unset); `make test-stateful`
runs a long one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any
from unittest.mock import patch

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from sdk.consumer.config import ConsumeFromWhere, PushConsumerConfig
from sdk.consumer.listener import (
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerOrderly,
)
from sdk.consumer.push_core import PushConsumerCore
from sdk.message import MessageExt
from sdk.testing import FakeClock
from tests.fuzzing import machine_settings
from tests.unit.fake_transport import FakeBroker, FakeTransport

GROUP = "g"
QUEUES = 2
CLIENTS = ("a", "b")
#: `make chaos` runs the long search too.
pytestmark = pytest.mark.chaos
#: Real seconds a step may take: far more than any step needs (the fake clock does not
#: move within a step), so only a hang reaches it.
STEP_LIMIT = 10.0


@dataclass
class Call:
    """A listener call in flight, ended by a rule."""

    client: str
    queue: int
    offsets: list[int]
    answer: asyncio.Future[ConsumeOrderlyStatus | Exception] = field(repr=False)


class World:
    """What every client's listener reports into, and the checks on it."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.processed: dict[int, set[int]] = {q: set() for q in range(QUEUES)}
        self.violations: list[str] = []

    def started(self, call: Call) -> None:
        others = [c for c in self.calls if c.queue == call.queue and c.client != call.client]
        if others:
            self.violations.append(f"{call} started while {others} ran")
        first = call.offsets[0]
        missing = set(range(first)) - self.processed[call.queue]
        if missing:
            self.violations.append(f"{call} skipped unprocessed {sorted(missing)}")
        self.calls.append(call)


class GatedListener(MessageListenerOrderly):
    """Each call waits until a rule answers it."""

    def __init__(self, world: World, client: str) -> None:
        self.world = world
        self.client = client

    async def consume_message(  # type: ignore[override]
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        loop = asyncio.get_running_loop()
        call = Call(self.client, msgs[0].queue.queue_id, [m.queue_offset for m in msgs],
                    loop.create_future())  # fmt: skip
        self.world.started(call)
        try:
            answer = await call.answer
        finally:
            self.world.calls.remove(call)
        if isinstance(answer, Exception):
            raise answer
        if answer is ConsumeOrderlyStatus.SUCCESS:
            self.world.processed[call.queue].update(call.offsets)
        return answer


class OrderlyConsumption(RuleBasedStateMachine):
    """Two orderly consumers of one group over a two-queue topic."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.broker: FakeBroker
        self.world = World()
        self.clients: dict[str, PushConsumerCore] = {}
        self.transports: dict[str, FakeTransport] = {}
        self.generation = 0

    # ------------------------------------------------------------------ plumbing
    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run a step; a step that hangs (on a clock that stands still) is a failure."""
        try:
            return self.loop.run_until_complete(asyncio.wait_for(coroutine, STEP_LIMIT))
        except TimeoutError:
            raise AssertionError(f"{coroutine.__qualname__} hung") from None

    def settle(self) -> None:
        """Let every task run until none is ready (the clock stands still)."""

        async def spin() -> None:
            for _ in range(300):
                await asyncio.sleep(0)

        self.run(spin())

    async def start_client(self, name: str) -> None:
        self.generation += 1
        with patch("sdk.consumer.core.new_client_id", lambda: f"{name}-{self.generation}"):
            transport = FakeTransport(self.broker)
            core = PushConsumerCore(  # client ids that sort the same way in every replay
                GROUP,
                transport,
                consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                config=PushConsumerConfig(shutdown_timeout=0.0, pull_batch_size=4),
                clock=self.clock,
            )
        core.offsets._read_attempts = 1  # type: ignore[union-attr]  # no real-time retry waits
        core.subscribe(self.broker.topic)
        core.register_message_listener(GatedListener(self.world, name))
        self.clients[name], self.transports[name] = core, transport
        await core.start()

    # ------------------------------------------------------------------ rules
    @initialize()
    def start(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.broker = self.run(self._new_broker())
        for name in CLIENTS:
            self.run(self.start_client(name))
        self.settle()

    async def _new_broker(self) -> FakeBroker:
        return FakeBroker(self.clock, queues=QUEUES)

    @rule(queue=st.integers(0, QUEUES - 1), count=st.integers(1, 3))
    def send(self, queue: int, count: int) -> None:
        self.broker.append(queue, ["k"] * count)
        self.settle()

    @precondition(lambda self: bool(self.world.calls))
    @rule(
        pick=st.integers(0, 7),
        answer=st.sampled_from(["ok", "ok", "ok", "suspend", "raise"]),
    )
    def end_a_call(self, pick: int, answer: str) -> None:
        call = self.world.calls[pick % len(self.world.calls)]
        outcome: ConsumeOrderlyStatus | Exception = {
            "ok": ConsumeOrderlyStatus.SUCCESS,
            "suspend": ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT,
            "raise": RuntimeError("listener failed"),
        }[answer]
        if not call.answer.done():
            call.answer.set_result(outcome)
        self.settle()

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0, 10.0, 20.0]))
    def time_passes(self, seconds: float) -> None:
        for _ in range(int(seconds / 0.5)):  # in steps, as timers would fire
            self.clock.advance(0.5)
            self.settle()

    @rule(keep_members=st.booleans())
    def broker_restarts(self, keep_members: bool) -> None:
        self.broker.restart(keep_members=keep_members)
        self.settle()

    @precondition(lambda self: any(not c.partitioned for c in self._links()))
    @rule(name=st.sampled_from(CLIENTS))
    def cut_off(self, name: str) -> None:
        # A process whose call runs when it is cut off keeps calling after losing its
        # lock (RocketMQ and Kafka alike): only a call-free client is cut off here.
        if any(c.client == name for c in self.world.calls):
            return
        self.transports[name].partitioned = True
        self.settle()

    @rule(name=st.sampled_from(CLIENTS))
    def heal(self, name: str) -> None:
        self.transports[name].partitioned = False
        self.settle()

    @rule(name=st.sampled_from(CLIENTS))
    def rolling_restart(self, name: str) -> None:
        self.run(self.clients[name].shutdown())
        self.settle()
        self.run(self.start_client(name))
        self.settle()

    def _links(self) -> list[Any]:
        return list(self.transports.values())

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_overlap_and_no_skip(self) -> None:
        assert not self.world.violations, self.world.violations

    @invariant()
    def commits_never_pass_unprocessed_messages_nor_go_back(self) -> None:
        for queue, offset in self.broker.offsets.items():
            missing = set(range(offset)) - self.world.processed[queue[1]]
            assert not missing, f"queue {queue[1]} committed {offset} before {sorted(missing)}"
        last: dict[int, tuple[int, int]] = {}
        for _client, queue, offset, epoch in self.broker.commits:
            if queue in last:
                before_offset, before_epoch = last[queue]
                assert epoch >= before_epoch, f"queue {queue}: epoch went back to {epoch}"
                assert offset >= before_offset, f"queue {queue}: offset went back to {offset}"
            last[queue] = (offset, epoch)

    def teardown(self) -> None:
        try:
            if hasattr(self, "broker"):
                self.everything_is_processed_once_the_faults_heal()
        finally:
            for core in self.clients.values():
                self.run(core.shutdown())
            self.loop.run_until_complete(self._cancel_the_rest())
            self.loop.close()
            asyncio.set_event_loop(None)

    async def _cancel_the_rest(self) -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def everything_is_processed_once_the_faults_heal(self) -> None:
        for link in self._links():
            link.partitioned = False
        for _ in range(400):
            for call in list(self.world.calls):
                if not call.answer.done():
                    call.answer.set_result(ConsumeOrderlyStatus.SUCCESS)
            self.clock.advance(0.5)
            self.settle()
            if all(
                self.world.processed[q] >= set(range(len(self.broker.messages[q])))
                for q in range(QUEUES)
            ):
                break
        for q in range(QUEUES):
            missing = set(range(len(self.broker.messages[q]))) - self.world.processed[q]
            assert not missing, f"queue {q} never delivered {sorted(missing)}"
        assert not self.world.violations, self.world.violations


OrderlyConsumption.TestCase.settings = machine_settings(25, 400, steps=(25, 60))
test_orderly_consumption = OrderlyConsumption.TestCase
