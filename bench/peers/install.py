"""Bringing in what a peer needs: its server (a Debian package) and its Python client (PyPI).

Each check is cheap when the thing is already there. A package that cannot be had makes
`ensure` return a reason, and run.py skips that peer with it instead of failing everything.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Needs:
    """What one peer needs: Debian packages (by the binary each provides) and pip packages.

    `debs` maps a package name to the path or command name of the executable it provides;
    `pips` maps a pip requirement to the module it makes importable. `optional_pips` are
    installed when they can be, and their absence only costs speed (e.g. hiredis).
    """

    debs: dict[str, str]
    pips: dict[str, str]
    optional_pips: dict[str, str]


_apt_updated = False


def _log(message: str) -> None:
    print(f"[peers] {message}", file=sys.stderr, flush=True)


def have_executable(name: str) -> bool:
    if os.path.isabs(name):
        return os.access(name, os.X_OK)
    return shutil.which(name) is not None


def _apt_candidate(package: str) -> str | None:
    """The version apt would install, or None when apt knows no such package."""
    try:
        out = subprocess.run(
            ["apt-cache", "policy", package], capture_output=True, text=True, check=False
        ).stdout
    except FileNotFoundError:
        return None
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("Candidate:"):
            version = line.split(":", 1)[1].strip()
            return None if version in ("", "(none)") else version
    return None


def _apt_update() -> None:
    global _apt_updated
    if _apt_updated:
        return
    _apt_updated = True
    _log("apt-get update (once)")
    subprocess.run(["apt-get", "update"], stdout=subprocess.DEVNULL, check=False)


def ensure_deb(package: str, executable: str) -> str | None:
    """Install `package` unless `executable` is already there; a reason when it can't be."""
    if have_executable(executable):
        return None
    if shutil.which("apt-get") is None:
        return f"{executable} is missing and there is no apt-get to install {package}"
    if os.geteuid() != 0:
        return f"{executable} is missing and installing {package} needs root"
    version = _apt_candidate(package)
    if version is None:
        _apt_update()
        version = _apt_candidate(package)
    if version is None:
        return f"apt knows no installable {package}"
    _log(f"apt-get install {package} ({version})")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    done = subprocess.run(
        ["apt-get", "install", "-y", "--no-install-recommends", package],
        env=env,
        stdout=subprocess.DEVNULL,
        check=False,
    )
    if done.returncode != 0 or not have_executable(executable):
        return f"apt-get install {package} failed (exit {done.returncode})"
    return None


def have_module(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def ensure_pip(requirement: str, module: str) -> str | None:
    """pip-install `requirement` into this interpreter unless `module` imports already."""
    if have_module(module):
        return None
    pip = [sys.executable, "-m", "pip"]
    with tempfile.TemporaryDirectory(prefix="peers-pip-") as scratch:
        probe = subprocess.run(
            [*pip, "download", "--quiet", "--no-deps", "-d", scratch, requirement],
            capture_output=True,
            text=True,
            check=False,
        )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no reason given"])[-1]
        return f"pip cannot get {requirement}: {why}"
    _log(f"pip install {requirement}")
    done = subprocess.run([*pip, "install", "--quiet", requirement], check=False)
    importlib.invalidate_caches()
    if done.returncode != 0 or not have_module(module):
        return f"pip install {requirement} failed (exit {done.returncode})"
    return None


def ensure(needs: Needs) -> tuple[str | None, list[str]]:
    """Install what `needs` lists; (why the peer cannot run or None, notes)."""
    notes: list[str] = []
    for package, executable in needs.debs.items():
        reason = ensure_deb(package, executable)
        if reason:
            return reason, notes
    for requirement, module in needs.pips.items():
        reason = ensure_pip(requirement, module)
        if reason:
            return reason, notes
    for requirement, module in needs.optional_pips.items():
        reason = ensure_pip(requirement, module)
        if reason:
            notes.append(f"{reason} (optional; running without it)")
    return None, notes
