"""A broker on a real, small file system (a 32 MB tmpfs) that fills up.

Unlike tests/system/test_retention_disk.py the disk is not simulated: the broker's statvfs
probe and real ENOSPC errors decide. Another file on the same file system (the filler)
plays the other program that fills the disk; deleting it frees the space.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.errors import BrokerUnavailableError
from tests.support import BrokerProcess, wait_until
from tests.system.test_retention_disk import QUEUE, check_kept, read_all, send

pytestmark = [pytest.mark.system, pytest.mark.chaos]

SIZE = 32 << 20
CHUNK = 1 << 16


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB tmpfs mounted for the test (skipped where mounting is not permitted)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={SIZE}", "tmpfs", str(mount_point)],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        pytest.skip("no mount command here: a real small file system cannot be made")
    if done.returncode != 0:
        pytest.skip(f"mounting a 32 MB tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def used_ratio(path: Path) -> float:
    """As the broker reckons it (`df`'s Use%)."""
    st = os.statvfs(path)
    used = st.f_blocks - st.f_bfree
    return used / (used + st.f_bavail)


def fill(filler: Path, up_to_ratio: float | None) -> None:
    """Grow `filler` until the disk is `up_to_ratio` used, or (None) until ENOSPC."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while up_to_ratio is None or used_ratio(filler.parent) < up_to_ratio:
            try:
                os.write(fd, b"f" * CHUNK)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                if up_to_ratio is None:
                    return
                raise
    finally:
        os.close(fd)


def start(data_dir: Path, *args: str) -> BrokerProcess:
    broker = BrokerProcess(
        data_dir, "--flush-mode", "sync", "--segment-bytes", str(1 << 20),
        "--disk-check-seconds", "0.1", *args,
    )  # fmt: skip
    broker.start()
    return broker


async def send_until_refused(client: BrokerClient, acked: dict[int, bytes]) -> str:
    """Send one message at a time until the broker answers DISK_FULL (retriable); its why."""
    for _ in range(2000):
        try:
            acked.update(await send(client, len(acked), 1))
        except BrokerUnavailableError as exc:
            assert exc.reason == "DISK_FULL" and exc.retriable, exc
            return str(exc)
    raise AssertionError("sends were never refused")


async def sends_resume(client: BrokerClient, acked: dict[int, bytes]) -> None:
    for _ in range(400):
        try:
            acked.update(await send(client, len(acked), 1))
            return
        except BrokerUnavailableError as exc:
            assert exc.reason == "DISK_FULL", exc
            await asyncio.sleep(0.05)
    raise AssertionError("sends never resumed after the space was freed")


async def reads_and_commits_work(client: BrokerClient, acked: dict[int, bytes]) -> None:
    minimum, read = await read_all(client)
    check_kept(acked, minimum, read)
    assert read and read[-1].queue_offset == max(acked), "every acknowledged message is read"
    await client.heartbeat("c1", [GroupInfo("g", "CONSUME_ORDERLY")])
    locked = await client.lock_batch("g", "c1", [QUEUE])
    after = read[-1].queue_offset + 1
    await client.commit_offsets("g", "c1", [(QUEUE, after, locked[QUEUE])])
    assert await client.query_offset("g", QUEUE) == after


def test_a_real_disk_over_the_limit_refuses_sends_then_resumes_and_survives_kill_9(
    small_disk: Path,
) -> None:
    data_dir, filler = small_disk / "data", small_disk / "filler"
    broker = start(data_dir)
    acked: dict[int, bytes] = {}

    async def until_full() -> None:
        client = BrokerClient(broker.address)
        try:
            await client.admin("CreateTopic", topic="t", queue_count=1)
            acked.update(await send(client, 0, 20))
            fill(filler, 0.85)  # another program takes most of the disk
            refused = await send_until_refused(client, acked)
            status = await client.admin("BrokerStatus")
            # Refused by ENOSPC on a write (sends filled the disk between two disk checks),
            # the status used to give the last check's ratio (0.8945, 0.8962: fresh CI runs
            # 31 and 54); the broker reads the disk again when a write finds it full.
            why = (
                f"{refused!r}; disk now {used_ratio(small_disk):.4f} used; {status}; "
                f"the broker's log ends: {broker.stderr()[-3000:]}"
            )
            assert status["sends_refused"] and status["disk_used_ratio"] >= 0.9, why
            await reads_and_commits_work(client, acked)
        finally:
            await client.close()

    asyncio.run(until_full())
    broker.kill9()  # on the full disk
    broker = start(data_dir)

    async def after_restart() -> None:
        client = BrokerClient(broker.address)
        try:
            await reads_and_commits_work(client, acked)
            # (Whether it refuses sends now depends on how much the deletion of its oldest
            # segments, due over 75 % used, gave back: not asserted.)
            filler.unlink()  # space freed: sends resume by themselves
            await sends_resume(client, acked)
            acked.update(await send(client, len(acked), 20))
            await reads_and_commits_work(client, acked)
            status = await client.admin("BrokerStatus")
            assert status["corrupt_records_detected"] == 0
        finally:
            await client.close()

    try:
        asyncio.run(after_restart())
    finally:
        assert broker.terminate() == 0, broker.stderr()


def test_a_disk_filled_to_the_last_byte_rolls_back_the_cut_batch_and_restarts_clean(
    small_disk: Path,
) -> None:
    # With every ratio at 1.0 only ENOSPC stops the sends: the batch it cuts short fails
    # whole, nothing of it is served, and the broker then refuses sends until space is freed.
    data_dir, filler = small_disk / "data", small_disk / "filler"
    ratios = ("--disk-high-ratio", "1", "--disk-force-ratio", "1", "--disk-refuse-ratio", "1")
    broker = start(data_dir, *ratios)
    acked: dict[int, bytes] = {}

    async def until_full() -> None:
        client = BrokerClient(broker.address)
        try:
            await client.admin("CreateTopic", topic="t", queue_count=1)
            acked.update(await send(client, 0, 20))
            fill(filler, 0.95)
            await send_until_refused(client, acked)
            # Reads work; commits and locks, which write files, may not on a disk this full
            # (the refuse ratio is there to keep room for them).
            minimum, read = await read_all(client)
            check_kept(acked, minimum, read)
            assert read[-1].queue_offset == max(acked), "the cut batch is not served"
        finally:
            await client.close()

    asyncio.run(until_full())
    fill(filler, None)  # and now not a byte is left
    broker.kill9()
    broker = start(data_dir, *ratios)
    # Its first checkpoint cannot be written on the full disk: a lost optimisation (recovery
    # replays from the previous one), not a failed store.
    wait_until(lambda: "No space left on device" in broker.stderr(), 30,
               "the first checkpoint to meet the full disk")  # fmt: skip

    async def after_restart() -> None:
        client = BrokerClient(broker.address)
        try:
            minimum, read = await read_all(client)
            check_kept(acked, minimum, read)
            assert read[-1].queue_offset == max(acked)
            filler.unlink()
            await sends_resume(client, acked)
            acked.update(await send(client, len(acked), 20))
            await reads_and_commits_work(client, acked)
            status = await client.admin("BrokerStatus")
            assert status["corrupt_records_detected"] == 0
        finally:
            await client.close()

    try:
        asyncio.run(after_restart())
    finally:
        assert broker.terminate() == 0, broker.stderr()
