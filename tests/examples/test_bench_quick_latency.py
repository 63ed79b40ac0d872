"""bench/run.py --quick measures the latency, pull, consume, keymode, poll, stream, floor and
micro groups (tests/examples/bench_quick.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples.bench_quick import PARTS, quick_run

pytestmark = pytest.mark.example


@pytest.mark.parametrize("group", PARTS["latency"])
def test_bench_quick_run_measures_every_figure(group: str, tmp_path: Path) -> None:
    quick_run(group, tmp_path)


def test_bench_with_the_console_open_fetches_its_pages_meanwhile(tmp_path: Path) -> None:
    report = quick_run("consume", tmp_path, "--console")
    assert report["options"]["console"] is True
    assert report["facts"]["console_pages"] > 0
    assert "console_page_failures" not in report["facts"]
