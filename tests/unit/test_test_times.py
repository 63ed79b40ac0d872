"""tools/test_times.py: which tier a test belongs to, from its JUnit classname."""

from __future__ import annotations

import pytest

from tools.test_times import tier_of


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
