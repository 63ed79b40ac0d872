"""Push delivery's flow control: the credit of one subscription (Delivery.subscribe).

A consumer that subscribes to a queue grants credit, in messages and optionally in bytes;
the broker sends a batch only while both are left, and each batch spends its records. So
what the broker has sent and the consumer has not made room for is bounded by what the
consumer granted: its memory, not the broker's pace, sets how much is in flight.

Subscriptions wait in the PullHolder (mockbroker/long_polling.py) with held pulls, on
their queue's appends, on their own credit grants and on their group's lock changes of
the queue, each under a key of its own.
"""

from __future__ import annotations

import itertools

from mockbroker.errors import invalid
from mockbroker.long_polling import PullHolder, QueueKey

#: A subscription with a lock re-checks it at least this often (broker clock seconds):
#: a lock that expires changes nothing anybody could notify.
SUBSCRIPTION_RECHECK = 1.0
#: Most credit one subscription may hold, in messages and in bytes.
MAX_CREDIT = 1 << 40

_ids = itertools.count(1)


def lock_wakeup(group: str, queue: QueueKey) -> QueueKey:
    """The holder key notified when `group`'s lock of `queue` changes (NUL: no topic has it)."""
    return (f"\0lock\0{group}\0{queue[0]}", queue[1])


class Credit:
    """What one subscription may still send: messages, and bytes (None: no byte limit)."""

    def __init__(self, holder: PullHolder, messages: int, size: int) -> None:
        _check(messages, size)
        self._holder = holder
        self.messages = messages
        self.bytes: int | None = size or None
        #: Records sent under this credit, and their bytes.
        self.sent = 0
        self.sent_bytes = 0
        #: The holder key a grant notifies.
        self.key: QueueKey = ("\0credit", next(_ids))

    @property
    def open(self) -> bool:
        """True while a batch may be sent."""
        return self.messages > 0 and (self.bytes is None or self.bytes > 0)

    def batch_bytes(self, max_bytes: int) -> int:
        """The most bytes the next batch may ask for (a read serves one record at least)."""
        return max_bytes if self.bytes is None else max(1, min(max_bytes, self.bytes))

    def spend(self, count: int, size: int) -> None:
        """A batch of `count` records, `size` bytes, was sent."""
        self.messages -= count
        if self.bytes is not None:
            self.bytes -= size
        self.sent += count
        self.sent_bytes += size

    def grant(self, messages: int, size: int) -> None:
        """The consumer made room: `messages` more, `size` more bytes (ignored without a limit).

        INVALID_ARGUMENT for a negative grant or one that would pass MAX_CREDIT.
        """
        _check(messages, size)
        if self.messages + messages > MAX_CREDIT or (
            self.bytes is not None and self.bytes + size > MAX_CREDIT
        ):
            raise invalid("INVALID_ARGUMENT", f"credit over {MAX_CREDIT} is not granted")
        self.messages += messages
        if self.bytes is not None:
            self.bytes += size
        self._holder.notify(*self.key)


def _check(messages: int, size: int) -> None:
    if not 0 <= messages <= MAX_CREDIT or not 0 <= size <= MAX_CREDIT:
        raise invalid(
            "INVALID_ARGUMENT",
            f"credit of {messages} messages and {size} bytes is outside 0..{MAX_CREDIT}",
        )
