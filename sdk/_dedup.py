"""The dedup state machine: one per key, shared by the blocking and asyncio coordinators.

Plain and synchronous (no threads, no event loop, no clock of its own: every call is
given `now`), so that a coordinator changes it inside one lock and acts on what it
returns outside, and a hypothesis state machine can drive it through any interleaving.

Each key is in one of three states::

    idle ──arrive──> working ──succeed──> done(value, expires_at)
     ^                  │                    │
     └──────fail────────┘                    │
     └───────────── now >= expires_at ───────┘ (or dropped at the key bound)

- idle: not in the table. The first caller to arrive gets RUN and the key turns working.
- working: one caller runs the work; those who arrive meanwhile get WAIT and are kept
  as waiters (any object the coordinator passes: an Event holder, a future).
- succeed: the key is done with its value until `now + ttl_seconds`; the waiters are
  handed back to be given the value, and later callers get CACHED with it.
- fail: the key is idle again and the waiters are handed back to be given the error
  (or, for an abandoned run, told to arrive again: then one of them runs the work).
- expiry: a done key whose time has come is idle again (removed when next seen).

At most `max_keys` keys are kept. A new key at the bound first drops expired results,
then the oldest results (done the longest ago); a working key is never dropped, since its
waiters need it. When every kept key is working, the new key's caller gets UNTRACKED:
it runs the work itself, neither shared nor cached.

This is seed 003's dedup ("处理唯一性"): one run per key at a time. Unlike the seed, the
callers that come during a run do not queue behind it to run again: they take its
outcome, so N identical requests cost one run, and a result stays shared for its TTL.
"""

from __future__ import annotations

import enum
import math
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from sdk.errors import InvalidArgumentError

W = TypeVar("W")


class Decision(enum.Enum):
    """What a caller that arrives must do."""

    RUN = "run"  # run the work, then call succeed() or fail()
    WAIT = "wait"  # wait on the waiter it passed in: succeed() or fail() hands it back
    CACHED = "cached"  # take Arrival.value
    UNTRACKED = "untracked"  # at the key bound with every key working: run the work alone


@dataclass(frozen=True, slots=True)
class Arrival:
    """The decision for one caller, the cached value, and the results dropped for room."""

    decision: Decision
    value: object = None
    evicted: tuple[Hashable, ...] = ()


@dataclass(slots=True)
class _Working(Generic[W]):
    waiters: list[W] = field(default_factory=list)


@dataclass(slots=True)
class _Done:
    value: object
    expires_at: float


class DedupTable(Generic[W]):
    """Per-key state of a dedup coordinator; not thread-safe (the coordinator locks)."""

    def __init__(self, ttl_seconds: float, max_keys: int) -> None:
        check_settings(ttl_seconds, max_keys)
        self.ttl_seconds = float(ttl_seconds)
        self.max_keys = max_keys
        self._entries: dict[Hashable, _Working[W] | _Done] = {}
        #: Done keys, oldest result first; results expire in this order too (one TTL).
        self._done: OrderedDict[Hashable, None] = OrderedDict()

    def __len__(self) -> int:
        """Keys kept: working, and done (expired ones not yet dropped included)."""
        return len(self._entries)

    def state(self, key: Hashable, now: float) -> str:
        """'idle', 'working' or 'done' (for tests and introspection)."""
        entry = self._entries.get(key)
        if entry is None or (isinstance(entry, _Done) and now >= entry.expires_at):
            return "idle"
        return "working" if isinstance(entry, _Working) else "done"

    def waiting(self, key: Hashable) -> int:
        """How many callers wait for the key's run."""
        entry = self._entries.get(key)
        return len(entry.waiters) if isinstance(entry, _Working) else 0

    def arrive(self, key: Hashable, now: float, waiter: W) -> Arrival:
        """A caller wants `key`'s result; `waiter` is kept only if the decision is WAIT."""
        entry = self._entries.get(key)
        if isinstance(entry, _Working):
            entry.waiters.append(waiter)
            return Arrival(Decision.WAIT)
        if entry is not None:
            if now < entry.expires_at:
                return Arrival(Decision.CACHED, entry.value)
            self._drop(key)
        self._drop_expired(now)
        evicted: list[Hashable] = []
        while len(self._entries) >= self.max_keys and self._done:
            oldest = next(iter(self._done))
            self._drop(oldest)
            evicted.append(oldest)
        if len(self._entries) >= self.max_keys:
            return Arrival(Decision.UNTRACKED, evicted=tuple(evicted))
        self._entries[key] = _Working()
        return Arrival(Decision.RUN, evicted=tuple(evicted))

    def succeed(self, key: Hashable, value: object, now: float) -> list[W]:
        """The run of `key` returned `value`: done until now + ttl. Returns its waiters."""
        waiters = self._working(key).waiters
        self._entries[key] = _Done(value, now + self.ttl_seconds)
        self._done[key] = None
        return waiters

    def fail(self, key: Hashable) -> list[W]:
        """The run of `key` failed or was abandoned: idle again. Returns its waiters."""
        waiters = self._working(key).waiters
        del self._entries[key]
        return waiters

    def _working(self, key: Hashable) -> _Working[W]:
        entry = self._entries.get(key)
        if not isinstance(entry, _Working):
            raise RuntimeError(f"key {key!r} is not working")  # a coordinator's bug
        return entry

    def _drop(self, key: Hashable) -> None:
        del self._entries[key]
        self._done.pop(key, None)

    def _drop_expired(self, now: float) -> None:
        while self._done:
            oldest = next(iter(self._done))
            entry = self._entries[oldest]
            assert isinstance(entry, _Done)
            if now < entry.expires_at:
                return
            self._drop(oldest)


def check_settings(ttl_seconds: float, max_keys: int) -> None:
    """Raise InvalidArgumentError unless ttl_seconds > 0 (finite) and max_keys >= 1."""
    if (
        isinstance(ttl_seconds, bool)
        or not isinstance(ttl_seconds, int | float)
        or not math.isfinite(ttl_seconds)
        or ttl_seconds <= 0
    ):
        raise InvalidArgumentError(f"ttl_seconds must be a positive number, not {ttl_seconds!r}")
    if isinstance(max_keys, bool) or not isinstance(max_keys, int) or max_keys < 1:
        raise InvalidArgumentError(f"max_keys must be an int >= 1, not {max_keys!r}")


def check_key(key: str) -> str:
    """Return `key` if it is a non-empty str, else raise InvalidArgumentError."""
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(f"a dedup key must be a non-empty str, not {key!r}")
    return key
