"""apache.rocketmq.v2.MessagingService: what RocketMQ 5's clients call, on ordermq's core.

Routes, heartbeats and sends go to the same objects ordermq's gRPC front uses (topic
registry, ConsumerGroups, mockbroker/delivery.py, the scheduler), so a message sent here
is read over ordermq's gRPC and the remoting front, and the other way round. Receiving is
the pop core's (receiving.py, pop.py).

- QueryRoute: one queue per ordermq queue, READ_WRITE, broker id 0, the v2 listener's
  endpoints, accepting NORMAL, FIFO, DELAY and TRANSACTION (the proxy's MIXED topic: the
  clients refuse to send a type not listed, and a transactional send is better refused
  here with its reason). A missing user topic is created when auto-creation is on (a v2
  client cannot say whether it produces).
- SendMessage: the server picks the queue, as the proxy does (the clients' queue ids are
  ignored): a FIFO message by its message group with ordermq's sharding formula
  (sdk/selector.py: murmur3 of the group modulo the topic's queue count), so that an
  ordermq producer's sharding key and a v2 message group of the same value share a queue
  and its order; other messages in turn. A request's messages are stored together (all
  or nothing) and must share their topic and message group.
- QueryAssignment: the proxy's answer: one assignment of queue -1 (the whole broker) for
  an ordinary group, one per queue for a FIFO one.
- Heartbeat registers a consumer in its group (consume type CONSUME_POP, subscriptions
  from its settings) as ordermq's clients are registered; NotifyClientTermination removes
  it. Do not mix RocketMQ 5 consumers and ordermq push consumers in one group: ordermq's
  rebalance would give queues to members that never pull them.
- RecallMessage cancels a DELAY message still waiting (its recall handle is its message
  id); SyncLiteSubscription is answered UNSUPPORTED.
- A TRANSACTION message (alone in its request) is stored as a half message
  (mockbroker/transactions.py) of the producer group named as its topic, as the Apache
  proxy names it; its entry carries the transaction id EndTransaction takes. Check-backs
  go to a producer that publishes the topic, as a RecoverOrphanedTransactionCommand on
  its Telemetry stream; it answers with EndTransaction.
- PullMessage, UpdateOffset, GetOffset and QueryOffset end with gRPC UNIMPLEMENTED, as the
  Apache proxy answers them (apache/rocketmq#10434); RocketMQ 5's clients never call them.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc
from grpc import StatusCode

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker.dedup import first_id
from mockbroker.delivery import Delivery
from mockbroker.errors import BrokerError
from mockbroker.fronts.grpc_errors import Context, MalformedRequest, add_service
from mockbroker.fronts.v2.auth import V2Auth
from mockbroker.fronts.v2.fields import client_id, group_name, topic_name
from mockbroker.fronts.v2.messages import Outgoing, from_ms, to_frame, to_v2
from mockbroker.fronts.v2.pop import DEFAULT_POLICY, GroupPolicy, PopCore
from mockbroker.fronts.v2.receiving import Receiving
from mockbroker.fronts.v2.status import V2Error, ok, status_of
from mockbroker.fronts.v2.telemetry import (
    CONSUMER_TYPES,
    Sessions,
    check_client_type,
    command,
)
from mockbroker.groups import GroupMembership
from mockbroker.schedule import CANCELLED
from mockbroker.state import BrokerState
from mockbroker.topics import check_group, is_system_topic
from sdk._remoting.translate import msg_id_for_uniq_key
from sdk._wire import iter_records
from sdk.selector import shard_index

#: What every topic accepts (ordermq's topics have no message type: the proxy's MIXED).
ACCEPTED_TYPES = (v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)
#: How v2 consumers appear in their group (RocketMQ's ConsumeType for pop consumers).
CONSUME_POP = "CONSUME_POP"
#: The method label of this front's requests in the broker's metrics ("v2.SendMessage"):
#: apart from ordermq's RPCs of the same names (QueryRoute, Heartbeat).
METRIC_PREFIX = "v2."
_MAX_RECALL_HANDLE = 255
Resp = TypeVar("Resp", bound=Any)
Handler = Callable[["RocketMQ5Service", Any, Context], Awaitable[Resp]]


def _answers(response: type[Resp]) -> Callable[[Handler[Resp]], Handler[Resp]]:
    """Wrap a unary handler: a request that does not parse, a refusal, the counting.

    The handler raises V2Error or BrokerError for a refusal; the answer is `response`
    with the refusal's status (gRPC OK, as the proxy answers).
    """

    def wrap(handler: Handler[Resp]) -> Handler[Resp]:
        method = METRIC_PREFIX + handler.__name__

        @functools.wraps(handler)
        async def wrapper(self: RocketMQ5Service, request: Any, context: Context) -> Resp:
            try:
                if isinstance(request, MalformedRequest):
                    raise V2Error(v2.BAD_REQUEST, request.error.message)
                if self.auth is not None:
                    self.auth.check(handler.__name__, context, request)
                answer = await handler(self, request, context)
            except (V2Error, BrokerError) as exc:
                answer = response(status=status_of(exc))
            except asyncio.CancelledError:
                self.requests.cancelled(method)
                raise
            except Exception:
                self.requests.crashed(method)
                raise
            self._count(method, answer.status)
            return answer

        return wrapper

    return wrap


class RocketMQ5Service:
    """The servicer of apache.rocketmq.v2.MessagingService on a BrokerState."""

    def __init__(
        self, state: BrokerState, pop: PopCore | None = None, auth: V2Auth | None = None
    ) -> None:
        self._s = state
        self.auth = auth
        self.requests = state.requests
        self._delivery = Delivery(state)
        self._sessions = Sessions()
        self._receiving = Receiving(pop, store_host=lambda: self.store_host, now_ms=self._now_ms)
        self._turns: dict[str, itertools.count[int]] = {}
        self._closing = asyncio.Event()
        self._endpoints = v2.Endpoints()
        self.store_host = ""

    def listening_on(self, host: str, port: int) -> None:
        """Where clients reach this front (routes and served messages name it)."""
        host = host.strip("[]")
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            scheme = v2.DOMAIN_NAME
        else:
            scheme = v2.IPv6 if ip.version == 6 else v2.IPv4
        self._endpoints = v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=port)])
        self.store_host = f"[{host}]:{port}" if scheme == v2.IPv6 else f"{host}:{port}"

    def close(self) -> None:
        """End the Telemetry streams (the broker is stopping)."""
        self._closing.set()

    @property
    def sessions(self) -> int:
        """Clients with a Telemetry stream and settings."""
        return self._sessions.count

    def _now_ms(self) -> int:
        return int(self._s.clock.now() * 1000)

    def _count(self, method: str, status: v2.Status) -> None:
        if status.code in (v2.OK, v2.MESSAGE_NOT_FOUND):
            self.requests.answered(method)
        else:
            name = v2.Code.Name(status.code)
            self.requests.failed(method, name, name)

    def _policy(self, group: str) -> GroupPolicy:
        core = self._receiving.core
        return core.group_policy(group) if core is not None else DEFAULT_POLICY

    # ------------------------------------------------------------------ routes
    def _queue(self, topic: str, queue_id: int) -> v2.MessageQueue:
        return v2.MessageQueue(
            topic=v2.Resource(name=topic),
            id=queue_id,
            permission=v2.READ_WRITE,
            broker=v2.Broker(name=self._s.config.broker_name, id=0, endpoints=self._endpoints),
            accept_message_types=ACCEPTED_TYPES,
        )

    @_answers(svc.QueryRouteResponse)
    async def QueryRoute(
        self, request: svc.QueryRouteRequest, context: Context
    ) -> svc.QueryRouteResponse:
        """The topic's queues; a missing user topic is created if auto-creation is on."""
        name = topic_name(request.topic)
        store = self._s.store
        topic = store.topics.find(name)
        if topic is None and self._s.config.auto_create_topics and not is_system_topic(name):
            topic = await self._s.topic_creation.user_topic(
                name, self._s.config.default_queues, client=context.peer()
            )
        if topic is None:
            topic = store.topics.get(name)  # TOPIC_NOT_FOUND
        return svc.QueryRouteResponse(
            status=ok(), message_queues=[self._queue(name, q) for q in range(topic.queue_count)]
        )

    @_answers(svc.QueryAssignmentResponse)
    async def QueryAssignment(
        self, request: svc.QueryAssignmentRequest, context: Context
    ) -> svc.QueryAssignmentResponse:
        """The broker-wide queue (-1) for an ordinary group, every queue for a FIFO one."""
        name = topic_name(request.topic)
        group = group_name(request.group)
        topic = self._s.store.topics.get(name)
        ids = range(topic.queue_count) if self._policy(group).fifo else (-1,)
        return svc.QueryAssignmentResponse(
            status=ok(),
            assignments=[v2.Assignment(message_queue=self._queue(name, q)) for q in ids],
        )

    # ------------------------------------------------------------------ membership
    @_answers(svc.HeartbeatResponse)
    async def Heartbeat(
        self, request: svc.HeartbeatRequest, context: Context
    ) -> svc.HeartbeatResponse:
        """A consumer stays a member of its group (producers have nothing to renew)."""
        cid = client_id(context.invocation_metadata())
        check_client_type(request.client_type)
        if request.client_type in CONSUMER_TYPES:
            if not request.HasField("group"):
                raise V2Error(v2.ILLEGAL_CONSUMER_GROUP, "a consumer's heartbeat names no group")
            group = group_name(request.group)
            session = self._sessions.get(cid)
            subscriptions = session.subscriptions if session and session.group == group else ()
            membership = GroupMembership(CONSUME_POP, "CLUSTERING", subscriptions)
            self._s.groups.heartbeat(cid, {group: membership}, context.peer())
        return svc.HeartbeatResponse(status=ok())

    @_answers(svc.NotifyClientTerminationResponse)
    async def NotifyClientTermination(
        self, request: svc.NotifyClientTerminationRequest, context: Context
    ) -> svc.NotifyClientTerminationResponse:
        """The client shuts down: it leaves its group at once."""
        cid = client_id(context.invocation_metadata())
        self._s.groups.unregister(cid)
        self._sessions.drop(cid)
        return svc.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(
        self,
        request_iterator: AsyncIterator[svc.TelemetryCommand | MalformedRequest],
        context: Context,
    ) -> AsyncIterator[svc.TelemetryCommand]:
        """Answer each Settings the client writes with the server's (telemetry.py).

        A producer's stream also carries the check-backs of its transactions
        (RecoverOrphanedTransactionCommand): it offers to answer them for each topic it
        publishes, its producer group being the topic (as the Apache proxy's).
        """
        try:
            cid = client_id(context.invocation_metadata())
        except V2Error as exc:
            self._count(METRIC_PREFIX + "Telemetry", exc.status())
            yield command(exc.status())
            return
        peer = context.peer()
        self._s.groups.stream_opened(peer)  # its end tells ConsumerGroups the client left
        self._sessions.opened(cid)
        outgoing: asyncio.Queue[svc.TelemetryCommand | None] = asyncio.Queue()
        checks: dict[str, asyncio.Task[None]] = {}

        async def read() -> None:
            try:
                async for received in _until(self._closing, request_iterator):
                    if isinstance(received, MalformedRequest):
                        status = v2.Status(code=v2.BAD_REQUEST, message=received.error.message)
                        answer = command(status)
                    elif received.HasField("settings"):
                        answer = self._settle(cid, received, context)
                        self._offer_checks(cid, received.settings, answer, checks, outgoing)
                    else:
                        continue  # answers to commands (an EndTransaction ends a check)
                    self._count(METRIC_PREFIX + "Telemetry", answer.status)
                    outgoing.put_nowait(answer)
            finally:
                outgoing.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (item := await outgoing.get()) is not None:
                yield item
            await reader  # what ended the client's side, raised here
        finally:
            for task in (reader, *checks.values()):
                task.cancel()
            await asyncio.gather(reader, *checks.values(), return_exceptions=True)
            self._sessions.closed(cid)
            self._s.groups.stream_closed(peer)

    def _offer_checks(
        self,
        cid: str,
        settings: v2.Settings,
        answer: svc.TelemetryCommand,
        checks: dict[str, asyncio.Task[None]],
        outgoing: asyncio.Queue[svc.TelemetryCommand | None],
    ) -> None:
        """A producer whose settings were accepted answers its topics' check-backs."""
        if answer.status.code != v2.OK or settings.client_type != v2.PRODUCER:
            return
        for resource in settings.publishing.topics:
            group = resource.name
            if group in checks:
                continue
            try:
                check_group(group)
            except BrokerError:
                continue  # its transactional sends are refused for the same reason
            checks[group] = asyncio.create_task(self._send_checks(group, cid, outgoing))

    async def _send_checks(
        self, group: str, cid: str, outgoing: asyncio.Queue[svc.TelemetryCommand | None]
    ) -> None:
        transactions = self._s.transactions
        async with transactions.watching(group, cid) as watcher:
            async for check in transactions.checks(watcher):
                [record] = iter_records(check.record, verify_crc=False)
                message = to_v2(record, store_host=self.store_host)
                message.system_properties.message_type = v2.TRANSACTION
                outgoing.put_nowait(
                    svc.TelemetryCommand(
                        recover_orphaned_transaction_command=svc.RecoverOrphanedTransactionCommand(
                            message=message, transaction_id=check.transaction_id
                        )
                    )
                )

    def _settle(
        self, cid: str, received: svc.TelemetryCommand, context: Context
    ) -> svc.TelemetryCommand:
        if self.auth is not None:
            try:
                self.auth.check("Telemetry", context, received)
            except V2Error as exc:
                return command(exc.status())
        return self._sessions.settle(cid, received.settings, self._policy)

    # ------------------------------------------------------------------ send
    @_answers(svc.SendMessageResponse)
    async def SendMessage(
        self, request: svc.SendMessageRequest, context: Context
    ) -> svc.SendMessageResponse:
        """Store the request's messages in one queue (or schedule them), all or nothing."""
        client = context.peer()
        with self._s.limits.unary(client, request.ByteSize()):
            try:
                return await self._send(request, client)
            except (V2Error, BrokerError) as exc:
                status = status_of(exc)
                return svc.SendMessageResponse(
                    status=status,
                    entries=[
                        svc.SendResultEntry(
                            status=status, message_id=m.system_properties.message_id
                        )
                        for m in request.messages
                    ],
                )

    async def _send(self, request: svc.SendMessageRequest, client: str) -> svc.SendMessageResponse:
        if not request.messages:
            raise V2Error(v2.BAD_REQUEST, "the request carries no message")
        names = {topic_name(m.topic) for m in request.messages}
        if len(names) > 1:
            raise V2Error(
                v2.BAD_REQUEST,
                f"a request's messages go to one topic, not {len(names)}: "
                f"{', '.join(sorted(names))}",
            )
        (name,) = names
        now_ms = self._now_ms()
        if any(m.system_properties.message_type == v2.TRANSACTION for m in request.messages):
            return await self._send_half(request, name, client, now_ms)
        batch = [to_frame(m, now_ms=now_ms) for m in request.messages]
        groups = {m.message_group for m in batch}
        if len(groups) > 1:
            raise V2Error(
                v2.BAD_REQUEST, "a request's messages must share one message group (or none)"
            )
        queue_id = self._queue_for(name, batch[0])
        sent = await self._delivery.send(client, name, queue_id, b"".join(m.frame for m in batch))
        code = v2.OK if sent.durable else v2.MASTER_PERSISTENCE_TIMEOUT
        status = (
            ok()
            if sent.durable
            else v2.Status(
                code=code,
                message="stored, but not flushed to disk within the sync flush timeout",
            )
        )
        first = sent.schedule_offset if sent.scheduled else sent.first_offset
        if sent.messages:  # a batch with duplicates: each entry its message's place
            return svc.SendMessageResponse(
                status=status,
                entries=[
                    svc.SendResultEntry(
                        status=status,
                        message_id=first_id(p) if p.duplicate else m.message_id,
                        offset=p.offset,
                        recall_handle=m.message_id if m.scheduled else "",
                    )
                    for m, p in zip(batch, sent.messages, strict=True)
                ],
            )
        return svc.SendMessageResponse(
            status=status,
            entries=[
                svc.SendResultEntry(
                    status=status,
                    message_id=m.message_id,
                    offset=first + i,
                    recall_handle=m.message_id if m.scheduled else "",
                )
                for i, m in enumerate(batch)
            ],
        )

    async def _send_half(
        self, request: svc.SendMessageRequest, name: str, client: str, now_ms: int
    ) -> svc.SendMessageResponse:
        """A TRANSACTION message: a half message of producer group `name` (the topic)."""
        if len(request.messages) != 1:
            raise V2Error(
                v2.BAD_REQUEST,
                f"a transactional message is sent alone, not with {len(request.messages) - 1} "
                "others",
            )
        message = to_frame(request.messages[0], now_ms=now_ms, transaction=True)
        queue_id = self._queue_for(name, message)
        stored = await self._delivery.send_half(client, name, queue_id, message.frame, name)
        status = (
            ok()
            if stored.durable
            else v2.Status(
                code=v2.MASTER_PERSISTENCE_TIMEOUT,
                message="stored, but not flushed to disk within the sync flush timeout",
            )
        )
        entry = svc.SendResultEntry(
            status=status, message_id=message.message_id, transaction_id=stored.transaction_id
        )
        return svc.SendMessageResponse(status=status, entries=[entry])

    def _queue_for(self, name: str, message: Outgoing) -> int:
        topic = self._s.store.topics.find(name)
        count = topic.queue_count if topic is not None else self._s.config.default_queues
        if message.message_group:
            return shard_index(message.message_group, count)
        if topic is None:
            return 0  # the send creates the topic (or is refused): its turns start after
        turn = self._turns.get(name)
        if turn is None:
            turn = self._turns[name] = itertools.count(1)
        return next(turn) % count

    @_answers(svc.RecallMessageResponse)
    async def RecallMessage(
        self, request: svc.RecallMessageRequest, context: Context
    ) -> svc.RecallMessageResponse:
        """Cancel a delayed message that has not fallen due yet."""
        name = topic_name(request.topic)
        handle = request.recall_handle
        if not handle or len(handle) > _MAX_RECALL_HANDLE:
            raise V2Error(
                v2.BAD_REQUEST,
                f"recall_handle must be 1-{_MAX_RECALL_HANDLE} characters (the SendReceipt's)",
            )
        outcome = await self._s.scheduler.cancel(name, msg_id_for_uniq_key(handle))
        if outcome != CANCELLED:
            raise V2Error(
                v2.NOT_FOUND,
                f"message {handle} of topic {name!r} was already delivered; it cannot be recalled",
            )
        return svc.RecallMessageResponse(status=ok(), message_id=handle)

    @_answers(svc.EndTransactionResponse)
    async def EndTransaction(
        self, request: svc.EndTransactionRequest, context: Context
    ) -> svc.EndTransactionResponse:
        """Commit or roll back a half message; answered once that is durable.

        The producer group is the topic (as the Apache proxy's); the transaction id is the
        one SendMessage answered, and must be that of `message_id`.
        """
        name = topic_name(request.topic)
        resolution = request.resolution
        if resolution not in (v2.COMMIT, v2.ROLLBACK):
            raise V2Error(v2.BAD_REQUEST, f"resolution {resolution} is neither COMMIT nor ROLLBACK")
        txn_id = request.transaction_id
        msg_hex = txn_id.partition("-")[0]
        if not txn_id or msg_id_for_uniq_key(request.message_id).hex().upper() != msg_hex:
            raise V2Error(
                v2.INVALID_TRANSACTION_ID,
                f"transaction id {txn_id!r} is not that of message {request.message_id!r}",
            )
        await self._s.transactions.end(name, txn_id, resolution == v2.COMMIT)
        return svc.EndTransactionResponse(status=ok())

    @_answers(svc.SyncLiteSubscriptionResponse)
    async def SyncLiteSubscription(
        self, request: svc.SyncLiteSubscriptionRequest, context: Context
    ) -> svc.SyncLiteSubscriptionResponse:
        """Lite topics are not supported."""
        raise V2Error(v2.UNSUPPORTED, "lite topics are not supported by this broker")

    # ------------------------------------------------------------------ receive
    async def ReceiveMessage(
        self, request: svc.ReceiveMessageRequest | MalformedRequest, context: Context
    ) -> AsyncIterator[svc.ReceiveMessageResponse]:
        """Pop messages for a group (receiving.py); one status, messages, a timestamp."""
        if isinstance(request, MalformedRequest):
            status = v2.Status(code=v2.BAD_REQUEST, message=request.error.message)
            answer = [
                svc.ReceiveMessageResponse(status=status),
                svc.ReceiveMessageResponse(delivery_timestamp=from_ms(self._now_ms())),
            ]
        else:
            try:
                if self.auth is not None:
                    self.auth.check("ReceiveMessage", context, request)
                answer = await self._receiving.receive(
                    request, time_remaining=context.time_remaining(), client=context.peer()
                )
            except V2Error as exc:  # refused by the ACL: the status alone, as the proxy
                answer = [svc.ReceiveMessageResponse(status=exc.status())]
            except asyncio.CancelledError:
                self.requests.cancelled(METRIC_PREFIX + "ReceiveMessage")
                raise
        self._count(METRIC_PREFIX + "ReceiveMessage", answer[0].status)
        for element in answer:
            yield element

    @_answers(svc.AckMessageResponse)
    async def AckMessage(
        self, request: svc.AckMessageRequest, context: Context
    ) -> svc.AckMessageResponse:
        """Ack received messages by receipt handle."""
        return await self._receiving.ack(request)

    @_answers(svc.ChangeInvisibleDurationResponse)
    async def ChangeInvisibleDuration(
        self, request: svc.ChangeInvisibleDurationRequest, context: Context
    ) -> svc.ChangeInvisibleDurationResponse:
        """Extend a received message's invisible time (a new receipt handle)."""
        return await self._receiving.change_invisible(request)

    @_answers(svc.ForwardMessageToDeadLetterQueueResponse)
    async def ForwardMessageToDeadLetterQueue(
        self, request: svc.ForwardMessageToDeadLetterQueueRequest, context: Context
    ) -> svc.ForwardMessageToDeadLetterQueueResponse:
        """Dead-letter a received message (a FIFO consumer gives up on it)."""
        return await self._receiving.forward_to_dead_letter(request)

    # ------------------------------------------------------------------ not served
    async def PullMessage(
        self, request: object, context: Context
    ) -> AsyncIterator[svc.PullMessageResponse]:
        """UNIMPLEMENTED, as the Apache proxy answers it."""
        await _unimplemented(self, "PullMessage", context)
        yield svc.PullMessageResponse()  # pragma: no cover (abort raises)

    async def UpdateOffset(self, request: object, context: Context) -> svc.UpdateOffsetResponse:
        """UNIMPLEMENTED, as the Apache proxy answers it."""
        await _unimplemented(self, "UpdateOffset", context)
        raise AssertionError("unreachable: abort raises")

    async def GetOffset(self, request: object, context: Context) -> svc.GetOffsetResponse:
        """UNIMPLEMENTED, as the Apache proxy answers it."""
        await _unimplemented(self, "GetOffset", context)
        raise AssertionError("unreachable: abort raises")

    async def QueryOffset(self, request: object, context: Context) -> svc.QueryOffsetResponse:
        """UNIMPLEMENTED, as the Apache proxy answers it."""
        await _unimplemented(self, "QueryOffset", context)
        raise AssertionError("unreachable: abort raises")


