"""bench/run.py --broker-busy-poll-us: every broker of a run started with it, and the
run's facts saying what its brokers did."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from mockbroker import BrokerConfig
from mockbroker.__main__ import build_parser
from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import run as bench_run
from procs import busy_poll_option


def started_with(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> tuple[Sequence[str], object]:
    """The options a run's broker is started with, and the run's busy-poll fact."""
    seen: list[Sequence[str]] = []

    @contextlib.contextmanager
    def fake_broker(
        data_dir: Path, flush_mode: str, profile: object = None, extra: Sequence[str] = ()
    ) -> Iterator[object]:
        seen.append(extra)
        yield object()

    monkeypatch.setattr(bench_run, "broker_process", fake_broker)
    bench = bench_run.Bench(bench_run.parse_args(argv), Path("."))
    with bench._broker("probe", "async"):
        pass
    return seen[0], bench.facts["broker_busy_poll_us"]


def test_a_run_starts_its_brokers_with_the_busy_polling_it_asks_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra, fact = started_with(monkeypatch, ["--only", "produce", "--broker-busy-poll-us", "0"])
    assert "--busy-poll-us" in extra and fact == 0
    given = extra[list(extra).index("--busy-poll-us") :][:2]
    assert build_parser().parse_args(["--data-dir", "x", *given]).busy_poll_us == 0
    extra, fact = started_with(monkeypatch, ["--only", "produce"])
    assert "--busy-poll-us" not in extra and fact == BrokerConfig().busy_poll_us
    assert busy_poll_option(object()) == (), "flood and profile runs without the option"
