"""Power cuts over transactional messages (issue 41): both or neither, whatever the cut.

An order-service thread sends transactional messages with sdk.TransactionProducer under
sync flush while the power goes at a random moment (tests/system/powerloss.py: only what
was fsynced survives, or by mode some of the rest); the next broker starts on what the cut
left. Each message's local transaction follows a fixed rule of its number i: commit
(i % 3 == 0), roll back (i % 3 == 1), or answer UNKNOWN and leave it to the check-back,
which commits when i is even and rolls back when it is odd; the check-back answers by the
same rule, so every transaction has one right outcome whatever the cuts did to its END.

After the last cut a broker without tracing serves a producer of the group, which answers
the check-backs of what the cuts left pending, until none is pending. Then:
- every message delivered is one whose rule commits, and each is stored once (a cut
  between a commit and its outcome record must not commit it twice);
- every message whose half was stored (its local transaction ran) and whose rule commits
  is delivered: a half message acknowledged is durable, and so is an answered END;
- every broker recovered without logging an error.
"""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from sdk import LocalTransactionState, Message, MessageExt, TransactionProducer
from sdk.errors import OrderMQError
from tests.chaos_report import ChaosRecorder, scaled
from tests.support import BrokerProcess, wait_until
from tests.system.powerloss import PowerGrid
from tests.system.test_crash_recovery import SEED, TOPIC, read_topic
from tests.system.test_power_loss import check_clean, context
from tools.powerloss.model import MODES

pytestmark = [pytest.mark.system, pytest.mark.chaos]

StartBroker = Callable[..., BrokerProcess]
ROUNDS = scaled(4, 20)
PER_ROUND = 60
#: Local transactions a round waits for before the random countdown to its cut.
MIN_PER_ROUND = 15
GROUP = "orders-powerloss"
SLOW_DISK_MS = 3.0
PATIENCE = 90.0
BROKER_ARGS = (
    "--flush-mode", "sync", "--transaction-timeout-seconds", "1",
    "--transaction-check-seconds", "1", "--metrics-port", "0",
)  # fmt: skip


def commits(i: int) -> bool:
    """The right outcome of transaction i: committed (else rolled back)."""
    return i % 3 == 0 or (i % 3 == 2 and i % 2 == 0)


class Orders:
    """The listener: the rule above; notes every local transaction that ran."""

    def __init__(self) -> None:
        self.ran: set[int] = set()
        self.lock = threading.Lock()

    def execute_local_transaction(self, msg: Message, arg: int) -> LocalTransactionState:
        with self.lock:
            self.ran.add(arg)
        if arg % 3 == 2:
            return LocalTransactionState.UNKNOWN
        return self._rule(arg)

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        return self._rule(int(msg.body.split(b"-")[1]))

    @staticmethod
    def _rule(i: int) -> LocalTransactionState:
        return (
            LocalTransactionState.COMMIT_MESSAGE
            if commits(i)
            else LocalTransactionState.ROLLBACK_MESSAGE
        )


def pending(broker: BrokerProcess) -> float:
    url = f"http://{broker.fronts['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=PATIENCE) as response:
        text = response.read().decode()
    [line] = [x for x in text.splitlines() if x.startswith("ordermq_transactions_pending ")]
    return float(line.split()[1])


def send_then_cut(
    grid: PowerGrid, broker: BrokerProcess, orders: Orders, rng: random.Random, round_no: int
) -> None:
    """Send the round's transactions until the power goes, somewhere in the middle."""
    stop = threading.Event()
    failures: list[BaseException] = []
    first = round_no * PER_ROUND
    ran_before = len(orders.ran)

    def send() -> None:
        try:
            with TransactionProducer(broker.address, orders, group=GROUP) as producer:
                for i in range(first, first + PER_ROUND):
                    if stop.is_set():
                        return
                    message = Message(TOPIC, b"txn-%d" % i, keys=f"t{i}", sharding_key=f"k{i % 8}")
                    producer.send_message_in_transaction(message, arg=i)
        except OrderMQError:
            return  # the power went: the broker is gone
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=send, name="transactions", daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(orders.ran) >= ran_before + MIN_PER_ROUND, PATIENCE,
                   "the round's first local transactions")  # fmt: skip
        time.sleep(rng.uniform(0.05, 0.3))  # the chaos: the power goes mid-sending
        grid.cut(broker, MODES[round_no % len(MODES)], rng)
    finally:
        stop.set()
        thread.join(PATIENCE)
    assert not thread.is_alive(), "the sender is stuck"
    assert not failures, f"the sender failed: {failures[0]!r}"


def test_each_transaction_ends_as_its_local_transaction_did_through_power_cuts(
    tmp_path: Path, start_broker: StartBroker, chaos_report: ChaosRecorder
) -> None:
    grid = PowerGrid(tmp_path, sync_delay_ms=SLOW_DISK_MS)
    rng = random.Random(SEED + 41)
    orders = Orders()
    for round_no in range(ROUNDS + 1):
        last = round_no == ROUNDS
        broker = start_broker(grid.data, *BROKER_ARGS, env=None if last else grid.arm())
        try:
            check_clean(broker)
            if not last:
                send_then_cut(grid, broker, orders, rng, round_no)
        except AssertionError as exc:
            raise context(round_no, broker)(exc) from exc
    with TransactionProducer(broker.address, orders, group=GROUP):  # answers the check-backs
        wait_until(lambda: pending(broker) == 0, PATIENCE, "no transaction pending")
    queues, _ = read_topic(broker.address)
    stored = [int(m.body.split(b"-")[1]) for c in queues.values() for m in c.messages]
    check_clean(broker)
    assert broker.terminate() == 0, broker.stderr()
    wrong = sorted(i for i in stored if not commits(i))
    assert not wrong, f"rolled-back transactions delivered: {wrong[:10]}"
    twice = sorted({i for i in stored if stored.count(i) > 1})
    assert not twice, f"transactions committed twice: {twice[:10]}"
    missing = sorted(i for i in orders.ran if commits(i) and i not in stored)
    assert not missing, f"committed transactions lost: {missing[:10]}"
    assert len(orders.ran) >= ROUNDS * MIN_PER_ROUND
    print(f"\ntransaction power cuts: {len(orders.ran)} local transactions ran, "
          f"{len(stored)} messages committed and stored")  # fmt: skip
    chaos_report.record(
        fault="power cut, transactional messages (sync)",
        rounds=ROUNDS,
        acked=len(orders.ran),
        lost=0,
        order_violations=0,
        duplicates=0,
        note=f"{len(stored)} committed, 0 rolled back delivered, 0 committed twice",
    )
