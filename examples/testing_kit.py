"""Testing your own listener with sdk.testing: a pytest module, as an application has one.

What it shows: an application's handler (here: account balances kept per account, each
message a deposit) tested under what production does to it: the broker restarting in
the middle, a handler that fails now and then, keys of one queue run side by side
(ProcessingOrder.KEY). sdk.testing gives the in-process broker (TestBroker), a listener
that records what was handled (OrderRecorder) and the check that every account's
messages were handled in the order they were sent, none lost (assert_handled_in_order).

Run it:  python -m pytest -q examples/testing_kit.py
"""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from sdk import (
    ConsumeFromWhere,
    Message,
    MessageExt,
    ProcessingOrder,
    Producer,
    PushConsumer,
    PushConsumerConfig,
)
from sdk.testing import OrderRecorder, TestBroker, assert_handled_in_order

ACCOUNTS = [f"account-{i}" for i in range(6)]
#: Quick retries and offset commits: a test should not wait a second per retry.
CONFIG = PushConsumerConfig(suspend_current_queue_time=0.05, persist_interval=0.1)


class Balances:
    """The application's handler: a deposit per message, a balance per account."""

    def __init__(self) -> None:
        self.balance: dict[str, int] = defaultdict(int)
        self.history: dict[str, list[int]] = defaultdict(list)
        self.lock = threading.Lock()

    def handle(self, message: MessageExt) -> None:
        account, amount = message.sharding_key or "", int(message.body.split(b":")[1])
        with self.lock:
            self.balance[account] += amount
            self.history[account].append(amount)


def send_deposits(address: str, rounds: range) -> dict[str | None, list[bytes]]:
    """One deposit per account per round (body "round:amount"); what was sent, per key."""
    sent: dict[str | None, list[bytes]] = defaultdict(list)
    with Producer(address) as producer:
        for r in rounds:
            for account in ACCOUNTS:
                body = f"{r}:{r + 1}".encode()
                producer.send(Message("deposits", body, sharding_key=account))
                sent[account].append(body)
    return sent


def consumer(address: str, recorder: OrderRecorder) -> PushConsumer:
    c = PushConsumer("balances", address, config=CONFIG, ordering=ProcessingOrder.KEY,
                     consume_from_where=ConsumeFromWhere.FIRST_OFFSET)  # fmt: skip
    c.subscribe("deposits")
    c.register_message_listener(recorder)
    return c


@pytest.fixture
def broker() -> TestBroker:
    with TestBroker(default_queues=2) as b:  # 6 accounts share 2 queues
        yield b  # type: ignore[misc]


def test_every_account_in_order_through_a_broker_restart(broker: TestBroker) -> None:
    app = Balances()
    recorder = OrderRecorder(app.handle)
    with consumer(broker.address, recorder):
        sent = send_deposits(broker.address, range(10))
        recorder.wait_for(60)
        broker.restart()  # same address and data; the consumer reconnects by itself
        for account, bodies in send_deposits(broker.address, range(10, 20)).items():
            sent[account] += bodies
        recorder.wait_for(120)
    # A restart may repeat what was handled after the last offset commit: at least once.
    assert_handled_in_order(sent, recorder, max_duplicates=len(ACCOUNTS) * 20)


def test_a_failing_handler_is_retried_before_the_account_moves_on(broker: TestBroker) -> None:
    app = Balances()
    failures = {"account-3": 1}  # the first try of account-3's round 5 fails

    def flaky(message: MessageExt) -> None:
        key = message.sharding_key
        if key in failures and message.body.startswith(b"5:") and failures.pop(key):
            raise ConnectionError("the database went away")
        app.handle(message)

    recorder = OrderRecorder(flaky)
    with consumer(broker.address, recorder):
        sent = send_deposits(broker.address, range(10))
        recorder.wait_for(60)
    assert_handled_in_order(sent, recorder)
    assert app.history["account-3"] == list(range(1, 11)), "retried in its place"
    assert all(app.balance[a] == sum(range(1, 11)) for a in ACCOUNTS)
