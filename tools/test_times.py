"""Where `make test`'s time goes: each check's wall time, and pytest's time per tier.

Runs the checks `make test` runs beside pytest (here first, each timed on its own), then
pytest with a JUnit report, and prints a table per tier (unit, component, system, interop,
examples, docs) with the number of tests, the seconds they took, their share and their CPU
seconds (the test processes' own and their reaped children's: the brokers and clients the
tests started; tests/conftest.py records them when ORDERMQ_TEST_CPU_DIR is set), then the
slowest tests and the busiest files. The figures are also written to
build/test-times.json. Extra arguments go to pytest (`make test-times PYTEST_ARGS="-x"`).

--update-durations writes each test file's seconds into tests/durations.json (`make
test-durations`), which tests/conftest.py reads to start the longest files first: the files
that ran replace their entries, files that no longer exist are dropped, the others stay.

Tier sums add each test's own duration (set-up and tear-down included); with tests run
in parallel they add up to more than the wall time, which is printed apart.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = ("proto-check", "docs-check", "docs-api", "lint", "typecheck")
TIERS = ("unit", "component", "system", "interop", "examples", "docs")
INTEROP_PREFIX = "tests.system.test_rocketmq"
DURATIONS = ROOT / "tests" / "durations.json"
#: A directory where each pytest process writes its test files' CPU seconds (conftest.py).
CPU_DIR_ENV = "ORDERMQ_TEST_CPU_DIR"


def tier_of(classname: str) -> str:
    """The tier of a test from its JUnit classname ("tests.unit.test_pop", "README.md")."""
    if classname.startswith(INTEROP_PREFIX):
        return "interop"
    for tier in ("unit", "component", "system", "examples"):
        if classname.startswith(f"tests.{tier}."):
            return tier
    return "docs"


def file_of(classname: str, root: Path = ROOT) -> str | None:
    """The file, relative to `root`, of a JUnit classname: "tests.unit.test_pop" and
    "tests.unit.test_pop.TestX" -> tests/unit/test_pop.py, "docs.operations.md" ->
    docs/operations.md; None when no such file exists."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        module = "/".join(parts[:end]) + ".py"
        document = "/".join(parts[: end - 1]) + "." + parts[end - 1] if end > 1 else ""
        for name in (module, document):
            if name and (root / name).is_file():
                return name
    return None


#: Where make test starts a file that has no seconds in tests/durations.json: after those
#: that have, slowest tier first (README.md and docs/ are short, like the unit files).
SLOWEST_TIERS_FIRST = ("tests/examples/", "tests/system/", "tests/component/", "tests/unit/")


def read_durations(path: Path = DURATIONS) -> dict[str, float]:
    """tests/durations.json: each test file's seconds, by its path from the root."""
    durations: dict[str, float] = json.loads(path.read_text()) if path.exists() else {}
    return durations


def start_order(paths: list[str], durations: dict[str, float]) -> dict[str, tuple[float, int]]:
    """Each file's sort key for tests/conftest.py (`paths` from the root): its seconds in
    `durations`, longest first, then its tier, slowest first."""

    def tier(path: str) -> int:
        ranks = [r for r, t in enumerate(SLOWEST_TIERS_FIRST) if path.startswith(t)]
        return ranks[0] if ranks else len(SLOWEST_TIERS_FIRST) - 1

    return {p: (-durations.get(p, 0.0), tier(p)) for p in paths}


def tier_of_path(path: str) -> str:
    """The tier of a test file by its path from the root (as tier_of for classnames)."""
    return tier_of(path.removesuffix(".py").replace("/", "."))


def read_cpu(directory: Path) -> dict[str, float]:
    """Each test file's CPU seconds, summed over the files the pytest processes wrote."""
    per_file: dict[str, float] = defaultdict(float)
    for written in sorted(directory.glob("cpu-*.json")):
        for path, seconds in json.loads(written.read_text()).items():
            per_file[path] += seconds
    return dict(per_file)


def merged_durations(
    old: dict[str, float], measured: dict[str, float], root: Path = ROOT
) -> dict[str, float]:
    """`old` with the files of `measured` replaced and the files gone from `root` dropped,
    sorted by name, in tenths of a second."""
    merged = {f: s for f, s in old.items() if (root / f).is_file()}
    merged.update(measured)
    return {f: round(merged[f], 1) for f in sorted(merged)}


def timed(command: list[str]) -> tuple[float, int]:
    """Run `command` in the project; its wall seconds and exit code."""
    start = time.monotonic()
    code = subprocess.call(command, cwd=ROOT)
    return time.monotonic() - start, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowest", type=int, default=25, help="slowest tests to list")
    parser.add_argument("--skip-checks", action="store_true", help="time pytest only")
    parser.add_argument(
        "--update-durations", action="store_true", help=f"write each file's seconds to {DURATIONS}"
    )
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
    with tempfile.TemporaryDirectory() as cpu_dir:
        os.environ[CPU_DIR_ENV] = cpu_dir
        wall, code = timed(command)
        cpu = read_cpu(Path(cpu_dir))
    cpu_per_tier: dict[str, float] = defaultdict(float)
    for name, seconds in cpu.items():
        cpu_per_tier[tier_of_path(name)] += seconds
    per_tier: dict[str, list[float]] = defaultdict(list)
    tests: list[tuple[float, str]] = []
    per_file: dict[str, float] = defaultdict(float)
    for case in ET.parse(report).getroot().iter("testcase"):
        seconds = float(case.get("time", "0"))
        classname = case.get("classname", "")
        per_tier[tier_of(classname)].append(seconds)
        tests.append((seconds, f"{classname}::{case.get('name', '')}"))
        if (path := file_of(classname)) is not None:
            per_file[path] += seconds
    total = sum(map(sum, per_tier.values())) or 1.0
    print("\n| step | wall s |\n|---|---|")
    for check, seconds in checks.items():
        print(f"| make {check} | {seconds:.1f} |")
    print(f"| pytest | {wall:.1f} |")
    print("\n| tier | tests | test s | share | CPU s |\n|---|---|---|---|---|")
    for tier in TIERS:
        times = per_tier.get(tier, [])
        print(
            f"| {tier} | {len(times)} | {sum(times):.1f} | {sum(times) / total:.0%} "
            f"| {cpu_per_tier.get(tier, 0.0):.1f} |"
        )
    print(f"\nCPU: {sum(cpu.values()):.1f} s in all; {args.slowest} busiest files:")
    for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[: args.slowest]:
        print(f"  {seconds:7.1f}  {name}")
    print(f"\n{args.slowest} slowest:")
    for seconds, name in sorted(tests, reverse=True)[: args.slowest]:
        print(f"  {seconds:7.1f}  {name}")
    (build / "test-times.json").write_text(
        json.dumps(
            {
                "checks": checks,
                "pytest_wall_seconds": wall,
                "tiers": {
                    t: {"tests": len(v), "seconds": sum(v), "cpu_seconds": cpu_per_tier.get(t, 0.0)}
                    for t, v in per_tier.items()
                },
                "cpu_seconds_per_file": {f: round(s, 1) for f, s in sorted(cpu.items())},
                "slowest": [[s, n] for s, n in sorted(tests, reverse=True)[: args.slowest]],
            },
            indent=1,
        )
    )
    if args.update_durations and per_file:
        merged = merged_durations(read_durations(), per_file)
        DURATIONS.write_text(json.dumps(merged, indent=1) + "\n")
        print(f"{len(per_file)} files' seconds written to {DURATIONS.relative_to(ROOT)}")
    return code


if __name__ == "__main__":
    sys.exit(main())
