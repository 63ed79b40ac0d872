"""tools/test_times.py: which tier and file a test belongs to, and the files' start order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT
from tools.test_times import (
    CPU_DIR_ENV,
    file_of,
    merged_durations,
    read_cpu,
    read_durations,
    start_order,
    tier_of,
    tier_of_path,
)


@pytest.mark.parametrize(
    ("classname", "tier"),
    [
        ("tests.unit.test_pop", "unit"),
        ("tests.component.test_receive", "component"),
        ("tests.system.test_broker_restart_chaos", "system"),
        ("tests.system.test_rocketmq_cpp_client", "interop"),
        ("tests.system.test_rocketmq5_python_client", "interop"),
        ("tests.examples.test_examples", "examples"),
        ("README.md", "docs"),
        ("docs.operations.md", "docs"),
    ],
)
def test_a_test_is_counted_in_its_tier(classname: str, tier: str) -> None:
    assert tier_of(classname) == tier


@pytest.mark.parametrize(
    ("classname", "path"),
    [
        ("tests.unit.test_test_times", "tests/unit/test_test_times.py"),
        ("tests.examples.test_examples", "tests/examples/test_examples.py"),
        ("tests.unit.acl.test_acl_file", "tests/unit/acl/test_acl_file.py"),
        ("tests.unit.acl.test_acl_file.TestSomething", "tests/unit/acl/test_acl_file.py"),
        ("README.md", "README.md"),
        ("docs.operations.md", "docs/operations.md"),
        ("tests.unit.test_no_such_file", None),
    ],
)
def test_a_test_is_counted_in_its_file(classname: str, path: str | None) -> None:
    assert file_of(classname) == path


def test_new_seconds_replace_old_ones_and_gone_files_are_dropped(tmp_path: Path) -> None:
    for name in ("a.py", "b.py", "c.py"):
        (tmp_path / name).touch()
    old = {"b.py": 3.0, "gone.py": 9.0, "c.py": 1.0}
    merged = merged_durations(old, {"b.py": 4.04, "a.py": 2.0}, tmp_path)
    assert list(merged.items()) == [("a.py", 2.0), ("b.py", 4.0), ("c.py", 1.0)]


def test_files_start_longest_first_then_slowest_tier_first() -> None:
    paths = [
        "README.md", "tests/unit/test_a.py", "tests/component/test_b.py",
        "tests/system/test_c.py", "tests/system/test_d.py", "tests/examples/test_e.py",
    ]  # fmt: skip
    durations = {"tests/system/test_d.py": 30.0, "tests/unit/test_a.py": 40.0}
    keys = start_order(paths, durations)
    assert sorted(paths, key=keys.__getitem__) == [
        "tests/unit/test_a.py", "tests/system/test_d.py",  # measured, longest first
        "tests/examples/test_e.py", "tests/system/test_c.py", "tests/component/test_b.py",
        "README.md",
    ]  # fmt: skip


def test_the_committed_durations_give_seconds_by_file() -> None:
    durations = read_durations()
    assert durations, "tests/durations.json is missing or empty (make test-durations)"
    assert all(isinstance(seconds, float) and seconds >= 0 for seconds in durations.values())
    assert all(path.startswith("tests/") or path.endswith(".md") for path in durations)


@pytest.mark.parametrize(
    ("path", "tier"),
    [
        ("tests/unit/test_pop.py", "unit"),
        ("tests/system/test_rocketmq_cpp_client.py", "interop"),
        ("tests/system/test_cluster.py", "system"),
        ("docs/operations.md", "docs"),
    ],
)
def test_a_files_cpu_is_counted_in_its_tier(path: str, tier: str) -> None:
    assert tier_of_path(path) == tier


def test_each_files_cpu_seconds_are_recorded_per_process_and_summed(tmp_path: Path) -> None:
    test = "tests/unit/test_selector.py"
    env = {**os.environ, CPU_DIR_ENV: str(tmp_path)}
    for _ in range(2):  # two pytest processes, as two xdist workers
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
            cwd=ROOT, env=env, check=True, capture_output=True,
        )  # fmt: skip
    written = sorted(tmp_path.glob("cpu-*.json"))
    assert len(written) == 2
    one = json.loads(written[0].read_text())
    assert list(one) == [test] and one[test] > 0
    both = read_cpu(tmp_path)
    assert both[test] == pytest.approx(sum(json.loads(w.read_text())[test] for w in written))
