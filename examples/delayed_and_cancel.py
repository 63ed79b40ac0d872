"""Delayed messages, and cancelling one before it is due.

What it shows: `delay_seconds=` / `deliver_at=` hold a message back on the broker; the
SendResult's msg_id cancels it. The broker keeps scheduled messages in its commit log, so
they survive a restart; they reach their key's queue when due, never earlier.

Run it:  python examples/delayed_and_cancel.py
(It waits about 2 seconds for the reminders to fall due.)
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import ConsumeFromWhere, LitePullConsumer, Message, Producer


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-delay-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp))) as broker,
        Producer(broker.address) as producer,
    ):
        sent_at = time.time()
        keep = producer.send(Message("reminders", b"pay invoice 7", sharding_key="acct-1",
                                     delay_seconds=1.5))  # fmt: skip
        drop = producer.send(Message("reminders", b"pay invoice 8", sharding_key="acct-1",
                                     delay_seconds=1.5))  # fmt: skip
        print(f"scheduled {keep.msg_id} and {drop.msg_id} for +1.5 s")
        print("cancel the second:", "cancelled" if producer.cancel(drop.msg_id) else "too late")

        reader = LitePullConsumer("reminder-reader", broker.address,
                                  consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        reader.subscribe("reminders")
        got = []
        with reader:
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got += reader.poll(timeout=0.5)
        late = [m.store_timestamp / 1000 - sent_at for m in got]
        print("delivered:", [m.body.decode() for m in got],
              "after", [f"{s:.1f}s" for s in late])  # fmt: skip
        print(
            "second cancel says:",
            "cancelled" if producer.cancel(keep.msg_id) else "already delivered",
        )
    due_ms = int((sent_at + 1.5) * 1000)  # the broker keeps whole milliseconds
    ok = [m.body for m in got] == [b"pay invoice 7"] and all(
        m.store_timestamp >= due_ms for m in got
    )
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
