"""sdk.testing's order checks: what order_problems finds in what recorders handled."""

from __future__ import annotations

import pytest

from sdk import ConsumeOrderlyContext, MessageExt, MessageQueue
from sdk.testing import OrderRecorder, assert_handled_in_order, order_problems

Q = MessageQueue("t", "b", 0)
SENT: dict[str | None, list[bytes]] = {"a": [b"a0", b"a1", b"a2"], "b": [b"b0", b"b1"]}


def handle(recorder: OrderRecorder, *bodies: bytes) -> None:
    """The recorder handles one call per body, in the order given."""
    for offset, body in enumerate(bodies):
        key = body[:1].decode()
        m = MessageExt("t", body, None, (), {}, key, f"{offset:032X}", Q, offset, 0, 0, 0)
        recorder.consume_message([m], ConsumeOrderlyContext(Q, 1.0))


def test_everything_in_order_once_has_no_problem() -> None:
    r = OrderRecorder()
    handle(r, b"a0", b"b0", b"a1", b"b1", b"a2")
    assert order_problems(SENT, r) == []
    assert_handled_in_order(SENT, r)


def test_a_later_message_before_an_earlier_one_is_an_order_problem() -> None:
    r = OrderRecorder()
    handle(r, b"a0", b"a2", b"a1", b"b0", b"b1")
    assert order_problems(SENT, r, max_duplicates=1) == [
        "key 'a': b'a2' was handled before b'a1'"  # and a1, handled after it, counts as again
    ]


def test_lost_unknown_and_repeated_messages_are_problems() -> None:
    r = OrderRecorder()
    handle(r, b"a0", b"a1", b"a0", b"a1", b"a2", b"b0", b"bx")
    assert order_problems(SENT, r) == [
        "handled b'bx' of key 'b', which was not sent",
        "key 'b': 1 never handled, from b'b1'",
        "2 re-deliveries handled again, more than max_duplicates=0",
    ]
    assert order_problems(SENT, r, max_duplicates=2)[-1] == "key 'b': 1 never handled, from b'b1'"


def test_recorders_of_several_consumers_are_checked_together() -> None:
    first, second = OrderRecorder(name="A"), OrderRecorder(name="B")
    handle(first, b"a0", b"b0")
    handle(second, b"a1", b"a2", b"b1")
    assert order_problems(SENT, first, second) == []
    with pytest.raises(AssertionError, match="key 'a': 2 never handled, from b'a1'"):
        assert_handled_in_order(SENT, first)


def test_a_handler_that_raises_records_nothing_and_fails_the_call() -> None:
    def handler(m: MessageExt) -> None:
        raise ConnectionError("down")

    r = OrderRecorder(handler)
    with pytest.raises(ConnectionError):
        handle(r, b"a0")
    assert r.handled == []
    with pytest.raises(AssertionError, match=r"0 of 1 messages handled within 0\.01 s"):
        r.wait_for(1, timeout=0.01)


def test_the_same_body_twice_for_a_key_is_refused() -> None:
    with pytest.raises(ValueError, match="key 'a' has the body b'x' twice"):
        order_problems({"a": [b"x", b"x"]}, OrderRecorder())
