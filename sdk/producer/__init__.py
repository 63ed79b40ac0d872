"""The blocking Producer (the asyncio one is sdk.aio.Producer; both share one core)."""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Sequence
from typing import Any

from sdk._blocking import BlockingClient
from sdk._transport import connect
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.message import Message, MessageQueue, SendResult, check_message
from sdk.producer.config import ProducerConfig
from sdk.producer.core import PartialBatchError, ProducerCore
from sdk.producer.retry import EarlierSendFailedError
from sdk.selector import MessageQueueSelector
from sdk.tls import TLSConfig

log = logging.getLogger("ordermq.producer")

__all__ = ["EarlierSendFailedError", "PartialBatchError", "Producer", "ProducerConfig"]


class Producer(BlockingClient):
    """Send messages; blocking calls, safe to use from many threads.

    Args:
        endpoints: One broker "host:port" or several ("h1:p1;h2:p2" or a list); any of
            them answers route queries.
        group: Producer group name (informational for now).
        config: ProducerConfig: deadlines, retries, accumulator, spool.
        tls: Connect over TLS (sdk.TLSConfig: CA, client certificate, server name);
            None: plain text.
        credentials: The broker's ACL account (sdk.Credentials): every call is
            signed; not over rocketmq:// yet (UnsupportedByTransportError).

    Use it as a context manager, or call start() and shutdown()::

        with Producer("127.0.0.1:8081") as producer:
            producer.send(Message("orders", b"created", sharding_key="order-42"))
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        group: str | None = None,
        config: ProducerConfig | None = None,
        clock: Clock | None = None,
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self._core = ProducerCore(
            connect(endpoints, tls, credentials, clock), group=group, config=config, clock=clock
        )
        super().__init__(self._core, "ordermq-producer")

    def shutdown(self) -> None:
        """Send what is buffered, give a spool time to drain, close the connections."""
        super().shutdown()

    def send(
        self,
        message: Message,
        *,
        selector: MessageQueueSelector | None = None,
        arg: Any = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message; returns once the broker stored it (per its flush mode)."""
        core = self._core
        return self._run_started(
            lambda: core.send_started(message, selector=selector, arg=arg, timeout=timeout)
        )

    def send_batch(
        self, messages: Sequence[Message], *, timeout: float | None = None
    ) -> list[SendResult]:
        """Send many messages; results in input order.

        Over ordermq's gRPC the batch is one request whatever its queues (a few when it
        is larger than a request may be); each queue's messages are stored whole or
        refused whole, in order, its delayed ones apart (they go to the scheduler as a
        part of their own); PartialBatchError, naming the failed messages by index, when
        some were refused. Over rocketmq://, one request per queue (RocketMQ's batches
        are per queue).
        """
        return self._run(self._core.send_batch(messages, timeout=timeout))

    def send_async(
        self, message: Message, *, selector: MessageQueueSelector | None = None, arg: Any = None
    ) -> concurrent.futures.Future[SendResult]:
        """Start a send and return at once; the future resolves to its SendResult.

        Sends started one after another, with send_async or send, keep their order.
        Cancelling the future does not stop a send already begun on the producer's loop.
        """
        core = self._core
        return self._begin(lambda: core.send_started(message, selector=selector, arg=arg))

    def send_oneway(self, message: Message) -> None:
        """Send without waiting for or reporting the outcome (failures are only logged).

        InvalidMessageError, at once, for what is not a Message.
        """
        future = self.send_async(check_message(message, "send_oneway()"))
        future.add_done_callback(_log_oneway_failure)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every accepted message reached the broker (accumulator, spool).

        Raises TimeoutError when `timeout` seconds pass first.
        """
        self._run(self._core.flush(timeout))

    def cancel(self, msg_id: str) -> bool:
        """Cancel a delayed message before it is due; False if it was already delivered.

        Raises MessageNotFoundError for an id no broker scheduled.
        """
        return self._run(self._core.cancel(msg_id))

    def fetch_publish_message_queues(self, topic: str) -> list[MessageQueue]:
        """The queues of `topic` that sends choose among."""
        return self._run(self._core.fetch_publish_message_queues(topic))


def _log_oneway_failure(future: concurrent.futures.Future[SendResult]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("one-way send failed: %s", future.exception())
