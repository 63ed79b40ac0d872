"""The dedup table (sdk/_dedup.py) as a state machine: any interleaving, checked invariants.

Hypothesis interleaves callers arriving for a few keys, the running caller of a key
succeeding, failing or abandoning its run (a cancelled task: its waiters arrive again),
and time passing beyond results' expiry, on a table smaller than the keys. A model kept
beside the table says what must happen; after every step:
- a key has at most one running caller, and the work runs only when the key has no
  run under way and no unexpired result kept (at most one run per success window);
- a run's waiters are handed back exactly, each once, and every caller that arrived has
  exactly one outcome (the value or the error) or is still running or waiting;
- only results are dropped for room, oldest first, and only at the bound; a working key
  never is; the table never holds more than max_keys keys;
and at the end, once every run succeeds, every caller has its outcome.

CI runs a bounded, derandomized search (HYPOTHESIS_PROFILE unset); `make test-stateful`
runs a long one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sdk._dedup import Decision, DedupTable, check_key, check_settings
from sdk.errors import InvalidArgumentError
from tests.fuzzing import machine_settings

KEYS = ("a", "b", "c", "d", "e")
TTL = 10.0
MAX_KEYS = 3


@dataclass
class Key:
    """The model of one key."""

    runner: int | None = None
    waiters: list[int] = field(default_factory=list)
    value: str | None = None  # the kept result, if any
    expires_at: float = 0.0
    done_seq: int = 0  # when it became done: the order results are dropped in
    successes: int = 0
    runs: int = 0


class DedupMachine(RuleBasedStateMachine):
    """One table, five keys, room for three."""

    def __init__(self) -> None:
        super().__init__()
        self.table: DedupTable[int] = DedupTable(TTL, MAX_KEYS)
        self.now = 0.0
        self.keys = {k: Key() for k in KEYS}
        self.callers = 0
        self.outcomes: dict[int, list[str]] = {}
        self.seq = 0

    # ------------------------------------------------------------------ the model
    def kept(self, key: str) -> bool:
        m = self.keys[key]
        return m.runner is not None or (m.value is not None and self.now < m.expires_at)

    def arrive(self, caller: int, key: str) -> None:
        m = self.keys[key]
        live_before = sum(self.kept(k) for k in KEYS)
        done_by_age = sorted(
            (k for k in KEYS if self.keys[k].runner is None and self.kept(k)),
            key=lambda k: self.keys[k].done_seq,
        )
        arrival = self.table.arrive(key, self.now, caller)
        # Only results are dropped, oldest first, and only to make room at the bound.
        assert list(arrival.evicted) == done_by_age[: len(arrival.evicted)], arrival
        assert key not in arrival.evicted
        if arrival.evicted:
            assert live_before >= MAX_KEYS, (live_before, arrival)
        for k in arrival.evicted:
            self.keys[str(k)].value = None
        if m.runner is not None:
            assert arrival.decision is Decision.WAIT, arrival
            m.waiters.append(caller)
        elif self.kept(key):
            assert arrival.decision is Decision.CACHED, arrival
            assert arrival.value == m.value
            self.outcomes[caller].append(m.value or "")
        elif arrival.decision is Decision.UNTRACKED:
            # Room for none: every kept key is working.
            assert sum(self.kept(k) for k in KEYS) >= MAX_KEYS
            assert all(self.keys[k].runner is not None for k in KEYS if self.kept(k))
            self.outcomes[caller].append("untracked")
        else:
            assert arrival.decision is Decision.RUN, arrival
            m.runner, m.value = caller, None
            m.runs += 1

    # ------------------------------------------------------------------ rules
    @rule(key=st.sampled_from(KEYS))
    def a_caller_arrives(self, key: str) -> None:
        self.callers += 1
        self.outcomes[self.callers] = []
        self.arrive(self.callers, key)

    @precondition(lambda self: any(m.runner is not None for m in self.keys.values()))
    @rule(data=st.data(), how=st.sampled_from(["succeed", "fail", "abandon"]))
    def a_run_ends(self, data: st.DataObject, how: str) -> None:
        key = data.draw(st.sampled_from([k for k in KEYS if self.keys[k].runner is not None]))
        self.end(key, how)

    def end(self, key: str, how: str) -> None:
        m = self.keys[key]
        assert m.runner is not None
        runner, expected = m.runner, m.waiters
        m.runner, m.waiters = None, []
        if how == "succeed":
            m.successes += 1
            self.seq += 1
            value = f"{key}#{m.successes}"
            waiters = self.table.succeed(key, value, self.now)
            m.value, m.expires_at, m.done_seq = value, self.now + TTL, self.seq
            for caller in (runner, *waiters):
                self.outcomes[caller].append(value)
        else:
            waiters = self.table.fail(key)
            self.outcomes[runner].append("error")
        assert waiters == expected, (waiters, expected)
        if how == "fail":
            for caller in waiters:
                self.outcomes[caller].append("error")
        elif how == "abandon":
            for caller in waiters:  # they arrive again: one of them runs the work
                self.arrive(caller, key)

    @rule(seconds=st.sampled_from([0.5, 3.0, TTL - 0.5, TTL, 2 * TTL]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    # ------------------------------------------------------------------ invariants
    @invariant()
    def the_table_agrees_with_the_model(self) -> None:
        assert len(self.table) <= MAX_KEYS
        for k in KEYS:
            m = self.keys[k]
            if m.runner is not None:
                assert self.table.state(k, self.now) == "working"
                assert self.table.waiting(k) == len(m.waiters)
            elif m.value is not None and self.now < m.expires_at:
                assert self.table.state(k, self.now) == "done"
            else:
                assert self.table.state(k, self.now) == "idle"

    @invariant()
    def every_caller_has_one_outcome_or_is_pending(self) -> None:
        pending = {m.runner for m in self.keys.values()} | {
            c for m in self.keys.values() for c in m.waiters
        }
        for caller, got in self.outcomes.items():
            assert len(got) == (0 if caller in pending else 1), (caller, got)

    def teardown(self) -> None:
        for k in KEYS:
            while self.keys[k].runner is not None:
                self.end(k, "succeed")
        assert all(len(got) == 1 for got in self.outcomes.values()), self.outcomes
        for m in self.keys.values():
            # Every run started after the previous one ended without a kept result.
            assert m.runs >= m.successes


DedupMachine.TestCase.settings = machine_settings(150, 1000, steps=(40, 80))
test_dedup_state_machine = DedupMachine.TestCase


@pytest.mark.parametrize(
    ("ttl", "max_keys"), [(0, 1), (-1.0, 1), (float("inf"), 1), (float("nan"), 1), (1, 0)]
)
def test_bad_settings_are_refused(ttl: float, max_keys: int) -> None:
    with pytest.raises(InvalidArgumentError):
        check_settings(ttl, max_keys)


@pytest.mark.parametrize("key", ["", b"k", None, 3])
def test_a_key_is_a_non_empty_str(key: object) -> None:
    with pytest.raises(InvalidArgumentError):
        check_key(key)  # type: ignore[arg-type]


def test_a_full_table_of_working_keys_runs_a_new_key_untracked() -> None:
    table: DedupTable[int] = DedupTable(5.0, 2)
    assert table.arrive("a", 0.0, 1).decision is Decision.RUN
    assert table.arrive("b", 0.0, 2).decision is Decision.RUN
    assert table.arrive("c", 0.0, 3).decision is Decision.UNTRACKED
    table.succeed("a", "A", 1.0)
    arrival = table.arrive("c", 2.0, 4)
    assert (arrival.decision, arrival.evicted) == (Decision.RUN, ("a",))
    assert len(table) == 2
