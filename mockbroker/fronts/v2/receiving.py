"""ReceiveMessage, AckMessage, ChangeInvisibleDuration, ForwardMessageToDeadLetterQueue.

Each request is checked, translated into one call (or, for a batch of acks, one call per
entry) of the pop core (pop.py), and its outcome into the v2 answer the clients need:

- ReceiveMessage streams exactly one `status` element (the clients return nothing
  without one), then the messages, then one `delivery_timestamp` element (the Python
  push consumer's metrics fail on a missing one and it never consumes), as the Apache
  proxy writes them. Nothing to hand out within the long poll is MESSAGE_NOT_FOUND,
  which the clients read as an empty receive. Each message carries its receipt handle,
  delivery attempt and invisible duration.
- A push consumer's receive asks for `auto_renew` instead of an invisible duration: its
  messages are invisible for AUTO_RENEW_INVISIBLE_SECONDS (the proxy's renewal slice).
  The proxy then keeps renewing them while the client holds them; this front does not,
  so a push consumer that holds a message longer gets it again.
- The long poll lasts what the request asks, at most MAX_LONG_POLLING_SECONDS and never
  past the call's deadline (less a margin, so the answer arrives in time).
- Acks are answered per entry; the response's status is the entries' common one, else
  MULTIPLE_RESULTS (as the proxy answers a mixed batch).

Without a pop core each request is checked and then answered NOT_IMPLEMENTED.
"""

from __future__ import annotations

from collections.abc import Callable

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker.errors import BrokerError
from mockbroker.fronts.v2.fields import duration_of, group_name, seconds, topic_name
from mockbroker.fronts.v2.messages import from_ms, to_v2
from mockbroker.fronts.v2.pop import PopCore, Popped
from mockbroker.fronts.v2.status import V2Error, ok, status_of
from sdk._remoting.command import RemotingError
from sdk._remoting.subscription import parse_subscription

#: Most messages one receive hands out (RocketMQ's pop takes at most 32 a request).
MAX_RECEIVE_BATCH = 32
#: A push consumer's messages are invisible this long (the proxy's renewal slice).
AUTO_RENEW_INVISIBLE_SECONDS = 60.0
#: Longest long poll; what the settings tell push consumers to ask for.
MAX_LONG_POLLING_SECONDS = 30.0
#: The answer of a long poll leaves this much of the call's deadline for the way back.
DEADLINE_MARGIN_SECONDS = 0.5
NO_POP_CORE = (
    "{what} needs the broker's pop core (receive with an invisible time, ack, redelivery), "
    "which this build does not serve yet; RocketMQ 5 producers work, consume with "
    "ordermq's consumers or the RocketMQ 4 remoting clients meanwhile"
)


