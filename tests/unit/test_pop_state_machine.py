"""The pop core as a state machine, checked against a model on a FakeClock.

Hypothesis interleaves sends (with and without sharding keys), receives with short
invisible durations, acks and changes of invisible duration with current, replaced and
expired receipts, time passing (leases run out, used-up messages go to the DLQ) and
kill -9 restarts. The model predicts every answer. Checked at each step:
- a receive delivers only messages neither acknowledged nor dead-lettered nor held, never
  past a group's window, and (FIFO) only the first unsettled message of its sharding key;
  it delivers as many as it asked for while that many are deliverable (so every unacked
  message comes back once its lease ran out, also after a restart);
- each delivery's attempt is the model's count plus one; a message goes to %DLQ%g exactly
  when its lease ran out after `MAX_ATTEMPTS` deliveries;
- acks and changes answer what the rules say (OK, RECEIPT_EXPIRED, INVALID_RECEIPT_HANDLE), and
  a refused one changes nothing;
- the group's base is its first unsettled message; the committed offset (which follows
  it) is never past an unsettled message and never goes backwards;
and at the end, once time passes, every message is acknowledged or dead-lettered.

CI runs a bounded, derandomized search; HYPOTHESIS_PROFILE=long a long random one.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mockbroker.errors import BrokerError
from tests.fuzzing import machine_settings
from tests.unit.pop_world import PopWorld, record_of

pytestmark = pytest.mark.chaos
QUEUES = 2
MAX_ATTEMPTS = 3
MAX_IN_FLIGHT = 4
GROUP = "g"
KEYS = (b"", b"A", b"B")


@dataclass
class Msg:
    """The model of one message."""

    queue: int
    offset: int
    key: bytes
    body: bytes
    attempts: int = 0
    receipt: str = ""  # of the latest delivery or change
    deadline_ms: int = 0
    state: str = "new"  # new, held (a lease, maybe run out), acked, dead
    settled_by: str = ""  # the receipt that acknowledged it

    @property
    def settled(self) -> bool:
        return self.state in ("acked", "dead")


@dataclass(frozen=True)
class Issued:
    """A receipt handed out, current or not."""

    receipt: str
    queue: int
    offset: int
    deadline_ms: int


class PopMachine(RuleBasedStateMachine):
    """One group, FIFO or not, over a two-queue topic."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.world = PopWorld(Path(self.tmp.name), max_in_flight=MAX_IN_FLIGHT,
                              max_attempts=MAX_ATTEMPTS, queues=QUEUES)  # fmt: skip
        self.queues: list[list[Msg]] = [[] for _ in range(QUEUES)]
        self.issued: list[Issued] = []
        self.committed = [0] * QUEUES
        self.fifo = False

    @initialize(fifo=st.booleans())
    def choose_mode(self, fifo: bool) -> None:
        self.fifo = fifo
        self.world.topic()

    # ------------------------------------------------------------------ the model
    def now_ms(self) -> int:
        return int(self.world.clock.now() * 1000)

    def first_unsettled(self, queue: int) -> int:
        msgs = self.queues[queue]
        return next((m.offset for m in msgs if not m.settled), len(msgs))

    def live(self, m: Msg) -> bool:
        return m.state == "held" and self.now_ms() < m.deadline_ms

    def deliverable(self) -> list[Msg]:
        out = []
        for q, msgs in enumerate(self.queues):
            limit = self.first_unsettled(q) + MAX_IN_FLIGHT
            seen: set[bytes] = set()
            for m in msgs:
                if m.settled:
                    continue
                free = not self.live(m) and m.attempts < MAX_ATTEMPTS and m.offset < limit
                if free and (not self.fifo or m.key not in seen):
                    out.append(m)
                seen.add(m.key)
        return out

    # ------------------------------------------------------------------ rules
    @rule(queue=st.integers(0, QUEUES - 1), key=st.sampled_from(KEYS), count=st.integers(1, 3))
    def send(self, queue: int, key: bytes, count: int) -> None:
        msgs = self.queues[queue]
        bodies = [b"%d-%d" % (queue, len(msgs) + i) for i in range(count)]
        self.world.send(queue, *bodies, key=key)
        for body in bodies:
            msgs.append(Msg(queue, len(msgs), key, body))

    @rule(want=st.integers(1, 5), invisible=st.sampled_from([1, 2, 5]))
    def receive(self, want: int, invisible: int) -> None:
        expected = self.deliverable()
        got = self.world.receive(GROUP, want, invisible, fifo=self.fifo,
                                 max_attempts=MAX_ATTEMPTS)  # fmt: skip
        assert len(got) == min(want, len(expected)), (got, expected)
        allowed = {(m.queue, m.offset) for m in expected}
        for r in got:
            assert (r.queue_id, r.offset) in allowed, f"{r} was not deliverable"
            m = self.queues[r.queue_id][r.offset]
            assert record_of(r).body == m.body
            assert r.attempt == m.attempts + 1
            m.attempts, m.state = r.attempt, "held"
            m.receipt, m.deadline_ms = r.receipt, r.invisible_until_ms
            self.issued.append(Issued(r.receipt, r.queue_id, r.offset, r.invisible_until_ms))

    def outcome(self, issued: Issued, m: Msg, *, change: bool) -> set[str]:
        """What an ack (or change) with this receipt may answer now."""
        now = self.now_ms()
        expired = now >= issued.deadline_ms
        if m.state == "held" and m.receipt == issued.receipt:
            return {"RECEIPT_EXPIRED"} if now >= m.deadline_ms else {"OK"}
        if m.settled and m.settled_by == issued.receipt:
            # Remembered while the window holds it; else judged by its time.
            done = "INVALID_RECEIPT_HANDLE" if change else "OK"
            return {done, "RECEIPT_EXPIRED"} if expired else {done}
        if expired:
            return {"RECEIPT_EXPIRED"}
        if m.settled:
            return {"INVALID_RECEIPT_HANDLE"} if change else {"OK"}
        return {"INVALID_RECEIPT_HANDLE"}

    @precondition(lambda self: self.issued)
    @rule(data=st.data())
    def ack(self, data: st.DataObject) -> None:
        issued = data.draw(st.sampled_from(self.issued))
        m = self.queues[issued.queue][issued.offset]
        allowed = self.outcome(issued, m, change=False)
        before = self.world.pop.describe()
        try:
            self.world.ack(issued.receipt, GROUP)
        except BrokerError as exc:
            assert exc.reason in allowed, (exc.reason, allowed, m, issued)
            assert self.world.pop.describe() == before, "a refused ack changed something"
            return
        assert "OK" in allowed, (allowed, m, issued)
        if not m.settled:
            m.state, m.settled_by = "acked", issued.receipt

    @precondition(lambda self: any(self.live(m) for msgs in self.queues for m in msgs))
    @rule(data=st.data())
    def ack_a_held_message(self, data: st.DataObject) -> None:
        """The usual case, made frequent: the current receipt of a message still held."""
        held = [m for msgs in self.queues for m in msgs if self.live(m)]
        m = data.draw(st.sampled_from(held))
        self.world.ack(m.receipt, GROUP)
        m.state, m.settled_by = "acked", m.receipt

    @precondition(lambda self: self.issued)
    @rule(data=st.data(), invisible=st.sampled_from([0, 1, 3, 8]))
    def change(self, data: st.DataObject, invisible: int) -> None:
        issued = data.draw(st.sampled_from(self.issued))
        m = self.queues[issued.queue][issued.offset]
        allowed = self.outcome(issued, m, change=True)
        before = self.world.pop.describe()
        try:
            renewed = self.world.run(
                self.world.pop.change_invisible_duration(GROUP, issued.receipt, invisible * 1000)
            )
        except BrokerError as exc:
            assert exc.reason in allowed, (exc.reason, allowed, m, issued)
            assert self.world.pop.describe() == before, "a refused change changed something"
            return
        assert "OK" in allowed, (allowed, m, issued)
        assert renewed.attempt == m.attempts
        assert renewed.invisible_until_ms == self.now_ms() + invisible * 1000
        m.receipt, m.deadline_ms = renewed.receipt, renewed.invisible_until_ms
        self.issued.append(Issued(renewed.receipt, m.queue, m.offset, m.deadline_ms))

    def pass_time(self, seconds: float) -> None:
        """The clock moves and the broker sweeps: used-up messages are dead-lettered."""
        self.world.advance(seconds)
        now = self.now_ms()
        for msgs in self.queues:
            for m in msgs:
                if m.state == "held" and now >= m.deadline_ms and m.attempts >= MAX_ATTEMPTS:
                    m.state = "dead"

    @rule(seconds=st.sampled_from([0.5, 1, 2, 6]))
    def time_passes(self, seconds: float) -> None:
        self.pass_time(seconds)
        dead = sorted(d.body for d in self.world.dead_letters(GROUP))
        expected = sorted(m.body for msgs in self.queues for m in msgs if m.state == "dead")
        assert dead == expected

    @rule()
    def kill_and_restart(self) -> None:
        self.world.crash()

    @rule()
    def commit_offsets(self) -> None:
        self.world.run(self.world.pop.commit_offsets())
        for q in range(QUEUES):
            committed = self.world.committed(GROUP, q)
            if committed is None:
                continue
            assert committed >= self.committed[q], "an offset went backwards"
            assert committed == self.first_unsettled(q) or not self.queues[q], (committed, q)
            self.committed[q] = committed

    # ------------------------------------------------------------------ invariants
    @invariant()
    def the_base_is_the_first_unsettled_message(self) -> None:
        for q in range(QUEUES):
            committed = self.world.committed(GROUP, q)
            assert committed is None or committed <= self.first_unsettled(q)
            progress = self.world.pop.progress(GROUP, "jobs", q)
            if progress is not None:  # the group's base is exactly its first unsettled one
                assert progress.base == self.first_unsettled(q), (progress, q)

    def teardown(self) -> None:
        try:
            self.everything_is_settled_in_the_end()
        finally:
            self.world.close()
            self.tmp.cleanup()

    def everything_is_settled_in_the_end(self) -> None:
        if not any(self.queues):
            return
        for _ in range(MAX_ATTEMPTS * 60):
            if all(m.settled for msgs in self.queues for m in msgs):
                break
            self.pass_time(10)
            for r in self.world.receive(GROUP, 5, 1, fifo=self.fifo, max_attempts=MAX_ATTEMPTS):
                m = self.queues[r.queue_id][r.offset]
                assert not m.settled, f"{m} came back"
                self.world.ack(r)
                m.state = "acked"
        assert all(m.settled for msgs in self.queues for m in msgs), self.queues
        dead = sorted(d.body for d in self.world.dead_letters(GROUP))
        assert dead == sorted(m.body for msgs in self.queues for m in msgs if m.state == "dead")
        self.world.run(self.world.pop.commit_offsets())
        for q in range(QUEUES):
            assert self.world.committed(GROUP, q) in (None, len(self.queues[q]))


PopMachine.TestCase.settings = machine_settings(100, 300, steps=(30, 60))
test_pop_state_machine = PopMachine.TestCase
