"""The push consumer's async core, shared by sdk.PushConsumer and sdk.aio.PushConsumer.

On top of ConsumerCore: a listener and its consume service (orderly or concurrent), the
thread pool for plain listeners, and the hosts' calls those services make.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from sdk import metrics
from sdk._transport.protocol import Transport
from sdk._validation import RETRY_PREFIX, check_kind
from sdk.clock import Clock
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.consumer.config import (
    ConsumeFromWhere,
    KeyFailurePolicy,
    MessageModel,
    ProcessingOrder,
    PushConsumerConfig,
)
from sdk.consumer.consume_by_key import ConsumeByKeyService
from sdk.consumer.consume_concurrently import ConsumeConcurrentlyService
from sdk.consumer.consume_orderly import ConsumeOrderlyService
from sdk.consumer.core import QueueHook
from sdk.consumer.listener import MessageListenerConcurrently, MessageListenerOrderly
from sdk.consumer.process_queue import ProcessQueue
from sdk.consumer.push_delivery import PushDeliveryCore
from sdk.errors import (
    ClientStateError,
    InvalidArgumentError,
    OrderMQError,
)
from sdk.message import MessageExt, MessageQueue

log = logging.getLogger("ordermq.consumer")

__all__ = ["PushConsumerCore", "QueueHook"]


class PushConsumerCore(PushDeliveryCore):
    """Subscriptions, rebalance, pulls, locks, offsets, and a listener's consume service."""

    def __init__(
        self,
        group: str,
        transport: Transport,
        *,
        consume_from_where: ConsumeFromWhere = ConsumeFromWhere.LAST_OFFSET,
        consume_timestamp: datetime | float | None = None,
        allocate_strategy: AllocateMessageQueueStrategy | None = None,
        message_model: MessageModel = MessageModel.CLUSTERING,
        ordering: ProcessingOrder = ProcessingOrder.QUEUE,
        config: PushConsumerConfig | None = None,
        on_queues_assigned: QueueHook | None = None,
        on_queues_revoked: QueueHook | None = None,
        clock: Clock | None = None,
        offset_dir: Path | None = None,
        instance_name: str = "DEFAULT",
    ) -> None:
        if not isinstance(ordering, ProcessingOrder):
            raise InvalidArgumentError(
                f"ordering must be a ProcessingOrder, not {type(ordering).__name__}"
            )
        self.ordering = ordering
        check_kind(message_model, MessageModel, "message_model")
        self.config = c = check_kind(config, PushConsumerConfig, "config") or PushConsumerConfig()
        if c.key_failure_policy is KeyFailurePolicy.PARK and ordering is not ProcessingOrder.KEY:
            raise InvalidArgumentError(
                "key_failure_policy PARK needs ordering=ProcessingOrder.KEY: in queue mode a "
                "failing message holds its whole queue"
            )
        super().__init__(
            group,
            transport,
            tuning=c,
            threshold_for_all=c.pull_threshold_for_topic,
            locks=False,  # decided by the listener, at registration
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
            on_queues_assigned=on_queues_assigned,
            on_queues_revoked=on_queues_revoked,
            clock=clock,
            broadcasting=message_model is MessageModel.BROADCASTING,
            offset_dir=offset_dir,
            instance_name=instance_name,
        )
        self._listener: MessageListenerOrderly | MessageListenerConcurrently | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._service: (
            ConsumeOrderlyService | ConsumeByKeyService | ConsumeConcurrentlyService | None
        ) = None
        #: Push delivery was asked for and nothing has said it is not served.
        self._push = c.delivery == "push"

    @property
    def orderly(self) -> bool:
        """True with an orderly listener."""
        return isinstance(self._listener, MessageListenerOrderly)

    def register_message_listener(
        self, listener: MessageListenerOrderly | MessageListenerConcurrently
    ) -> None:
        """Set the listener: orderly or concurrent."""
        self._check_new("register_message_listener()")
        if not isinstance(listener, MessageListenerOrderly | MessageListenerConcurrently):
            raise InvalidArgumentError(
                "the listener must be a MessageListenerOrderly or a MessageListenerConcurrently, "
                f"not {type(listener).__name__}"
            )
        if self.ordering is ProcessingOrder.KEY and not isinstance(
            listener, MessageListenerOrderly
        ):
            raise InvalidArgumentError(
                "ordering=ProcessingOrder.KEY needs a MessageListenerOrderly: a concurrent "
                "listener keeps no order to choose"
            )
        self._listener = listener
        self.uses_locks = self.orderly and not self.broadcasting  # members share no queues
        self.consume_type = "CONSUME_ORDERLY" if self.orderly else "CONSUME_CONCURRENTLY"

    async def start(self) -> None:
        """Join the group, take queues, start consuming."""
        if self._state != "new":
            raise ClientStateError(f"consumer cannot start: it is {self._state}")
        if self._listener is None:
            raise ClientStateError("register a message listener before start()")
        if self._subscriptions and not self.orderly and not self.broadcasting:
            self._subscriptions[RETRY_PREFIX + self.group] = "*"
        self._executor = ThreadPoolExecutor(
            self.config.consume_threads, thread_name_prefix=f"ordermq-{self.group}"
        )
        if isinstance(self._listener, MessageListenerOrderly):
            service = (
                ConsumeByKeyService
                if self.ordering is ProcessingOrder.KEY
                else ConsumeOrderlyService
            )
            self._service = service(
                self._listener,
                self,
                self._executor,
                self._clock,
                self.config,
                locks=self.uses_locks,
                group=self.group,
            )
        else:
            self._service = ConsumeConcurrentlyService(
                self._listener, self, self._executor, self._clock, self.config, group=self.group
            )
        try:
            await self._start_core()
        except BaseException:
            self._executor.shutdown(wait=False)
            await self._transport.close()
            self._state = "shut down"
            raise

    async def shutdown(self) -> None:
        """Stop pulling, let listener calls finish, persist offsets, unlock, leave.

        Listener calls in flight get `config.shutdown_timeout` seconds.
        """
        if self._state in ("new", "shut down"):
            self._state = "shut down"
            return
        held = await self._stop_pulling()
        if self._service is not None:
            await self._service.shutdown(self.config.shutdown_timeout)
        await self._leave(held)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ ConsumerCore hooks
    def _deliver(self, queue: MessageQueue, pq: ProcessQueue) -> None:
        assert self._service is not None
        self._service.submit(queue, pq)

    # ------------------------------------------------------------------ service hosts
    def commit(self, queue: MessageQueue, offset: int) -> None:
        """Record the next offset to consume (the consume services call this)."""
        if offset >= 0:
            self.offsets.update(queue, offset)

    async def send_to_dead_letter(self, message: MessageExt, reconsume_times: int) -> bool:
        """Move a message to the group's dead-letter queue."""
        try:
            sent = await self._transport.send_back(
                self.group,
                message,
                max_reconsume_times=reconsume_times,
                reconsume_times=reconsume_times,
            )
        except OrderMQError as exc:
            log.warning("could not dead-letter %s: %s", message.msg_id, exc)
            return False
        if sent.dead_letter:
            metrics.dead_lettered(self.group)
        return sent.dead_letter

    async def park_key(self, message: MessageExt, pq: ProcessQueue, reason: str) -> int | None:
        """Park the message's key at the broker from it on; the offset it is parked through.

        None when that failed (logged): the key is retried and parked again later.
        """
        try:
            through = await self._transport.park_key(
                self.group, self.client_id, message, epoch=pq.lock_epoch, reason=reason
            )
        except OrderMQError as exc:
            log.warning("could not park key %r at %s: %s", message.sharding_key, message.msg_id,
                        exc)  # fmt: skip
            return None
        log.warning("parked key %r of %s from offset %d (through %d): %s", message.sharding_key,
                    message.queue, message.queue_offset, through, reason)  # fmt: skip
        return through

    async def send_back(self, message: MessageExt, delay_level: int, max_times: int) -> bool:
        """Return a failed message for a retry through the broker (concurrent consumers).

        Broadcasting members do not retry (as in RocketMQ): the failure is logged.
        """
        if self.broadcasting:
            log.warning("broadcast message %s failed and is dropped", message.msg_id)
            return True
        try:
            sent = await self._transport.send_back(
                self.group,
                message,
                delay_level=delay_level,
                max_reconsume_times=max_times,
                reconsume_times=message.reconsume_times,
            )
        except OrderMQError as exc:
            log.warning("could not send %s back for retry: %s", message.msg_id, exc)
            return False
        if sent.dead_letter:
            metrics.dead_lettered(self.group)
        else:
            metrics.retried(self.group, 1, local=False)
        return True
