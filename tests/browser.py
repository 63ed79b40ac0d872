"""Headless Chromium for the console's browser tests: Debian's, installed on first use.

`chromium()` returns the browser's path. Where it is missing and this process may install
Debian packages (root, apt-get), it installs `chromium` once per machine (a lock file keeps
two test workers from doing it at once); otherwise the test is skipped, saying why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

#: Flags for a headless Chromium on a machine without a screen or outside network: no
#: sandbox (root), no GPU, no calls home (a closed network refuses them noisily).
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-quic",
]  # fmt: skip
INSTALL_TIMEOUT_SECONDS = 900


def _found() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def chromium() -> str:
    """The path of a Chromium to drive; installs Debian's when it can, else skips."""
    path = _found()
    if path is not None:
        return path
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium), "
                    "and this process cannot install it")  # fmt: skip
    lock = Path(tempfile.gettempdir()) / "ordermq-chromium-install.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        path = _found()  # another worker may have installed it meanwhile
        if path is None:
            env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
            for cmd in (["apt-get", "update", "-q"],
                        ["apt-get", "install", "-y", "-q", "--no-install-recommends",
                         "chromium"]):  # fmt: skip
                done = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                      timeout=INSTALL_TIMEOUT_SECONDS)  # fmt: skip
                if done.returncode != 0:
                    pytest.skip(f"installing Chromium failed ({' '.join(cmd)}): "
                                f"{done.stderr.strip()[-500:]}")  # fmt: skip
            path = _found()
    if path is None:
        pytest.skip("apt-get installed chromium, but no chromium command is on PATH")
    return path
