"""Commit-log reads from worker threads (message queries) while retention deletes.

QUERY_MESSAGE, CONSUMER_SEND_MSG_BACK and the admin service's lookups read the commit log
in threads; retention closes segment files meanwhile. The test stops a read at the worst
moment and runs retention there. (The message index needs no such care: its files only
grow, or lose whole entries to a failed batch's roll-back, and a scan reads whole entries
of what is there.)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from mockbroker.store import commitlog as commitlog_module
from mockbroker.store.commitlog import CommitLog

SEGMENT = 4096


def test_a_read_in_a_thread_finishes_before_retention_closes_its_segment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = CommitLog(tmp_path / "commitlog", SEGMENT)
    log.open()
    first = log.append(b"a" * 3000)
    second = log.append(b"b" * 3000)  # rolls: the first record's segment can be deleted
    reading, deleted = threading.Event(), threading.Event()
    real_pread: Callable[[int, int, int], bytes] = os.pread

    def paused_pread(fd: int, size: int, offset: int) -> bytes:
        if threading.current_thread().name == "reader":
            reading.set()
            deleted.wait(0.5)  # retention runs now, if nothing holds it back
        return real_pread(fd, size, offset)

    monkeypatch.setattr(commitlog_module.os, "pread", paused_pread)
    got: list[bytes | BaseException] = []

    def read() -> None:
        try:
            got.append(log.read(first, 3000))
        except BaseException as exc:
            got.append(exc)

    reader = threading.Thread(target=read, name="reader")
    reader.start()
    assert reading.wait(30)
    deleter = threading.Thread(target=lambda: (log.delete_below(second), deleted.set()))
    deleter.start()
    reader.join(30)
    deleter.join(30)
    monkeypatch.undo()
    assert got == [b"a" * 3000]
    assert log.start == second, "deleted once the read was done"
    log.close()
