"""Online backup: a copy written while sends go on, restored into a new broker."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import Message, MessageQueue, Producer, SendStatus
from sdk._transport.broker_client import BrokerClient, GroupInfo
from sdk.cli import cli
from sdk.errors import InvalidArgumentError
from tests.component.pulling import read_queue

T = TypeVar("T")
TOPIC, QUEUES, GROUP = "orders", 4, "billing"


def call(broker: EmbeddedBroker, body: Callable[[BrokerClient], Awaitable[T]]) -> T:
    async def main() -> T:
        client = BrokerClient(broker.address)
        try:
            return await body(client)
        finally:
            await client.close()

    return asyncio.run(main())


def backup(broker: EmbeddedBroker, directory: Path | str) -> dict[str, Any]:
    return call(broker, lambda c: c.admin("Backup", directory=str(directory)))


def queue(q: int) -> MessageQueue:
    return MessageQueue(TOPIC, "broker-a", q)


def bodies(address: str, q: int) -> list[bytes]:
    return [m.body for m in read_queue(address, queue(q))]


class Sender(threading.Thread):
    """Sends until stopped, noting each acknowledged send (queue id, offset, body)."""

    def __init__(self, producer: Producer) -> None:
        super().__init__(daemon=True)
        self.producer = producer
        self.acked: list[tuple[int, int, bytes]] = []
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                body = f"live-{n}".encode()
                r = self.producer.send(Message(TOPIC, body, sharding_key=f"order-{n % 13}"))
                assert r.status is SendStatus.SEND_OK
                self.acked.append((r.queue.queue_id, r.queue_offset, body))
                n += 1
        except BaseException as exc:  # reported by the test
            self.failure = exc


@pytest.mark.parametrize("flush_mode", ["async", "sync"])
def test_a_backup_taken_during_sends_restores_every_message_acknowledged_before_it(
    tmp_path: Path, flush_mode: str
) -> None:
    copy = tmp_path / "copy"
    config = BrokerConfig(data_dir=tmp_path / "live", flush_mode=flush_mode, segment_bytes=1 << 20)
    with EmbeddedBroker(config) as live, Producer(live.address) as producer:
        call(live, lambda c: c.create_topic(TOPIC, QUEUES))
        call(live, lambda c: c.create_topic("audit", 2))
        for i in range(400):  # several commit-log segments
            producer.send(Message(TOPIC, b"before-%d" % i + bytes(4000), sharding_key=f"o{i}"))

        async def commit(c: BrokerClient) -> None:
            await c.heartbeat("c1", [GroupInfo(GROUP, "CONSUME_POLL")])
            await c.commit_offsets(GROUP, "c1", [(queue(0), 7, 0), (queue(3), 2, 0)])

        call(live, commit)
        sender = Sender(producer)
        sender.start()
        try:
            while len(sender.acked) < 50 and sender.failure is None:
                sender.stop.wait(0.01)
            acked_before = list(sender.acked)
            answer = backup(live, copy)
        finally:
            sender.stop.set()
            sender.join()
        assert sender.failure is None, sender.failure
        live_queues = {q: bodies(live.address, q) for q in range(QUEUES)}

    assert answer["directory"] == str(copy.resolve())
    assert int(answer["bytes"]) > 0 and int(answer["commit_log_end"]) > 0
    with EmbeddedBroker(BrokerConfig(data_dir=copy)) as restored:
        restored_queues = {q: bodies(restored.address, q) for q in range(QUEUES)}
        for q, got in restored_queues.items():
            # One moment's cut: each queue of the copy is a prefix of the live queue.
            assert got == live_queues[q][: len(got)], f"queue {q} is not a prefix"
        assert sum(b.startswith(b"before-") for q in restored_queues.values() for b in q) == 400
        for q, offset, body in acked_before:
            assert restored_queues[q][offset] == body
        status = call(restored, lambda c: c.admin("BrokerStatus"))
        assert status["recovered_from_crash"] is False

        async def restored_state(c: BrokerClient) -> tuple[set[str], list[int | None]]:
            listed = await c.admin("ListTopics")
            offsets = [await c.query_offset(GROUP, queue(q)) for q in range(QUEUES)]
            return {t["topic"] for t in listed["topics"]}, offsets

        topics, offsets = call(restored, restored_state)
        assert topics == {TOPIC, "audit"}
        assert offsets == [7, None, None, 2]
        with Producer(restored.address) as again:  # the copy is a working data directory
            assert (
                again.send(Message(TOPIC, b"after", sharding_key="x")).status is SendStatus.SEND_OK
            )


def test_a_bad_backup_directory_is_refused_and_nothing_changes(tmp_path: Path) -> None:
    config = BrokerConfig(data_dir=tmp_path / "live")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_bytes(b"mine")
    a_file = tmp_path / "file"
    a_file.write_bytes(b"x")
    loop = tmp_path / "loop"  # a symbolic link to itself: resolving it never ends
    loop.symlink_to(loop)
    with EmbeddedBroker(config) as live, Producer(live.address) as producer:
        call(live, lambda c: c.create_topic(TOPIC, QUEUES))
        producer.send(Message(TOPIC, b"one", sharding_key="a"))
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        refusals = {
            "relative/dir": ("INVALID_ARGUMENT", "is not an absolute path"),
            str(config.data_dir / "inside"): ("INVALID_ARGUMENT", "inside the broker's data"),
            str(config.data_dir): ("INVALID_ARGUMENT", "inside the broker's data"),
            str(full): ("FAILED_PRECONDITION", "exists and is not empty"),
            str(a_file): ("FAILED_PRECONDITION", "is not a directory"),
            str(tmp_path / "no" / "parent"): ("FAILED_PRECONDITION", "does not exist"),
            "": ("INVALID_ARGUMENT", "the backup directory is empty"),
            str(tmp_path / "nul\x00byte"): ("INVALID_ARGUMENT", "NUL character"),
            str(tmp_path / ("x" * 300)): ("INVALID_ARGUMENT", "File name too long"),
            str(loop / "copy"): ("FAILED_PRECONDITION", "cannot be used"),
        }
        for directory, (code, words) in refusals.items():
            with pytest.raises(InvalidArgumentError) as refused:
                backup(live, directory)
            assert refused.value.code == code, directory
            assert words in str(refused.value), directory
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        assert (full / "keep.txt").read_bytes() == b"mine"
        assert [b for q in range(QUEUES) for b in bodies(live.address, q)] == [b"one"]


def test_the_cli_writes_a_backup_into_an_empty_directory_and_says_what_it_copied(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "live")) as live:
        with Producer(live.address) as producer:
            call(live, lambda c: c.create_topic(TOPIC, 1))
            for i in range(3):
                producer.send(Message(TOPIC, b"m%d" % i))
        runner = CliRunner()
        shown = runner.invoke(cli, ["--broker", live.address, "broker", "backup", str(empty)])
        assert shown.exit_code == 0, shown.output
        assert f"backup written to {empty.resolve()} on the broker's machine" in shown.output
        assert "3 messages" in shown.output
        again = runner.invoke(
            cli, ["--broker", live.address, "--json", "broker", "backup", str(tmp_path / "j")]
        )
        assert again.exit_code == 0, again.output
        assert json.loads(again.output)["messages"] == 3
    with EmbeddedBroker(BrokerConfig(data_dir=empty)) as restored:
        assert [m.body for m in read_queue(restored.address, queue(0))] == [b"m0", b"m1", b"m2"]
