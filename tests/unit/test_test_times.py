"""tools/test_times.py: which tier and file a test belongs to, and the files' start order."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.test_times import file_of, merged_durations, read_durations, start_order, tier_of


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
