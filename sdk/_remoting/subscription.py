"""RocketMQ's subscription expressions (tags joined by "||"), as FilterAPI reads them."""

from __future__ import annotations

from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingError

#: Java's String.trim: every character up to U+0020.
_JAVA_TRIM = "".join(map(chr, range(33)))


def parse_subscription(expression: str | None) -> frozenset[bytes] | None:
    """The tags a subscription names, as FilterAPI reads it; None for every tag.

    "*" or empty is every tag; otherwise the tags joined by "||", each trimmed, empty
    ones skipped (a set that ends up empty matches nothing). Only "||" alone (or
    repeated) does not parse: SUBSCRIPTION_PARSE_FAILED.
    """
    if expression is None or expression in ("", "*"):
        return None
    parts = expression.split("||")
    if not any(parts):
        raise RemotingError(
            ResponseCode.SUBSCRIPTION_PARSE_FAILED,
            f"the subscription {expression!r} names no tag",
        )
    return frozenset(t.encode() for p in parts if (t := p.strip(_JAVA_TRIM)))
