"""The public surface: what `sdk` and `mockbroker` export, and that it is documented."""

from __future__ import annotations

import inspect

import mockbroker
import sdk
import sdk.aio
import sdk.clock
import sdk.errors
import sdk.log
import sdk.metrics
import sdk.testing
import sdk.tracing


def test_sdk_exports_exactly_the_public_names() -> None:
    assert sorted(sdk.__all__) == sorted(
        [
            "AccumulatorConfig", "AllocateMessageQueueAveragely",
            "AllocateMessageQueueAveragelyByCircle",
            "AllocateMessageQueueConsistentHash", "AllocateMessageQueueStrategy",
            "Career", "ConsumeConcurrentlyContext", "ConsumeConcurrentlyStatus", "ConsumeFromWhere",
            "ConsumeOrderlyContext", "ConsumeOrderlyStatus", "Credentials", "DedupCoordinator",
            "EarlierSendFailedError",
            "KeepInvisible", "KeyFailurePolicy", "LitePullConsumer",
            "LitePullConsumerConfig", "Message", "MessageExt",
            "MessageListenerConcurrently", "MessageListenerOrderly", "MessageModel",
            "MessageQueue", "MessageQueueSelector", "OrderMQError", "PartialBatchError",
            "ProcessingOrder",
            "Producer", "ProducerConfig", "PushConsumer", "PushConsumerConfig", "Receipt",
            "RoundRobinSelector",
            "SelectMessageQueueByHash", "SelectMessageQueueByRandom", "SendResult",
            "SendStatus", "SimpleConsumer", "TLSConfig", "shard_index", "wait_for_shutdown_signal",
            "LocalTransactionState", "TransactionListener", "TransactionProducer",
            "TransactionSendResult",
        ]
    )  # fmt: skip
    assert sorted(sdk.aio.__all__) == [
        "Career",
        "DedupCoordinator",
        "LitePullConsumer",
        "Producer",
        "PushConsumer",
        "SimpleConsumer",
        "TransactionListener",
        "TransactionProducer",
        "wait_for_shutdown_signal",
    ]
    assert sorted(mockbroker.__all__) == ["Broker", "BrokerConfig", "EmbeddedBroker", "FlushMode"]


def test_no_generated_protobuf_type_leaks_into_the_public_api() -> None:
    for module in (sdk, sdk.aio, mockbroker):
        for name in module.__all__:
            obj = getattr(module, name)
            assert "_pb" not in getattr(obj, "__module__", ""), name


def test_every_public_name_and_method_has_a_docstring() -> None:
    missing = []
    for module in (sdk, sdk.aio, sdk.errors, sdk.clock, sdk.testing, sdk.log, sdk.metrics,
                   sdk.tracing, mockbroker):  # fmt: skip
        defined_here = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
        names = getattr(module, "__all__", defined_here)
        for name in names:
            obj = getattr(module, name)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            if not obj.__module__.startswith("typing") and not inspect.getdoc(obj):
                missing.append(f"{module.__name__}.{name}")
            if inspect.isclass(obj) and obj.__module__.split(".")[0] in ("sdk", "mockbroker"):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not callable(member):
                        continue
                    if not inspect.getdoc(member):
                        missing.append(f"{module.__name__}.{name}.{attr}")
    assert not missing, missing
