"""Where `make test`'s time goes: each check's wall time, and pytest's time per tier.

Runs the checks `make test` runs before pytest (each timed on its own), then pytest with
a JUnit report, and prints a table per tier (unit, component, system, interop, examples,
docs) with the number of tests, the seconds they took and their share, then the slowest
tests. The figures are also written to build/test-times.json. Extra arguments go to
pytest (`make test-times PYTEST_ARGS="-x"`).

Tier sums add each test's own duration (set-up and tear-down included); with tests run
in parallel they add up to more than the wall time, which is printed apart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("proto-check", "docs-check", "docs-api", "lint", "typecheck")
TIERS = ("unit", "component", "system", "interop", "examples", "docs")
INTEROP_PREFIX = "tests.system.test_rocketmq"


def tier_of(classname: str) -> str:
    """The tier of a test from its JUnit classname ("tests.unit.test_pop", "README.md")."""
    if classname.startswith(INTEROP_PREFIX):
        return "interop"
    for tier in ("unit", "component", "system", "examples"):
        if classname.startswith(f"tests.{tier}."):
            return tier
    return "docs"


def timed(command: list[str]) -> tuple[float, int]:
    """Run `command` in the project; its wall seconds and exit code."""
    start = time.monotonic()
    code = subprocess.call(command, cwd=ROOT)
    return time.monotonic() - start, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowest", type=int, default=25, help="slowest tests to list")
    parser.add_argument("--skip-checks", action="store_true", help="time pytest only")
    args, pytest_args = parser.parse_known_args()
    build = ROOT / "build"
    build.mkdir(exist_ok=True)
    checks: dict[str, float] = {}
    if not args.skip_checks:
        for check in CHECKS:
            checks[check], code = timed(["make", "--no-print-directory", "-s", check])
            if code:
                print(f"make {check} failed", file=sys.stderr)
                return code
    report = build / "test-times.xml"
    command = [sys.executable, "-m", "pytest", "-q", f"--junitxml={report}", *pytest_args]
    wall, code = timed(command)
    per_tier: dict[str, list[float]] = defaultdict(list)
    tests: list[tuple[float, str]] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        seconds = float(case.get("time", "0"))
        classname = case.get("classname", "")
        per_tier[tier_of(classname)].append(seconds)
        tests.append((seconds, f"{classname}::{case.get('name', '')}"))
    total = sum(map(sum, per_tier.values())) or 1.0
    print("\n| step | wall s |\n|---|---|")
    for check, seconds in checks.items():
        print(f"| make {check} | {seconds:.1f} |")
    print(f"| pytest | {wall:.1f} |")
    print("\n| tier | tests | test s | share |\n|---|---|---|---|")
    for tier in TIERS:
        times = per_tier.get(tier, [])
        print(f"| {tier} | {len(times)} | {sum(times):.1f} | {sum(times) / total:.0%} |")
    print(f"\n{args.slowest} slowest:")
    for seconds, name in sorted(tests, reverse=True)[: args.slowest]:
        print(f"  {seconds:7.1f}  {name}")
    (build / "test-times.json").write_text(
        json.dumps(
            {
                "checks": checks,
                "pytest_wall_seconds": wall,
                "tiers": {t: {"tests": len(v), "seconds": sum(v)} for t, v in per_tier.items()},
                "slowest": [[s, n] for s, n in sorted(tests, reverse=True)[: args.slowest]],
            },
            indent=1,
        )
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
