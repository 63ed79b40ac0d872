"""Automatic garbage collections held off while a burst of short-lived objects lives.

A `/metrics` scrape of a broker with many groups builds an object per series (35 000
with 1 000 groups and their offsets) and drops them all once the text is written. While
they live, the allocations set off collections (about 100 a scrape), and a full one
walks them along with everything the broker holds: up to 19 ms during which no thread
of the process runs, the event loop included (bench/scrape_pauses.py). Held off, the
objects are freed by their reference counts as the page is written, and the collection
that follows finds only what outlived it.

Collections are held process-wide (the collector has no other switch), only for the
length of the work, and given back as they were: a process that had them off keeps
them off. Overlapping holds (two scrapes at once, in two threads) count.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


class CollectionHold:
    """Holds automatic collections off while any of its `held()` blocks runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._was_enabled = False

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Automatic collections off for the block (they go back on after the last)."""
        with self._lock:
            if not self._holders:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if not self._holders and self._was_enabled:
                    gc.enable()


#: The process's hold (collections are process-wide).
COLLECTIONS = CollectionHold()
