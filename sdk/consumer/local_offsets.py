"""Offsets of a broadcasting consumer: every member keeps its own, in a local file.

Same interface as RemoteOffsetStore. The file (JSON, replaced atomically with fsync) is
per group and instance name, so a restarted member continues where it stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from sdk._files import read_json
from sdk.message import MessageQueue


def default_offset_dir(group: str, instance_name: str) -> Path:
    """~/.ordermq/offsets/<group>/<instance name>."""
    return Path.home() / ".ordermq" / "offsets" / group / instance_name


class LocalFileOffsetStore:
    """Offsets in memory, persisted to `directory/offsets.json`.

    A file that cannot be read raises CorruptFileError: the member does not guess where
    to continue (move the file aside to start from its consume-from-where).
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / "offsets.json"
        self._offsets: dict[MessageQueue, int] = {}
        self._stored: dict[MessageQueue, int] = {}
        # One write at a time: two share the temporary file, and an older snapshot
        # written last would move the stored offsets back.
        self._persisting = asyncio.Lock()
        if self.path.exists():
            self._stored = read_json(self.path, _parse)

    def update(self, queue: MessageQueue, offset: int, *, increase_only: bool = True) -> None:
        """Record the next offset to consume; with increase_only, never move it back."""
        current = self._offsets.get(queue)
        if increase_only and current is not None and offset <= current:
            return
        self._offsets[queue] = offset

    def get(self, queue: MessageQueue) -> int | None:
        """The offset in memory, or None."""
        return self._offsets.get(queue)

    def set_epoch(self, queue: MessageQueue, epoch: int) -> None:
        """Broadcasting members take no locks: nothing to fence."""

    def remove(self, queue: MessageQueue) -> None:
        """Forget a queue in memory (its stored offset stays in the file)."""
        self._offsets.pop(queue, None)

    async def fetch(self, queue: MessageQueue) -> int | None:
        """The offset stored in the file, or None."""
        return self._stored.get(queue)

    async def persist(self, queues: list[MessageQueue] | None = None) -> None:
        """Write every known offset to the file if any changed."""
        async with self._persisting:
            merged = {**self._stored, **self._offsets}
            if merged == self._stored:
                return
            write = asyncio.ensure_future(asyncio.to_thread(self._write, merged))
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # The thread writes on: the next persist waits for it (they would share
                # the temporary file), then the cancellation goes on.
                await asyncio.wait([write])
                if write.exception() is None:
                    self._stored = merged
                raise
            self._stored = merged

    def _write(self, offsets: dict[MessageQueue, int]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "offsets": [
                {"topic": q.topic, "broker": q.broker_name, "queue_id": q.queue_id, "offset": o}
                for q, o in sorted(offsets.items())
            ]
        }
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


def _parse(raw: dict[str, Any]) -> dict[MessageQueue, int]:
    stored: dict[MessageQueue, int] = {}
    for item in raw["offsets"]:
        topic, broker, qid, offset = (item[k] for k in ("topic", "broker", "queue_id", "offset"))
        if not (type(topic) is str and type(broker) is str):
            raise ValueError(f"topic {topic!r} or broker {broker!r} is not a name")
        if not (type(qid) is int and type(offset) is int and qid >= 0 and offset >= 0):
            raise ValueError(f"queue id {qid!r} or offset {offset!r} is not a natural number")
        stored[MessageQueue(topic, broker, qid)] = offset
    return stored
