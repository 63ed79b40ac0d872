"""The data directory's format number, in the file FORMAT: a version reads only its own.

A directory without the file is from before it existed, which is format 1, the first.
A directory in a newer format is refused before anything in it is read or changed: an
older broker could otherwise take records it cannot read for corruption.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mockbroker.store.files import write_atomically
from sdk._files import read_json
from sdk._version import __version__
from sdk.errors import DataFormatError

FORMAT_FILE = "FORMAT"
#: The format this version writes and reads.
CURRENT_FORMAT = 1


def check_data_format(data_dir: Path) -> None:
    """Refuse a directory in another format (DataFormatError); mark an unmarked one.

    CorruptFileError when FORMAT does not parse.
    """
    path = data_dir / FORMAT_FILE
    if not path.exists():
        write_atomically(path, _marker())
        return
    found, written_by = read_json(path, _parse)
    if found != CURRENT_FORMAT:
        raise DataFormatError(
            f"{data_dir} is in data format {found}, written by ordermq {written_by}; "
            f"ordermq {__version__} reads format {CURRENT_FORMAT} only. Run the version that "
            "wrote it, or restore the copy taken before the upgrade"
        )


def _marker() -> bytes:
    return json.dumps({"format": CURRENT_FORMAT, "written_by": __version__}).encode() + b"\n"


def _parse(raw: dict[str, Any]) -> tuple[int, str]:
    found, written_by = raw["format"], raw.get("written_by", "unknown")
    if type(found) is not int or found < 1 or not isinstance(written_by, str):
        raise ValueError(f"format {found!r}, written_by {written_by!r}")
    return found, written_by
