"""Checks of names and limits shared by the message types and the clients."""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import fields
from typing import Any

from sdk.errors import InvalidArgumentError, InvalidGroupError, InvalidTopicError

NAME_RE = re.compile(r"^[A-Za-z0-9_|-]{1,127}$")
SYSTEM_PREFIX = "rmq_sys_"
#: Topics the system names for a consumer group: its retries, and its dead letters.
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
PARKED_PREFIX = "%PARKED%"
#: Topics that passed check_topic; it runs for every message built, and most
#: applications use a few topics. Bounded: once full, further topics are checked each time.
_VALID_TOPICS: set[str] = set()
_VALID_TOPICS_MAX = 1024


def check_topic(topic: str) -> str:
    """Return `topic` if users may send to it, else raise InvalidTopicError."""
    # Exact str only: a subclass could compare equal to a cached name yet behave otherwise.
    if type(topic) is str and topic in _VALID_TOPICS:
        return topic
    if not isinstance(topic, str) or not NAME_RE.fullmatch(topic):
        raise InvalidTopicError(
            f"topic {topic!r} must match {NAME_RE.pattern} (letters, digits, _ | -; 1-127 chars)"
        )
    if topic.startswith(SYSTEM_PREFIX):
        raise InvalidTopicError(f"topic {topic!r}: the prefix {SYSTEM_PREFIX!r} is reserved")
    if type(topic) is str and len(_VALID_TOPICS) < _VALID_TOPICS_MAX:
        _VALID_TOPICS.add(topic)
    return topic


def check_group(group: str) -> str:
    """Return `group` if it is a valid group name, else raise InvalidGroupError."""
    if not isinstance(group, str) or not NAME_RE.fullmatch(group):
        raise InvalidGroupError(f"group {group!r} must match {NAME_RE.pattern}")
    return group


def tag_problem(tag: str) -> str | None:
    """What makes `tag` no message tag a subscription could name, or None if nothing.

    A tag holds no '|' (subscriptions join tags with '||'), no ',' (a tag "A,B" was surely
    meant as two) and no '*' ('*' alone subscribes to every tag), and no white space at
    its ends (a subscription's tags are trimmed). Inner spaces are allowed, as in RocketMQ.
    """
    if not tag.strip():
        return "is empty"
    if tag != tag.strip():
        return "starts or ends with white space"
    bad = [c for c in "|,*" if c in tag]
    if bad:
        return "contains " + " and ".join(repr(c) for c in bad)
    if not tag.isascii():
        try:
            tag.encode()
        except UnicodeEncodeError as exc:
            return f"is not UTF-8 text: it holds a lone surrogate at index {exc.start}"
    return None


def split_tag_expression(expression: str) -> list[str] | None:
    """The tags a subscription expression names; None for every tag ('*' or empty).

    "TagA || TagB" (white space around the tags is ignored, as RocketMQ's FilterAPI
    trims it) -> ["TagA", "TagB"]. Anything else, such as "TagA | TagB", "TagA,TagB" or
    "TagA ||", raises ValueError saying which part is wrong: RocketMQ would take it as a
    tag no message carries, or drop the empty part, and match less than was meant.
    """
    if not isinstance(expression, str):
        raise ValueError(f"a tag expression is a str, not {type(expression).__name__}")
    text = expression.strip()
    if text in ("", "*"):
        return None
    tags = [t.strip() for t in text.split("||")]
    for tag in tags:
        problem = tag_problem(tag)
        if problem is not None:
            raise ValueError(
                f"tag expression {expression!r} must be '*' or tags joined by '||' (like "
                f"'TagA || TagB'): the tag {tag!r} {problem}"
            )
    return tags


def finite_number(value: object) -> bool:
    """True for an int or float that is finite (a bool is no number here)."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def host_problem(host: object) -> str | None:
    """What makes `host` no host name or address to listen on or connect to; None if nothing.

    A name (IDNA-encodable: labels of 1-63 characters), an IPv4 address, or an IPv6
    address bare or in brackets. Checked where a host is given: a control character or an
    over-long label reached getaddrinfo and ended in a ValueError or UnicodeError.
    """
    if not isinstance(host, str):
        return f"it is not a str but {type(host).__name__}"
    if not host:
        return "it is empty"
    if not host.isprintable() or any(c.isspace() or c == "/" for c in host):
        return "it holds a space, a control character or '/'"
    if ":" in host:
        try:
            bracketed = host.startswith("[") and host.endswith("]")
            ipaddress.IPv6Address(host[1:-1] if bracketed else host)
        except ValueError:
            return "it is no IPv6 address"
        return None
    try:
        host.encode("idna")
    except UnicodeError as exc:
        return f"it is no host name ({exc})"
    return None


def check_kind(value: Any, kind: type[Any], name: str) -> Any:
    """`value` when it is None or a `kind`; else InvalidArgumentError naming `name`."""
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(
            f"{name} must be a {kind.__name__} or None, not {type(value).__name__}"
        )
    return value


def check_durations(config: Any, *, zero: frozenset[str] = frozenset()) -> None:
    """InvalidArgumentError unless every duration (`float` field) of `config` is seconds > 0.

    A finite number above 0, or also 0 for the fields named in `zero`. A 0 interval would
    spin (a heartbeat or rebalance loop with no wait), a negative or NaN one does the same
    in asyncio's sleep, an infinite one never comes: each is refused where the config is
    made, not found out while the client runs.
    """
    for f in fields(config):
        if f.type != "float":
            continue
        value = getattr(config, f.name)
        if finite_number(value) and (value > 0 or (value == 0 and f.name in zero)):
            continue
        least = "at least 0" if f.name in zero else "above 0"
        raise InvalidArgumentError(
            f"{type(config).__name__}.{f.name} must be a finite number of seconds {least}, "
            f"not {value!r}"
        )


def check_clock(clock: Any) -> Any:
    """`clock` when it is None or has a Clock's methods; else InvalidArgumentError.

    Checked where it is given: a value that is no clock would otherwise fail only once
    time is first read, with an AttributeError from inside the SDK.
    """
    if clock is not None and not all(
        callable(getattr(clock, name, None)) for name in ("now", "monotonic", "sleep_until")
    ):
        raise InvalidArgumentError(
            f"clock must be a Clock (now, monotonic, sleep_until) or None, not "
            f"{type(clock).__name__}"
        )
    return clock


def check_counts(config: Any) -> None:
    """InvalidArgumentError unless every count (`int` field) of `config` is an int.

    A bool is no count; an `int | None` field may also be None. A float count was taken
    before: a consumer with `pull_batch_size=2.5` failed every pull in the background and
    polled nothing.
    """
    for f in fields(config):
        if f.type not in ("int", "int | None"):
            continue
        value = getattr(config, f.name)
        if value is None and f.type == "int | None":
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            continue
        allowed = "an int or None" if f.type == "int | None" else "an int"
        raise InvalidArgumentError(
            f"{type(config).__name__}.{f.name} must be {allowed}, not {value!r}"
        )
