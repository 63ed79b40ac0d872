"""JSON objects assembled from members serialized before: a save re-serializes what changed.

The broker's tables (offsets, locks) are files of a JSON object per group. Each group's
member is kept as bytes, made again only when the group changed; a save joins them.
"""

from __future__ import annotations

import json
from typing import Any


def json_member(key: str, value: Any) -> bytes:
    """`"key": value` as one line of an object's body (value on one line)."""
    return f"  {json.dumps(key)}: {json.dumps(value)}".encode()


def json_object(members: dict[str, bytes], before: bytes = b"", after: bytes = b"") -> bytes:
    """An object of `members` (json_member's), one line each, in their keys' order.

    `before` and `after` are put around it in the same copy (a table's file is megabytes).
    """
    if not members:
        return before + b"{}" + after
    body = b",\n".join([members[key] for key in sorted(members)])
    return b"".join([before, b"{\n", body, b"\n }", after])
