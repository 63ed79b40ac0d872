"""What a broker keeps about itself in its data directory: its id, its Exchange port.

The id is random, made at the first start and the same across restarts. Routes give it
beside the broker's Exchange port (QueueRoute.exchange_broker_id) and the port greets
with it, so that a client whose route is older than a restart (the port may have moved,
and another broker on the host taken the old number) never carries one broker's traffic
to another broker's port.

An Exchange port given as 0 (a free one, the default) is kept too: the next start takes
the same number again while it is free, so that clients reconnect where they were.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from mockbroker.store.files import write_atomically

#: The files in the data directory that hold the id and the Exchange port chosen.
BROKER_ID_FILE = "broker-id"
EXCHANGE_PORT_FILE = "exchange-port"


def broker_id(data_dir: Path) -> str:
    """The id kept in `data_dir`, made (and kept) on the first call for a new directory."""
    kept = _read(data_dir / BROKER_ID_FILE)
    if kept:
        return kept
    made = uuid.uuid4().hex
    write_atomically(data_dir / BROKER_ID_FILE, made.encode("ascii"))
    return made


def kept_exchange_port(data_dir: Path) -> int | None:
    """The Exchange port the last start chose (None: none, or not a port number)."""
    kept = _read(data_dir / EXCHANGE_PORT_FILE)
    return int(kept) if kept.isdigit() and 0 < int(kept) < 65536 else None


def keep_exchange_port(data_dir: Path, port: int) -> None:
    """Keep `port` for the next start (written only when it changed)."""
    if kept_exchange_port(data_dir) != port:
        write_atomically(data_dir / EXCHANGE_PORT_FILE, str(port).encode("ascii"))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace").strip()
    except FileNotFoundError:
        return ""
