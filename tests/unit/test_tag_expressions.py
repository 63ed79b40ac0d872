"""Subscription tag expressions: "TagA || TagB" (spaces or not), or refused at subscribe().

RocketMQ's FilterAPI splits at "||" and trims each tag, so "TagA | TagB" or "TagA,TagB"
become one tag no message carries, and the subscription silently matches nothing; ordermq
refuses them with InvalidTagExpressionError when subscribe() is called, before anything
is sent (the broker refuses them too: test_validation_matrix).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import sdk.aio
from sdk import LitePullConsumer, OrderMQError, PushConsumer, SimpleConsumer
from sdk._validation import split_tag_expression
from sdk.errors import InvalidTagExpressionError

#: Nothing listens there: a consumer that sent anything would fail differently.
NOWHERE = "127.0.0.1:1"

FACES: list[Callable[[], Any]] = [
    lambda: PushConsumer("g", NOWHERE),
    lambda: LitePullConsumer("g", NOWHERE),
    lambda: sdk.aio.PushConsumer("g", NOWHERE),
    lambda: sdk.aio.LitePullConsumer("g", NOWHERE),
]


@pytest.mark.parametrize(
    ("expression", "tags"),
    [
        ("*", None),
        ("", None),
        ("  *  ", None),
        ("TagA", ["TagA"]),
        ("TagA || TagB", ["TagA", "TagB"]),
        ("TagA||TagB", ["TagA", "TagB"]),
        ("  TagA  ||TagB ", ["TagA", "TagB"]),
        ("Tag A || Tag-B_2", ["Tag A", "Tag-B_2"]),
    ],
)
def test_valid_expressions_name_their_tags(expression: str, tags: list[str] | None) -> None:
    assert split_tag_expression(expression) == tags


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("TagA | TagB", "the tag 'TagA | TagB' contains '|'"),
        ("TagA|TagB", "contains '|'"),
        ("TagA,TagB", "the tag 'TagA,TagB' contains ','"),
        ("TagA, TagB", "contains ','"),
        ("TagA ||", "the tag '' is empty"),
        ("|| TagB", "is empty"),
        ("TagA || || TagB", "is empty"),
        ("TagA|||TagB", "the tag '|TagB' contains '|'"),
        ("TagA || *", "contains '*'"),
        ("Tag*", "contains '*'"),
        ("TagA || B\ud800", "is not UTF-8 text: it holds a lone surrogate at index 1"),
    ],
)
@pytest.mark.parametrize("face", range(len(FACES)))
def test_subscribe_refuses_what_is_not_an_expression(expression: str, why: str, face: int) -> None:
    consumer = FACES[face]()
    with pytest.raises(InvalidTagExpressionError, match="must be '\\*' or tags joined by") as info:
        consumer.subscribe("orders", expression)
    assert why in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, OrderMQError)
    consumer.subscribe("orders", "TagA || TagB")  # the refusal changed nothing


@pytest.mark.parametrize(
    "make",
    [*FACES, lambda: SimpleConsumer("g", NOWHERE), lambda: sdk.aio.SimpleConsumer("g", NOWHERE)],
)
@pytest.mark.parametrize("expression", [["TagA", "TagB"], None, 5])
def test_a_non_string_expression_is_refused(make: Callable[[], Any], expression: object) -> None:
    """The SimpleConsumer raised AttributeError ('NoneType' object has no attribute 'strip')."""
    with pytest.raises(InvalidTagExpressionError, match="a tag expression is a str, not"):
        make().subscribe("orders", expression)
