"""sdk.PushConsumer: the blocking face of the push consumer."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sdk._blocking import BlockingClient
from sdk._transport import connect
from sdk.clock import Clock
from sdk.consumer.allocate import AllocateMessageQueueStrategy
from sdk.consumer.config import (
    ConsumeFromWhere,
    MessageModel,
    ProcessingOrder,
    PushConsumerConfig,
)
from sdk.consumer.listener import MessageListenerConcurrently, MessageListenerOrderly
from sdk.consumer.push_core import PushConsumerCore, QueueHook
from sdk.credentials import Credentials
from sdk.tls import TLSConfig


class PushConsumer(BlockingClient):
    """Receive messages through a listener; messages of one queue stay in order.

    Args:
        group: Consumer group; the group's members share the topic's queues.
        endpoints: One broker "host:port" or several ("h1:p1;h2:p2" or a list).
        consume_from_where: Where to start on a queue the group never committed: with
            the default LAST_OFFSET, at its end, or at 0 on a young queue (see
            ConsumeFromWhere).
        consume_timestamp: For ConsumeFromWhere.TIMESTAMP: a datetime or epoch seconds.
        allocate_strategy: How queues are split among members (default: averagely).
        message_model: MessageModel.CLUSTERING (each message to one member), or
            BROADCASTING (every member gets every message; no locks, no retries; each
            member keeps its offsets in `offset_dir`).
        ordering: With an orderly listener: ProcessingOrder.QUEUE (the default,
            RocketMQ's) calls a queue's messages one batch at a time; ProcessingOrder.KEY
            calls each sharding key's messages one batch at a time, different keys of one
            queue side by side (see ProcessingOrder; a message of another key finished
            past the queue's lowest unfinished one may be handled again after a crash).
        config: Thresholds, batch sizes, intervals (PushConsumerConfig).
        on_queues_assigned: Called with the queues taken, after their locks are granted.
        on_queues_revoked: Called with the queues given up, before they are unlocked.
        clock: Time source (sdk.testing.FakeClock in tests).
        tls: Connect over TLS (sdk.TLSConfig: CA, client certificate, server name);
            None: plain text.
        credentials: The broker's ACL account (sdk.Credentials): every call is
            signed; not over rocketmq:// yet (UnsupportedByTransportError).
        offset_dir: Broadcasting: where this member's offsets file lives (default
            ~/.ordermq/offsets/<group>/<instance_name>).
        instance_name: Broadcasting: tells apart members of one group on one host.

    Listeners that are plain functions run on a pool of `config.consume_threads` threads;
    `async def` listeners need sdk.aio.PushConsumer.

    Stopping: shutdown(), or the end of a `with` block, stops pulling, lets listener calls
    in flight finish (up to `config.shutdown_timeout`), commits the offsets, unlocks the
    queues and leaves the group. A consumer still running when its process ends is shut
    down the same way, the last client started first:

    - when the main thread ends: it returned, raised, or got Ctrl+C (KeyboardInterrupt);
    - on SIGTERM, if the program had no SIGTERM handler when the consumer started (on the
      main thread): ordermq's handler shuts the clients down, then the process ends by
      SIGTERM as it would have. A program with its own handler keeps it.

    A second Ctrl+C or SIGTERM during that shutdown ends the process at once. To stop on a
    signal and carry on afterwards, wait for it (`sdk.wait_for_shutdown_signal`).

    A process that dies without shutting down (kill -9, a crash) cannot unlock its queues.
    The broker sees its connection close; when no heartbeat from it follows within the
    broker's `disconnect_grace_seconds` (30 s by default), it removes the client from its
    groups and releases its locks, and the other members take its queues. A paused
    process (SIGSTOP, a debugger) keeps its connection, since it may resume at any
    moment: its queues stay with it until the broker expires it for silence
    (`client_timeout_seconds`, 120 s by default; its locks' lease, 60 s, is over by then).

    Example::

        from sdk import PushConsumer, wait_for_shutdown_signal

        consumer = PushConsumer("billing", "127.0.0.1:8081")
        consumer.subscribe("orders", "paid || refunded")
        consumer.register_message_listener(MyOrderlyListener())
        with consumer:
            wait_for_shutdown_signal()  # until Ctrl+C or SIGTERM
    """

    def __init__(
        self,
        group: str,
        endpoints: str | list[str],
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
        tls: TLSConfig | None = None,
        credentials: Credentials | None = None,
        offset_dir: Path | None = None,
        instance_name: str = "DEFAULT",
    ) -> None:
        self._core = PushConsumerCore(
            group,
            connect(endpoints, tls, credentials, clock),
            consume_from_where=consume_from_where,
            consume_timestamp=consume_timestamp,
            allocate_strategy=allocate_strategy,
            message_model=message_model,
            ordering=ordering,
            config=config,
            on_queues_assigned=on_queues_assigned,
            on_queues_revoked=on_queues_revoked,
            clock=clock,
            offset_dir=offset_dir,
            instance_name=instance_name,
        )
        super().__init__(self._core, f"ordermq-consumer-{group}")

    @property
    def client_id(self) -> str:
        """The member id this consumer has in its group."""
        return self._core.client_id

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Consume `topic`'s messages whose tag matches `expression` ('*' or 'A || B').

        The topic need not exist yet: its queues are taken once a producer creates it.
        """
        self._core.subscribe(topic, expression)

    def register_message_listener(
        self, listener: MessageListenerOrderly | MessageListenerConcurrently
    ) -> None:
        """Set the listener: a MessageListenerOrderly or a MessageListenerConcurrently."""
        self._core.register_message_listener(listener)

    def shutdown(self) -> None:
        """Stop: finish listener calls in flight, persist offsets, unlock, leave."""
        super().shutdown()
