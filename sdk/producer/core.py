"""The producer's async core, shared by the blocking and the asyncio faces.

Messages reach the brokers through a Transport (sdk/_transport/protocol.py), which
encodes each one once (`prepare`) and sends them; this module never sees a wire layout.
Three ways a message can go, chosen by the configuration:
- direct: one request per send (or per queue of a send_batch), retried per policy;
- accumulator: concurrent sends gathered into shared requests, one part per queue;
- spool: written to a local file first, delivered from it in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, cast

from sdk import metrics, tracing
from sdk._accel import speedups
from sdk._transport.protocol import Appended, SendPart, Transport
from sdk._validation import check_group, check_kind, check_topic
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.errors import (
    ClientStateError,
    FlushTimeoutError,
    InvalidArgumentError,
    OrderMQError,
)
from sdk.message import (
    ENCODING_FAILURES,
    Message,
    MessageIdGenerator,
    MessageQueue,
    SendResult,
    SendStatus,
    build_send_results,
    check_message,
    recheck_message,
)
from sdk.producer.accumulator import Accumulator, Part
from sdk.producer.config import ProducerConfig
from sdk.producer.retry import (
    EarlierSendFailedError,
    describe,
    holds_back,
    is_retriable,
    with_retries,
)
from sdk.producer.spool import Spool, Spooled, spool_frame
from sdk.selector import MessageQueueSelector, RoundRobinSelector, shard_index

#: How often flush() looks whether everything accepted has reached the broker.
FLUSH_POLL_SECONDS = 0.01

log = logging.getLogger("ordermq.producer")

#: Messages delivered from the spool per round.
SPOOL_BATCH = 1000
#: How long keyless sends pass over a broker after one failed there (as RocketMQ's
#: producer isolates a failing broker with sendLatencyFaultEnable).
AVOID_FAILED_BROKER_SECONDS = 30.0

#: sdk._speedups' grouping of a batch by queue and its SendResults, where it was built.
_shard_groups_in_c = speedups.shard_groups if speedups is not None else None
_send_results_in_c: Callable[..., list[SendResult]] | None = (
    speedups.send_results if speedups is not None else None
)
#: A batch's message ids in C, where it was built.
_message_ids_in_c = speedups.message_ids if speedups is not None else None


def _pick_in_python(items: list[Any], indexes: list[int]) -> list[Any]:
    return [items[i] for i in indexes]


def _put_at_in_python(into: list[Any], indexes: list[int], values: list[Any]) -> None:
    for i, value in zip(indexes, values, strict=True):
        into[i] = value


#: A mixed-key batch's parts picked from it, and their results put back in input order:
#: in C where it was built (a list comprehension and a loop per part otherwise).
_pick: Callable[[list[Any], list[int]], list[Any]] = (
    speedups.pick if speedups is not None else _pick_in_python
)
_put_at: Callable[[list[Any], list[int], list[Any]], None] = (
    speedups.put_at if speedups is not None else _put_at_in_python
)


class PartialBatchError(OrderMQError):
    """Some queues of a batch were stored and others were not.

    `results[i]` is the SendResult of message i, or None where its queue failed;
    `errors` holds the failures. The message names the failed messages by their index in
    the batch: a broker's error names a frame by its number within the refused part (that
    queue's messages of the request), not within the batch.
    """

    def __init__(self, results: list[SendResult | None], errors: list[OrderMQError]) -> None:
        failed = [i for i, r in enumerate(results) if r is None]
        super().__init__(
            f"{len(results) - len(failed)} of {len(results)} messages were stored; "
            f"{_name_messages(failed)} failed: {errors[0]}"
        )
        self.results = results
        self.errors = errors


class ProducerCore:
    """Queue selection, batching, retries and the spool; runs on one event loop.

    `transport`: how it reaches the brokers (sdk._transport.connect); closed at shutdown.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        group: str | None = None,
        config: ProducerConfig | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._transport = transport
        self._prepare = transport.prepare  # per message: one lookup fewer
        self.group = check_group(group) if group is not None else None
        self.config = check_kind(config, ProducerConfig, "config") or ProducerConfig()
        if self.config.spool_dir is not None and self.config.accumulator is not None:
            raise InvalidArgumentError("spool_dir and accumulator are exclusive: the spool batches")
        self._clock: Clock = clock or SystemClock()
        self._ids = MessageIdGenerator(_message_ids_in_c)
        self._round_robin = RoundRobinSelector()
        #: Broker name -> until when (clock.monotonic) keyless sends pass over it.
        self._failed_brokers: dict[str, float] = {}
        self._refreshed: dict[str, float] = {}
        self._accumulator: Accumulator | None = None
        self._spool: Spool | None = None
        self._spool_task: asyncio.Task[None] | None = None
        self._spool_holds = _SpoolHolds()
        self._admission = asyncio.Lock()
        self._accepting = 0  # sends on their way into the accumulator
        self._state = "new"

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Open the spool (re-delivering what it still holds); connections open on use."""
        if self._state != "new":
            raise ClientStateError(f"producer cannot start: it is {self._state}")
        if self.config.accumulator is not None:
            self._accumulator = Accumulator(
                self.config.accumulator,
                self._request_parts,
                self._retry_part,
                self._clock,
                self._transport.max_send_bytes,
            )
        if self.config.spool_dir is not None:
            self._spool = Spool(self.config.spool_dir)
            try:
                await asyncio.to_thread(self._spool.open)
            # A path no spool can be kept at; a failing disk's errors stay what they are.
            except (FileExistsError, NotADirectoryError, PermissionError) as exc:
                raise InvalidArgumentError(
                    f"spool_dir {str(self.config.spool_dir)!r}: the spool cannot be kept "
                    f"there: {exc}"
                ) from exc
            self._spool.start()
            if self._spool.recovered:
                log.info("spool: %d messages to deliver from an earlier run", self._spool.recovered)
            self._spool_task = asyncio.create_task(self._deliver_spool(), name="spool-delivery")
        self._state = "running"

    async def shutdown(self) -> None:
        """Send what is buffered, give the spool `send_timeout` to drain, close."""
        if self._state != "running":
            self._state = "shut down"
            return
        self._state = "stopping"
        if self._accumulator is not None:
            await self._accumulator.close()
        if self._spool is not None:
            try:
                await self.flush(self.config.send_timeout)
            except TimeoutError as exc:
                log.warning("spool: %s; they stay in %s for the next start", exc, self._spool.path)
            if self._spool_task is not None:
                self._spool_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._spool_task
            await self._spool.close()
        self._state = "shut down"
        await self._transport.close()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until everything accepted has reached the broker.

        TimeoutError if not, naming what holds the spool back.
        """

        def waiting() -> int:
            return (
                self._accepting
                + (self._accumulator.pending if self._accumulator is not None else 0)
                + (self._spool.pending if self._spool is not None else 0)
            )

        async def drained() -> None:
            # One turn of the loop first, as wait_for's task of old gave: send() tasks the
            # caller created just before flush() have not run yet, and are not counted.
            await asyncio.sleep(0)
            while waiting():
                await asyncio.sleep(FLUSH_POLL_SECONDS)
            # The count drops as the senders' futures are set, before the tasks awaiting
            # them run: one more turn, and every caller has its result when flush returns.
            await asyncio.sleep(0)

        if timeout is not None and not timeout >= 0:  # NaN too
            raise InvalidArgumentError(
                f"flush timeout must be a number of seconds >= 0 (or None), not {timeout}"
            )
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a
            # cancellation of the caller that arrives as the spool drains.
            async with asyncio.timeout(timeout):
                await drained()
        except TimeoutError:
            if not waiting():  # all there by the deadline (a timeout of 0 with nothing sent)
                return
            text = f"{waiting()} accepted message(s) did not reach the broker within {timeout}s"
            if self._spool_holds.causes:
                text += f"; the spool holds back {self._spool_holds}"
            raise TimeoutError(text) from None

    def _check_running(self) -> None:
        if self._state != "running":
            raise ClientStateError(f"producer is {self._state}; call start() first")

    # ------------------------------------------------------------------ routes
    def _route_fresh(self, topic: str) -> bool:
        """Whether the topic's route was looked up and is not due for a refresh."""
        last = self._refreshed.get(topic)
        return last is not None and self._clock.now() - last < self.config.route_refresh_interval

    async def writable_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues sorted by (broker, queue id); refreshed periodically."""
        now = self._clock.now()
        last = self._refreshed.get(topic)
        if last is not None and now - last >= self.config.route_refresh_interval:
            queues = await self._transport.writable_queues(topic, refresh=True)
            self._refreshed[topic] = now
            return queues
        queues = await self._transport.writable_queues(topic)
        if last is None:
            self._refreshed[topic] = now
        return queues

    async def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        """The queues `send` chooses among for `topic`."""
        self._check_running()
        check_topic(topic)
        return list(await self.writable_queues(topic))

    # ------------------------------------------------------------------ send
    async def send(
        self,
        message: Message,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message and return where it was stored (or that it was spooled)."""
        self._check_running()
        check_message(message, "send()")
        msg_id = self._ids.next()
        if tracing.enabled():
            span, carrier = tracing.start_send_span(message.topic, msg_id.hex().upper())
            try:
                return await self._started(message, msg_id, carrier, selector, arg, timeout)
            except BaseException as exc:
                span.record_exception(exc)
                raise
            finally:
                span.end()
        return await self._started(message, msg_id, None, selector, arg, timeout)

    def send_started(
        self,
        message: Message,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> Awaitable[SendResult]:
        """send(), begun at once on the loop: what gives its result.

        For the blocking producer, whose threads wait on what this returns: a send the
        accumulator admits at once returns the buffered message's future, which needs no
        task to wait on; the others a coroutine to run. Raises what send() raises before
        its first wait (a stopped producer, a message that fails validation).
        """
        if tracing.enabled():
            return self.send(message, selector=selector, arg=arg, timeout=timeout)
        self._check_running()
        check_message(message, "send()")
        return self._started(message, self._ids.next(), None, selector, arg, timeout)

    def _started(
        self,
        message: Message,
        msg_id: bytes,
        carrier: dict[str, str] | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        timeout: float | None,
    ) -> Awaitable[SendResult]:
        """The send begun: handed to the accumulator where it goes there, else a coroutine."""
        accumulator = self._accumulator
        if (
            accumulator is None
            or self._spool is not None
            or timeout is not None
            or _delayed(message)
        ):
            return self._send_one(message, msg_id, carrier, selector, arg, timeout)
        try:
            prepared = self._prepare(message, msg_id, self._clock.now(), carrier)
        except ENCODING_FAILURES:
            recheck_message(message, "send()")
            raise
        return self._accumulate(accumulator, message, prepared, msg_id, selector, arg)

    async def _send_one(
        self,
        message: Message,
        msg_id: bytes,
        carrier: dict[str, str] | None,
        selector: MessageQueueSelector | None,
        arg: Any,
        timeout: float | None,
    ) -> SendResult:
        """A send spooled, or sent as a request of its own (no accumulator, a deadline)."""
        now = self._clock.now()
        spooling = self._spool is not None
        if spooling and selector is not None:
            raise InvalidArgumentError("a spooling producer routes by sharding key only")
        encode = spool_frame if spooling else self._prepare
        try:
            prepared = encode(message, msg_id, now, carrier)
        except ENCODING_FAILURES:
            recheck_message(message, "send()")
            raise
        if spooling:
            return (await self._spool_messages([message], [prepared], [msg_id]))[0]
        queues = await self.writable_queues(message.topic)
        queue = self._select(queues, message, selector, arg)
        movable = selector is None and message.sharding_key is None
        return (await self._send_batch(queue, [prepared], [msg_id], timeout, movable))[0]

    def _accumulate(
        self,
        accumulator: Accumulator,
        message: Message,
        prepared: bytes,
        msg_id: bytes,
        selector: MessageQueueSelector | None,
        arg: Any,
    ) -> Awaitable[SendResult]:
        """Hand the message to the accumulator; what gives its result.

        Admission is in call order, so that the per-queue buffers see messages in the
        order the caller sent them. Usually it waits for nothing (the route known, room
        in the buffer, no earlier send still being admitted) and is done here, in order
        as it is; else the coroutine returned takes the admission lock (asyncio locks
        are FIFO), counted among the sends being admitted from now on, so that no later
        send overtakes it.
        """
        ticket = accumulator.ticket()
        topic = message.topic
        admitted = None
        try:
            if not self._accepting and self._route_fresh(topic):
                queues = self._transport.known_writable_queues(topic)
                if queues is not None:
                    admitted = self._admit(
                        accumulator, queues, message, prepared, msg_id, ticket, selector, arg
                    )
                    if admitted[2] is not None:
                        return admitted[2]
        except EarlierSendFailedError:
            raise
        except OrderMQError as exc:  # the sends waiting behind this one must fail too
            accumulator.hold(topic, exc)
            raise
        self._accepting += 1
        return self._accumulate_in_turn(
            accumulator, message, prepared, msg_id, ticket, selector, arg, admitted
        )

    async def _accumulate_in_turn(
        self,
        accumulator: Accumulator,
        message: Message,
        prepared: bytes,
        msg_id: bytes,
        ticket: int,
        selector: MessageQueueSelector | None,
        arg: Any,
        admitted: tuple[MessageQueue, bool, Awaitable[SendResult] | None] | None,
    ) -> SendResult:
        """The rest of _accumulate under the admission lock; counted in `_accepting`."""
        topic = message.topic
        try:
            try:
                async with self._admission:
                    if admitted is None:  # its queue is chosen once, whatever the path
                        queues = await self.writable_queues(topic)
                        admitted = self._admit(
                            accumulator, queues, message, prepared, msg_id, ticket, selector, arg
                        )
                    queue, movable, waiter = admitted
                    if waiter is None:  # no room in the buffer: wait for it
                        waiter = await accumulator.enqueue(queue, prepared, msg_id, ticket, movable)
            finally:
                self._accepting -= 1
        except EarlierSendFailedError:
            raise
        except OrderMQError as exc:
            accumulator.hold(topic, exc)
            raise
        return await waiter

    def _admit(
        self,
        accumulator: Accumulator,
        queues: list[MessageQueue],
        message: Message,
        prepared: bytes,
        msg_id: bytes,
        ticket: int,
        selector: MessageQueueSelector | None,
        arg: Any,
    ) -> tuple[MessageQueue, bool, Awaitable[SendResult] | None]:
        """Choose the message's queue and hand the message over, without waiting.

        The queue, whether the message may move (keyless), and what gives its result:
        a request of its own sent in the caller's task (an idle producer: no hand-off to
        the accumulator's tasks), or the buffered message's future; None when the
        buffer has no room.
        """
        queue = self._select(queues, message, selector, arg)
        movable = selector is None and message.sharding_key is None
        claimed = accumulator.claim(queue, prepared, msg_id, ticket, movable)
        if claimed is not None:
            return queue, movable, accumulator.send_claimed(queue, claimed)
        return queue, movable, accumulator.enqueue_now(queue, prepared, msg_id, ticket, movable)

    async def send_batch(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[SendResult]:
        """Send many messages, in one request for all queues where the wire allows.

        Results follow the input order. Keyed messages go to their key's queue; the
        keyless ones of the batch share one queue chosen round robin.
        """
        self._check_running()
        if not messages:
            raise InvalidArgumentError("send_batch needs at least one message")
        ids = self._ids.take(len(messages))
        now = self._clock.now()
        # A spooling producer keeps messages in the spool's layout; they are prepared
        # for the transport when the spool delivers them.
        encode = spool_frame if self._spool is not None else self._prepare
        spans: list[Any] = []
        try:
            try:
                if tracing.enabled():
                    encoded = []
                    for m, msg_id in zip(messages, ids, strict=True):
                        span, carrier = tracing.start_send_span(m.topic, msg_id.hex().upper())
                        spans.append(span)
                        encoded.append(encode(m, msg_id, now, carrier))
                elif self._spool is not None:
                    encoded = [encode(m, ids[i], now) for i, m in enumerate(messages)]
                else:
                    encoded = self._transport.prepare_many(messages, ids, now)
            except ENCODING_FAILURES:
                # What is not a Message, or one with a field set to a bad value after it
                # was made, is named here, off the path of every good batch.
                for i, m in enumerate(messages):
                    recheck_message(m, f"send_batch() (message {i})")
                raise
            if self._spool is not None:
                return await self._spool_messages(list(messages), encoded, ids)
            return await self._send_prepared(messages, encoded, ids, timeout)
        finally:
            for span in spans:
                span.end()

    async def _send_prepared(
        self,
        messages: Sequence[Message],
        prepared: list[bytes],
        ids: list[bytes],
        timeout: float | None,
    ) -> list[SendResult]:
        # Keyed by (topic, queue index, delayed): a MessageQueue's dataclass __hash__ would
        # run in Python for every message.
        groups: dict[tuple[str, int, bool], list[int]] = {}
        keyless: dict[str, int] = {}
        lead = messages[0].topic
        by_topic: dict[str, list[MessageQueue]] = {lead: await self.writable_queues(lead)}
        # The usual batch (one topic's keyed messages, due now) is grouped in C.
        grouped = (
            _shard_groups_in_c(messages, lead, len(by_topic[lead]))
            if _shard_groups_in_c is not None
            else None
        )
        if grouped is not None:
            groups = {(lead, index, False): indexes for index, indexes in grouped.items()}
        for i, m in enumerate(messages if grouped is None else ()):
            topic = m.topic
            queues = by_topic.get(topic)
            if queues is None:
                queues = by_topic[topic] = await self.writable_queues(topic)
            key = m.sharding_key
            if key is not None:
                index = shard_index(key, len(queues))
            else:
                index = keyless.get(topic, -1)
                if index < 0:
                    index = keyless[topic] = queues.index(self._keyless(queues, m))
            group = (topic, index, m.delay_seconds is not None or m.deliver_at is not None)
            indexes = groups.get(group)
            if indexes is None:
                indexes = groups[group] = []
            indexes.append(i)
        limit = self._transport.max_send_bytes
        # Within the limit whole (the usual batch): one chunk per queue, summed in one pass.
        whole = sum(map(len, prepared)) <= limit
        plan: list[tuple[MessageQueue, list[list[int]], bool]] = []
        for group, indexes in groups.items():
            queue = by_topic[group[0]][group[1]]
            # Only a group on its topic's keyless queue may be all keyless: look there only.
            movable = keyless.get(group[0]) == group[1] and all(
                messages[i].sharding_key is None for i in indexes
            )
            chunks = [indexes] if whole else _chunks_by_size(indexes, prepared, limit)
            if len(groups) == 1 and len(chunks) == 1:  # one request, results in input order
                return await self._send_batch(queue, prepared, ids, timeout, movable)
            plan.append((queue, chunks, movable))
        firsts = await self._send_first_chunks(plan, prepared, ids, timeout, whole)
        # A queue whose one chunk went out with the others and got a final answer needs
        # nothing more: only the queues with requests left (or a retry) run, side by side.
        outcomes: list[list[tuple[list[int], list[SendResult] | OrderMQError]] | BaseException]
        outcomes = [[] for _ in plan]
        rest: dict[int, Coroutine[Any, Any, Any]] = {}
        for n, ((queue, chunks, movable), first) in enumerate(zip(plan, firsts, strict=True)):
            if len(chunks) == 1 and first is not None and _final(first):
                outcomes[n] = [(chunks[0], first)]
            else:
                rest[n] = self._send_in_order(queue, chunks, prepared, ids, timeout, movable, first)
        if rest:
            done = await asyncio.gather(*rest.values(), return_exceptions=True)
            for n, outcome in zip(rest, done, strict=True):
                outcomes[n] = outcome
        results: list[SendResult | None] = [None] * len(messages)
        errors: list[OrderMQError] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            for chunk, sent in outcome:
                if isinstance(sent, OrderMQError):
                    errors.append(sent)
                    continue
                _put_at(results, chunk, sent)
        if errors:
            if all(r is None for r in results):
                raise errors[0]
            raise PartialBatchError(results, errors)
        return cast(list[SendResult], results)  # every message has its result

    async def _send_in_order(
        self,
        queue: MessageQueue,
        chunks: list[list[int]],
        prepared: list[bytes],
        ids: list[bytes],
        timeout: float | None,
        movable: bool,
        first: list[SendResult] | OrderMQError | None = None,
    ) -> list[tuple[list[int], list[SendResult] | OrderMQError]]:
        """One queue's requests, one after another; each chunk's results or failure.

        `first`: what became of the first chunk, sent already with other queues' (None:
        not sent yet); a retriable failure of it is retried here, that request counted as
        its first attempt.
        After a keyed request fails, the later ones are not sent (EarlierSendFailedError):
        they would be stored ahead of the failed messages. Keyless chunks (`movable`) each
        go to the queue the chunk before was stored on, which a retry may have changed.
        """
        outcomes: list[tuple[list[int], list[SendResult] | OrderMQError]] = []
        failure: OrderMQError | None = None
        for n, chunk in enumerate(chunks):
            if failure is not None:
                outcomes.append((chunk, EarlierSendFailedError(describe(queue), failure)))
                continue
            if n == 0 and first is not None and _final(first):
                outcomes.append((chunk, first))
                if isinstance(first, OrderMQError) and not movable and holds_back(first):
                    failure = first
                continue
            # A retriable failure in the shared request: that was this chunk's first attempt.
            tried = first if n == 0 and isinstance(first, OrderMQError) else None
            try:
                sent = await self._send_batch(
                    queue,
                    _pick(prepared, chunk),
                    _pick(ids, chunk),
                    timeout,
                    movable,
                    failure=tried,
                )
            except OrderMQError as exc:
                outcomes.append((chunk, exc))
                if not movable and holds_back(exc):
                    failure = exc
                continue
            outcomes.append((chunk, sent))
            if movable and sent:  # a retry moved it: the later chunks follow, not the dead queue
                queue = sent[-1].queue
        return outcomes

    async def cancel(self, msg_id: str) -> bool:
        """Cancel a scheduled message; False if it was already delivered."""
        self._check_running()
        return await self._transport.cancel_scheduled(msg_id)

    def _select(
        self,
        queues: list[MessageQueue],
        message: Message,
        selector: MessageQueueSelector | None,
        arg: Any,
    ) -> MessageQueue:
        if selector is not None:
            queue = selector(queues, message, arg)
            if queue not in queues:
                raise InvalidArgumentError(f"the selector chose {queue!r}, not a writable queue")
            return queue
        if message.sharding_key is not None:
            return queues[shard_index(message.sharding_key, len(queues))]
        return self._keyless(queues, message)

    def _keyless(self, queues: list[MessageQueue], message: Message) -> MessageQueue:
        """The next queue in turn, passing over brokers a keyless send just failed on.

        Each failure would cost an attempt, a backoff and a route refresh; the brokers are
        avoided for AVOID_FAILED_BROKER_SECONDS (all of them failed: none is).
        """
        if self._failed_brokers:
            now = self._clock.monotonic()
            for name, until in list(self._failed_brokers.items()):
                if until <= now:
                    del self._failed_brokers[name]
            usable = [q for q in queues if q.broker_name not in self._failed_brokers]
            if usable and len(usable) < len(queues):
                return self._round_robin(usable, message, None)
        return self._round_robin(queues, message, None)

    async def _send_first_chunks(
        self,
        plan: list[tuple[MessageQueue, list[list[int]], bool]],
        prepared: list[bytes],
        ids: list[bytes],
        timeout: float | None,
        whole: bool = False,
    ) -> list[list[SendResult] | OrderMQError | None]:
        """Send every queue's first chunk together, in as few requests as the wire takes.

        A batch over several queues is then one request (or a few, each within
        `max_send_bytes`) instead of one per queue; later chunks of a queue, and retries
        of a failed first one, go on alone (`_send_in_order`). Each queue's outcome.
        `whole`: the batch is within `max_send_bytes`, so it is one request.
        """
        if len(plan) < 2:
            return [None] * len(plan)
        deadline = timeout if timeout is not None else self.config.send_timeout
        if whole:  # the usual batch: one request, awaited here (no task to gather)
            return list(await self._request_parts(_first_parts(plan, prepared, ids), deadline))
        limit = self._transport.max_send_bytes
        requests: list[list[int]] = [[]]  # indexes into plan
        size = 0
        for n, (_, chunks, _) in enumerate(plan):
            chunk_bytes = sum(len(prepared[i]) for i in chunks[0])
            if requests[-1] and size + chunk_bytes > limit:
                requests.append([])
                size = 0
            requests[-1].append(n)
            size += chunk_bytes
        firsts: list[list[SendResult] | OrderMQError | None] = [None] * len(plan)

        async def one_request(members: list[int]) -> None:
            parts = _first_parts([plan[n] for n in members], prepared, ids)
            outcomes = await self._request_parts(parts, deadline)
            for n, outcome in zip(members, outcomes, strict=True):
                firsts[n] = outcome

        await asyncio.gather(*(one_request(members) for members in requests))
        return firsts

    async def _request_parts(
        self, parts: list[Part], timeout: float | None = None
    ) -> list[list[SendResult] | OrderMQError]:
        """One request (Transport.send_parts) for several queues, not retried.

        Each part's results, or the error that refused it (FlushTimeoutError: stored,
        fsync unconfirmed).
        """
        deadline = timeout if timeout is not None else self.config.send_timeout
        started = time.perf_counter()
        answers = await self._send_parts(
            [(queue, prepared) for queue, prepared, _ in parts], deadline
        )
        elapsed = time.perf_counter() - started
        outcomes: list[list[SendResult] | OrderMQError] = []
        for (queue, _, ids), answer in zip(parts, answers, strict=True):
            if isinstance(answer, OrderMQError):
                outcomes.append(answer)
                continue
            metrics.observe_send(queue.topic, elapsed)
            try:
                outcomes.append(_results(queue, answer, ids))
            except FlushTimeoutError as exc:
                outcomes.append(exc)
        return outcomes

    async def _send_parts(
        self, parts: list[SendPart], timeout: float
    ) -> list[Appended | OrderMQError]:
        """Transport.send_parts; a lone part as a plain send, which costs both sides less."""
        if len(parts) > 1:
            return await self._transport.send_parts(parts, timeout=timeout)
        queue, prepared = parts[0]
        try:
            return [await self._transport.send(queue, prepared, timeout=timeout)]
        except ClientStateError:
            raise
        except OrderMQError as exc:
            return [exc]

    async def _retry_part(
        self,
        queue: MessageQueue,
        prepared: list[bytes],
        ids: list[bytes],
        failure: BaseException,
        movable: bool,
    ) -> list[SendResult]:
        """A part of a shared request failed retriably: its other attempts, alone.

        The shared request was its first attempt: the retries follow as for a send of its
        own; `failure` again when no retry is left.
        """
        return await self._send_batch(queue, prepared, ids, movable=movable, failure=failure)

    async def _before_retry(
        self, queue: MessageQueue, movable: bool, failed: set[str]
    ) -> MessageQueue:
        """Refresh the route after a failed attempt on `queue`; the queue to try next.

        A keyed send keeps its queue. A keyless one (`movable`) goes to the next queue on
        a broker not in `failed` (to which the failed one is added), as RocketMQ's does.
        """
        self._refreshed.pop(queue.topic, None)
        with contextlib.suppress(OrderMQError):
            await self._transport.writable_queues(queue.topic, refresh=True)
        if not movable:
            return queue
        failed.add(queue.broker_name)
        self._failed_brokers[queue.broker_name] = (
            self._clock.monotonic() + AVOID_FAILED_BROKER_SECONDS
        )
        return _next_queue(await self._transport.writable_queues(queue.topic), queue, failed)

    async def _send_batch(
        self,
        queue: MessageQueue,
        prepared: list[bytes],
        ids: list[bytes],
        timeout: float | None = None,
        movable: bool = False,
        failure: BaseException | None = None,
    ) -> list[SendResult]:
        """One request for one queue, retried per policy; keyed sends keep their queue.

        `failure`: the first attempt was made already, in a request shared with other
        queues, and failed so: it counts as one of the policy's attempts, and the retries
        (backoff, route refresh, another queue when `movable`) go as after a send's own.
        """
        send = self._transport.send
        deadline = timeout if timeout is not None else self.config.send_timeout
        target = [queue]
        failed: set[str] = set()  # the brokers a keyless attempt failed on so far

        async def attempt(n: int) -> list[SendResult]:
            q = target[0]
            started = time.perf_counter()
            appended = await send(q, prepared, timeout=deadline)
            metrics.observe_send(q.topic, time.perf_counter() - started)
            return _results(q, appended, ids)

        async def before_retry(exc: BaseException) -> None:
            log.info("send to %s failed (%s); retrying", target[0], exc)
            target[0] = await self._before_retry(target[0], movable, failed)

        return await with_retries(
            attempt,
            retry_times=self.config.retry_times,
            backoff=self.config.retry_backoff,
            backoff_max=self.config.retry_backoff_max,
            before_retry=before_retry,
            failure=failure,
        )

    # ------------------------------------------------------------------ spool
    async def _spool_messages(
        self, messages: list[Message], frames: list[bytes], ids: list[bytes]
    ) -> list[SendResult]:
        """Keep messages (`frames`: as spool_frame made them) in the spool, to send later."""
        assert self._spool is not None
        await self._spool.append(
            [(m.topic, m.sharding_key, f) for m, f in zip(messages, frames, strict=True)]
        )
        return [
            SendResult(SendStatus.SPOOLED, msg_id.hex().upper(), MessageQueue(m.topic, "", -1), -1)
            for m, msg_id in zip(messages, ids, strict=True)
        ]

    async def _deliver_spool(self) -> None:
        """Deliver spooled messages in acceptance order per queue, forever."""
        spool = self._spool
        assert spool is not None
        backoff = self.config.retry_backoff or 0.05
        while True:
            batch = spool.take(SPOOL_BATCH)
            if not batch:
                await spool.wait_for_new()
                continue
            try:
                failed = await self._deliver_round(batch)
            except Exception as exc:  # a spool write failed, or a bug: keep the messages
                self._spool_holds.failed("every queue", exc)
                failed = batch
            else:
                self._spool_holds.cleared("every queue")
            if failed:
                spool.give_back(failed)
                await sleep_for(self._clock, backoff)
                backoff = min(backoff * 2, self.config.retry_backoff_max)
            else:
                backoff = self.config.retry_backoff or 0.05

    async def _deliver_round(self, batch: list[Spooled]) -> list[Spooled]:
        """Send one round; the messages that could not be delivered.

        A message goes out only if every earlier one of its queue did: a topic's route is
        read once per round (without one, all its messages wait), and a queue's requests
        go one after another, up to the first that fails.
        """
        routes: dict[str, list[MessageQueue] | None] = {}
        groups: dict[MessageQueue, list[Spooled]] = {}
        held: list[Spooled] = []
        for m in batch:
            if m.topic not in routes:
                routes[m.topic] = await self._spool_route(m.topic)
            queues = routes[m.topic]
            if queues is None:
                held.append(m)
                continue
            if m.sharding_key is not None:
                queue = queues[shard_index(m.sharding_key, len(queues))]
            else:
                queue = queues[m.seq % len(queues)]
            groups.setdefault(queue, []).append(m)
        outcomes = await asyncio.gather(
            *(self._deliver_queue(q, ms) for q, ms in groups.items()), return_exceptions=True
        )
        for outcome in outcomes:  # raised once every queue is done: none still delivers
            if isinstance(outcome, BaseException):
                raise outcome
            held += outcome
        return held

    async def _spool_route(self, topic: str) -> list[MessageQueue] | None:
        """The topic's queues, or None (noted in the holds) when they cannot be read."""
        place = f"topic {topic!r}"
        try:
            queues = await self.writable_queues(topic)
        except OrderMQError as exc:
            self._spool_holds.failed(place, exc)
            return None
        self._spool_holds.cleared(place)
        return queues

    async def _deliver_queue(self, queue: MessageQueue, items: list[Spooled]) -> list[Spooled]:
        """Deliver one queue's messages in order; those a failed request held back."""
        spool = self._spool
        assert spool is not None
        place = describe(queue)
        prepare = self._transport.prepare_spooled
        prepared = [prepare(s.frame) for s in items]
        limit = self._transport.max_send_bytes
        for chunk in _spool_requests(items, prepared, limit):
            try:
                await self._send_batch(
                    queue, _pick(prepared, chunk), [items[i].msg_id for i in chunk]
                )
            except OrderMQError as exc:
                if holds_back(exc):  # else stored, fsync unconfirmed: a resend would duplicate
                    self._spool_holds.failed(place, exc)
                    return items[chunk[0] :]
            await spool.ack([items[i].seq for i in chunk])
        self._spool_holds.cleared(place)
        return []


class _SpoolHolds:
    """What holds spooled messages back, by topic (no route) or queue (delivery fails).

    Logged once per cause, as an error when retrying cannot fix it; flush names them.
    """

    def __init__(self) -> None:
        self.causes: dict[str, Exception] = {}

    def failed(self, place: str, exc: Exception) -> None:
        before = self.causes.get(place)
        self.causes[place] = exc
        if type(before) is type(exc):  # the same trouble as last round: said already
            return
        if is_retriable(exc):
            log.warning("spool: %s: delivery failed (%s); its messages wait, retrying", place, exc)
        else:
            log.error(
                "spool: %s: delivery failed (%s), and retrying will not fix that: its "
                "messages wait until the cause is fixed",
                place,
                exc,
                exc_info=not isinstance(exc, OrderMQError),
            )

    def cleared(self, place: str) -> None:
        if self.causes.pop(place, None) is not None:
            log.info("spool: %s: delivering again", place)

    def __str__(self) -> str:
        return "; ".join(f"{place}: {exc}" for place, exc in self.causes.items())


def _spool_requests(items: list[Spooled], prepared: list[bytes], limit: int) -> list[list[int]]:
    """One queue's spooled messages as requests the broker takes, in order.

    Each is within `limit` bytes, and either all delayed or all for now.
    """
    requests: list[list[int]] = []
    for _, run in itertools.groupby(range(len(items)), lambda i: items[i].deliver_at_ms > 0):
        requests += _chunks_by_size(list(run), prepared, limit)
    return requests


def _name_messages(indexes: list[int], shown: int = 10) -> str:
    """Name messages by index: message 3; messages 3, 7; or the first `shown` of many."""
    if len(indexes) == 1:
        return f"message {indexes[0]}"
    named = ", ".join(map(str, indexes[:shown]))
    if len(indexes) > shown:
        named += f", ... ({len(indexes)} in all)"
    return f"messages {named}"


def _delayed(message: Message) -> bool:
    return message.delay_seconds is not None or message.deliver_at is not None


def _first_parts(
    plan: list[tuple[MessageQueue, list[list[int]], bool]], prepared: list[bytes], ids: list[bytes]
) -> list[Part]:
    """The parts of one request: each planned queue's first chunk, frames and ids."""
    parts: list[Part] = []
    for queue, chunks, _ in plan:
        chunk = chunks[0]
        parts.append((queue, _pick(prepared, chunk), _pick(ids, chunk)))
    return parts


def _final(outcome: list[SendResult] | OrderMQError) -> bool:
    """Whether a part's outcome is its last word: results, or a failure not to retry."""
    return not (isinstance(outcome, OrderMQError) and outcome.retriable)


def _results(queue: MessageQueue, appended: Appended, ids: list[bytes]) -> list[SendResult]:
    """The SendResults of messages `ids` stored as `appended` says; FlushTimeoutError."""
    if not appended.durable:
        raise FlushTimeoutError(
            f"{queue.topic} queue {queue.queue_id}: the broker stored {appended.count} "
            f"message(s) from offset {appended.first_offset} but its sync flush timed "
            f"out; they may not survive a power loss (a resend may duplicate them)",
            code="OK",
            reason="FLUSH_DISK_TIMEOUT",
        )
    if appended.messages:  # a batch with duplicates: each message's own place
        return [
            SendResult(
                SendStatus.SEND_OK,
                (m.msg_id or msg_id).hex().upper(),
                queue
                if m.queue_id == queue.queue_id
                else dataclasses.replace(queue, queue_id=m.queue_id),
                -1 if appended.scheduled else m.offset,
            )
            for m, msg_id in zip(appended.messages, ids, strict=True)
        ]
    if 0 <= appended.queue_id != queue.queue_id:  # a duplicate of a send to another queue
        queue = dataclasses.replace(queue, queue_id=appended.queue_id)
    if _send_results_in_c is not None:
        first, step = (-1, 0) if appended.scheduled else (appended.first_offset, 1)
        return _send_results_in_c(SendStatus.SEND_OK, ids, queue, first, step)
    offsets = (
        itertools.repeat(-1, len(ids))
        if appended.scheduled
        else range(appended.first_offset, appended.first_offset + len(ids))
    )
    return build_send_results(SendStatus.SEND_OK, ids, queue, offsets)


def _chunks_by_size(indexes: list[int], prepared: list[bytes], limit: int) -> list[list[int]]:
    """Split a queue's messages into requests of at most `limit` bytes each."""
    if sum(map(len, map(prepared.__getitem__, indexes))) <= limit:
        return [indexes]
    chunks: list[list[int]] = [[]]
    size = 0
    for i in indexes:
        n = len(prepared[i])
        if chunks[-1] and size + n > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(i)
        size += n
    return chunks


def _next_queue(
    queues: Sequence[MessageQueue], after: MessageQueue, failed: set[str]
) -> MessageQueue:
    """The queue a keyless send retries on: the next after `after` not on a failed broker.

    RocketMQ's producer avoids the broker that just failed too; when every broker failed,
    the next queue in turn.
    """
    start = queues.index(after) + 1 if after in queues else 0
    turn = [queues[(start + i) % len(queues)] for i in range(len(queues))]
    return next((q for q in turn if q.broker_name not in failed), turn[0])