async def _unimplemented(service: RocketMQ5Service, method: str, context: Context) -> None:
    service.requests.failed(
        METRIC_PREFIX + method, StatusCode.UNIMPLEMENTED.name, "NOT_IMPLEMENTED"
    )
    await context.abort(
        StatusCode.UNIMPLEMENTED,
        f"{method} is not served, as the Apache RocketMQ proxy does not serve it "
        "(apache/rocketmq#10434): RocketMQ 5 consumers receive with ReceiveMessage",
    )


T = TypeVar("T")


async def _until(closing: asyncio.Event, items: AsyncIterator[T]) -> AsyncIterator[T]:
    """The items of `items` until it ends or `closing` is set, whichever comes first."""
    ended = asyncio.ensure_future(closing.wait())
    following: asyncio.Future[T] | None = None
    try:
        while True:
            following = asyncio.ensure_future(anext(items))
            await asyncio.wait({following, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not following.done():
                return
            try:
                item = following.result()
            except StopAsyncIteration:
                return
            yield item
    finally:  # also when the call is cancelled while waiting
        ended.cancel()
        if following is not None:
            following.cancel()


def add_to(server: grpc.aio.Server, service: RocketMQ5Service) -> None:
    """Serve apache.rocketmq.v2.MessagingService on `server` by `service`."""
    add_service(server, svc.DESCRIPTOR.services_by_name["MessagingService"], service)


__all__ = ["ACCEPTED_TYPES", "CONSUME_POP", "RocketMQ5Service", "add_to"]
