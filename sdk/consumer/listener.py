"""What users implement to consume: orderly and concurrent listeners, and their statuses.

A listener may be a plain object whose `consume_message` is a function (it runs on the
consumer's bounded thread pool) or a coroutine function (it runs on the consumer's event
loop; use it with sdk.aio.PushConsumer).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass

from sdk.message import MessageExt, MessageQueue


class ConsumeOrderlyStatus(enum.Enum):
    """What an orderly listener says about a batch (RocketMQ's ConsumeOrderlyStatus)."""

    SUCCESS = "SUCCESS"
    SUSPEND_CURRENT_QUEUE_A_MOMENT = "SUSPEND_CURRENT_QUEUE_A_MOMENT"


class ConsumeConcurrentlyStatus(enum.Enum):
    """What a concurrent listener says about a batch."""

    CONSUME_SUCCESS = "CONSUME_SUCCESS"
    RECONSUME_LATER = "RECONSUME_LATER"


@dataclass
class ConsumeOrderlyContext:
    """Passed to an orderly listener with each batch.

    `suspend_current_queue_time` (seconds) may be changed by the listener to choose how
    long the queue waits before the batch is retried after SUSPEND_CURRENT_QUEUE_A_MOMENT.
    """

    queue: MessageQueue
    suspend_current_queue_time: float


@dataclass
class ConsumeConcurrentlyContext:
    """Passed to a concurrent listener with each batch.

    `delay_level_when_next_consume`: 0 lets the broker choose (3 + reconsume times);
    1-18 picks a RocketMQ delay level for the retry.
    """

    queue: MessageQueue
    delay_level_when_next_consume: int = 0


class MessageListenerOrderly(ABC):
    """Consume each queue's messages one batch at a time, in queue order."""

    @abstractmethod
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeOrderlyContext
    ) -> ConsumeOrderlyStatus | Awaitable[ConsumeOrderlyStatus | None] | None:
        """Process `msgs`; SUCCESS commits them, anything else retries them later."""


class MessageListenerConcurrently(ABC):
    """Consume messages in parallel; failed ones come back later through a retry topic."""

    @abstractmethod
    def consume_message(
        self, msgs: list[MessageExt], context: ConsumeConcurrentlyContext
    ) -> ConsumeConcurrentlyStatus | Awaitable[ConsumeConcurrentlyStatus | None] | None:
        """Process `msgs`; CONSUME_SUCCESS acknowledges them, anything else retries them."""
