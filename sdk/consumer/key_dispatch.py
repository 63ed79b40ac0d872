"""Key mode of orderly consumption: which messages of one queue may be called now.

A queue's messages are grouped by sharding key. A key whose previous call has finished
offers its oldest waiting messages for the next call; a key with a call running, or one
waiting to retry a failed call, offers nothing. So each key's messages are handled one call
at a time, in offset order, while different keys of the queue run side by side. Messages
without a sharding key are one key among the others: in order among themselves.

Keys take turns in the order they became ready, so a key with a long backlog does not
keep the others waiting. What the queue may commit (the lowest offset not finished) is the
process queue's business (ProcessQueue.finish), not this one's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from sdk.message import MessageExt

Key = str | None


class KeyDispatch:
    """Per-key waiting lines of one queue, and which keys are free to be called."""

    def __init__(self) -> None:
        self._waiting: dict[Key, deque[MessageExt]] = {}
        self._ready: deque[Key] = deque()  # keys with waiting messages and nothing running
        self._busy: set[Key] = set()  # a call running, or a failed one waiting to retry

    def add(self, messages: Iterable[MessageExt]) -> None:
        """Queue pulled messages (in offset order) behind their keys' earlier ones."""
        for m in messages:
            key = m.sharding_key
            line = self._waiting.get(key)
            if line is None:
                line = self._waiting[key] = deque()
                if key not in self._busy:
                    self._ready.append(key)
            line.append(m)

    def next_call(self, max_messages: int) -> tuple[Key, list[MessageExt]] | None:
        """The next key free to be called and up to `max_messages` of its oldest messages.

        The key is busy from now until `done` or `resume`. None when no key is free.
        """
        if not self._ready:
            return None
        key = self._ready.popleft()
        line = self._waiting[key]
        batch = [line.popleft() for _ in range(min(max_messages, len(line)))]
        if not line:
            del self._waiting[key]
        self._busy.add(key)
        return key, batch

    def done(self, key: Key) -> None:
        """The key's call finished (handled, or moved to the dead-letter queue)."""
        if key not in self._busy:
            return
        self._busy.remove(key)
        if key in self._waiting:
            self._ready.append(key)

    def put_back(self, key: Key, batch: list[MessageExt]) -> None:
        """Return a batch that was not handled in front of its key.

        The key stays busy until `resume`: a failed call waiting to retry keeps its key
        waiting with it.
        """
        if batch:
            self._waiting.setdefault(key, deque()).extendleft(reversed(batch))

    def take_key(self, key: Key) -> list[MessageExt]:
        """Take every waiting message of a busy key (it was parked), oldest first."""
        line = self._waiting.pop(key, None)
        return list(line) if line is not None else []

    def resume(self, key: Key) -> None:
        """A key `put_back` held may be called again."""
        self.done(key)

    def clear(self) -> None:
        """Forget every waiting message and busy key (the queue was reset or dropped)."""
        self._waiting.clear()
        self._ready.clear()
        self._busy.clear()

    @property
    def waiting(self) -> int:
        """Messages waiting, over all keys."""
        return sum(len(line) for line in self._waiting.values())

    @property
    def busy_keys(self) -> int:
        """Keys with a call running or a retry pending."""
        return len(self._busy)
