"""bench/run.py's backlog group (make bench-backlog) on a small backlog: a file of its own,
as it takes about 40 s, so that the other examples run on the other worker meanwhile."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.example


def test_bench_backlog_group_recovers_and_reads_back_the_whole_backlog(tmp_path: Path) -> None:
    out = tmp_path / "backlog.json"
    # A 10 s pause between the two parts instead of make bench-backlog's 30 s: the deleting
    # broker still has 5 s, and nothing checked here depends on the pause's length.
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "--only", "backlog",
         "--backlog-messages", "16000", "--backlog-pause", "10", "--quiet",
         "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    figures = {f["key"]: f for f in report["figures"]}
    stored = figures["backlog.fill"]["runs"][0]["units"]
    assert stored == 16000
    assert figures["backlog.read"]["runs"][0]["units"] == stored  # every message came back
    assert figures["backlog.recovery"]["median"] > 0
    for key in ("broker.rss.bigbacklog.fill", "broker.rss.bigbacklog"):
        assert 10 < figures[key]["median"] < 1000, figures[key]
    assert report["facts"]["backlog_disk_bytes"] > stored * 100
