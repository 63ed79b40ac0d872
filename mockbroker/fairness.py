"""Fair turns at the store: one client's flood of sends or pulls does not starve the others.

The store's work (checking and appending a batch, reading a pull's answer) runs on the
broker's event loop, synchronously: while it runs, nothing else does, not even reading the
next request off a socket. Served first come, first served, a client with 50 large batches
in flight puts 50 batches ahead of another client's single message, and every step of that
message's way through the loop (read, append, answer) waits behind whatever store work is
ready at that moment.

So the work is cut into *slices* (a slice checks or reads at most `slice_messages`
messages and `slice_bytes` bytes; a large batch's records are laid out in slices
too, then written in one slice of its own, so that it is all or nothing) and each slice
takes a turn here first:

- uncontended, a turn is free (no await): while nobody waits and the store work done since
  the loop last went round is under `turn_seconds`, the slice runs at once;
- otherwise the slice waits. Waiting clients are served round robin, one slice per client
  per round, and each granted slice runs in a later pass of the loop, so between two slices
  the loop reads sockets and answers. A flooding client with 100 slices waiting gets one
  slice, then every other waiting client gets one, then the flooder again.

A client is a connection (its gRPC peer): the Exchange stream and the unary calls of one
channel are one client. A client's own slices keep their order.

The scheduler also tells whether clients other than a given one used the store lately
(`others_active`): a pull then answers one slice at most (fair_store.py), since copying a
large answer into its message and onto the socket is work of its own that no turn covers.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")

#: A client that took a turn this recently (seconds, on the scheduler's timer) is active.
ACTIVE_SECONDS = 1.0


class FairScheduler:
    """Grants turns to do store work: free when uncontended, round robin otherwise."""

    def __init__(self, *, turn_seconds: float, timer: Callable[[], float]) -> None:
        """`timer`: a monotonic clock in seconds (slices are timed with it)."""
        self._budget = turn_seconds
        self._timer = timer
        self._queues: dict[Hashable, deque[asyncio.Future[None]]] = {}
        self._ring: deque[Hashable] = deque()  # clients with a slice waiting, in turn order
        self._busy = False  # a slice holds the turn (granted, and not finished yet)
        self._holder: Hashable | None = None  # whose granted slice holds it
        self._spent = 0.0  # seconds of store work since the loop last went round
        self._round_scheduled = False
        # The two clients that took a turn last, and when: (client, time), latest first.
        self._recent: list[tuple[Hashable, float]] = []
        #: Counters: slices run, and those that had to wait for their turn.
        self.slices = 0
        self.waited = 0

    @property
    def waiting(self) -> int:
        """Slices waiting for their turn."""
        return sum(len(q) for q in self._queues.values())

    def turn(self, client: Hashable) -> Turn:
        """`async with scheduler.turn(client):` around one slice of store work."""
        return Turn(self, client)

    def others_active(self, client: Hashable) -> bool:
        """True when another client took a turn in the last ACTIVE_SECONDS."""
        now = self._timer()
        return any(c != client and now - at <= ACTIVE_SECONDS for c, at in self._recent)

    def _note(self, client: Hashable, at: float) -> None:
        recent = self._recent
        if recent and recent[0][0] == client:
            recent[0] = (client, at)
        else:
            recent.insert(0, (client, at))
            del recent[2:]

    # ------------------------------------------------------------------ internals
    def _free(self) -> bool:
        return not self._busy and not self._ring and self._spent < self._budget

    async def _wait(self, client: Hashable) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(client)
        if queue is None:
            queue = self._queues[client] = deque()
            if client != self._holder:  # the holder goes to the back once its slice is done
                self._ring.append(client)
        queue.append(future)
        self.waited += 1
        self._grant()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # granted, but it will not run: pass the turn on
                self._grant()
            else:
                self._forget(client, future)
            raise

    def _forget(self, client: Hashable, future: asyncio.Future[None]) -> None:
        queue = self._queues.get(client)
        if queue is None:
            return
        try:
            queue.remove(future)
        except ValueError:
            return
        if not queue:
            del self._queues[client]
            if client in self._ring:
                self._ring.remove(client)

    def _grant(self) -> None:
        """Hand the turn to the next waiting client, if the turn is free and budget is left."""
        while not self._busy and self._ring and self._spent < self._budget:
            client = self._ring.popleft()
            queue = self._queues[client]
            future = queue.popleft()
            if not queue:
                del self._queues[client]
            if future.cancelled():  # its task is about to hear of it (see _wait)
                if client in self._queues:
                    self._ring.appendleft(client)
                continue
            self._busy, self._holder = True, client
            future.set_result(None)  # it runs in the loop's next pass

    def _release(self) -> None:
        """The granted slice is done: its client's next slice waits behind the others'."""
        holder, self._holder = self._holder, None
        self._busy = False
        if holder is not None and holder in self._queues and holder not in self._ring:
            self._ring.append(holder)

    def _finished(self, elapsed: float) -> None:
        self._release()
        self.slices += 1
        self._spent += elapsed
        if not self._round_scheduled:
            # Runs once the loop went round (read sockets, ran what was ready): the budget
            # starts afresh there.
            self._round_scheduled = True
            asyncio.get_running_loop().call_soon(self._new_round)
        self._grant()

    def _new_round(self) -> None:
        self._round_scheduled = False
        self._spent = 0.0
        self._grant()


class Turn:
    """One slice's turn (see FairScheduler.turn); times the slice."""

    __slots__ = ("_client", "_scheduler", "_started")

    def __init__(self, scheduler: FairScheduler, client: Hashable) -> None:
        self._scheduler = scheduler
        self._client = client
        self._started = 0.0

    async def __aenter__(self) -> None:
        s = self._scheduler
        if s._free():
            s._busy = True
        else:
            await s._wait(self._client)
        self._started = s._timer()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        s = self._scheduler
        now = s._timer()
        s._note(self._client, now)
        s._finished(now - self._started)
