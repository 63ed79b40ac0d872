"""Failures: concurrent retries through the retry topic, orderly ones to the DLQ.

What it shows: a concurrent listener that answers RECONSUME_LATER gets the message again
later (the broker's retry topic, with a delay level; here level 1 = 1 s), with its
reconsume count raised. An orderly listener that keeps failing a message sends it to
the group's dead-letter queue after `max_reconsume_times`, and its queue moves on.
`ordermq dlq list GROUP` / `ordermq dlq resend GROUP` handle dead letters.

Run it:  python examples/retry_and_dlq.py
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeFromWhere,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    LitePullConsumer,
    Message,
    MessageExt,
    MessageListenerConcurrently,
    MessageListenerOrderly,
    MessageQueue,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)


class FailsOnce(MessageListenerConcurrently):
    def __init__(self) -> None:
        self.done = threading.Event()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus:
        m = msgs[0]
        print(f"  concurrent: {m.body.decode()} try {m.reconsume_times + 1}")
        if m.reconsume_times == 0:
            context.delay_level_when_next_consume = 1  # retry in 1 s
            return ConsumeConcurrentlyStatus.RECONSUME_LATER
        self.done.set()
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS


class RejectsPoison(MessageListenerOrderly):
    def __init__(self) -> None:
        self.after_poison = threading.Event()

    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus:
        m = msgs[0]
        print(f"  orderly: {m.body.decode()}")
        if m.body == b"poison":
            context.suspend_current_queue_time = 0.05
            return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
        if m.body == b"after poison":
            self.after_poison.set()
        return ConsumeOrderlyStatus.SUCCESS


def run_consumer(address: str, group: str, listener: object, **kw: object) -> PushConsumer:
    consumer = PushConsumer(group, address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET,
                            **kw)  # type: ignore[arg-type]  # fmt: skip
    consumer.subscribe("jobs")
    consumer.register_message_listener(listener)  # type: ignore[arg-type]
    consumer.start()
    return consumer


def main() -> int:
    with (
        tempfile.TemporaryDirectory(prefix="ordermq-retry-") as tmp,
        EmbeddedBroker(BrokerConfig(data_dir=Path(tmp))) as broker,
        Producer(broker.address) as producer,
    ):
        producer.send_batch([Message("jobs", b, sharding_key="same-queue")
                             for b in (b"poison", b"after poison")])  # fmt: skip
        print("concurrent group 'mailer':")
        flaky = FailsOnce()
        mailer = run_consumer(broker.address, "mailer", flaky)
        retried = flaky.done.wait(15)
        mailer.shutdown()

        print("orderly group 'ledger' (max 3 tries):")
        strict = RejectsPoison()
        config = PushConsumerConfig(max_reconsume_times=3)
        ledger = run_consumer(broker.address, "ledger", strict, config=config)
        moved_on = strict.after_poison.wait(15)
        ledger.shutdown()

        dlq = LitePullConsumer("dlq-reader", broker.address,
                               consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
        dlq.assign([MessageQueue("%DLQ%ledger", "broker-a", 0)])
        with dlq:
            deadline = time.monotonic() + 5
            dead: list[MessageExt] = []
            while not dead and time.monotonic() < deadline:
                dead = dlq.poll(timeout=0.5)
        print("dead letters of 'ledger':", [(m.body.decode(), m.reconsume_times) for m in dead])
    ok = retried and moved_on and [m.body for m in dead] == [b"poison"]
    print("result:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