class Receiving:
    """The consumer side of RocketMQ 5's API on a pop core (None: not available)."""

    def __init__(
        self,
        core: PopCore | None,
        *,
        store_host: Callable[[], str],
        now_ms: Callable[[], int],
    ) -> None:
        self._core = core
        self._store_host = store_host
        self._now_ms = now_ms

    @property
    def core(self) -> PopCore | None:
        """The pop core requests go to."""
        return self._core

    def _require_core(self, what: str) -> PopCore:
        if self._core is None:
            raise V2Error(v2.NOT_IMPLEMENTED, NO_POP_CORE.format(what=what))
        return self._core

    # ------------------------------------------------------------------ receive
    async def receive(
        self,
        request: svc.ReceiveMessageRequest,
        *,
        time_remaining: float | None,
        client: str | None = None,
    ) -> list[svc.ReceiveMessageResponse]:
        """The stream answering a receive; `time_remaining` is left of the call's deadline.

        `client` names the connection (fair turns and the in-flight limit).
        """
        try:
            popped = await self._receive(request, time_remaining, client)
        except (V2Error, BrokerError) as exc:
            return self._answer(status_of(exc), [])
        if not popped:
            return self._answer(v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message"), [])
        store_host = self._store_host()
        return self._answer(ok(), [self._served(p, store_host) for p in popped])

    async def _receive(
        self,
        request: svc.ReceiveMessageRequest,
        time_remaining: float | None,
        client: str | None = None,
    ) -> list[Popped]:
        group = group_name(request.group)
        topic = topic_name(request.message_queue.topic)
        tags = _tags(request.filter_expression)
        if not 1 <= request.batch_size <= MAX_RECEIVE_BATCH:
            raise V2Error(
                v2.BAD_REQUEST,
                f"batch_size {request.batch_size} is outside 1..{MAX_RECEIVE_BATCH}",
            )
        if request.auto_renew:
            invisible = AUTO_RENEW_INVISIBLE_SECONDS
        elif request.HasField("invisible_duration"):
            invisible = seconds(
                request.invisible_duration, "invisible_duration", v2.ILLEGAL_INVISIBLE_TIME
            )
        else:
            raise V2Error(
                v2.ILLEGAL_INVISIBLE_TIME,
                "a receive without auto_renew needs an invisible_duration",
            )
        wait = MAX_LONG_POLLING_SECONDS
        if request.HasField("long_polling_timeout"):
            wait = min(
                wait,
                seconds(
                    request.long_polling_timeout, "long_polling_timeout", v2.ILLEGAL_POLLING_TIME
                ),
            )
        if time_remaining is not None:
            wait = max(0.0, min(wait, time_remaining - DEADLINE_MARGIN_SECONDS))
        core = self._require_core("ReceiveMessage")
        return list(
            await core.receive(
                group=group,
                topic=topic,
                tags=tags,
                max_messages=request.batch_size,
                invisible_seconds=invisible,
                wait_seconds=wait,
                attempt_id=request.attempt_id,
                client=client,
            )
        )

    def _served(self, popped: Popped, store_host: str) -> v2.Message:
        message = to_v2(popped.record, store_host=store_host)
        sp = message.system_properties
        sp.receipt_handle = popped.receipt_handle
        sp.delivery_attempt = popped.delivery_attempt
        sp.invisible_duration.CopyFrom(duration_of(popped.invisible_seconds))
        return message

    def _answer(
        self, status: v2.Status, messages: list[v2.Message]
    ) -> list[svc.ReceiveMessageResponse]:
        return [
            svc.ReceiveMessageResponse(status=status),
            *(svc.ReceiveMessageResponse(message=m) for m in messages),
            svc.ReceiveMessageResponse(delivery_timestamp=from_ms(self._now_ms())),
        ]

    # ------------------------------------------------------------------ ack
    async def ack(self, request: svc.AckMessageRequest) -> svc.AckMessageResponse:
        """Ack each entry; the response's status is theirs in common, else MULTIPLE_RESULTS."""
        try:
            group = group_name(request.group)
            topic = topic_name(request.topic)
            if not request.entries:
                raise V2Error(v2.BAD_REQUEST, "the ack names no message (entries is empty)")
            core = self._require_core("AckMessage")
        except V2Error as exc:
            return svc.AckMessageResponse(status=exc.status())
        entries = []
        for entry in request.entries:
            try:
                await core.ack(
                    group=group, topic=topic, receipt_handle=_handle(entry.receipt_handle)
                )
                status = ok()
            except (V2Error, BrokerError) as exc:
                status = status_of(exc)
            entries.append(
                svc.AckMessageResultEntry(
                    message_id=entry.message_id, receipt_handle=entry.receipt_handle, status=status
                )
            )
        codes = {e.status.code for e in entries}
        if len(codes) == 1:
            overall = entries[0].status
        else:
            failed = sum(1 for e in entries if e.status.code != v2.OK)
            overall = v2.Status(
                code=v2.MULTIPLE_RESULTS,
                message=f"{failed} of {len(entries)} acks failed; see each entry's status",
            )
        return svc.AckMessageResponse(status=overall, entries=entries)

    # ------------------------------------------------------------------ change, forward
    async def change_invisible(
        self, request: svc.ChangeInvisibleDurationRequest
    ) -> svc.ChangeInvisibleDurationResponse:
        """Extend (or end) a message's invisible time; answers its new receipt handle."""
        try:
            group = group_name(request.group)
            topic = topic_name(request.topic)
            handle = _handle(request.receipt_handle)
            if not request.HasField("invisible_duration"):
                raise V2Error(v2.ILLEGAL_INVISIBLE_TIME, "the request has no invisible_duration")
            invisible = seconds(
                request.invisible_duration, "invisible_duration", v2.ILLEGAL_INVISIBLE_TIME
            )
            core = self._require_core("ChangeInvisibleDuration")
            new_handle = await core.change_invisible(
                group=group, topic=topic, receipt_handle=handle, invisible_seconds=invisible
            )
        except (V2Error, BrokerError) as exc:
            return svc.ChangeInvisibleDurationResponse(status=status_of(exc))
        return svc.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=new_handle)

    async def forward_to_dead_letter(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        """Move a received message to the group's dead-letter topic."""
        try:
            group = group_name(request.group)
            topic = topic_name(request.topic)
            handle = _handle(request.receipt_handle)
            core = self._require_core("ForwardMessageToDeadLetterQueue")
            await core.forward_to_dead_letter(group=group, topic=topic, receipt_handle=handle)
        except (V2Error, BrokerError) as exc:
            return svc.ForwardMessageToDeadLetterQueueResponse(status=status_of(exc))
        return svc.ForwardMessageToDeadLetterQueueResponse(status=ok())


def _handle(receipt_handle: str) -> str:
    if not receipt_handle:
        raise V2Error(v2.INVALID_RECEIPT_HANDLE, "the receipt_handle is empty")
    return receipt_handle


def _tags(expression: v2.FilterExpression) -> frozenset[bytes] | None:
    """The tags a filter expression names (None: every message), as RocketMQ parses them."""
    if expression.type == v2.SQL:
        raise V2Error(
            v2.ILLEGAL_FILTER_EXPRESSION,
            "SQL92 filter expressions are not supported by this broker; filter by tag",
        )
    try:
        return parse_subscription(expression.expression)
    except RemotingError as exc:
        raise V2Error(v2.ILLEGAL_FILTER_EXPRESSION, exc.remark) from None


__all__ = [
    "AUTO_RENEW_INVISIBLE_SECONDS",
    "MAX_LONG_POLLING_SECONDS",
    "MAX_RECEIVE_BATCH",
    "Receiving",
]
