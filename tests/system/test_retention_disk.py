"""Retention and a full disk in a broker process: refused sends, resumed sends, kill -9.

The disk is simulated (`--disk-usage-file`): the test sets how much else uses it, the
broker's own files count on top, so deleted segments free simulated space.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from sdk._transport.broker_client import BrokerClient, GroupInfo, PullStatus
from sdk._wire import encode_frame
from sdk.errors import BrokerUnavailableError
from sdk.message import MessageExt, MessageQueue
from tests.support import BrokerProcess, wait_until

pytestmark = [pytest.mark.system, pytest.mark.chaos]

TOTAL = 64 << 20
BODY = 20_000
QUEUE = MessageQueue("t", "broker-a", 0)


def set_disk(path: Path, other_used: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"total_bytes": TOTAL, "other_used_bytes": other_used}))
    os.replace(tmp, path)


def body(i: int) -> bytes:
    return i.to_bytes(4, "big") * (BODY // 4)


async def send(client: BrokerClient, first: int, n: int) -> dict[int, bytes]:
    """Send messages first..first+n-1 one by one; their acknowledged offsets."""
    acked: dict[int, bytes] = {}
    for i in range(first, first + n):
        frame = encode_frame(msg_id=os.urandom(16), born_timestamp_ms=1, body=body(i))
        appended = await client.send("t", 0, frame)
        acked[appended.first_offset] = body(i)
    return acked


async def read_all(client: BrokerClient) -> tuple[int, list[MessageExt]]:
    """The queue's min offset and every message from it to the end."""
    first = await client.pull("check", QUEUE, 0, max_messages=1)
    offset = first.next_offset if first.status is PullStatus.OFFSET_ILLEGAL else 0
    minimum = offset
    out: list[MessageExt] = []
    while True:
        got = await client.pull("check", QUEUE, offset, max_messages=200)
        if got.status is not PullStatus.FOUND:
            return minimum, out
        out += got.messages
        offset = got.next_offset


def check_kept(acked: dict[int, bytes], minimum: int, read: list[MessageExt]) -> None:
    """Every acknowledged message at or after the minimum is there, byte for byte."""
    assert [m.queue_offset for m in read] == list(range(minimum, minimum + len(read)))
    by_offset = {m.queue_offset: m.body for m in read}
    lost = [o for o in acked if o >= minimum and by_offset.get(o) != acked[o]]
    assert not lost, f"acknowledged messages lost or changed at offsets {lost[:10]}"


def start(tmp_path: Path, *args: str) -> BrokerProcess:
    broker = BrokerProcess(
        tmp_path / "data", "--flush-mode", "sync", "--segment-bytes", str(1 << 20), *args
    )
    broker.start()
    return broker


def test_a_full_disk_refuses_sends_keeps_reads_and_commits_and_sends_resume_once_freed(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk.json"
    set_disk(disk, 0)
    broker = start(tmp_path, "--disk-usage-file", str(disk), "--disk-check-seconds", "0.1")

    async def scenario() -> None:
        client = BrokerClient(broker.address)
        try:
            await client.admin("CreateTopic", topic="t", queue_count=1)
            acked = await send(client, 0, 200)  # about 4 MB: 4 segments
            set_disk(disk, int(TOTAL * 0.95))  # something else fills the disk

            async def refused() -> bool:
                try:
                    acked.update(await send(client, len(acked), 1))
                except BrokerUnavailableError as exc:
                    assert exc.reason == "DISK_FULL" and exc.retriable, exc
                    return True
                return False

            for _ in range(200):
                if await refused():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("sends were never refused")
            status = await client.admin("BrokerStatus")
            assert status["sends_refused"] and status["disk_used_ratio"] > 0.9

            minimum, read = await read_all(client)  # reads still work
            check_kept(acked, minimum, read)
            await client.heartbeat("c1", [GroupInfo("g", "CONSUME_ORDERLY")])
            locked = await client.lock_batch("g", "c1", [QUEUE])  # locks still work
            await client.commit_offsets("g", "c1", [(QUEUE, read[-1].queue_offset + 1,
                                                     locked[QUEUE])])  # fmt: skip
            assert await client.query_offset("g", QUEUE) == read[-1].queue_offset + 1

            set_disk(disk, 0)  # space freed: sends resume by themselves
            for _ in range(200):
                if not await refused():
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("sends never resumed")
            acked.update(await send(client, len(acked), 20))
            minimum, read = await read_all(client)
            check_kept(acked, minimum, read)
            assert read[-1].queue_offset == max(acked)
        finally:
            await client.close()

    try:
        asyncio.run(scenario())
    finally:
        assert broker.terminate() == 0, broker.stderr()


@pytest.mark.parametrize("point", ["retention-floor-written", "retention-unlinked-one"])
def test_kill_9_in_the_middle_of_a_deletion_recovers_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    # Retention of about 2 s of the broker's real clock: the first segments go soon after
    # they are written, and the broker dies at `point` of that deletion.
    monkeypatch.setenv("ORDERMQ_FAULT_POINT", point)
    broker = start(tmp_path, "--retention-hours", "0.0005", "--disk-check-seconds", "0.1")
    acked: dict[int, bytes] = {}

    async def fill() -> None:
        client = BrokerClient(broker.address)
        try:
            await client.admin("CreateTopic", topic="t", queue_count=1)
            acked.update(await send(client, 0, 200))
        except BrokerUnavailableError:
            pass  # it may die at the deletion point while we send
        finally:
            await client.close()

    asyncio.run(fill())
    assert broker.proc is not None
    wait_until(lambda: broker.proc is not None and broker.proc.poll() is not None, 60,
               "the broker to die at the deletion point")  # fmt: skip
    assert broker.proc.returncode == -9
    monkeypatch.delenv("ORDERMQ_FAULT_POINT")
    after = start(tmp_path, "--retention-hours", "1000")

    async def check() -> None:
        client = BrokerClient(after.address)
        try:
            minimum, read = await read_all(client)
            assert minimum > 0, "the deletion's new floor holds"
            check_kept(acked, minimum, read)
            more = await send(client, 1000, 5)
            assert min(more) == (read[-1].queue_offset + 1 if read else minimum)
            status = await client.admin("BrokerStatus")
            assert status["corrupt_records_detected"] == 0
        finally:
            await client.close()

    try:
        asyncio.run(check())
        segments = sorted(int(p.name) for p in (tmp_path / "data" / "commitlog").iterdir()
                          if p.name.isdigit())  # fmt: skip
        floor = int.from_bytes((tmp_path / "data" / "commitlog" / "floor").read_bytes()[:8],
                               "little")  # fmt: skip
        assert segments[0] == floor, "no segment below the floor is left behind"
    finally:
        assert after.terminate() == 0, after.stderr()
