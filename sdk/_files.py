"""JSON files ordermq keeps on disk, read at start.

What is not as it should be is refused with CorruptFileError naming the file and the
fault, never a bare KeyError or TypeError.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sdk.errors import CorruptFileError

T = TypeVar("T")


def parse_json(raw: bytes, parse: Callable[[Any], T], source: Path) -> T:
    """`parse` applied to the JSON document `raw`, read from the file `source`.

    CorruptFileError when `raw` is not JSON or `parse` finds it is not what the file
    should hold (ValueError, KeyError, TypeError, AttributeError; RecursionError for a
    document nested too deep to parse).
    """
    try:
        return parse(json.loads(raw))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        raise CorruptFileError(f"{source} is unreadable ({type(exc).__name__}: {exc})") from exc


def read_json(path: Path, parse: Callable[[Any], T]) -> T:
    """parse_json of the file at `path` (FileNotFoundError when there is none)."""
    return parse_json(path.read_bytes(), parse, path)
