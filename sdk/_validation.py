"""Checks of names and limits shared by the message types and the clients."""

from __future__ import annotations

import re

from sdk.errors import InvalidGroupError, InvalidTopicError

NAME_RE = re.compile(r"^[A-Za-z0-9_|-]{1,127}$")
SYSTEM_PREFIX = "rmq_sys_"


def check_topic(topic: str) -> str:
    """Return `topic` if users may send to it, else raise InvalidTopicError."""
    if not isinstance(topic, str) or not NAME_RE.match(topic):
        raise InvalidTopicError(
            f"topic {topic!r} must match {NAME_RE.pattern} (letters, digits, _ | -; 1-127 chars)"
        )
    if topic.startswith(SYSTEM_PREFIX):
        raise InvalidTopicError(f"topic {topic!r}: the prefix {SYSTEM_PREFIX!r} is reserved")
    return topic


def check_group(group: str) -> str:
    """Return `group` if it is a valid group name, else raise InvalidGroupError."""
    if not isinstance(group, str) or not NAME_RE.match(group):
        raise InvalidGroupError(f"group {group!r} must match {NAME_RE.pattern}")
    return group
