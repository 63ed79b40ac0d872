"""Lookup of stored messages by id and by key, for operators (not the hot read path).

Two append-only files of fixed-size entries, written a batch at a time with the commit
log: `index/ids` maps a message id to a commit-log position, `index/keys` maps an 8-byte
hash of (topic, key) to one. Lookups scan newest first and every hit is checked against
the record itself, so a stale or duplicated entry (after a crash, recovery appends the
replayed records again) can never answer with a wrong message.

Entries are kept in memory until PENDING_BYTES of them gather, or the flusher's next
checkpoint writes them (`write_pending`, before it syncs the files), instead of a
`write` system call for every send. Lookups read them from memory too. A crash may lose them, or
tear the last entry of a file (cut off at open): recovery replays the commit log from the
checkpoint, and indexes the records it replays again (MessageStore._reindex).

Retention trims both files to follow the commit log: the entries that point below its new
start are no longer scanned and their blocks are freed. Positions grow along each file
(bar the few a recovery repeats), so the cut is found by bisection.
"""

from __future__ import annotations

import errno
import hashlib
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from mockbroker.store.files import open_durably, punch_hole
from sdk._accel import speedups

_ID_ENTRY = struct.Struct("<16sq")
_KEY_ENTRY = struct.Struct("<8sq")
_CHUNK_ENTRIES = 16384
#: Bytes of entries a file keeps in memory before they are written (64 KiB: about
#: 2 700 ids).
PENDING_BYTES = 64 * 1024


def _key_hasher(topic: str) -> hashlib.blake2b:
    """A hash of the topic's key prefix; update it with a key to get that key's digest."""
    return hashlib.blake2b(topic.encode() + b"\0", digest_size=8)


def key_hash(topic: str, key: bytes) -> bytes:
    """The 8-byte digest a key is indexed under."""
    h = _key_hasher(topic)
    h.update(key)
    return h.digest()


def _id_entries_in_python(msg_ids: list[bytes], positions: list[int]) -> bytes:
    """The id file's entries of a write, joined (the C build packs them in one call)."""
    return b"".join(map(_ID_ENTRY.pack, msg_ids, positions))


_id_entries = speedups.pack_id_entries if speedups is not None else _id_entries_in_python


