"""The broker's id: a random name kept in its data directory, the same across restarts.

Routes give it beside the broker's Exchange port (QueueRoute.exchange_broker_id) and the
port greets with it, so that a client whose route is older than a restart (the port may
have moved, and another broker on the host taken the old number) never carries one
broker's traffic to another broker's port.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from mockbroker.store.files import write_atomically

#: The file in the data directory that holds the id.
BROKER_ID_FILE = "broker-id"


def broker_id(data_dir: Path) -> str:
    """The id kept in `data_dir`, made (and kept) on the first call for a new directory."""
    path = data_dir / BROKER_ID_FILE
    try:
        kept = path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        kept = ""
    if kept:
        return kept
    made = uuid.uuid4().hex
    write_atomically(path, made.encode("ascii"))
    return made
