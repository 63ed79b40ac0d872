"""bench/run.py --quick measures the remoting group (tests/examples/bench_quick.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.examples.bench_quick import PARTS, quick_run

pytestmark = pytest.mark.example


@pytest.mark.parametrize("group", PARTS["remoting"])
def test_bench_quick_run_measures_every_figure(group: str, tmp_path: Path) -> None:
    quick_run(group, tmp_path)
