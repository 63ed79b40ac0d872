import asyncio
import logging
import os
from pathlib import Path

import pytest

from mockbroker.acl import Acl, AclWatcher, load_acl_file
from sdk.testing import FakeClock

FIRST = """\
accounts:
  - accessKey: producer1
    secretKey: firstsecret
    defaultTopicPerm: PUB
"""
SECOND = """\
accounts:
  - accessKey: producer2
    secretKey: secondsecret
    defaultTopicPerm: SUB
  - accessKey: producer3
    secretKey: thirdsecret
"""
BAD = """\
accounts:
  - accessKey: producer2
    secretKey: badsecret
    defaultTopicPerm: WRITE
"""


def write(path: Path, text: str, tick: int) -> None:
    path.write_text(text)
    # A distinct mtime even on file systems with coarse timestamps.
    stamp = 1_700_000_000_000_000_000 + tick * 1_000_000_000
    os.utime(path, ns=(stamp, stamp))


@pytest.fixture
def acl_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain_acl.yml"
    write(path, FIRST, 0)
    return path


def test_unchanged_file_is_not_reread(acl_file: Path) -> None:
    acl = Acl(load_acl_file(acl_file))
    watcher = AclWatcher(acl, acl_file, FakeClock())
    assert not watcher.poll()


def test_good_to_good_swaps_the_rules(acl_file: Path) -> None:
    acl = Acl(load_acl_file(acl_file))
    watcher = AclWatcher(acl, acl_file, FakeClock())
    write(acl_file, SECOND, 1)
    assert watcher.poll()
    assert set(acl.rules.accounts) == {"producer2", "producer3"}
    assert acl.secret_of("producer2") == "secondsecret"


def test_good_to_bad_keeps_the_old_rules_and_logs_one_line(
    acl_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    acl = Acl(load_acl_file(acl_file))
    old = acl.rules
    watcher = AclWatcher(acl, acl_file, FakeClock())
    write(acl_file, BAD, 1)
    with caplog.at_level(logging.WARNING, logger="mockbroker.acl.watcher"):
        assert not watcher.poll()
        assert not watcher.poll()  # the same bad file is reported once
    assert acl.rules is old
    assert len(caplog.records) == 1
    line = caplog.records[0].getMessage()
    assert f"{acl_file}:4:" in line and "WRITE" in line
    assert "\n" not in line and "badsecret" not in line
    write(acl_file, SECOND, 2)
    assert watcher.poll()
    assert "producer2" in acl.rules.accounts


def test_a_deleted_file_keeps_the_old_rules(acl_file: Path) -> None:
    acl = Acl(load_acl_file(acl_file))
    old = acl.rules
    watcher = AclWatcher(acl, acl_file, FakeClock())
    acl_file.unlink()
    assert not watcher.poll()
    assert acl.rules is old


def test_the_period_must_be_positive(acl_file: Path) -> None:
    with pytest.raises(ValueError, match="polling period must be positive, not 0"):
        AclWatcher(Acl(load_acl_file(acl_file)), acl_file, FakeClock(), period=0)


def test_run_polls_on_the_clock(acl_file: Path) -> None:
    asyncio.run(run_polls_on_the_clock(acl_file))


async def run_polls_on_the_clock(acl_file: Path) -> None:
    clock = FakeClock()
    acl = Acl(load_acl_file(acl_file))
    watcher = AclWatcher(acl, acl_file, clock, period=10.0)
    task = asyncio.create_task(watcher.run())
    try:
        await asyncio.sleep(0)
        write(acl_file, SECOND, 1)
        clock.advance(9.0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert "producer1" in acl.rules.accounts
        clock.advance(1.0)
        for _ in range(5):
            await asyncio.sleep(0)
        assert "producer2" in acl.rules.accounts
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
