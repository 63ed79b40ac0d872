"""The tests' own helpers (tests/support.py) that other tests' verdicts rest on."""

from __future__ import annotations

from pathlib import Path

from tests.support import written_lines


def test_written_lines_leave_out_a_line_still_being_written(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    assert written_lines(log) == []
    log.write_text("got job-1 1\ndone job-1 1\ng")
    assert written_lines(log) == ["got job-1 1", "done job-1 1"]
    with log.open("a") as f:
        f.write("ot job-2 1\n")
    assert written_lines(log)[-1] == "got job-2 1"
