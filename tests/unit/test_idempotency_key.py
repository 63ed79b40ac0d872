"""Message(idempotency_key=...): the public way to set a broker dedup key (docs/dedup.md)."""

from __future__ import annotations

import pytest

from sdk import Message
from sdk.errors import InvalidMessageError


def test_the_key_is_kept_as_the_idempotency_key_property() -> None:
    m = Message("orders", b"x", idempotency_key="order-7", properties={"a": "b"})
    assert m.idempotency_key == "order-7"
    assert m.properties == {"a": "b", "IDEMPOTENCY_KEY": "order-7"}
    assert Message("orders", b"x").idempotency_key is None
    assert Message("orders", b"x", idempotency_key="ключ-" + "é" * 123).idempotency_key


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ("", "is empty"),
        ("k" * 129, "129 characters, over the limit of 128"),
        ("a\ud800", "not UTF-8"),
        ("a\x01b", "control characters"),
        (7, "must be a str"),
    ],
)
def test_a_bad_key_is_refused_naming_the_field(key: object, words: str) -> None:
    with pytest.raises(InvalidMessageError, match="idempotency_key") as caught:
        Message("orders", b"x", idempotency_key=key)  # type: ignore[arg-type]
    assert words in str(caught.value)


def test_a_key_that_differs_from_the_property_is_refused() -> None:
    with pytest.raises(InvalidMessageError, match="differs from the IDEMPOTENCY_KEY property"):
        Message("orders", b"x", idempotency_key="a", properties={"IDEMPOTENCY_KEY": "b"})
    same = Message("orders", b"x", idempotency_key="a", properties={"IDEMPOTENCY_KEY": "a"})
    assert same.idempotency_key == "a"
