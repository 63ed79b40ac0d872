"""`ordermq broker backup` against a broker process under sends; a broker started on the copy."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sdk import Message, MessageQueue, Producer, SendStatus
from tests.component.pulling import read_queue
from tests.support import ROOT, BrokerProcess

pytestmark = pytest.mark.system

TOPIC, QUEUES = "orders", 8


def test_a_backup_under_sends_restores_in_a_new_broker_process(tmp_path: Path) -> None:
    live = BrokerProcess(tmp_path / "live", "--flush-mode", "sync")
    address = live.start()
    acked: dict[tuple[int, int], bytes] = {}
    stop = threading.Event()
    failures: list[BaseException] = []

    def send() -> None:
        n = 0
        try:
            with Producer(address) as producer:
                while not stop.is_set():
                    body = b"m%d" % n
                    r = producer.send(Message(TOPIC, body, sharding_key=f"order-{n % 29}"))
                    assert r.status is SendStatus.SEND_OK
                    acked[(r.queue.queue_id, r.queue_offset)] = body
                    n += 1
        except BaseException as exc:  # reported by the test
            failures.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        while len(acked) < 100 and not failures:
            stop.wait(0.01)
        before = dict(acked)
        copy = tmp_path / "copy"
        cli = subprocess.run(
            [sys.executable, "-m", "sdk.cli", "--broker", address, "--json", "broker", "backup",
             str(copy)],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        stop.set()
        sender.join()
        live.kill9()  # the copy stands on its own
    assert not failures, failures
    assert cli.returncode == 0, cli.stderr
    answer = json.loads(cli.stdout)
    assert answer["directory"] == str(copy.resolve())

    restored = BrokerProcess(copy)
    address = restored.start()
    try:
        copied = {
            q: [m.body for m in read_queue(address, MessageQueue(TOPIC, "broker-a", q))]
            for q in range(QUEUES)
        }
    finally:
        assert restored.terminate() == 0, restored.stderr()
    for (q, offset), body in before.items():
        assert copied[q][offset] == body
    for q, bodies in copied.items():  # nothing but acknowledged sends, each at its offset
        assert all(acked.get((q, offset)) == body for offset, body in enumerate(bodies))
    assert sum(len(b) for b in copied.values()) == answer["messages"]
