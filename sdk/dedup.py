"""DedupCoordinator: N concurrent identical requests run the work once and share its result.

The blocking face; `sdk.aio.DedupCoordinator` is its asyncio twin. Both drive one state
machine (sdk/_dedup.py), changed inside a lock, with the waiting done outside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar, cast

from sdk._dedup import Decision, DedupTable, check_key
from sdk._validation import check_clock
from sdk.clock import Clock, SystemClock

T = TypeVar("T")


class _Waiter:
    """A caller blocked on another's run: woken with its value, its error, or 'again'."""

    __slots__ = ("again", "error", "event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: object = None
        self.error: BaseException | None = None
        self.again = False


class DedupCoordinator:
    """Runs the work for a key once for all the threads that ask for it together.

    `run(key, work)` calls `work()` in the caller's thread if no run of `key` is under way,
    else blocks until that run ends and returns its value (or raises its exception). A
    value is kept for `ttl_seconds` (on `clock.monotonic()`): a call within it returns the
    value without running anything. An exception is not kept: the next call runs the work
    again. If the running thread leaves the work by a BaseException that is not an
    Exception (KeyboardInterrupt, SystemExit), its waiters are not failed with it: one of
    them runs the work instead.

    At most `max_keys` keys are kept: for a new key at the bound, expired values and then
    the oldest values are dropped; a key being worked on is never dropped, and when every
    kept key is, the new key's call runs its work alone (neither shared nor cached).

    In-process only: threads of one process share a coordinator. Sharing runs across
    processes would go through the broker (it sees every client) and is left for later.
    A `work` must not call `run` with its own key: it would wait for itself.

    Args:
        ttl_seconds: how long a value is shared after its run returned; > 0.
        max_keys: the most keys kept, working or done; >= 1.
        clock: the time source of expiry (sdk.testing.FakeClock in tests).

    Raises:
        InvalidArgumentError: ttl_seconds not positive, max_keys below 1, or a clock
            that is no Clock.
    """

    def __init__(
        self, *, ttl_seconds: float, max_keys: int = 10_000, clock: Clock | None = None
    ) -> None:
        self._table: DedupTable[_Waiter] = DedupTable(ttl_seconds, max_keys)
        self._clock: Clock = check_clock(clock) or SystemClock()
        self._lock = threading.Lock()

    def run(self, key: str, work: Callable[[], T]) -> T:
        """Return `work()`'s value for `key`, running it only if no run or value is shared.

        Raises:
            InvalidArgumentError: `key` is not a non-empty str.
            Exception: what the shared run of `work` raised.
        """
        check_key(key)
        while True:
            waiter = _Waiter()
            with self._lock:
                arrival = self._table.arrive(key, self._clock.monotonic(), waiter)
            if arrival.decision is Decision.CACHED:
                return cast(T, arrival.value)
            if arrival.decision is Decision.UNTRACKED:
                return work()
            if arrival.decision is Decision.RUN:
                return self._run(key, work)
            waiter.event.wait()
            if waiter.again:
                continue
            if waiter.error is not None:
                raise waiter.error
            return cast(T, waiter.value)

    def _run(self, key: str, work: Callable[[], T]) -> T:
        try:
            value = work()
        except Exception as exc:
            with self._lock:
                waiters = self._table.fail(key)
            for w in waiters:
                w.error = exc
                w.event.set()
            raise
        except BaseException:
            with self._lock:
                waiters = self._table.fail(key)
            for w in waiters:
                w.again = True
                w.event.set()
            raise
        with self._lock:
            waiters = self._table.succeed(key, value, self._clock.monotonic())
        for w in waiters:
            w.value = value
            w.event.set()
        return value

    def waiting(self, key: str) -> int:
        """How many threads wait for the run of `key` under way (0 if none is)."""
        with self._lock:
            return self._table.waiting(key)

    def __len__(self) -> int:
        """How many keys are kept (working, or done and not yet dropped)."""
        with self._lock:
            return len(self._table)
