"""The push consumer's async core, shared by sdk.PushConsumer and sdk.aio.PushConsumer.

Background work, all on one event loop:
- heartbeats to every broker, and a membership watch that triggers rebalances;
- the rebalancer (at start, periodically, on membership change);
- one long-polling pull loop per held queue, with per-queue flow control;
- orderly: lock renewal of every held queue; the orderly consume service;
  concurrent: the concurrent consume service, which also consumes the retry topic;
- periodic offset persistence.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from sdk._transport.broker_client import GroupInfo, PullStatus
from sdk._transport.cluster import Cluster
from sdk._validation import check_group, check_topic
from sdk.clock import Clock, SystemClock, sleep_for
from sdk.consumer.allocate import AllocateMessageQueueAveragely, AllocateMessageQueueStrategy
from sdk.consumer.config import ConsumeFromWhere, MessageModel, PushConsumerConfig
from sdk.consumer.consume_concurrently import ConsumeConcurrentlyService
from sdk.consumer.consume_orderly import ConsumeOrderlyService
from sdk.consumer.listener import MessageListenerConcurrently, MessageListenerOrderly
from sdk.consumer.offset_store import RemoteOffsetStore
from sdk.consumer.process_queue import ProcessQueue
from sdk.consumer.rebalance import Rebalancer
from sdk.errors import ClientStateError, InvalidArgumentError, OrderMQError
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.consumer")

RETRY_PREFIX = "%RETRY%"
#: RocketMQ: drop a queue even without its consume lock after trying this long.
FORCE_RELEASE_AFTER = 20.0
#: RocketMQ: how long rebalance tries for a queue's consume lock before it gives up.
CONSUME_LOCK_WAIT = 0.5
#: Rebalance again this soon after a round that could not finish.
REBALANCE_RETRY = 0.5
FIRST_LOCK_RENEWAL = 1.0

QueueHook = Callable[[list[MessageQueue]], Awaitable[None] | None]


def new_client_id() -> str:
    """host@pid@random: unique per client instance."""
    return f"{socket.gethostname()}@{os.getpid()}@{uuid.uuid4().hex[:8]}"


def parse_expression(expression: str) -> str:
    """Check a tag expression ('*' or 'A || B'); InvalidTagExpressionError if malformed."""
    from sdk.errors import InvalidTagExpressionError

    text = expression.strip()
    if text in ("", "*"):
        return "*"
    tags = [t.strip() for t in text.split("||")]
    if any(not t or "*" in t for t in tags):
        raise InvalidTagExpressionError(
            f"tag expression {expression!r} must be '*' or tags joined by '||'"
        )
    return " || ".join(tags)


class PushConsumerCore:
    """Subscriptions, rebalance, pulls, locks, offsets and the consume service."""

    def __init__(
        self,
        group: str,
        endpoints: str | list[str],
        *,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: datetime | float | None = None,
        allocate_strategy: AllocateMessageQueueStrategy | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        config: PushConsumerConfig | None = None,
        on_queues_assigned: QueueHook | None = None,
        on_queues_revoked: QueueHook | None = None,
        clock: Clock | None = None,
        client_id: str | None = None,
    ) -> None:
        self.group = check_group(group)
        self._cluster = Cluster(endpoints)
        if not isinstance(consume_from_where, ConsumeFromWhere):
            raise InvalidArgumentError("consume_from_where must be a ConsumeFromWhere")
        if consume_from_where is ConsumeFromWhere.TIMESTAMP and consume_timestamp is None:
            raise InvalidArgumentError("ConsumeFromWhere.TIMESTAMP needs consume_timestamp")
        if message_model is MessageModel.BROADCASTING:
            raise InvalidArgumentError("broadcasting consumers are not supported yet")
        self._from_where = consume_from_where
        if isinstance(consume_timestamp, datetime):
            consume_timestamp = consume_timestamp.timestamp()
        self._from_timestamp = consume_timestamp
        self._strategy = allocate_strategy or AllocateMessageQueueAveragely()
        self.config = config or PushConsumerConfig()
        self._on_assigned = on_queues_assigned
        self._on_revoked = on_queues_revoked
        self._clock: Clock = clock or SystemClock()
        self.client_id = client_id or new_client_id()
        self._subscriptions: dict[str, str] = {}
        self._listener: MessageListenerOrderly | MessageListenerConcurrently | None = None
        self._state = "new"
        self._queues: dict[MessageQueue, ProcessQueue] = {}
        self._pulls: dict[MessageQueue, asyncio.Task[None]] = {}
        self._releasing_since: dict[MessageQueue, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._rebalance_now = asyncio.Event()
        self.offsets = RemoteOffsetStore(self._cluster, self.group, self.client_id)
        self._rebalancer = Rebalancer(
            self._cluster, self.group, self.client_id, self._strategy, self
        )
        self._executor: ThreadPoolExecutor | None = None
        self._service: ConsumeOrderlyService | ConsumeConcurrentlyService | None = None

    # ------------------------------------------------------------------ setup
    @property
    def orderly(self) -> bool:
        """True with an orderly listener."""
        return isinstance(self._listener, MessageListenerOrderly)

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic`'s messages whose tag matches `expression`."""
        if self._state != "new":
            raise ClientStateError("subscribe() must come before start()")
        self._subscriptions[check_topic(topic)] = parse_expression(expression)

    def register_message_listener(
        self, listener: MessageListenerOrderly | MessageListenerConcurrently
    ) -> None:
        """Set the listener: orderly or concurrent."""
        if self._state != "new":
            raise ClientStateError("register_message_listener() must come before start()")
        if not isinstance(listener, MessageListenerOrderly | MessageListenerConcurrently):
            raise InvalidArgumentError(
                "the listener must be a MessageListenerOrderly or a MessageListenerConcurrently, "
                f"not {type(listener).__name__}"
            )
        self._listener = listener

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Join the group, take queues, start consuming."""
        if self._state != "new":
            raise ClientStateError(f"consumer cannot start: it is {self._state}")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        if not self._subscriptions:
            raise ClientStateError("subscribe to at least one topic before start()")
        self._state = "starting"
        topics = list(self._subscriptions)
        if not self.orderly:
            self._subscriptions[RETRY_PREFIX + self.group] = "*"
        for topic in topics:
            await self._cluster.readable_queues(topic)  # fails fast on an unknown topic
        self._rebalancer.topics = list(self._subscriptions)
        self._executor = ThreadPoolExecutor(
            self.config.consume_threads, thread_name_prefix=f"ordermq-{self.group}"
        )
        if isinstance(self._listener, MessageListenerOrderly):
            self._service = ConsumeOrderlyService(
                self._listener, self, self._executor, self._clock, self.config
            )
        else:
            assert self._listener is not None
            self._service = ConsumeConcurrentlyService(
                self._listener, self, self._executor, self._clock, self.config
            )
        await self._heartbeat()
        self._state = "running"
        self._tasks = [
            asyncio.create_task(self._loop(self._heartbeat, self.config.heartbeat_interval)),
            asyncio.create_task(self._rebalance_loop()),
            asyncio.create_task(self._watch_membership()),
            asyncio.create_task(self._loop(self._persist, self.config.persist_interval)),
        ]
        if self.orderly:
            self._tasks.append(asyncio.create_task(self._lock_renewal_loop()))

    async def shutdown(self) -> None:
        """Stop pulling, let listener calls finish, persist offsets, unlock, leave.

        Listener calls in flight get `config.shutdown_timeout` seconds.
        """
        if self._state in ("new", "shut down"):
            self._state = "shut down"
            return
        self._state = "stopping"
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for pq in self._queues.values():
            pq.dropped = True
        await self._cancel_pulls(list(self._pulls))
        if self._service is not None:
            await self._service.shutdown(self.config.shutdown_timeout)
        held = list(self._queues)
        await self.offsets.persist(held)
        if held:
            await self._call_hook(self._on_revoked, held)
        if self.orderly and held:
            await self._unlock(held)
        for client in self._cluster.brokers():
            with contextlib.suppress(OrderMQError):
                await client.unregister(self.client_id)
        await self._cluster.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
        self._state = "shut down"

    # ------------------------------------------------------------------ rebalance host
    def held(self) -> Collection[MessageQueue]:
        """Queues held now, including ones being released."""
        return list(self._queues)

    async def acquire(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Lock (orderly), find the start offset, and start pulling each queue."""
        epochs: dict[MessageQueue, int] = {}
        if self.orderly:
            epochs = await self._lock(queues)
            queues = [q for q in queues if q in epochs]
        taken: list[MessageQueue] = []
        for queue in queues:
            try:
                offset = await self._start_offset(queue)
            except OrderMQError as exc:
                log.warning("cannot take %s yet: %s", queue, exc)
                continue
            pq = ProcessQueue()
            pq.next_offset = offset
            if queue in epochs:
                pq.locked, pq.lock_epoch, pq.last_lock_time = True, epochs[queue], self._clock.now()
                self.offsets.set_epoch(queue, epochs[queue])
            self.offsets.update(queue, offset, increase_only=False)
            self._queues[queue] = pq
            taken.append(queue)
        if taken:
            await self._call_hook(self._on_assigned, taken)
            for queue in taken:
                self._pulls[queue] = asyncio.create_task(
                    self._pull_loop(queue, self._queues[queue])
                )
        return taken

    async def release(self, queues: list[MessageQueue]) -> list[MessageQueue]:
        """Stop queues; persist their offsets and (orderly) unlock them.

        An orderly queue whose listener call does not end within CONSUME_LOCK_WAIT stays
        held until a later round (forced after FORCE_RELEASE_AFTER).
        """
        now = self._clock.now()
        ready: list[MessageQueue] = []
        for queue in queues:
            pq = self._queues[queue]
            pq.dropped = True
            self._releasing_since.setdefault(queue, now)
            if not self.orderly:
                ready.append(queue)
                continue
            try:
                await asyncio.wait_for(pq.consume_lock.acquire(), CONSUME_LOCK_WAIT)
            except TimeoutError:
                if now - self._releasing_since[queue] < FORCE_RELEASE_AFTER:
                    continue
                log.warning("forcing the release of %s: its listener call is still running", queue)
            else:
                pq.consume_lock.release()
            ready.append(queue)
        if not ready:
            return []
        await self._cancel_pulls(ready)
        await self.offsets.persist(ready)
        await self._call_hook(self._on_revoked, ready)
        if self.orderly:
            await self._unlock(ready)
        for queue in ready:
            self._queues.pop(queue, None)
            self._releasing_since.pop(queue, None)
            self.offsets.remove(queue)
        return ready

    # ------------------------------------------------------------------ orderly host
    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Record the next offset to consume (the consume services call this)."""
        if offset >= 0:
            self.offsets.update(queue, offset)

    async def send_to_dead_letter(self, message: MessageExt, reconsume_times: int) -> bool:
        """Move a message to the group's dead-letter queue."""
        try:
            sent = await self._cluster.client_for(message.queue).send_back(
                self.group,
                message.queue,
                message.queue_offset,
                max_reconsume_times=reconsume_times,
                reconsume_times=reconsume_times,
            )
        except OrderMQError as exc:
            log.warning("could not dead-letter %s: %s", message.msg_id, exc)
            return False
        return sent.dead_letter

    async def send_back(self, message: MessageExt, delay_level: int, max_times: int) -> bool:
        """Return a failed message for a retry through the broker (concurrent consumers)."""
        try:
            await self._cluster.client_for(message.queue).send_back(
                self.group,
                message.queue,
                message.queue_offset,
                delay_level=delay_level,
                max_reconsume_times=max_times,
                reconsume_times=message.reconsume_times,
            )
        except OrderMQError as exc:
            log.warning("could not send %s back for retry: %s", message.msg_id, exc)
            return False
        return True

    async def relock(self, queue: MessageQueue, pq: ProcessQueue) -> bool:
        """Try to lock one queue again now."""
        epochs = await self._lock([queue])
        if queue in epochs:
            await self._apply_lock(queue, pq, epochs[queue])
            return True
        return False

    # ------------------------------------------------------------------ loops
    async def _loop(self, step: Callable[[], Awaitable[None]], every: float) -> None:
        while True:
            await sleep_for(self._clock, every)
            try:
                await step()
            except OrderMQError as exc:
                log.warning("%s failed: %s", step.__name__, exc)

    async def _heartbeat(self) -> None:
        info = GroupInfo(
            self.group,
            "CONSUME_ORDERLY" if self.orderly else "CONSUME_CONCURRENTLY",
            "CLUSTERING",
            tuple(self._subscriptions.items()),
        )
        for client in self._cluster.brokers():
            await client.heartbeat(self.client_id, [info])

    async def _persist(self) -> None:
        await self.offsets.persist(list(self._queues))

    async def _rebalance_loop(self) -> None:
        delay = 0.0
        while True:
            if delay:
                await self._wait_for_rebalance(delay)
            self._rebalance_now.clear()
            complete = await self._rebalancer.rebalance()
            delay = self.config.rebalance_interval if complete else REBALANCE_RETRY

    async def _wait_for_rebalance(self, delay: float) -> None:
        sleeper = asyncio.ensure_future(sleep_for(self._clock, delay))
        trigger = asyncio.ensure_future(self._rebalance_now.wait())
        try:
            await asyncio.wait((sleeper, trigger), return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            trigger.cancel()

    async def _watch_membership(self) -> None:
        known = 0
        while True:
            try:
                client = self._cluster.brokers()[0]
                async for version, _members in client.watch_membership(self.group, known):
                    known = version
                    self._rebalance_now.set()
            except OrderMQError as exc:
                log.debug("membership watch interrupted: %s", exc)
            await sleep_for(self._clock, self.config.pull_error_backoff)

    async def _lock_renewal_loop(self) -> None:
        await sleep_for(self._clock, FIRST_LOCK_RENEWAL)
        while True:
            try:
                await self._renew_locks()
            except OrderMQError as exc:
                log.warning("lock renewal failed: %s", exc)
            await sleep_for(self._clock, self.config.lock_renew_interval)

    async def _renew_locks(self) -> None:
        held = {q: pq for q, pq in self._queues.items() if not pq.dropped}
        if not held:
            return
        epochs = await self._lock(list(held))
        for queue, pq in held.items():
            if queue in epochs:
                await self._apply_lock(queue, pq, epochs[queue])
            elif pq.locked:
                log.warning("lost the lock of %s", queue)
                pq.locked = False

    async def _apply_lock(self, queue: MessageQueue, pq: ProcessQueue, epoch: int) -> None:
        if pq.lock_epoch and epoch != pq.lock_epoch:
            # The lock passed through another owner: what we buffered, and where we
            # were, may be stale. Start again from the committed offset.
            log.warning("%s changed owner while we were away; re-reading its offset", queue)
            async with pq.object_lock:
                pq.clear()
                committed = await self.offsets.fetch(queue)
                if committed is not None:
                    pq.next_offset = committed
                    self.offsets.update(queue, committed, increase_only=False)
        pq.locked, pq.lock_epoch, pq.last_lock_time = True, epoch, self._clock.now()
        self.offsets.set_epoch(queue, epoch)

    # ------------------------------------------------------------------ pulling
    async def _pull_loop(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        config = self.config
        expression = self._subscriptions.get(queue.topic, "*")
        while not pq.dropped:
            if self._over_threshold(pq):
                await sleep_for(self._clock, config.flow_control_backoff)
                continue
            if self.orderly and not pq.locked:
                await sleep_for(self._clock, 1.0)
                continue
            try:
                result = await self._cluster.client_for(queue).pull(
                    self.group,
                    queue,
                    pq.next_offset,
                    max_messages=config.pull_batch_size,
                    max_bytes=config.pull_max_bytes,
                    tag_expression=expression,
                    suspend_timeout=config.pull_suspend,
                    timeout=config.pull_timeout,
                )
            except OrderMQError as exc:
                log.warning("pull of %s failed: %s", queue, exc)
                await sleep_for(self._clock, config.pull_error_backoff)
                continue
            if pq.dropped:
                return
            if result.status is PullStatus.FOUND:
                if queue.topic.startswith(RETRY_PREFIX):
                    _restore_origin(result.messages)
                pq.put(result.messages)
                pq.next_offset = result.next_offset
                assert self._service is not None
                self._service.submit(queue, pq)
            elif result.status is PullStatus.OFFSET_ILLEGAL:
                log.warning(
                    "%s: offset %d is outside [%d, %d]; continuing at %d",
                    queue, pq.next_offset, result.min_offset, result.max_offset, result.next_offset,
                )  # fmt: skip
                pq.next_offset = result.next_offset
                self.offsets.update(queue, result.next_offset, increase_only=False)
            else:
                pq.next_offset = result.next_offset
                if pq.count == 0:  # skipped only non-matching messages: move past them
                    self.offsets.update(queue, result.next_offset)

    def _over_threshold(self, pq: ProcessQueue) -> bool:
        config = self.config
        limit = config.pull_threshold_for_queue
        if config.pull_threshold_for_topic > 0 and self._queues:
            limit = min(limit, max(1, config.pull_threshold_for_topic // len(self._queues)))
        return pq.count >= limit or pq.size >= config.pull_threshold_bytes_for_queue

    async def _cancel_pulls(self, queues: list[MessageQueue]) -> None:
        tasks = [t for q in queues if (t := self._pulls.pop(q, None)) is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------------ helpers
    async def _start_offset(self, queue: MessageQueue) -> int:
        committed = await self.offsets.fetch(queue)
        if committed is not None:
            return committed
        low, high, at_time = await self._cluster.client_for(queue).queue_offsets(
            queue,
            int((self._from_timestamp or 0) * 1000)
            if self._from_where is ConsumeFromWhere.TIMESTAMP
            else 0,
        )
        if (
            queue.topic.startswith(RETRY_PREFIX)
            or self._from_where is ConsumeFromWhere.FIRST_OFFSET
        ):
            return low
        if self._from_where is ConsumeFromWhere.TIMESTAMP:
            return at_time
        return high

    async def _lock(self, queues: list[MessageQueue]) -> dict[MessageQueue, int]:
        by_broker: dict[str, list[MessageQueue]] = {}
        for q in queues:
            by_broker.setdefault(self._cluster.client_for(q).address, []).append(q)
        epochs: dict[MessageQueue, int] = {}
        for address, group in by_broker.items():
            try:
                epochs.update(
                    await self._cluster.client(address).lock_batch(
                        self.group, self.client_id, group
                    )
                )
            except OrderMQError as exc:
                log.warning("locking %d queues at %s failed: %s", len(group), address, exc)
        return epochs

    async def _unlock(self, queues: list[MessageQueue]) -> None:
        by_broker: dict[str, list[MessageQueue]] = {}
        for q in queues:
            by_broker.setdefault(self._cluster.client_for(q).address, []).append(q)
        for address, group in by_broker.items():
            try:
                await self._cluster.client(address).unlock_batch(self.group, self.client_id, group)
            except OrderMQError as exc:
                log.warning("unlocking %d queues at %s failed: %s", len(group), address, exc)

    async def _call_hook(self, hook: QueueHook | None, queues: list[MessageQueue]) -> None:
        if hook is None:
            return
        try:
            result: Any = hook(sorted(queues))
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("rebalance hook %s raised", getattr(hook, "__name__", hook))


def _restore_origin(messages: list[MessageExt]) -> None:
    """Messages read from a retry topic show the topic they were first sent to."""
    for m in messages:
        origin = m.properties.get("ORIGIN_TOPIC")
        if origin:
            m.topic = origin
