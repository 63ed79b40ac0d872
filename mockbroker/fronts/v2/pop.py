"""What the v2 front needs from the pop core: receive with an invisible time, ack, extend.

RocketMQ 5's consumers (SimpleConsumer, PushConsumer) do not read queues by offset: they
*receive* messages, which stay invisible to the rest of their group for a while, and *ack*
each one, or let it come back when its time runs out. That bookkeeping (what is in flight
per group, until when, how often it was delivered, dead letters, FIFO message groups,
durability) is the pop core's (issue 18), not the front's. The front translates requests
into the calls of `PopCore` (receiving.py) and nothing else; until a core is plugged in,
those requests are answered NOT_IMPLEMENTED.

Refusals are BrokerErrors, raised before anything changed. The front answers each with
the v2 code for its reason (status.py): INVALID_RECEIPT_HANDLE and RECEIPT_EXPIRED
(a handle that does not parse, names no message in flight, or whose invisible time has
run out) -> INVALID_RECEIPT_HANDLE; INVALID_INVISIBLE_TIME -> ILLEGAL_INVISIBLE_TIME;
TOPIC_NOT_FOUND, INVALID_GROUP, INVALID_TAG_EXPRESSION as usual; any other
INVALID_ARGUMENT -> BAD_REQUEST.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sdk._wire import StoredRecord


@dataclass(frozen=True, slots=True)
class Popped:
    """One message handed to a consumer, invisible to its group for a while.

    Attributes:
        record: The message as stored. Its `topic` is served as the message's topic:
            for a redelivery kept in a retry topic, give the topic the consumer receives
            from. Its queue id and offset are served as they are.
        receipt_handle: Opaque to the front and the client; names this delivery in ack,
            change_invisible and forward_to_dead_letter. Printable ASCII.
        delivery_attempt: 1 for the first delivery, counting up with each redelivery.
        invisible_seconds: How long the message stays invisible from now.
    """

    record: StoredRecord
    receipt_handle: str
    delivery_attempt: int
    invisible_seconds: float


@dataclass(frozen=True, slots=True)
class GroupPolicy:
    """How a consumer group consumes, told to its clients in their settings.

    Attributes:
        fifo: The group takes a message group's messages one at a time, in order (the
            next only once the one before is acked or dead-lettered).
        max_delivery_attempts: Deliveries before a message goes to `%DLQ%<group>`.
    """

    fifo: bool = False
    max_delivery_attempts: int = 17


#: The policy without a pop core: RocketMQ's defaults (16 retries, so 17 deliveries).
DEFAULT_POLICY = GroupPolicy()


class PopCore(Protocol):
    """Receive, ack, extend and dead-letter messages of a consumer group, by receipt handle."""

    def group_policy(self, group: str) -> GroupPolicy:
        """The group's policy (a group never configured gets the defaults)."""
        ...

    async def receive(
        self,
        *,
        group: str,
        topic: str,
        tags: frozenset[bytes] | None,
        max_messages: int,
        invisible_seconds: float,
        wait_seconds: float,
        attempt_id: str,
        client: str | None = None,
    ) -> Sequence[Popped]:
        """Up to `max_messages` visible messages of `topic` for `group`, now invisible.

        From every queue of the topic (RocketMQ 5's clients name a queue, or -1; the
        Apache proxy pops from the whole broker whichever they name). `tags` filters by
        tag (None: every message). With nothing to hand out, wait up to `wait_seconds`
        for something, then return what there is (maybe nothing). `attempt_id` is the
        same when a client retries a receive whose answer it lost ("" when it sent
        none): a core may answer the retry with the same messages. `client` names the
        connection (fair turns and the in-flight limit, as for pulls; None: neither).
        """
        ...

    async def ack(self, *, group: str, topic: str, receipt_handle: str) -> None:
        """The message is consumed: never delivered to the group again."""
        ...

    async def change_invisible(
        self, *, group: str, topic: str, receipt_handle: str, invisible_seconds: float
    ) -> str:
        """Keep the message invisible for `invisible_seconds` from now; its new handle.

        The old handle is no longer valid (the client keeps the new one). 0 makes it
        visible again at once (a consumer's negative acknowledgement).
        """
        ...

    async def forward_to_dead_letter(self, *, group: str, topic: str, receipt_handle: str) -> None:
        """Move the message to `%DLQ%<group>` now (a FIFO consumer gives up on it)."""
        ...


__all__ = ["DEFAULT_POLICY", "GroupPolicy", "PopCore", "Popped"]
