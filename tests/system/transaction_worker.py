"""An order-service process of the transaction chaos test (test_transaction_chaos.py).

    python tests/system/transaction_worker.py --broker HOST:PORT --db FILE [--orders N]
        [--hang-at K]

Places orders 0..N-1 with sdk.TransactionProducer (group "chaos-orders"), each message's
keys its order id "o-<i>". The local transaction of order i writes the row "o-<i>" to the
SQLite database FILE:
- i % 3 == 0: writes and commits the row, answers COMMIT_MESSAGE;
- i % 3 == 1: writes and commits the row, answers UNKNOWN (the check-back commits it);
- i % 3 == 2: writes no row, answers ROLLBACK_MESSAGE;
- i == K: begins the row's database transaction, prints "hanging in o-<K>" and waits
  there for ever (the test kills it: the row is never committed).
Prints "placed o-<i> <state>" per order. Check-backs answer COMMIT_MESSAGE when the row
exists, else ROLLBACK_MESSAGE, and print "checked o-<i> <state>". After its orders it
answers check-backs until SIGTERM, then exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import threading
from pathlib import Path

from sdk import (
    LocalTransactionState,
    Message,
    MessageExt,
    TransactionProducer,
    wait_for_shutdown_signal,
)

GROUP = "chaos-orders"
TOPIC = "chaos-orders"


class Orders:
    """The listener: the order rows in SQLite."""

    def __init__(self, db: Path, hang_at: int | None) -> None:
        self.db = db
        self.hang_at = hang_at

    def execute_local_transaction(self, msg: Message, arg: int) -> LocalTransactionState:
        order_id = f"o-{arg}"
        with contextlib.closing(sqlite3.connect(self.db, timeout=30)) as db:
            if arg == self.hang_at:
                db.execute("BEGIN")
                db.execute("INSERT INTO orders (id) VALUES (?)", (order_id,))
                print(f"hanging in {order_id}", flush=True)
                threading.Event().wait()
            if arg % 3 == 2:
                return LocalTransactionState.ROLLBACK_MESSAGE
            with db:
                db.execute("INSERT INTO orders (id) VALUES (?)", (order_id,))
        if arg % 3 == 1:
            return LocalTransactionState.UNKNOWN
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        order_id = msg.keys[0]
        with contextlib.closing(sqlite3.connect(self.db, timeout=30)) as db:
            row = db.execute("SELECT 1 FROM orders WHERE id = ?", (order_id,)).fetchone()
        state = (
            LocalTransactionState.COMMIT_MESSAGE
            if row is not None
            else LocalTransactionState.ROLLBACK_MESSAGE
        )
        print(f"checked {order_id} {state.name}", flush=True)
        return state


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--broker", required=True)
    parser.add_argument("--db", required=True, type=Path)
    parser.add_argument("--orders", type=int, default=0)
    parser.add_argument("--hang-at", type=int)
    args = parser.parse_args()
    with TransactionProducer(args.broker, Orders(args.db, args.hang_at), group=GROUP) as p:
        print("started", flush=True)
        for i in range(args.orders):
            message = Message(TOPIC, f"order {i}".encode(), keys=f"o-{i}", sharding_key=f"o-{i}")
            state = p.send_message_in_transaction(message, arg=i).local_transaction_state
            print(f"placed o-{i} {state.name}", flush=True)
        wait_for_shutdown_signal()


if __name__ == "__main__":
    main()
