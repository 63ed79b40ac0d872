"""The pop state on disk: a snapshot and an append-only journal in `<data dir>/pop/`.

- `state.json` holds a snapshot and its generation G (replaced atomically);
- `journal-G.log` holds the changes made since, one record a line:
  the CRC32 of the JSON in 8 hex digits, a space, the JSON, a newline.

A change is appended (a write into the page cache, on the event loop) and answered once
`sync` returns: concurrent changes share one fsync (group commit). A failed write or fsync
makes the journal refuse every later change (STORE_UNAVAILABLE) until a restart, as the
message store does: what is on disk is then unknown, and only recovery finds out.

Recovery reads the snapshot, then replays journal-G, journal-G+1, ... in turn, up to the
first line that is torn or fails its CRC: a power cut loses only what was never synced,
which lies past everything synced, so every answered change is before it, and nothing of
a later journal was synced before the earlier one was (compaction syncs the old journal
before any sync of the new one). `begin` then writes the replayed state as a new
generation with an empty journal, and deletes the older files.

Compaction bounds the journal: once it passes `compact_bytes` (and four times the last
snapshot), the state is snapshotted as generation G+1 and new records go to
journal-G+1, in one step on the event loop so that the snapshot holds exactly what the
old journal does; the old journal is synced, the snapshot written, the old journal
deleted. A crash in between leaves state.json at G with journals G and G+1, which
recovery replays in turn.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import zlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.store.files import fsync_dir, open_durably, write_atomically
from sdk._files import parse_json
from sdk.errors import CorruptFileError

log = logging.getLogger("mockbroker.pop")

STATE_FILE = "state.json"
_FORMAT = 1
#: Smallest journal worth compacting.
COMPACT_BYTES = 4 * 1024 * 1024
T = TypeVar("T")


class Journal:
    """The pop state's snapshot and journal in one directory."""

    def __init__(self, directory: Path, *, compact_bytes: int = COMPACT_BYTES) -> None:
        self.directory = directory
        self._compact_bytes = compact_bytes
        self._generation = 0
        self._fd: int | None = None
        self._bytes = 0  # written to the current journal
        self._snapshot_bytes = 0
        self._seq = 0  # records appended so far
        self._durable = 0  # records known to be on disk
        self._lock = asyncio.Lock()  # one fsync or compaction at a time
        self.failure: OSError | None = None
        #: Why `begin` could not open the journal (a full disk at start), until it can.
        self.closed_by: OSError | None = None
        #: Records replayed at the last start.
        self.replayed = 0

    # ------------------------------------------------------------------ start
    def open(
        self, restore: Callable[[Any], None], replay: Callable[[dict[str, Any]], None]
    ) -> None:
        """Read the snapshot into `restore` (None without one), then each record into `replay`.

        CorruptFileError when the snapshot cannot be read, or a record whose CRC is good
        does not apply.
        """
        state_path = self.directory / STATE_FILE
        state: Any = None
        if state_path.exists():
            raw = state_path.read_bytes()
            self._generation, state = parse_json(raw, _parse_state, state_path)
            self._snapshot_bytes = len(raw)
        try:
            restore(state)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptFileError(f"{state_path} does not hold a pop state: {exc!r}") from exc
        while self._path(self._generation).exists():
            whole = self._replay(self._path(self._generation), replay)
            self._generation += 1
            if not whole:
                break  # nothing after a torn record was ever synced

    def _replay(self, path: Path, replay: Callable[[dict[str, Any]], None]) -> bool:
        """Replay a journal; False when it ends in a torn or damaged record."""
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            end = data.find(b"\n", pos)
            record = _record(data[pos:end]) if end >= 0 else None
            if record is None:
                log.warning("%s: %d bytes after offset %d were never synced; ignored",
                            path, len(data) - pos, pos)  # fmt: skip
                return False
            try:
                replay(record)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise CorruptFileError(f"{path} offset {pos}: record {record!r}: {exc!r}") from exc
            self.replayed += 1
            pos = end + 1
        return True

    def begin(self, state: dict[str, Any]) -> None:
        """Start a new generation holding `state`, with an empty journal (after `open`).

        OSError when that cannot be written (a full disk): the journal stays closed, and
        `begin` may be called again; files it left behind are replayed or replaced then.
        """
        generation = self._generation
        fd = open_durably(self._path(generation), os.O_WRONLY | os.O_APPEND | os.O_TRUNC)
        try:
            self._write_snapshot(generation, state)
        except OSError as exc:
            os.close(fd)
            self.closed_by = exc
            raise
        self._fd, self._bytes, self.closed_by = fd, 0, None
        for path in self.directory.glob("journal-*.log"):
            if path != self._path(generation):
                path.unlink()
        fsync_dir(self.directory)

    # ------------------------------------------------------------------ changes
    def append(self, record: dict[str, Any]) -> None:
        """Write one record (page cache); `sync` makes it durable."""
        self.check()
        text = json.dumps(record, separators=(",", ":")).encode()
        line = b"%08x %s\n" % (zlib.crc32(text), text)
        assert self._fd is not None
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(self._fd, view) :]
        except OSError as exc:
            raise self._fail(exc) from exc
        self._seq += 1
        self._bytes += len(line)

    async def sync(self) -> None:
        """Return once every record appended so far is on disk."""
        target = self._seq
        if self._durable >= target:
            return
        async with self._lock:
            if self._durable >= target:
                return
            self.check()
            upto, fd = self._seq, self._fd
            assert fd is not None
            try:
                await _finish(asyncio.to_thread(os.fsync, fd))
            except OSError as exc:
                raise self._fail(exc) from exc
            self._durable = max(self._durable, upto)

    def wants_compaction(self) -> bool:
        """True once the journal is worth replacing by a snapshot."""
        return self._bytes >= max(self._compact_bytes, 4 * self._snapshot_bytes)

    async def compact(self, state: Callable[[], dict[str, Any]]) -> None:
        """Snapshot `state()` as the next generation and continue in an empty journal."""
        async with self._lock:
            self.check()
            generation = self._generation + 1
            flags = os.O_WRONLY | os.O_APPEND | os.O_TRUNC
            try:
                fd = await _finish(asyncio.to_thread(open_durably, self._path(generation), flags))
            except OSError as exc:
                log.error("pop journal not compacted (retried later): %s", exc)
                return
            # The switch: no await between taking the state and moving to the new journal.
            snapshot = state()
            old_fd, old_generation, upto = self._fd, self._generation, self._seq
            self._fd, self._generation, self._bytes = fd, generation, 0
            assert old_fd is not None
            try:
                await _finish(asyncio.to_thread(os.fsync, old_fd))
            except OSError as exc:
                raise self._fail(exc) from exc
            finally:
                os.close(old_fd)
            self._durable = max(self._durable, upto)
            try:
                await _finish(asyncio.to_thread(self._write_snapshot, generation, snapshot))
            except OSError as exc:  # state.json stays at the old generation: still whole
                log.error("pop state snapshot not written (retried later): %s", exc)
                return
            try:
                await _finish(asyncio.to_thread(self._remove, old_generation))
            except OSError as exc:
                log.warning("old pop journal not removed: %s", exc)

    async def close(self) -> None:
        """Sync and close the journal."""
        if self._fd is None:
            return
        if self.failure is None:
            try:
                await self.sync()
            except BrokerError as exc:
                log.error("pop journal not synced at close: %s", exc.message)
        os.close(self._fd)
        self._fd = None

    # ------------------------------------------------------------------ internals
    def _path(self, generation: int) -> Path:
        return self.directory / f"journal-{generation}.log"

    def _write_snapshot(self, generation: int, state: dict[str, Any]) -> None:
        data = json.dumps({"format": _FORMAT, "generation": generation, "state": state})
        raw = data.encode()
        write_atomically(self.directory / STATE_FILE, raw)
        self._snapshot_bytes = len(raw)

    def _remove(self, generation: int) -> None:
        for g in range(generation, -1, -1):
            path = self._path(g)
            if not path.exists():
                break
            path.unlink()
        fsync_dir(self.directory)

    @property
    def ready(self) -> bool:
        """True while changes can be journaled."""
        return self._fd is not None and self.failure is None

    def check(self) -> None:
        """STORE_UNAVAILABLE (or DISK_FULL) once the journal failed, or while it is closed."""
        if self.failure is not None:
            raise _unavailable(self.failure)
        if self._fd is None:
            if self.closed_by is not None:
                reason = (
                    "DISK_FULL" if self.closed_by.errno == errno.ENOSPC else "STORE_UNAVAILABLE"
                )
                raise BrokerError(
                    StatusCode.UNAVAILABLE,
                    reason,
                    f"the pop journal could not be opened ({self.closed_by}); receives and "
                    "acks are refused until it can be (retried every flush interval)",
                )
            raise BrokerError(
                StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "the pop journal is not open"
            )

    def _fail(self, exc: OSError) -> BrokerError:
        if self.failure is None:
            log.critical("pop journal write failed; receives and acks are refused until a "
                         "restart: %s", exc)  # fmt: skip
            self.failure = exc
        return _unavailable(exc)


async def _finish(work: Awaitable[T]) -> T:
    """Await file work in a thread.

    If the caller is cancelled, the work still finishes before the cancellation goes on:
    a file must not be closed under a running fsync.
    """
    task: asyncio.Future[T] = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


def _unavailable(exc: OSError) -> BrokerError:
    reason = "DISK_FULL" if exc.errno == errno.ENOSPC else "STORE_UNAVAILABLE"
    return BrokerError(
        StatusCode.UNAVAILABLE,
        reason,
        f"the pop journal cannot be written ({exc}); receives and acks are refused until "
        "the broker restarts",
    )


def _record(line: bytes) -> dict[str, Any] | None:
    """The record of a journal line; None when torn or damaged."""
    if len(line) < 10 or line[8:9] != b" ":
        return None
    text = line[9:]
    try:
        if int(line[:8], 16) != zlib.crc32(text):
            return None
        record = json.loads(text)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _parse_state(raw: Any) -> tuple[int, Any]:
    if raw["format"] != _FORMAT:
        raise ValueError(f"format {raw['format']!r}, not {_FORMAT}")
    generation = raw["generation"]
    if type(generation) is not int or generation < 0:
        raise ValueError(f"generation {generation!r}")
    return generation, raw["state"]
