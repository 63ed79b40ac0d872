"""`make test-pythons`: the unit tier on every other Python ordermq supports, if installed.

pyproject.toml says Python 3.11+, and `make test` runs everything on the `python3` that
made `.venv`. asyncio changes between versions in ways only a run shows (from 3.12,
gather() over finished tasks returns without letting the loop run: Producer.shutdown()
spun for ever there, while 3.11 passed every test). So each version of VERSIONS other
than this one, found on PATH (`python3.12`, ...) or installed by pyenv, gets a virtualenv
of its own, `.venv-3.12`, installed like `.venv` (again when pyproject.toml or
sdk/_speedups.c changes), and runs `tests/unit`. A version that is not installed is named
and skipped: the command does not fail for it. `make test` runs it beside the tests.

    python tools/other_pythons.py                 # 3.12 and 3.13
    python tools/other_pythons.py 3.13 -- -x -k producer   # one version, pytest arguments
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The versions besides the one `.venv` has, newest last.
VERSIONS = ("3.12", "3.13")
#: What a virtualenv's install depends on (the Makefile's $(STAMP) rule).
INSTALL_INPUTS = (ROOT / "pyproject.toml", ROOT / "sdk" / "_speedups.c")


def installed(version: str) -> Path | None:
    """`.venv-<version>` set up to run the tests; None when that Python is not installed
    or cannot make a virtualenv (a distribution's Python without its venv module).

    CalledProcessError when the project does not install there: that is a finding.
    """
    interpreter = _interpreter(version)
    if interpreter is None:
        return None
    venv = ROOT / f".venv-{version}"
    python = venv / "bin" / "python"
    stamp = venv / ".installed"
    newest = max(p.stat().st_mtime for p in INSTALL_INPUTS)
    if stamp.exists() and stamp.stat().st_mtime >= newest:
        return python
    if not python.exists():
        made = subprocess.run([interpreter, "-m", "venv", str(venv)], capture_output=True)
        if made.returncode:
            print(f"{interpreter}: no virtualenv ({made.stderr.decode().strip()[-200:]})")
            shutil.rmtree(venv, ignore_errors=True)
            return None
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "-e", ".[dev]"], check=True, cwd=ROOT
    )
    stamp.touch()
    return python


def _interpreter(version: str) -> str | None:
    """`python<version>` on PATH, or else one pyenv installed; None if neither runs."""
    found = shutil.which(f"python{version}")
    candidates = [found] if found else []
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates += sorted(str(p) for p in pyenv.glob(f"{version}.*/bin/python{version}"))
    return next((c for c in candidates if _runs(c, version)), None)


def _runs(interpreter: str, version: str) -> bool:
    """Whether `interpreter` is that version (a pyenv shim of one not selected is not)."""
    probe = subprocess.run(
        [interpreter, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
    )
    return probe.returncode == 0 and probe.stdout.strip() == version


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("versions", nargs="*", default=list(VERSIONS), help="e.g. 3.12 3.13")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = ap.parse_args(argv[:split]), argv[split + 1 :]
    failed = []
    mine = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for version in args.versions:
        if version == mine:
            print(f"python{version}: the tests' own Python, skipped")
            continue
        python = installed(version)
        if python is None:
            print(f"python{version}: not installed (or no venv), skipped")
            continue
        # Its output at the end, in one piece: make test prints the suite's beside it.
        run = subprocess.run(
            [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit",
             *pytest_args],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        lines = run.stdout.strip().splitlines()
        if run.returncode:
            failed.append(version)
            print(run.stdout, run.stderr, sep="\n")
        print(f"python{version}, tests/unit: {lines[-1] if lines else run.stderr.strip()}")
    if failed:
        print(f"tests/unit failed on Python {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
