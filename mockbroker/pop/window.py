"""One group's window over one queue: the messages it received and has not settled.

The window spans the queue offsets [base, position): `base` is the group's first
unsettled message (what its committed offset becomes), `position` the next message no
receive has looked at yet. Every offset in between is
- an entry: a message to deliver or delivered, with its sharding key, how often it was
  delivered and, while a receive holds it, its lease (nonce and invisible-until time);
- settled: acknowledged (with the nonce of the receipt that did it) or dead-lettered
  (nonce 0), kept so that a repeated ack is recognised;
- or absent: filtered out by the receive's tag expression (settled at once).

A lease lives while the clock is before its deadline; `expire` ends the leases that ran
out, which makes their messages visible again. Plain synchronous code: the service calls
it on the event loop, journals what changed, and replays the journal through the same
methods after a restart.
"""

from __future__ import annotations

import base64
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Entry:
    """An unsettled message of the window."""

    key: bytes  # the sharding key: one message group of a FIFO group per key and queue
    attempts: int = 0  # deliveries so far
    nonce: int = 0  # the live lease's nonce; 0 while no receive holds the message
    deadline_ms: int = 0  # when that lease ends
    dead_lettering: bool = False  # being copied to the dead-letter topic


@dataclass(frozen=True, slots=True)
class Lease:
    """A delivery: the message at `offset` is hidden until `deadline_ms`."""

    offset: int
    nonce: int
    deadline_ms: int
    attempts: int


