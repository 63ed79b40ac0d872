from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from mockbroker import BrokerConfig, EmbeddedBroker
from tests.chaos_report import REPORT_PATH_ENV, ChaosRecorder, ChaosReport
from tests.faultproxy import NO_PROXY_VARIABLES, FaultProxy
from tests.fuzzing import LONG, Tracebacks
from tools.test_times import CPU_DIR_ENV, read_durations, start_order

_CHAOS = pytest.StashKey[ChaosReport]()

# Hypothesis times each example against the wall clock (a 200 ms deadline, and a health
# check of slow data generation): on a loaded machine a process stopped for a moment fails
# a test that is correct ("Unreliable test timings!"). Tests here assert no timing.
# `make test` makes the same search every run, as the fuzz tests and state machines do
# (tests/fuzzing.py); HYPOTHESIS_PROFILE=long searches anew each time.
settings.register_profile(
    "ordermq",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=not LONG,
    database=None,
)
settings.load_profile("ordermq")


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_CHAOS] = ChaosReport()


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest) -> ChaosRecorder:
    """Records this fault test's row of the summary table (tests/chaos_report.py)."""
    return ChaosRecorder(request.config.stash[_CHAOS], request.node.name)


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


# make test runs files whole on three workers (--dist loadfile --no-loadscope-reorder), each
# worker taking the next file when it is almost done: the longest files first, so that the
# last ones to start are short and the workers finish together. xdist's own order (most
# tests first) left a system file last. A file's seconds come from tests/durations.json
# (`make test-durations` refreshes it); files not in it follow, slowest tier first.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sorts the files longest first (tools/test_times.py); a file's tests keep their order."""
    paths = {item: _relative(item.path, config.rootpath) for item in items}
    keys = start_order(sorted(set(paths.values())), read_durations())
    items.sort(key=lambda item: keys[paths[item]])


# make test-times: each file's CPU seconds (this process's and its reaped children's: the
# brokers and clients its tests started), written per worker into $ORDERMQ_TEST_CPU_DIR.
_CPU = pytest.StashKey[dict[str, float]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    if not os.environ.get(CPU_DIR_ENV):
        yield
        return
    before = os.times()
    yield
    after = os.times()
    spent = sum(after[:4]) - sum(before[:4])  # user, system, children's user and system
    per_file = item.config.stash.setdefault(_CPU, {})
    path = _relative(item.path, item.config.rootpath)
    per_file[path] = per_file.get(path, 0.0) + spent


def pytest_sessionfinish(session: pytest.Session) -> None:
    directory = os.environ.get(CPU_DIR_ENV)
    per_file = session.config.stash.get(_CPU, {})
    if directory and per_file:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / f"cpu-{os.getpid()}.json").write_text(json.dumps(per_file))


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
def tracebacks() -> Iterator[Tracebacks]:
    """What is logged with a traceback attached while the test runs (the fuzz tests)."""
    handler = Tracebacks()
    logging.getLogger().addHandler(handler)
    yield handler
    logging.getLogger().removeHandler(handler)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """An embedded broker on port 0 with its data in a temporary directory."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker")) as b:
        yield b


@pytest.fixture
def process_proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault proxy that this process's gRPC channels made from now on go through."""
    with FaultProxy(seed=5) as p:
        monkeypatch.setenv("grpc_proxy", p.url)
        for name in NO_PROXY_VARIABLES:
            monkeypatch.delenv(name, raising=False)
        yield p


@pytest.fixture
def sync_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """Like `broker`, in sync flush mode."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker", flush_mode="sync")) as b:
        yield b
