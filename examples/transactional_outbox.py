"""An order row and its "order created" message, both or neither: sdk.TransactionProducer.

What it shows: the order service of seed 004 writes each order to its database (SQLite
here) and publishes it for the shipping service. A plain send after the database commit
loses the message when the service dies between the two; a send before it publishes
orders that never were. A transactional message does neither: the message is stored as a
half message that no consumer sees, the order row is written in a local database
transaction, and then the message is committed (the row was written) or rolled back (it
was not). Then, in turn:

- an order that breaks a database constraint (amount 0, or an id taken) is rolled back:
  no row, no message;
- an order-service process dies (os._exit) after its database commit, before telling the
  broker: the broker checks back with a live producer of the group, which finds the row
  and commits the message;
- another dies before its database commit: the check-back finds no row and rolls the
  message back.

The shipping consumer then has seen exactly the orders whose rows exist, each once.

Run it:  python examples/transactional_outbox.py
(It starts its own broker, checking back 1 s after a half message (6 s by default);
it takes about 5 seconds.) Exit status 0, and "result: OK", when every check held.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    LocalTransactionState,
    Message,
    MessageExt,
    MessageListenerOrderly,
    PushConsumer,
    TransactionProducer,
)

TOPIC = "orders"
GROUP = "order-service"
CHECK_AFTER = 1.0  # the broker's --transaction-timeout-seconds, short for the example
SCHEMA = "CREATE TABLE orders (id TEXT PRIMARY KEY, amount INTEGER NOT NULL CHECK (amount > 0))"


class OrderService:
    """The TransactionListener: writes the order row; answers the broker's check-backs."""

    def __init__(self, db: Path, die: str | None = None) -> None:
        self.db = db
        self.die = die  # "after-commit" or "before-commit": this process dies there
        self.checked: dict[str, str] = {}

    def execute_local_transaction(
        self, msg: Message, arg: tuple[str, int]
    ) -> LocalTransactionState:
        order_id, amount = arg
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            try:
                with db:  # one database transaction: committed at the end of the block
                    db.execute("INSERT INTO orders (id, amount) VALUES (?, ?)", (order_id, amount))
                    if self.die == "before-commit":
                        os._exit(3)  # the row is never committed
            except sqlite3.IntegrityError as exc:
                print(f"order {order_id} refused by the database ({exc}): rolled back")
                return LocalTransactionState.ROLLBACK_MESSAGE
        if self.die == "after-commit":
            os._exit(3)  # the row is committed, the broker never hears of it
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        order_id = msg.keys[0]
        with contextlib.closing(sqlite3.connect(self.db)) as db:
            row = db.execute("SELECT 1 FROM orders WHERE id = ?", (order_id,)).fetchone()
        state = (
            LocalTransactionState.COMMIT_MESSAGE
            if row is not None
            else LocalTransactionState.ROLLBACK_MESSAGE
        )
        self.checked[order_id] = state.name
        print(f"checked back {order_id}: {state.name}")
        return state


def place(producer: TransactionProducer, order_id: str, amount: int) -> str:
    """Send the order's message in a transaction with its row; the outcome's name."""
    body = f'{{"order": "{order_id}", "amount": {amount}}}'.encode()
    message = Message(TOPIC, body, keys=order_id, sharding_key=order_id)
    result = producer.send_message_in_transaction(message, arg=(order_id, amount))
    return result.local_transaction_state.name


def dying_service(address: str, db: Path, order_id: str, where: str) -> None:
    """Another order-service process, which dies in the middle of one order."""
    with TransactionProducer(address, OrderService(db, die=where), group=GROUP) as producer:
        place(producer, order_id, 40)
    raise SystemExit("not reached: the process dies in its local transaction")


class Shipping(MessageListenerOrderly):
    """The shipping service's listener: notes the order id of every message it gets."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        with self.lock:
            self.seen.extend(m.keys[0] for m in msgs)
        return ConsumeOrderlyStatus.SUCCESS


def main() -> int:
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="ordermq-outbox-") as tmp:
        db = Path(tmp) / "orders.db"
        with contextlib.closing(sqlite3.connect(db)) as conn, conn:
            conn.execute(SCHEMA)
        config = BrokerConfig(
            data_dir=Path(tmp) / "broker",
            transaction_timeout_seconds=CHECK_AFTER,
            transaction_check_seconds=CHECK_AFTER,
        )
        with EmbeddedBroker(config) as broker:
            shipping = Shipping()
            consumer = PushConsumer(
                "shipping", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
            )
            consumer.subscribe(TOPIC)
            consumer.register_message_listener(shipping)
            service = OrderService(db)
            with (
                consumer,
                TransactionProducer(broker.address, service, group=GROUP) as producer,
            ):
                outcomes = {
                    "o-1": place(producer, "o-1", 30),
                    "o-2": place(producer, "o-2", 0),  # breaks the amount constraint
                }
                outcomes["o-1 again"] = place(producer, "o-1", 35)  # the id is taken
                print("placed:", outcomes)
                checks["a written order commits, refused ones roll back"] = outcomes == {
                    "o-1": "COMMIT_MESSAGE",
                    "o-2": "ROLLBACK_MESSAGE",
                    "o-1 again": "ROLLBACK_MESSAGE",
                }
                for order_id, where in (("o-3", "after-commit"), ("o-4", "before-commit")):
                    code = subprocess.run(
                        [sys.executable, __file__, "--die", where, "--broker", broker.address,
                         "--db", str(db), "--order", order_id],
                        timeout=60,
                    ).returncode  # fmt: skip
                    print(f"order service died {where.replace('-', ' ')} of {order_id}"
                          f" (exit status {code})")  # fmt: skip
                    checks[f"the service died {where}"] = code == 3
                # Settled: no transaction pending at the broker, and the shipping service
                # has been handed every message the topic holds (so none can come later).
                state = broker.broker.state
                assert state is not None

                def stored() -> int:
                    topic = state.store.topics.find(TOPIC)
                    if topic is None:
                        return 0
                    queues = range(topic.queue_count)
                    return sum(state.store.queue(topic, q).max_offset for q in queues)

                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and (
                    state.transactions.pending or len(shipping.seen) < max(2, stored())
                ):
                    time.sleep(0.05)
            with contextlib.closing(sqlite3.connect(db)) as conn:
                rows = sorted(r[0] for r in conn.execute("SELECT id FROM orders"))
        print("rows in the database:", rows)
        print("orders the shipping service got:", sorted(shipping.seen))
        checks["check-back committed o-3, rolled back o-4"] = service.checked == {
            "o-3": "COMMIT_MESSAGE",
            "o-4": "ROLLBACK_MESSAGE",
        }
        checks["shipped exactly the orders written, once each"] = (
            sorted(shipping.seen) == rows == ["o-1", "o-3"]
        )
    for name, ok in checks.items():
        print(f"{'ok ' if ok else 'FAILED'} {name}")
    ok = all(checks.values())
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--die", choices=["after-commit", "before-commit"])
    parser.add_argument("--broker")
    parser.add_argument("--db", type=Path)
    parser.add_argument("--order")
    args = parser.parse_args()
    if args.die:
        dying_service(args.broker, args.db, args.order, args.die)
    sys.exit(main())
