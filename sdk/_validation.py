"""Checks of names and limits shared by the message types and the clients."""

from __future__ import annotations

import re

from sdk.errors import InvalidGroupError, InvalidTopicError

NAME_RE = re.compile(r"^[A-Za-z0-9_|-]{1,127}$")
SYSTEM_PREFIX = "rmq_sys_"
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
