"""Flushing: periodic (async mode) and group commit (sync mode), plus checkpoints.

Async mode: every `interval` the commit log and the dirty consume queues are synced and a
checkpoint is written. Sync mode does the same periodically and, in addition, a sender
awaits `wait_durable(end)`: one fsync serves every sender waiting when it starts (group
commit); `on_flushed` is told the position each fsync made durable, which is not
everything appended by then (appends made during the fsync wait for the next one). After a
failed fsync nothing is ever reported durable again: every waiter and
every later write is refused, because the kernel may have dropped the dirty pages.

A checkpoint that cannot be written for want of space (ENOSPC) is not such a failure: the
data is synced, only the shortcut for recovery is older (it replays from the previous
checkpoint), and the next checkpoint is tried at the next flush. The same holds for the
consume-queue entries each queue keeps in memory (consumequeue.py), and the index's
(message_index.py): they are written before the checkpoint that counts them, and none is
written while any of them cannot be.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from mockbroker.histogram import Histogram
from mockbroker.store.checkpoint import Checkpoint, write_checkpoint
from mockbroker.store.commitlog import CommitLog, FlushPlan
from mockbroker.store.consumequeue import ConsumeQueue
from mockbroker.store.message_index import MessageIndex

log = logging.getLogger("mockbroker.flush")


class FlushFailedError(Exception):
    """An fsync failed; the store no longer acknowledges writes."""


class Flusher:
    """Owns every fsync of the message store."""

    def __init__(
        self,
        commitlog: CommitLog,
        queues: Callable[[], Iterable[ConsumeQueue]],
        checkpoint_path: Path,
        *,
        interval_seconds: float,
        index: MessageIndex | None = None,
        on_flushed: Callable[[int], None] | None = None,
    ) -> None:
        self._index = index
        self._on_flushed = on_flushed
        self._log = commitlog
        self._queues = queues
        self._checkpoint_path = checkpoint_path
        self._interval = interval_seconds
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._stopping = False
        self._lock = asyncio.Lock()  # one flush at a time
        self._tasks: list[asyncio.Task[None]] = []
        self.failure: OSError | None = None
        self._checkpointed = -1
        self._checkpoint_failing = False  # the last checkpoint write met a full disk
        #: How long each flush's fsyncs (and checkpoint write) took, in seconds.
        self.flush_seconds = Histogram()

    @property
    def checkpointed(self) -> int:
        """The position the last checkpoint recorded (0 before the first)."""
        return max(self._checkpointed, 0)

    def start(self) -> None:
        """Start the periodic and the group-commit loops."""
        self._tasks = [
            asyncio.create_task(self._periodic(), name="flush-periodic"),
            asyncio.create_task(self._group_commit(), name="flush-group-commit"),
        ]

    async def stop(self) -> None:
        """Stop the loops, then flush and checkpoint everything one last time."""
        self._stopping = True
        self._wake.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.failure is None:
            await self.flush(checkpoint=True)
        self._fail_waiters()

    async def wait_durable(self, position: int) -> None:
        """Return once the commit log is synced up to `position`."""
        if self.failure is not None:
            raise FlushFailedError(f"an earlier fsync failed: {self.failure}")
        if self._log.flushed >= position:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((position, future))
        self._wake.set()
        await future

    @property
    def lock(self) -> asyncio.Lock:
        """Held while a flush runs: hold it to close a consume queue's file."""
        return self._lock

    async def flush(self, *, checkpoint: bool) -> None:
        """Sync the commit log (and with `checkpoint`, the consume queues and checkpoint)."""
        async with self._lock:
            if self.failure is not None:
                raise FlushFailedError(f"an earlier fsync failed: {self.failure}")
            if checkpoint and self._checkpointed == self._log.end == self._log.flushed:
                return  # idle: nothing appended since the last checkpoint
            plan = self._log.begin_flush()
            record: Checkpoint | None = None
            if checkpoint:
                queues = list(self._queues())
                dirty = [q for q in queues if q.dirty]
                try:
                    written = self._write_tails(dirty)
                except OSError as exc:
                    raise self._failed(exc) from exc
                if written:  # a count must not name entries the queue's file lacks
                    # Taken with the log's end: the counts cover exactly the entries below it.
                    record = Checkpoint(plan.target, {q.name: q.count for q in queues})
                    for q in dirty:
                        q.dirty = False
                plan.fds += [q.fileno() for q in dirty]
                if self._index is not None:
                    plan.fds += self._index.fds()
            started = time.perf_counter()
            work = asyncio.ensure_future(asyncio.to_thread(self._execute, record, plan))
            try:
                await asyncio.shield(work)
            except asyncio.CancelledError:
                # The fsync goes on in its thread: keep the lock until it is done, or the
                # next flush would write the checkpoint file at the same time.
                await asyncio.wait([work])
                if not work.cancelled() and isinstance(work.exception(), OSError):
                    self.failure = work.exception()  # type: ignore[assignment]
                raise
            except OSError as exc:
                raise self._failed(exc) from exc
            self.flush_seconds.observe(time.perf_counter() - started)
            self._log.complete_flush(plan)
            if record is not None and work.result():
                self._checkpointed = plan.target
            self._release_waiters()
            if self._on_flushed is not None:
                self._on_flushed(plan.target)

    def _failed(self, exc: OSError) -> FlushFailedError:
        """Refuse writes from now on: the kernel may have dropped what it was to write."""
        self.failure = exc
        log.critical("a write or fsync failed; the store now refuses writes: %s", exc)
        self._fail_waiters()
        return FlushFailedError(str(exc))

    def _write_tails(self, queues: list[ConsumeQueue]) -> bool:
        """Write the entries the queues and the index keep in memory; False if no room.

        Then no checkpoint is written this time (as when the checkpoint itself finds the
        disk full): they stay in memory and the next flush tries again.
        """
        try:
            for q in queues:
                q.write_tail()
            if self._index is not None:
                self._index.write_pending()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            if not self._checkpoint_failing:
                log.error("cannot write consume-queue or index entries (%s): recovery after "
                          "a crash would replay from the previous checkpoint; retried at "
                          "every flush", exc)  # fmt: skip
            self._checkpoint_failing = True
            return False
        return True

    def _execute(self, checkpoint: Checkpoint | None, plan: FlushPlan) -> bool:
        """Sync the plan, then write the checkpoint; False when the disk had no room for it."""
        CommitLog.execute_flush(plan)
        if checkpoint is None:
            return True
        try:
            write_checkpoint(self._checkpoint_path, checkpoint)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            if not self._checkpoint_failing:
                log.error("cannot write the checkpoint (%s): recovery after a crash would "
                          "replay from the previous one; retried at every flush", exc)  # fmt: skip
            self._checkpoint_failing = True
            return False
        if self._checkpoint_failing:
            log.warning("checkpoint written again")
            self._checkpoint_failing = False
        return True

    async def _periodic(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._interval)
            try:
                await self.flush(checkpoint=True)
            except FlushFailedError:
                return

    async def _group_commit(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            if self._waiters:
                try:
                    await self.flush(checkpoint=False)
                except FlushFailedError:
                    return

    def _release_waiters(self) -> None:
        flushed = self._log.flushed
        still: list[tuple[int, asyncio.Future[None]]] = []
        for position, future in self._waiters:
            if position <= flushed:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((position, future))
        self._waiters = still
        if still:
            self._wake.set()

    def _fail_waiters(self) -> None:
        reason = self.failure or "the store is shutting down"
        for _, future in self._waiters:
            if not future.done():
                future.set_exception(FlushFailedError(str(reason)))
        self._waiters = []
