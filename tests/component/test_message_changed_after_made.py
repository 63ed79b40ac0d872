"""A Message changed after it was made, then sent, over each transport.

A Message checks its fields and encodes its properties when it is made. Properties given
again afterwards (a new mapping) are checked and encoded again, and stored as given; a
field set to a bad value afterwards is named when the send encodes it, as the
constructor would have named it, and nothing is stored.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sdk import (
    ConsumeFromWhere,
    LitePullConsumer,
    LocalTransactionState,
    Message,
    MessageExt,
    Producer,
    TransactionProducer,
)
from sdk.errors import OrderMQError
from tests.component.transports import TRANSPORTS, BrokerOver, broker_over

TOPIC = "orders"


@pytest.fixture(params=TRANSPORTS)
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BrokerOver]:
    with broker_over(request.param, tmp_path / "data") as b:
        yield b


def stored(broker: BrokerOver, expected: int) -> list[MessageExt]:
    """The messages of TOPIC from the start: `expected` of them, and any more that came."""
    reader = LitePullConsumer(
        "readers", broker.address, consume_from_where=ConsumeFromWhere.FIRST_OFFSET
    )
    reader.subscribe(TOPIC)
    with reader:
        found: list[MessageExt] = []
        deadline = time.monotonic() + 10
        while len(found) < expected and time.monotonic() < deadline:
            found += reader.poll(timeout=0.2)
        return found + reader.poll(timeout=0.2)


def test_properties_given_again_after_the_message_was_made_are_stored(
    broker: BrokerOver,
) -> None:
    # Changed in place they were kept in the dict but not in the encoding a send carries:
    # over gRPC the message was stored without them, and nothing said so.
    m = Message(TOPIC, b"x", properties={"order": "1"}, sharding_key="k")
    m.properties = {**m.properties, "trace": "abc"}
    with Producer(broker.address) as producer:
        producer.send(m)
        producer.send_batch([m])
    found = stored(broker, 2)
    assert len(found) == 2
    assert all(
        {"order": "1", "trace": "abc"}.items() <= dict(f.properties).items() for f in found
    ), [f.properties for f in found]


class Committing:
    """A transaction listener whose local transactions all commit."""

    def execute_local_transaction(self, msg: Message, arg: Any) -> LocalTransactionState:
        """Commit."""
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, msg: MessageExt) -> LocalTransactionState:
        """Commit."""
        return LocalTransactionState.COMMIT_MESSAGE


#: A field set after the message was made, and how the error names it.
BAD_FIELDS = [
    ("sharding_key", 5, "sharding.key"),
    ("sharding_key", b"k", "sharding.key"),
    ("tags", 5, "tags must be a str"),
    ("keys", (1,), "key must be a str"),
    ("body", "text", "body must be bytes"),
    ("body", b"", "body is empty"),
    ("delay_seconds", math.nan, "delay"),
    ("delay_seconds", math.inf, "delay"),
    ("deliver_at", "soon", "deliver_at|delivery time|delayed"),
    ("topic", "bad topic", "topic"),
]


@pytest.mark.parametrize(("field", "value", "says"), BAD_FIELDS)
def test_a_field_set_to_a_bad_value_after_the_message_was_made_is_named_when_sent(
    broker: BrokerOver, field: str, value: object, says: str
) -> None:
    # Most raised AttributeError, ValueError or OverflowError from inside the encoding.
    def bad() -> Message:
        m = Message(TOPIC, b"x", sharding_key="k")
        setattr(m, field, value)
        return m

    # A batch stores or refuses each queue's messages whole: a good message of another
    # topic than the changed one's would be stored.
    good_of_its_topic = [] if field == "topic" else [Message(TOPIC, b"good", sharding_key="k")]
    with (
        Producer(broker.address) as producer,
        TransactionProducer(broker.address, Committing(), group="txn-senders") as transactions,
    ):
        sends: list[Callable[[], object]] = [
            lambda: producer.send(bad()),
            lambda: producer.send(bad(), timeout=5),
            lambda: producer.send_batch([*good_of_its_topic, bad()]),
            lambda: producer.send_async(bad()).result(timeout=10),
            lambda: transactions.send_message_in_transaction(bad()),
        ]
        for send in sends:
            with pytest.raises(OrderMQError, match=says):
                send()
        producer.send(Message(TOPIC, b"after", sharding_key="k"))
    assert [f.body for f in stored(broker, 1)] == [b"after"], "nothing of the refused sends"
