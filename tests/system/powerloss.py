"""Power cuts for the system tests: a traced broker, killed, its directory rebuilt.

kill -9 alone keeps the page cache: whatever the broker wrote survives, synced or not. A
`PowerGrid` runs the broker with tools/powerloss/powerloss.c preloaded, which journals
every change it makes under its data directory; `cut()` kills the broker with SIGKILL and
replaces the data directory with what tools/powerloss/model.py says a disk would hold after
the power came back (only what was fsynced, plus, by mode, some of the rest). The next
broker starts on that, as a machine would after the outage.
"""

from __future__ import annotations

import functools
import random
import re
import shutil
import time
from pathlib import Path

import pytest

from tests.support import BrokerProcess
from tools.powerloss.model import NoCompilerError, Rebuilt, build, environment, rebuild, snapshot

#: A broker log line at these levels means something went wrong, not just a crash found.
_BAD_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) |^Traceback", re.MULTILINE)


@functools.cache
def _library() -> Path | str:
    try:
        return build()
    except NoCompilerError as exc:
        return str(exc)


def library() -> Path:
    """The compiled preload library; skips the test when there is no C compiler."""
    built = _library()
    if isinstance(built, str):
        pytest.skip(f"power-loss tests need a C compiler: {built}")
    return built


class PowerGrid:
    """One broker data directory through a series of power cuts.

    Before each traced run `arm()` snapshots the directory (the durable state the run
    starts from) and gives the environment that journals the run; `cut()` ends it. With
    `sync_delay_ms`, each fsync of the traced broker takes that much longer.
    """

    def __init__(self, work: Path, sync_delay_ms: float = 0.0) -> None:
        self.library = library()
        self.sync_delay_ms = sync_delay_ms
        self.work = work
        (work / "broker").mkdir(parents=True)
        # The preload matches paths under the real path: no symlink may lead to it.
        self.data = (work / "broker").resolve()
        self.cuts = 0
        self.cut_at = 0.0  # time.monotonic() once the last cut's broker was dead
        self._armed: tuple[Path, Path] | None = None

    def arm(self) -> dict[str, str]:
        """Snapshot the data directory; the environment that traces the next broker."""
        run = self.work / f"run-{self.cuts}"
        snap, journal = run / "snapshot", run / "journal"
        snapshot(self.data, snap)
        self._armed = (snap, journal)
        return environment(self.library, self.data, journal, self.sync_delay_ms)

    def cut(self, broker: BrokerProcess, mode: str, rng: random.Random) -> Rebuilt:
        """Cut the power of `broker`: SIGKILL, then only what the disk kept survives."""
        assert self._armed is not None, "arm() before starting the broker"
        snap, journal = self._armed
        self._armed = None
        broker.kill9()
        self.cut_at = time.monotonic()
        assert journal.exists(), f"the broker ran untraced (LD_PRELOAD of {self.library} failed?)"
        rebuilt = snap.parent / "rebuilt"
        stats = rebuild(snap, journal, rebuilt, mode, rng)
        shutil.rmtree(self.data)
        shutil.copytree(rebuilt, self.data)  # the cut's result stays for a post-mortem
        self.cuts += 1
        return stats


def bad_log_lines(stderr: str) -> list[str]:
    """The ERROR and CRITICAL lines and tracebacks of a broker's log."""
    lines = stderr.splitlines()
    return [line for line in lines if _BAD_LINE.match(line)]
