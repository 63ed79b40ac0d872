from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker
from tests.chaos_report import REPORT_PATH_ENV, ChaosRecorder, ChaosReport

_CHAOS = pytest.StashKey[ChaosReport]()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_CHAOS] = ChaosReport()


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> ChaosRecorder:
    """Records this fault test's row of the summary table (tests/chaos_report.py)."""
    return ChaosRecorder(request.config.stash[_CHAOS], request.node.name)


# make test runs files whole on two workers (--dist loadfile --no-loadscope-reorder), in
# this order: the longest files first, so that the last ones to start are short and both
# workers finish together. xdist's own order (most tests first) left a system file last.
_SLOWEST_FIRST = ("tests/examples/", "tests/system/", "tests/component/", "tests/unit/")


def _start_rank(item: pytest.Item) -> int:
    path = item.path.as_posix()
    for rank, tier in enumerate(_SLOWEST_FIRST):
        if f"/{tier}" in path:
            return rank
    return len(_SLOWEST_FIRST) - 1  # README.md and docs/: short, like the unit files


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sorts the files slowest tier first; a file's own tests keep their order."""
    items.sort(key=_start_rank)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    report = config.stash[_CHAOS]
    if not report.rows:
        return
    terminalreporter.section("fault suite summary")
    terminalreporter.write_line(report.table())
    if path := os.environ.get(REPORT_PATH_ENV):
        report.write(Path(path))


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """An embedded broker on port 0 with its data in a temporary directory."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker")) as b:
        yield b


@pytest.fixture
def sync_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """Like `broker`, in sync flush mode."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker", flush_mode="sync")) as b:
        yield b
