"""The tests' own helpers (tests/support.py) that other tests' verdicts rest on."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support import ephemeral_ports, stable_ports, written_lines


def test_written_lines_leave_out_a_line_still_being_written(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    assert written_lines(log) == []
    log.write_text("got job-1 1\ndone job-1 1\ng")
    assert written_lines(log) == ["got job-1 1", "done job-1 1"]
    with log.open("a") as f:
        f.write("ot job-2 1\n")
    assert written_lines(log)[-1] == "got job-2 1"


def test_stable_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    ports = stable_ports(5)
    assert len(set(ports)) == 5
    assert all(port < ephemeral_ports().start for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
