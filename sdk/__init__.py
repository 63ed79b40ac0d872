"""ordermq: ordered messaging for Python, RocketMQ-style.

Messages with the same sharding key land on the same queue and are read in the order they
were sent; different keys spread over the queues and run in parallel.

The blocking clients are here, DedupCoordinator (one run for many identical
requests) and Career (one holder at a time of a singleton job); their asyncio twins
are in `sdk.aio`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sdk._version import __version__ as __version__
from sdk.consumer.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueStrategy,
)
from sdk.consumer.config import (
    ConsumeFromWhere,
    KeyFailurePolicy,
    LitePullConsumerConfig,
    MessageModel,
    ProcessingOrder,
    PushConsumerConfig,
)
from sdk.consumer.listener import (
    ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext,
    ConsumeOrderlyStatus,
    MessageListenerConcurrently,
    MessageListenerOrderly,
)
from sdk.credentials import Credentials
from sdk.errors import OrderMQError
from sdk.message import Message, MessageExt, MessageQueue, Receipt, SendResult, SendStatus
from sdk.selector import (
    MessageQueueSelector,
    RoundRobinSelector,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
    shard_index,
)
from sdk.tls import TLSConfig

if TYPE_CHECKING:
    from sdk._blocking import wait_for_shutdown_signal
    from sdk._transaction import LocalTransactionState, TransactionSendResult
    from sdk.career import Career
    from sdk.consumer.lite_pull import LitePullConsumer
    from sdk.consumer.push import PushConsumer
    from sdk.consumer.simple import KeepInvisible, SimpleConsumer
    from sdk.dedup import DedupCoordinator
    from sdk.producer import EarlierSendFailedError, PartialBatchError, Producer
    from sdk.producer.config import AccumulatorConfig, ProducerConfig
    from sdk.transaction import TransactionListener, TransactionProducer

#: The clients, imported on first use: the broker imports sdk's wire modules without them
#: (a third of its start-up time), and so does a process that only reads messages' types.
_LAZY = {
    "wait_for_shutdown_signal": "sdk._blocking",
    "LitePullConsumer": "sdk.consumer.lite_pull",
    "PushConsumer": "sdk.consumer.push",
    "KeepInvisible": "sdk.consumer.simple",
    "SimpleConsumer": "sdk.consumer.simple",
    "Career": "sdk.career",
    "DedupCoordinator": "sdk.dedup",
    "EarlierSendFailedError": "sdk.producer",
    "PartialBatchError": "sdk.producer",
    "Producer": "sdk.producer",
    # Its package's __init__ is the Producer: importing the config imports the client.
    "AccumulatorConfig": "sdk.producer.config",
    "ProducerConfig": "sdk.producer.config",
    "TransactionListener": "sdk.transaction",
    "TransactionProducer": "sdk.transaction",
    "LocalTransactionState": "sdk._transaction",
    "TransactionSendResult": "sdk._transaction",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'sdk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AccumulatorConfig",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueConsistentHash",
    "AllocateMessageQueueStrategy",
    "Career",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "Credentials",
    "DedupCoordinator",
    "EarlierSendFailedError",
    "KeepInvisible",
    "KeyFailurePolicy",
    "LitePullConsumer",
    "LitePullConsumerConfig",
    "LocalTransactionState",
    "Message",
    "MessageExt",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "OrderMQError",
    "PartialBatchError",
    "ProcessingOrder",
    "Producer",
    "ProducerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "Receipt",
    "RoundRobinSelector",
    "SelectMessageQueueByHash",
    "SelectMessageQueueByRandom",
    "SendResult",
    "SendStatus",
    "SimpleConsumer",
    "TLSConfig",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "shard_index",
    "wait_for_shutdown_signal",
]
