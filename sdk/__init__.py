"""ordermq: ordered messaging for Python, RocketMQ-style.

Messages with the same sharding key land on the same queue and are read in the order they
were sent; different keys spread over the queues and run in parallel.

The blocking clients are here; their asyncio twins are in `sdk.aio`.
"""

from sdk._blocking import wait_for_shutdown_signal
from sdk._version import __version__ as __version__
from sdk.consumer.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueStrategy,
)
from sdk.consumer.config import (
    ConsumeFromWhere,
    LitePullConsumerConfig,
    MessageModel,
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
from sdk.consumer.lite_pull import LitePullConsumer
from sdk.consumer.push import PushConsumer
from sdk.consumer.simple import KeepInvisible, SimpleConsumer
from sdk.credentials import Credentials
from sdk.errors import OrderMQError
from sdk.message import Message, MessageExt, MessageQueue, Receipt, SendResult, SendStatus
from sdk.producer import EarlierSendFailedError, PartialBatchError, Producer
from sdk.producer.config import AccumulatorConfig, ProducerConfig
from sdk.selector import (
    MessageQueueSelector,
    RoundRobinSelector,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
    shard_index,
)
from sdk.tls import TLSConfig

__all__ = [
    "AccumulatorConfig",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueConsistentHash",
    "AllocateMessageQueueStrategy",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "Credentials",
    "EarlierSendFailedError",
    "KeepInvisible",
    "LitePullConsumer",
    "LitePullConsumerConfig",
    "Message",
    "MessageExt",
    "MessageListenerConcurrently",
    "MessageListenerOrderly",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "OrderMQError",
    "PartialBatchError",
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
    "shard_index",
    "wait_for_shutdown_signal",
]
