"""The accumulator: what concurrent sends made gathers into shared requests.

Messages wait in a buffer per queue. One sender takes the ready queues' messages (a
queue is ready once it is full, messages or bytes, or its first message has waited
`linger`) and sends them in one request over several queues (Transport.send_parts),
at most `max_requests_in_flight` requests at a time. With `linger=0` this is natural
batching: a send goes at once when nothing is in flight, and the sends that arrive while
a request is in flight ride the next one.

Callers that send one after another (each awaiting its send) send again on the turn of
the event loop their answers come. A request ends once the callers it answered have had
that turn, so what they send then goes in one request (none of them alone, as to an idle
producer); and while a request is in flight, sends made on an answer's turn wait for it
instead of opening another (sends that come on their own still go beside it). Otherwise
such callers split into groups whose requests take turns, each carrying a share of them,
though a request costs both sides about the same whatever it carries.

Each queue has at most one part in flight (its retries included), so messages of one
queue (and so of one sharding key) reach the broker in the order they were accepted. A
part that fails retriably is retried alone, per the producer's retry policy, while the
later messages of its queue wait (a part of keyless messages only may be retried on
another queue, as a send of its own would); the other parts of its request are not
affected. The buffer over all queues is bounded: a send into a full buffer waits for
room (up to `block_timeout`) or fails at once with BufferFullError, as configured.

Sends are numbered (tickets) as they are made. When a part fails, or a send fails before
it was queued (no route, no room), the sends made until then that still wait to go to
that queue (or topic) fail too, unsent, with EarlierSendFailedError: no message is stored
after an earlier one of its queue that failed. Sends made after the failure go ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from sdk.clock import Clock
from sdk.errors import BufferFullError
from sdk.message import MessageQueue, SendResult
from sdk.producer.config import AccumulatorConfig
from sdk.producer.retry import EarlierSendFailedError, describe, holds_back, is_retriable

#: One queue's share of a request: the queue, its prepared messages, their ids.
Part = tuple[MessageQueue, list[bytes], list[bytes]]
#: Sends parts in one request (no retries); each part's results, or what refused it.
SendParts = Callable[[list[Part]], Awaitable[Sequence[list[SendResult] | BaseException]]]
#: Retries one part that failed retriably (the failure given), per the retry policy; the
#: last argument: every message of the part is keyless (it may move to another queue).
RetryPart = Callable[
    [MessageQueue, list[bytes], list[bytes], BaseException, bool], Awaitable[list[SendResult]]
]


@dataclass
class _Pending:
    prepared: bytes  # as the transport prepared it
    msg_id: bytes
    future: asyncio.Future[SendResult]
    since: float
    ticket: int
    movable: bool  # keyless: its retry may go to another queue
    prompted: bool  # made on the turn a request's answers were given (see _answered)


class _QueueBuffer:
    def __init__(self) -> None:
        self.items: deque[_Pending] = deque()
        self.bytes = 0
        self.busy = False  # a part of this queue is in flight or being retried


class Accumulator:
    """Buffers per queue in front of a multi-queue send; see the module docstring.

    `request_max_bytes`: the most bytes one request may carry (the transport's limit).
    """

    def __init__(
        self,
        config: AccumulatorConfig,
        send_parts: SendParts,
        retry_part: RetryPart,
        clock: Clock,
        request_max_bytes: int,
    ) -> None:
        self._config = config
        self._send_parts = send_parts
        self._retry_part = retry_part
        self._clock = clock
        self._request_max_bytes = request_max_bytes
        self._queues: dict[MessageQueue, _QueueBuffer] = {}
        # The buffers holding messages: the sender looks at these only, not at every
        # queue the producer ever sent to (a producer of many topics scanned them all
        # for every request).
        self._waiting: dict[MessageQueue, _QueueBuffer] = {}
        self._pending = 0
        self._buffered = 0  # messages in the buffers, not yet taken for a request
        self._room = asyncio.Condition()
        self._room_waiters = 0  # sends in _wait_for_room
        self._closed = False
        self._tickets = 0
        # topic or queue -> (the last ticket issued when a send to it failed, the failure)
        self._holds: dict[str | MessageQueue, tuple[int, BaseException]] = {}
        self._wake = asyncio.Event()
        self._in_flight = 0
        # Requests whose callers are having their turn, answered (see _answered).
        self._answering = 0
        self._unprompted = 0  # buffered messages that did not come on an answer's turn
        self._tasks: set[asyncio.Task[None]] = set()
        self._sender: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Messages accepted and not yet answered by the broker."""
        return self._pending

    def ticket(self) -> int:
        """Number a send as it is made, before it waits for anything (see `hold`)."""
        self._tickets += 1
        return self._tickets

    def hold(self, where: str | MessageQueue, failure: BaseException) -> None:
        """Note that a send to `where` (a topic, or a queue) failed.

        The sends made until now that have yet to go there fail with EarlierSendFailedError.
        """
        self._holds[where] = (self._tickets, failure)

    def _check_holds(self, queue: MessageQueue, ticket: int) -> None:
        if not self._holds:  # the usual case, checked for every message
            return
        for where in (queue.topic, queue):
            held = self._holds.get(where)
            if held is not None and ticket <= held[0]:
                text = describe(queue) if where is queue else f"topic {queue.topic!r}"
                raise EarlierSendFailedError(text, held[1])

    async def enqueue(
        self,
        queue: MessageQueue,
        prepared: bytes,
        msg_id: bytes,
        ticket: int,
        movable: bool = False,
    ) -> asyncio.Future[SendResult]:
        """Queue one prepared message (waiting for room); the future of its SendResult.

        `movable`: the message is keyless, so a retry may send it to another queue.
        EarlierSendFailedError when an earlier send to its topic or queue failed.
        """
        future = self.enqueue_now(queue, prepared, msg_id, ticket, movable)
        while future is None:
            await self._wait_for_room()
            # Checked again: a part of its queue may have failed meanwhile.
            future = self.enqueue_now(queue, prepared, msg_id, ticket, movable)
        return future

    def enqueue_now(
        self,
        queue: MessageQueue,
        prepared: bytes,
        msg_id: bytes,
        ticket: int,
        movable: bool = False,
    ) -> asyncio.Future[SendResult] | None:
        """`enqueue` without waiting: None when the buffer has no room."""
        self._check_holds(queue, ticket)
        if self._pending >= self._config.buffer_max_messages:
            return None
        buffer = self._buffer(queue)
        if self._sender is None:
            self._sender = asyncio.create_task(self._send_forever(), name="accumulator")
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        prompted = self._answering > 0
        buffer.items.append(
            _Pending(prepared, msg_id, future, self._clock.now(), ticket, movable, prompted)
        )
        self._waiting[queue] = buffer
        buffer.bytes += len(prepared)
        self._pending += 1
        self._buffered += 1
        if not prompted:
            self._unprompted += 1
        self._wake.set()
        return future

    def claim(
        self,
        queue: MessageQueue,
        prepared: bytes,
        msg_id: bytes,
        ticket: int,
        movable: bool = False,
    ) -> _Pending | None:
        """Take one message to send at once, in the caller's task (`send_claimed`).

        Only with natural batching (no linger) and an idle producer: nothing buffered, no
        request in flight (while one is, the sends that come wait to go together). The
        message is then a request of its own, as without the accumulator, and the sends
        that come meanwhile wait for it as for any request in flight. None: `enqueue` it.
        EarlierSendFailedError as `enqueue` raises it.
        """
        config = self._config
        if (
            config.linger
            or self._buffered
            or self._closed
            or self._in_flight
            or self._pending >= config.buffer_max_messages
        ):
            return None
        buffer = self._buffer(queue)
        if buffer.busy:
            return None
        self._check_holds(queue, ticket)
        future: asyncio.Future[SendResult] = asyncio.get_running_loop().create_future()
        buffer.busy = True
        self._in_flight += 1
        self._pending += 1
        return _Pending(prepared, msg_id, future, self._clock.now(), ticket, movable, False)

    async def send_claimed(self, queue: MessageQueue, claimed: _Pending) -> SendResult:
        """Send a claimed message as a request of its own; its result (or its error).

        Cancelled while its request is in flight, it may or may not be stored, and the
        later sends of its queue go on, as with no accumulator.
        """
        try:
            await self._request([(queue, [claimed])], claimed=True)
        except asyncio.CancelledError:
            if not claimed.future.done():
                claimed.future.cancel()
                self._pending -= 1
                self._queues[queue].busy = False
                self._wake_if_buffered()
            raise
        return await claimed.future

    def _buffer(self, queue: MessageQueue) -> _QueueBuffer:
        buffer = self._queues.get(queue)
        if buffer is None:
            buffer = self._queues[queue] = _QueueBuffer()
        return buffer

    async def _wait_for_room(self) -> None:
        limit = self._config.buffer_max_messages
        if self._pending < limit:
            return
        if self._config.when_full == "fail":
            raise BufferFullError(f"{self._pending} messages wait to be sent (limit {limit})")
        self._room_waiters += 1
        try:
            async with self._room:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
                # cancellation that arrives as room frees up, and the send would go on.
                async with asyncio.timeout(self._config.block_timeout):
                    await self._room.wait_for(lambda: self._pending < limit)
        except TimeoutError:
            raise BufferFullError(
                f"no room in the send buffer within {self._config.block_timeout}s "
                f"({self._pending} messages wait; limit {limit})"
            ) from None
        finally:
            self._room_waiters -= 1

    async def _send_forever(self) -> None:
        """Start a request whenever one may go and queues are ready; else wait.

        While a request is in flight, another goes only for a message that did not come
        on an answer's turn: those wait to go with the sends of the callers it answers.
        """
        while True:
            self._wake.clear()
            if self._in_flight >= self._config.max_requests_in_flight or (
                self._in_flight and not self._unprompted
            ):
                await self._wake.wait()
                continue
            parts, next_ready = self._take_ready()
            if parts:
                self._in_flight += 1
                self._spawn(self._request(parts))
                continue
            if next_ready is None:
                await self._wake.wait()
            else:
                await self._sleep_or_wake(next_ready)

    def _take_ready(self) -> tuple[list[tuple[MessageQueue, list[_Pending]]], float | None]:
        """Take the ready queues' messages for one request (marking them busy).

        Oldest first, within `request_max_bytes` (at least one part). Also when the
        earliest queue left waiting becomes ready (None: none waits for its linger).
        """
        config = self._config
        now = self._clock.now()
        waiting = [(q, b) for q, b in self._waiting.items() if not b.busy]
        waiting.sort(key=lambda qb: qb[1].items[0].ticket)
        parts: list[tuple[MessageQueue, list[_Pending]]] = []
        size = 0
        next_ready: float | None = None
        for queue, buffer in waiting:
            full = len(buffer.items) >= config.batch_max_messages or (
                buffer.bytes >= config.batch_max_bytes
            )
            ready_at = buffer.items[0].since + config.linger
            if not (full or self._closed or now >= ready_at):
                next_ready = ready_at if next_ready is None else min(next_ready, ready_at)
                continue
            room = self._request_max_bytes - size
            if parts and len(buffer.items[0].prepared) > room:
                continue
            batch = _take(buffer, config.batch_max_messages, min(config.batch_max_bytes, room))
            if not buffer.items:
                del self._waiting[queue]
            self._buffered -= len(batch)
            self._unprompted -= sum(not p.prompted for p in batch)
            buffer.busy = True
            parts.append((queue, batch))
            size += sum(len(p.prepared) for p in batch)
        return parts, next_ready

    async def _request(
        self, parts: list[tuple[MessageQueue, list[_Pending]]], claimed: bool = False
    ) -> None:
        """Send `parts` in one request; settle each part, or hand it to a retry.

        `claimed`: sent in its caller's task (send_claimed), which goes on at once.
        """
        try:
            outcomes = await self._send_parts(
                [(q, [p.prepared for p in b], [p.msg_id for p in b]) for q, b in parts]
            )
        except Exception as exc:  # the whole request failed
            outcomes = [exc] * len(parts)
        except BaseException:
            self._in_flight -= 1
            self._wake_if_buffered()
            raise
        self._answering += 1
        try:
            for (queue, batch), outcome in zip(parts, outcomes, strict=True):
                if isinstance(outcome, BaseException) and is_retriable(outcome):
                    self._spawn(self._retry(queue, batch, outcome))
                else:
                    await self._settle(queue, batch, outcome, wake=False)
        finally:
            if claimed:  # its caller goes on now, and may send again as a lone send would
                self._in_flight -= 1
            # The sender runs after the callers woken above, and may take what waited
            # meanwhile (beside this request if it may, before it ends).
            self._wake_if_buffered()
            asyncio.get_running_loop().call_soon(self._answered, not claimed)

    def _answered(self, ends_request: bool) -> None:
        """The callers a request answered have had their turn (their tasks woke first).

        `ends_request`: the request counted as in flight until now, so that they sent in
        one request what they sent meanwhile (none of them alone, as an idle producer's).
        """
        self._answering -= 1
        if ends_request:
            self._in_flight -= 1
        self._wake_if_buffered()

    async def _retry(
        self, queue: MessageQueue, batch: list[_Pending], failure: BaseException
    ) -> None:
        """Retry one part alone while the later messages of its queue wait.

        A part of keyless messages only may be retried on another queue.
        """
        outcome: list[SendResult] | BaseException
        try:
            outcome = await self._retry_part(
                queue,
                [p.prepared for p in batch],
                [p.msg_id for p in batch],
                failure,
                all(p.movable for p in batch),
            )
        except Exception as exc:
            outcome = exc
        await self._settle(queue, batch, outcome)

    async def _settle(
        self,
        queue: MessageQueue,
        batch: list[_Pending],
        outcome: list[SendResult] | BaseException,
        wake: bool = True,
    ) -> None:
        """Answer a part's callers; after a failure, fail those waiting behind it.

        `wake`: wake the sender if messages wait (False: the caller will).
        """
        buffer = self._queues[queue]
        if isinstance(outcome, BaseException):
            _fail(batch, outcome)
            if holds_back(outcome):  # every message waiting behind it was sent before now
                self.hold(queue, outcome)
                behind = list(buffer.items)
                buffer.items.clear()
                self._waiting.pop(queue, None)
                buffer.bytes = 0
                _fail(behind, EarlierSendFailedError(describe(queue), outcome))
                self._pending -= len(behind)
                self._buffered -= len(behind)
                self._unprompted -= sum(not p.prompted for p in behind)
        else:
            for p, result in zip(batch, outcome, strict=True):
                if not p.future.done():
                    p.future.set_result(result)
        self._pending -= len(batch)
        buffer.busy = False
        if wake:
            self._wake_if_buffered()
        if self._room_waiters:  # a lock round per part otherwise, for nobody
            async with self._room:
                self._room.notify_all()

    def _wake_if_buffered(self) -> None:
        # A request ended or a queue is free again: that matters to the sender only when
        # messages wait (a lone send's producer wakes nobody: one loop pass less).
        if self._buffered:
            self._wake.set()

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sleep_or_wake(self, deadline: float) -> None:
        sleeper = asyncio.ensure_future(self._clock.sleep_until(deadline))
        waker = asyncio.ensure_future(self._wake.wait())
        try:
            await asyncio.wait((sleeper, waker), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waker.cancel()

    async def close(self) -> None:
        """Send what is buffered (no more lingering), then stop the sender."""
        self._closed = True
        self._wake.set()
        pending = [p.future for b in self._waiting.values() for p in b.items]
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        # Until none is left unfinished: a finished task leaves the set only in a later
        # pass of the loop, and from Python 3.12 gather() over finished tasks returns
        # without letting the loop run, so waiting for the set to empty never ended.
        while running := [t for t in self._tasks if not t.done()]:
            await asyncio.gather(*running, return_exceptions=True)
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender


def _take(buffer: _QueueBuffer, max_messages: int, max_bytes: int) -> list[_Pending]:
    """Up to `max_messages` of a queue's first messages within `max_bytes` (at least one)."""
    batch: list[_Pending] = []
    size = 0
    while buffer.items and len(batch) < max_messages:
        if batch and size + len(buffer.items[0].prepared) > max_bytes:
            break
        item = buffer.items.popleft()
        batch.append(item)
        size += len(item.prepared)
    buffer.bytes -= size
    return batch


def _fail(items: list[_Pending], exc: BaseException) -> None:
    for p in items:
        if not p.future.done():
            p.future.set_exception(exc)
