"""The asyncio face of ordermq's clients; same core as the blocking ones."""

from sdk.aio.career import Career
from sdk.aio.dedup import DedupCoordinator
from sdk.aio.lite_pull_consumer import LitePullConsumer
from sdk.aio.producer import Producer
from sdk.aio.push_consumer import PushConsumer
from sdk.aio.signals import wait_for_shutdown_signal
from sdk.aio.simple_consumer import SimpleConsumer
from sdk.aio.transaction import TransactionListener, TransactionProducer

__all__ = [
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