class Window:
    """The unsettled part of one queue for one group (see the module docstring)."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.position = base
        self.entries: dict[int, Entry] = {}  # by offset, in offset order
        self.settled: dict[int, int] = {}  # offset -> the nonce that settled it (0: DLQ)
        self.unleased = 0  # entries no receive holds (nonce 0)
        self._leases: list[tuple[int, int, int]] = []  # heap of (deadline, offset, nonce)
        # Replay restores entries beyond `position` (messages re-read later): until the
        # position passes them, entries read from the store are sorted in.
        self._known_to = base

    # ------------------------------------------------------------------ queries
    def held(self, offset: int, nonce: int) -> Entry | None:
        """The entry at `offset` if `nonce` is its current lease's (whose time may be up)."""
        entry = self.entries.get(offset)
        return entry if entry is not None and nonce and entry.nonce == nonce else None

    def is_settled(self, offset: int) -> bool:
        """True when the message at `offset` was acknowledged, dead-lettered or filtered out."""
        if offset < self.base or offset in self.settled:
            return True
        return offset < self.position and offset not in self.entries

    def next_deadline(self) -> int | None:
        """When the earliest live lease ends (ms), None without one."""
        heap = self._leases
        while heap:
            deadline, offset, nonce = heap[0]
            entry = self.entries.get(offset)
            if entry is not None and entry.nonce == nonce and entry.deadline_ms == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def in_flight(self, now_ms: int) -> int:
        """How many messages a receive holds now."""
        return sum(1 for e in self.entries.values() if e.nonce and e.deadline_ms > now_ms)

    def delivered(self) -> int:
        """How many unsettled messages were delivered at least once."""
        return sum(1 for e in self.entries.values() if e.attempts)

    @property
    def empty(self) -> bool:
        """True when nothing is unsettled or remembered."""
        return not self.entries and not self.settled

    # ------------------------------------------------------------------ receiving
    def index(self, found: Iterable[tuple[int, bytes]], next_offset: int) -> None:
        """Take in messages read from `position`: (offset, sharding key) of each one.

        Offsets below `next_offset` not among them were filtered out: settled.
        """
        for offset, key in found:
            if offset not in self.entries and offset not in self.settled and offset >= self.base:
                self.entries[offset] = Entry(key)
                self.unleased += 1
        self.position = max(self.position, next_offset)
        if self._known_to > self.base:
            self.entries = dict(sorted(self.entries.items()))
            if self.position >= self._known_to:
                self._known_to = self.base
        self._advance()

    def expire(self, now_ms: int, max_attempts: int) -> tuple[int, list[int]]:
        """End the leases that ran out by `now_ms`.

        Returns how many messages became visible again, and the offsets of those that were
        delivered `max_attempts` times already (for the dead-letter topic).
        """
        freed, exhausted = 0, []
        heap = self._leases
        while heap and heap[0][0] <= now_ms:
            deadline, offset, nonce = heapq.heappop(heap)
            entry = self.entries.get(offset)
            if entry is None or entry.nonce != nonce or entry.deadline_ms != deadline:
                continue
            entry.nonce = 0
            self.unleased += 1
            freed += 1
            if entry.attempts >= max_attempts:
                exhausted.append(offset)
        return freed, exhausted

    def candidates(
        self, want: int, *, fifo: bool, max_attempts: int
    ) -> tuple[list[int], list[int]]:
        """Up to `want` offsets a receive may take now, in offset order; and exhausted ones.

        Call `expire` first. A FIFO group takes only the first unsettled message of each
        sharding key. Messages delivered `max_attempts` times are not taken but returned
        second, for the dead-letter topic.
        """
        chosen: list[int] = []
        exhausted: list[int] = []
        free = self.unleased
        seen: set[bytes] = set()
        for offset, entry in self.entries.items():
            if free == 0 or len(chosen) >= want:
                break
            if not entry.nonce:
                free -= 1
                if entry.dead_lettering:
                    pass
                elif entry.attempts >= max_attempts:
                    exhausted.append(offset)
                elif not fifo or entry.key not in seen:
                    chosen.append(offset)
            if fifo:
                seen.add(entry.key)
        return chosen, exhausted

    def lease(self, offset: int, nonce: int, deadline_ms: int) -> Lease:
        """Deliver the message at `offset` (a candidate): hidden until `deadline_ms`."""
        entry = self.entries[offset]
        if not entry.nonce:
            self.unleased -= 1
        entry.attempts += 1
        self._hold(offset, entry, nonce, deadline_ms)
        return Lease(offset, nonce, deadline_ms, entry.attempts)

    def unlease(self, offset: int) -> None:
        """Take back a lease whose delivery never went out: the entry is as before `lease`."""
        entry = self.entries[offset]
        entry.attempts -= 1
        entry.nonce = 0
        self.unleased += 1

    def change(self, offset: int, nonce: int, deadline_ms: int) -> Lease:
        """Replace a held message's lease with a new one (a new nonce and deadline)."""
        entry = self.entries[offset]
        if not entry.nonce:
            self.unleased -= 1
        self._hold(offset, entry, nonce, deadline_ms)
        return Lease(offset, nonce, deadline_ms, entry.attempts)

    def _hold(self, offset: int, entry: Entry, nonce: int, deadline_ms: int) -> None:
        entry.nonce, entry.deadline_ms = nonce, deadline_ms
        heapq.heappush(self._leases, (deadline_ms, offset, nonce))
        if len(self._leases) > 4 * len(self.entries) + 64:  # mostly replaced leases
            self._leases = [(e.deadline_ms, o, e.nonce) for o, e in self.entries.items() if e.nonce]
            heapq.heapify(self._leases)

    def release(self, offset: int) -> None:
        """End the lease of `offset` at once (its dead-letter copy failed: try again later)."""
        entry = self.entries.get(offset)
        if entry is not None:
            entry.dead_lettering = False
            if entry.nonce:
                entry.nonce = 0
                self.unleased += 1

    def settle(self, offset: int, nonce: int) -> None:
        """The message at `offset` is done: acknowledged with `nonce`, or dead-lettered (0)."""
        entry = self.entries.pop(offset, None)
        if entry is not None and not entry.nonce:
            self.unleased -= 1
        if offset >= self.base:
            self.settled[offset] = nonce
        self._advance()

    def _advance(self) -> None:
        """Move the base over settled offsets (known as such even past the position)."""
        base, position, entries, settled = self.base, self.position, self.entries, self.settled
        while base in settled or (base < position and base not in entries):
            base += 1
        if base > self.base:
            self.base, self.position = base, max(position, base)
            self.settled = {o: n for o, n in settled.items() if o >= base}

    # ------------------------------------------------------------------ moving the window
    def move_base(self, base: int) -> int:
        """Skip everything below `base` (retention deleted it, or replay moves past it).

        Returns how many unsettled messages were dropped.
        """
        if base <= self.base:
            return 0
        dropped = [o for o in self.entries if o < base]
        for offset in dropped:
            if not self.entries.pop(offset).nonce:
                self.unleased -= 1
        self.base = base
        self.position = max(self.position, base)
        self.settled = {o: n for o, n in self.settled.items() if o >= base}
        self._advance()
        return len(dropped)

    def truncate(self, end: int) -> None:
        """Forget everything at or past `end`: the queue ends there (a crash lost the rest)."""
        for offset in [o for o in self.entries if o >= end]:
            if not self.entries.pop(offset).nonce:
                self.unleased -= 1
        self.settled = {o: n for o, n in self.settled.items() if o < end}
        self.base, self.position = min(self.base, end), min(self.position, end)
        self._known_to = min(self._known_to, end)

    def reset(self, offset: int) -> None:
        """Start over at `offset`: every lease and settlement is forgotten."""
        self.entries.clear()
        self.settled.clear()
        self._leases.clear()
        self.unleased = 0
        self.base = self.position = self._known_to = offset

    # ------------------------------------------------------------------ replay, snapshots
    def restore(self, offset: int, key: bytes, attempts: int, nonce: int, deadline_ms: int) -> None:
        """Replay a delivery: the entry at `offset` as the journal recorded it."""
        if offset < self.base or offset in self.settled:
            return
        entry = self.entries.get(offset)
        if entry is None:
            entry = self.entries[offset] = Entry(key)
            self.unleased += 1
            self._known_to = max(self._known_to, offset + 1)
        entry.attempts = attempts
        if nonce:
            self.change(offset, nonce, deadline_ms)

    def restored(self) -> None:
        """Replay is over: put the entries in offset order."""
        self.entries = dict(sorted(self.entries.items()))

    def to_json(self) -> dict[str, Any]:
        """What a snapshot keeps: base, delivered entries and settlements."""
        return {
            "base": self.base,
            "entries": [
                [o, b64(e.key), e.attempts, e.nonce, e.deadline_ms]
                for o, e in self.entries.items()
                if e.attempts
            ],
            "settled": [[o, n] for o, n in sorted(self.settled.items())],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Window:
        """The window a snapshot kept (ValueError, KeyError, TypeError when malformed)."""
        window = cls(natural(data["base"]))
        for offset, nonce in data["settled"]:
            window.settled[natural(offset)] = natural(nonce, UINT64)
        for offset, key, attempts, nonce, deadline in data["entries"]:
            window.restore(
                natural(offset),
                unb64(key),
                natural(attempts),
                natural(nonce, UINT64),
                natural(deadline),
            )
        window.restored()
        return window


#: Offsets, times and counts read from files fit a signed 64-bit field; nonces fill 64 bits.
INT64, UINT64 = 2**63, 2**64


def natural(value: object, limit: int = INT64) -> int:
    """`value` if it is an int in 0..limit-1, else ValueError (for numbers read from files)."""
    if type(value) is not int or not 0 <= value < limit:
        raise ValueError(f"{value!r} is not a natural number below {limit}")
    return value


def b64(raw: bytes) -> str:
    """Bytes as base64 text (sharding keys in journal records and snapshots)."""
    return base64.b64encode(raw).decode()


def unb64(text: object) -> bytes:
    """Bytes from base64 text read from a file (ValueError when it is not)."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} is not base64 text")
    return base64.b64decode(text, validate=True)
