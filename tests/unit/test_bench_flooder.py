"""bench/flooder.py: where a pull flooder reads next, including after retention deleted
the start of its backlog (a send flood filling the disk can cause that in the same run)."""

from __future__ import annotations

import sys

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from tests.support import ROOT

sys.path.insert(0, str(ROOT / "bench"))

import flooder


def answer(status: int, next_offset: int, min_offset: int, max_offset: int) -> pb.PullResponse:
    return pb.PullResponse(
        status=status, next_offset=next_offset, min_offset=min_offset, max_offset=max_offset
    )


def test_a_pull_flooder_reads_on_and_wraps_to_the_oldest_stored_message() -> None:
    assert flooder.next_pull_offset(answer(pb.FOUND, 500, 0, 1000)) == 500
    assert flooder.next_pull_offset(answer(pb.FOUND, 1000, 0, 1000)) == 0  # the end: again
    assert flooder.next_pull_offset(answer(pb.NO_NEW_MESSAGE, 1000, 0, 1000)) == 0


def test_a_pull_flooder_whose_backlog_start_was_deleted_reads_what_is_left() -> None:
    # Offset 0 no longer stored: starting over at 0 read nothing, pull after pull (the
    # full run of 2026-11-28 recorded pull floods of 0 msg/s).
    assert flooder.next_pull_offset(answer(pb.OFFSET_ILLEGAL, 40_000, 40_000, 100_000)) == 40_000
    assert flooder.next_pull_offset(answer(pb.FOUND, 100_000, 40_000, 100_000)) == 40_000