class MessageIndex:
    """The id and key index files of one store."""

    def __init__(self, directory: Path) -> None:
        #: The id and key files, in the order of `sizes`.
        self.paths = (directory / "ids", directory / "keys")
        self._ids = open_durably(directory / "ids", os.O_RDWR | os.O_APPEND)
        self._keys = open_durably(directory / "keys", os.O_RDWR | os.O_APPEND)
        #: Each file's size with its entries in memory, kept here (fstat costs a call).
        self._sizes: dict[int, int] = {}
        #: Per file, entries not written yet (newest last).
        self._pending: dict[int, bytearray] = {self._ids: bytearray(), self._keys: bytearray()}
        for fd, entry in ((self._ids, _ID_ENTRY), (self._keys, _KEY_ENTRY)):
            size = os.fstat(fd).st_size
            if size % entry.size:  # a crash tore the last entry: later ones would be skewed
                size -= size % entry.size
                os.ftruncate(fd, size)
            self._sizes[fd] = size
        #: Per file, the first entry still pointing into the commit log.
        self._live_from: dict[int, int] = {self._ids: 0, self._keys: 0}

    def add(
        self,
        topic: str,
        positions: list[int],
        msg_ids: list[bytes],
        keyed: list[tuple[int, bytes]],
    ) -> None:
        """Index a batch: every message by id, and `keyed` (position, keys joined by NUL).

        The entries are kept in memory; once a file has PENDING_BYTES of them they are
        written (OSError when that fails: they stay in memory, `roll_back` drops them).
        """
        self._keep(self._ids, _id_entries(msg_ids, positions))
        if not keyed:
            return
        # Hashing the prefix once and copying its state gives key_hash's digest at half
        # the cost of a new hash per key.
        prefix = _key_hasher(topic)
        pack = _KEY_ENTRY.pack
        entries: list[bytes] = []
        for position, joined in keyed:
            for key in joined.split(b"\0"):
                h = prefix.copy()
                h.update(key)
                entries.append(pack(h.digest(), position))
        self._keep(self._keys, b"".join(entries))

    def _keep(self, fd: int, entries: bytes) -> None:
        pending = self._pending[fd]
        pending += entries
        self._sizes[fd] += len(entries)
        if len(pending) >= PENDING_BYTES:
            self._write(fd)

    def _write(self, fd: int) -> None:
        pending = self._pending[fd]
        size = _ID_ENTRY.size if fd == self._ids else _KEY_ENTRY.size
        in_file = self._in_file(fd)
        while pending:
            written = os.write(fd, pending)
            whole = written - written % size
            if whole != written:  # a full disk tore an entry: keep the files whole entries
                os.ftruncate(fd, in_file + whole)
                if not whole:
                    raise OSError(errno.ENOSPC, "no room for an index entry")
            del pending[:whole]
            in_file += whole

    def _in_file(self, fd: int) -> int:
        """The bytes of `fd`'s entries written to the file (the rest wait in memory)."""
        return self._sizes[fd] - len(self._pending[fd])

    def write_pending(self) -> None:
        """Write the entries kept in memory (before the files are synced, and at close).

        OSError when a write fails: what was not written stays in memory for the next try.
        """
        self._write(self._ids)
        self._write(self._keys)

    def positions_of_id(self, msg_id: bytes) -> Iterator[int]:
        """Commit-log positions indexed under `msg_id`, newest first."""
        for entry_id, position in self._scan(self._ids, _ID_ENTRY):
            if entry_id == msg_id:
                yield position

    def positions_of_key(self, topic: str, key: bytes) -> Iterator[int]:
        """Commit-log positions indexed under (topic, key), newest first."""
        wanted = key_hash(topic, key)
        for digest, position in self._scan(self._keys, _KEY_ENTRY):
            if digest == wanted:
                yield position

    def _scan(self, fd: int, entry: struct.Struct) -> Iterator[tuple[bytes, int]]:
        # Lookups may run in a worker thread while the loop adds entries and writes them:
        # the entries in memory are copied first, then the file's size read, so an entry
        # written in between is scanned twice (lookups take each position once), never
        # missed, and the file is read only up to what it holds.
        pending = bytes(self._pending[fd])
        end = os.fstat(fd).st_size // entry.size
        yield from reversed(list(entry.iter_unpack(pending)))
        live_from = self._live_from[fd]
        while end > live_from:
            start = max(live_from, end - _CHUNK_ENTRIES)
            data = os.pread(fd, (end - start) * entry.size, start * entry.size)
            yield from reversed(list(entry.iter_unpack(data)))
            end = start

    def sizes(self) -> tuple[int, int]:
        """The byte sizes of the id and key files (to roll back a failed batch)."""
        return self._sizes[self._ids], self._sizes[self._keys]

    def roll_back(self, sizes: tuple[int, int]) -> None:
        """Cut both files back to `sizes` (entries of a batch that failed to be stored)."""
        for fd, size in zip((self._ids, self._keys), sizes, strict=True):
            pending = self._pending[fd]
            in_file = os.fstat(fd).st_size
            if size >= in_file:
                del pending[size - in_file :]
            else:
                os.ftruncate(fd, size)
                pending.clear()
            self._sizes[fd] = min(in_file + len(pending), size)

    def trim_below(self, position: int) -> None:
        """Stop scanning, and free, the entries that point below commit-log `position`.

        Only entries in the files: those in memory are newer (and a lookup checks each
        position it finds against the commit log).
        """
        for fd, entry in ((self._ids, _ID_ENTRY), (self._keys, _KEY_ENTRY)):
            lo = self._live_from[fd]
            hi = self._in_file(fd) // entry.size
            while lo < hi:
                mid = (lo + hi) // 2
                if entry.unpack(os.pread(fd, entry.size, mid * entry.size))[1] < position:
                    lo = mid + 1
                else:
                    hi = mid
            if lo > self._live_from[fd]:
                self._live_from[fd] = lo
                punch_hole(fd, lo * entry.size)

    def fds(self) -> list[int]:
        """The index files' descriptors, synced with each checkpoint."""
        return [self._ids, self._keys]

    def close(self) -> None:
        """Close the index files; entries still in memory are dropped (`write_pending` first)."""
        os.close(self._ids)
        os.close(self._keys)
