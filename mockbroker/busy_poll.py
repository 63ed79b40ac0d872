"""The standalone broker's selector: it polls for a moment before it sleeps.

A client waiting for its answer sends its next request within a few hundred
microseconds. If the broker's event loop is asleep in epoll_wait by then, the client's
send has to wake it: on a virtual machine that is an inter-processor interrupt and a
context switch, tens of microseconds on both sides of every request (perf on this
project's machine: 15-20% of each side's CPU for a lone send). While requests come that
densely, the loop polls without sleeping for up to `spin_seconds` first, and finds them
at once. When a spin ends with nothing, the selector stops spinning (the broker goes
idle without burning a core) until a wait again ends within `spin_seconds`; a wait
that took longer, spin included, keeps it from spinning, so that requests coming just
too far apart for it do not have it spin in vain before each.

The spin holds the GIL but for its polls' system calls, so a thread waiting for the GIL
(an fsync's worker coming back) could wait a whole switch interval (5 ms) for it: the
loop does not spin while work it gave its threads (`run_in_executor`, `to_thread`) is
unfinished (`ThreadWork`), and a sync-flush broker, whose sends wait on an fsync worker,
spins little.

Only the standalone broker's loop does this (`python -m mockbroker`, the process owns
its cores' worth of work), and only where it may use two cores or more
(`available_cores`: its CPU affinity, a container's CPU quota): on one core a spin would
keep the very client it waits for from running, and in a container it would spend the
quota. An embedded broker shares its loop or process with the application and never
spins.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> float:
    """The cores this process may use: its CPU affinity, capped by a cgroup CPU quota.

    The quota is read as a container sees its own: cgroup v2 `cpu.max`, or v1
    `cpu/cpu.cfs_quota_us` over `cpu/cpu.cfs_period_us`.
    """
    cores = float(len(os.sched_getaffinity(0)))
    quota = _cgroup_quota(cgroup)
    return cores if quota is None else min(cores, quota)


def _cgroup_quota(cgroup: Path) -> float | None:
    """The CPU quota in cores (None: none set, or no cgroup files to read)."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        pass
    try:
        v1_quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        v1_period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return v1_quota / v1_period if v1_quota > 0 and v1_period > 0 else None


class ThreadWork(ThreadPoolExecutor):
    """The loop's default executor, counting the work it has not finished."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="asyncio")
        self._unfinished = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Future[_T]:
        """ThreadPoolExecutor.submit, counted until the work is done."""
        with self._lock:
            self._unfinished += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _: Future[Any] | None) -> None:
        with self._lock:
            self._unfinished -= 1

    def idle(self) -> bool:
        """True when no work given to the threads is unfinished."""
        return not self._unfinished


class BusyPollSelector(selectors.EpollSelector):
    """A selector whose waits poll for up to `spin_seconds` before they block.

    `timer` is a monotonic clock in seconds (tests give a fake one). A spin never makes
    a wait longer than its timeout. `may_spin` says whether a spin may start now (False:
    a thread may need the GIL soon).
    """

    def __init__(
        self,
        spin_seconds: float,
        timer: Callable[[], float] = time.perf_counter,
        may_spin: Callable[[], bool] = lambda: True,
    ) -> None:
        super().__init__()
        self._spin = spin_seconds
        self._timer = timer
        self._may_spin = may_spin
        self._spinning = spin_seconds > 0
        #: Waits that found their events while spinning, and spins that found none
        #: (ordermq_busy_poll_spins_total).
        self.spins_hit = 0
        self.spins_missed = 0

    @property
    def spin_seconds(self) -> float:
        """The longest a wait polls before it blocks (0: it never does)."""
        return self._spin

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        """Wait for events as EpollSelector.select does, polling first while spinning."""
        spin = self._spin
        if spin <= 0 or (timeout is not None and timeout <= 0):
            return super().select(timeout)
        timer = self._timer
        started = timer()
        if self._spinning and self._may_spin():
            limit = spin if timeout is None else min(spin, timeout)
            while True:
                ready = super().select(0)
                if ready:
                    self.spins_hit += 1
                    return ready
                spent = timer() - started
                if spent >= limit:
                    break
            if timeout is not None and spent >= timeout:
                return []  # a timer is due: that says nothing of how densely requests come
            self.spins_missed += 1
            self._spinning = False  # quiet now: sleep until requests come densely again
            if timeout is not None:
                timeout -= spent
        ready = super().select(timeout)
        if ready:  # whole wait (a missed spin included) within a spin: spin next time
            self._spinning = timer() - started < spin
        return ready


class PollingEventLoop(asyncio.SelectorEventLoop):
    """The standalone broker's event loop, over a BusyPollSelector (kept for the metrics)."""

    def __init__(self, selector: BusyPollSelector) -> None:
        super().__init__(selector)
        self.busy_poll = selector
