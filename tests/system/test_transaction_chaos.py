"""Transactions through kill -9 of the broker and of a producer mid-transaction (issue 41).

An order-service process (tests/system/transaction_worker.py) places orders with
sdk.TransactionProducer: each order's row goes to a SQLite database in the local
transaction, some commit, some answer UNKNOWN (left to the check-back), some roll back.
In the middle of one order's local transaction (its row written, not committed) the broker
and the producer are killed with SIGKILL together, with that transaction and the UNKNOWN
ones of the last seconds pending. The broker restarts on its data; a second order-service
process of the group answers the check-backs. Then every message is delivered exactly
when its local transaction committed: the messages the consumer got are the rows of the
database, and each at one queue offset only (committed once).
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageExt,
    MessageListenerOrderly,
    PushConsumer,
)
from tests.support import ROOT, LineReader, wait_until
from tests.system.conftest import StartBroker

pytestmark = [pytest.mark.system, pytest.mark.chaos]

ORDERS = 40
HANG_AT = 31
CHECK_AFTER = 3.0  # --transaction-timeout-seconds: the UNKNOWNs of the last 3 s are pending


class Shipping(MessageListenerOrderly):
    """Records (order id, queue offset) of every message delivered."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.seen.extend((m.keys[0], m.queue_offset) for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS

    def orders(self) -> set[str]:
        with self.lock:
            return {key for key, _ in self.seen}


def worker(address: str, db: Path, *args: str) -> subprocess.Popen[str]:
    script = ROOT / "tests" / "system" / "transaction_worker.py"
    return subprocess.Popen(
        [sys.executable, str(script), "--broker", address, "--db", str(db), *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def rows(db: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        return {r[0] for r in conn.execute("SELECT id FROM orders")}


def pending(metrics: str) -> float:
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    [line] = [x for x in text.splitlines() if x.startswith("ordermq_transactions_pending ")]
    return float(line.split()[1])


def test_each_message_is_delivered_exactly_when_its_local_transaction_committed(
    tmp_path: Path, start_broker: StartBroker
) -> None:
    db = tmp_path / "orders.db"
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("CREATE TABLE orders (id TEXT PRIMARY KEY)")
    broker = start_broker(
        tmp_path / "data",
        "--transaction-timeout-seconds", str(CHECK_AFTER),
        "--transaction-check-seconds", "1",
        "--metrics-port", "0",
    )  # fmt: skip
    shipping = Shipping()
    consumer = PushConsumer(
        "shipping", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    consumer.subscribe("chaos-orders")
    consumer.register_message_listener(shipping)
    first = worker(broker.address, db, "--orders", str(ORDERS), "--hang-at", str(HANG_AT))
    second: subprocess.Popen[str] | None = None
    try:
        consumer.start()
        assert first.stdout is not None
        placed = LineReader(first.stdout.fileno())
        assert placed.find(f"hanging in o-{HANG_AT}", 60), first.stderr
        broker.kill9()
        first.kill()
        first.wait()
        broker.restart()
        second = worker(broker.address, db)
        wait_until(lambda: pending(broker.fronts["metrics"]) == 0, 60, "no transaction pending")
        written = rows(db)
        wait_until(lambda: shipping.orders() >= written, 30, "every written order delivered")
    finally:
        consumer.shutdown()
        if second is not None:
            second.terminate()
            checked, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    # the test did what it says: the hung order and some UNKNOWNs were pending at the kill
    assert f"checked o-{HANG_AT} ROLLBACK_MESSAGE" in checked, checked
    assert any(
        line.startswith("checked ") and line.endswith("COMMIT_MESSAGE")
        for line in checked.splitlines()
    ), checked
    # each message delivered exactly when its local transaction committed, committed once
    assert shipping.orders() == written
    offsets: dict[str, set[int]] = {}
    for key, offset in shipping.seen:
        offsets.setdefault(key, set()).add(offset)
    assert all(len(o) == 1 for o in offsets.values()), offsets
    expected = {f"o-{i}" for i in range(HANG_AT) if i % 3 != 2}
    assert written == expected
