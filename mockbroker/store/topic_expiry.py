"""Per-topic retention over a shared commit log: expiry in the index, holds on segments.

Every topic's records share the commit log, whose segments go whole (retention.py). A
topic's own retention (mockbroker/topics.py `TopicRetention`) therefore acts in two ways:

- Shorter than the broker's, or a size cap: its messages *expire*. At every retention
  check each of its queues' min offset moves past the messages stored more than `hours`
  ago and past the oldest ones while the queue holds more than `bytes_per_queue` bytes;
  they are served no more (a pull below the min offset is answered from it, as after a
  segment deletion, and the groups that had not read them see them counted as skipped).
  Their bytes stay on disk until their segment goes by the broker's rules, which every
  other topic in it shares.
- Longer than the broker's: the segments holding its messages not yet past their own time
  are *held*: the age rule deletes nothing at or after the oldest such record. The early
  rules (a disk about to fill, `max_data_bytes`) still apply, as they do to the broker's
  own retention time.

`SizeWindow` keeps each capped queue's byte count up to date from the entries appended
since the last check, so a check reads only what is new.
"""

from __future__ import annotations

from dataclasses import dataclass

from mockbroker.store.consumequeue import ConsumeQueue

#: Index entries read per call while counting a queue's bytes.
_CHUNK = 4096


@dataclass
class SizeWindow:
    """The bytes of a queue's messages from offset `start` to `end` (exclusive)."""

    start: int = 0
    end: int = 0
    bytes: int = 0

    def floor(self, cq: ConsumeQueue, cap: int) -> int:
        """The lowest offset from which the queue's messages take at most `cap` bytes.

        The newest message always stays, however large. Entries of size 0 at the head (no
        stored message has size 0: they were expired before a restart, and read back as
        zeros) are skipped.
        """
        if self.start < cq.min_offset or self.end > cq.count:
            # Moved by a segment deletion, or cut by a failed append: count afresh.
            self.start = self.end = cq.min_offset
            self.bytes = 0
        while self.end < cq.count:
            entries = cq.read(self.end, _CHUNK)
            self.bytes += sum(max(size, 0) for _, size, _ in entries)
            self.end += len(entries)
        while True:
            entries = cq.read(self.start, _CHUNK)
            for _, size, _ in entries:
                # Size 0: an entry expired before a restart (its block reads back as zeros).
                if size != 0 and (self.bytes <= cap or self.start >= self.end - 1):
                    return self.start
                self.bytes -= max(size, 0)
                self.start += 1
            if not entries:
                return self.start
