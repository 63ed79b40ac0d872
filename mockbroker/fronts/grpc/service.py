"""MessagingService: what producers and consumers call.

Protobuf in, domain calls, protobuf out; every refusal is a BrokerError turned into its
status.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import TYPE_CHECKING

from google.protobuf.message import Message

from mockbroker.delivery import Delivery, SendOutcome
from mockbroker.errors import BrokerError, invalid
from mockbroker.fronts.grpc.exchange import ExchangeStreams, RequestCheck
from mockbroker.fronts.grpc_errors import (
    Context,
    MalformedRequest,
    abort,
    answers_errors,
    message_id,
    parsed,
)
from mockbroker.groups import GroupMembership
from mockbroker.offset_commits import Fenced, OffsetUpdate
from mockbroker.parking import ParkedKey
from mockbroker.push import Credit
from mockbroker.queue_locks import QueueLocks
from mockbroker.schedule import CANCELLED
from mockbroker.state import BrokerState, check_client_id
from mockbroker.store.message_store import GetResult, parse_tag_expression
from mockbroker.topics import (
    check_any_topic,
    check_group,
    check_user_topic,
)
from sdk._batching import join_repeated
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    from mockbroker.fronts.grpc.auth import GrpcAuth  # built only with an ACL

#: The Exchange stream's full method path, which its opening is signed with.
EXCHANGE_PATH = "/ordermq.v1.MessagingService/Exchange"
EXCHANGE_BATCHED_PATH = "/ordermq.v1.MessagingService/ExchangeBatched"


class MessagingService(pb_grpc.MessagingServiceServicer):
    """Routing, send, pull, receive, locks, membership, offsets, retry and scheduling."""

    def __init__(self, state: BrokerState, auth: GrpcAuth | None = None) -> None:
        self._s = state
        #: The ACL's checks (None: no ACL file); the unary RPCs are checked by add_service.
        self._auth = auth
        self.requests = state.requests
        self._delivery = Delivery(state)
        self._locks = QueueLocks(state)
        self.exchanges = ExchangeStreams(
            self.send, self.pull, state.requests, state.limits, self.subscribe
        )

    # ------------------------------------------------------------------ exchange
    async def Exchange(
        self,
        request_iterator: AsyncIterator[pb.ExchangeRequest | MalformedRequest],
        context: Context,
    ) -> AsyncIterator[pb.ExchangeResponse]:
        """Send and Pull requests multiplexed on one stream (mockbroker/fronts/grpc/exchange.py).

        With an ACL the stream's opening is signed, and each request is checked as the
        RPC it carries (a send needs Send's permissions, a pull Pull's).
        """
        checked, check = await self._opening(context, EXCHANGE_PATH, "Exchange")
        if not checked:
            return
        async with self._stream_of(context, "Exchange"):
            try:
                async for answer in self.exchanges.serve(request_iterator, context.peer(), check):
                    yield answer
            except BrokerError as exc:  # a request that did not parse ends the stream
                await abort(context, exc)

    async def ExchangeBatched(  # type: ignore[override]  # answers serialized, see below
        self,
        request_iterator: AsyncIterator[pb.ExchangeRequests | MalformedRequest],
        context: Context,
    ) -> AsyncIterator[bytes]:
        """Exchange with several requests and answers to a stream message.

        Its first message carries no answer (the client learns the broker serves it).
        The answers are serialized here, each once, and framed as ExchangeResponses: a
        message put into another's repeated field would be copied, records and all.
        """
        checked, check = await self._opening(context, EXCHANGE_BATCHED_PATH, "ExchangeBatched")
        if not checked:
            return
        async with self._stream_of(context, "ExchangeBatched"):
            yield b""  # an ExchangeResponses with no answers
            try:
                requests = each_request(request_iterator)
                async for batch in self.exchanges.serve_batches(requests, context.peer(), check):
                    yield join_repeated([answer.SerializeToString() for answer in batch])
            except BrokerError as exc:  # a request that did not parse ends the stream
                await abort(context, exc)

    async def _opening(
        self, context: Context, path: str, method: str
    ) -> tuple[bool, RequestCheck | None]:
        """An Exchange stream's opening checked by the ACL: (admitted, each request's check).

        A refused opening is aborted here (False).
        """
        auth = self._auth
        if auth is None:
            return True, None
        try:
            caller = auth.caller(path, context, None)
        except BrokerError as exc:
            self.requests.refused(method, exc)
            await abort(context, exc)
            return False, None

        def check(method: str, request: Message) -> None:
            auth.authorize(caller, method, request)

        return True, check

    # ------------------------------------------------------------------ routing, send
    @answers_errors
    async def QueryRoute(
        self, request: pb.QueryRouteRequest, context: Context
    ) -> pb.QueryRouteResponse:
        """Queues of a topic; creates it when asked to and allowed."""
        check_any_topic(request.topic)
        store = self._s.store
        topic = store.topics.find(request.topic)
        if topic is None and request.create_if_missing and self._s.config.auto_create_topics:
            topic = await self._s.topic_creation.user_topic(
                request.topic, self._s.config.default_queues, client=context.peer()
            )
        if topic is None:
            topic = store.topics.get(request.topic)  # raises TOPIC_NOT_FOUND
        name = self._s.config.broker_name
        return pb.QueryRouteResponse(
            queues=[
                pb.QueueRoute(
                    queue=pb.MessageQueue(topic=topic.name, broker_name=name, queue_id=qid),
                    broker_address=self._s.address,
                    readable=True,
                    writable=True,
                    exchange_address=self._s.exchange_address,
                    exchange_broker_id=self._s.exchange_broker_id,
                )
                for qid in range(topic.queue_count)
            ],
            takes_send_parts=True,
        )

    @answers_errors
    async def Send(self, request: pb.SendRequest, context: Context) -> pb.SendResponse:
        """Append a batch of frames to one queue, or schedule it."""
        client = context.peer()
        with self._s.limits.unary(client, request.ByteSize()):
            return await self.send(request, client)

    async def send(
        self, request: pb.SendRequest, client: str, answer: pb.SendResponse | None = None
    ) -> pb.SendResponse:
        """Send's work, for the unary RPC and the Exchange stream (raises BrokerError).

        `client` names the connection it came on (fairness between clients). The answer
        is filled into `answer` when given (the one inside the stream's envelope: a
        message given to another's constructor is copied).
        """
        response = pb.SendResponse() if answer is None else answer
        if request.parts:
            return await self._send_parts(request, client, response)
        # Each read of a protobuf bytes field copies it: read the frames once.
        sent = await self._delivery.send(client, request.topic, request.queue_id, request.frames)
        response.status = pb.SEND_OK if sent.durable else pb.FLUSH_DISK_TIMEOUT
        response.queue_id = sent.queue_id if sent.duplicate else request.queue_id
        response.first_queue_offset = sent.first_offset
        response.count = sent.count
        response.store_timestamp_ms = sent.store_timestamp_ms
        response.scheduled = sent.scheduled
        response.duplicate = sent.duplicate
        if sent.messages:
            response.messages.extend(_message_results(sent))
        return response

    async def _send_parts(
        self, request: pb.SendRequest, client: str, response: pb.SendResponse
    ) -> pb.SendResponse:
        """A batch over several queues: each part stored or refused on its own (send_parts)."""
        parts = [(p.queue_id, p.frames) for p in request.parts]  # each read copies: once
        sent = await self._delivery.send_parts(client, request.topic, parts)
        # Filled in place: a message given to a repeated field's constructor is copied.
        add = response.parts.add
        ok = pb.SEND_OK
        for (queue_id, _), outcome in zip(parts, sent, strict=True):
            if isinstance(outcome, BrokerError):
                error = add(queue_id=queue_id).error
                error.code = outcome.status.name
                error.reason = outcome.reason
                error.message = outcome.message
                continue
            if not (outcome.scheduled or outcome.queue_id >= 0 or outcome.messages):
                # The usual part: only the fields it sets (each keyword costs a lookup).
                add(
                    status=ok if outcome.durable else pb.FLUSH_DISK_TIMEOUT,
                    queue_id=queue_id,
                    first_queue_offset=outcome.first_offset,
                    count=outcome.count,
                    store_timestamp_ms=outcome.store_timestamp_ms,
                )
                continue
            result = add(
                status=ok if outcome.durable else pb.FLUSH_DISK_TIMEOUT,
                queue_id=outcome.queue_id if outcome.duplicate else queue_id,
                first_queue_offset=outcome.first_offset,
                count=outcome.count,
                store_timestamp_ms=outcome.store_timestamp_ms,
                scheduled=outcome.scheduled,
                duplicate=outcome.duplicate,
            )
            if outcome.messages:
                result.messages.extend(_message_results(outcome))
        return response

    # ------------------------------------------------------------------ pull
    @answers_errors
    async def Pull(self, request: pb.PullRequest, context: Context) -> pb.PullResponse:
        """Read from one queue by offset; hold the call while there is nothing to read."""
        return await self.pull(request, context.peer())

    async def pull(
        self, request: pb.PullRequest, client: str, answer: pb.PullResponse | None = None
    ) -> pb.PullResponse:
        """Pull's work, for the unary RPC and the Exchange stream (raises BrokerError).

        `client` names the connection it came on (fairness between clients). The answer
        is filled into `answer` when given: the Exchange stream passes the one inside its
        envelope, since copying megabytes of records into another message would hold the
        loop up for a millisecond or more.
        """
        got = await self._delivery.pull(
            client,
            group=request.group,
            topic_name=request.topic,
            queue_id=request.queue_id,
            offset=request.offset,
            max_messages=request.max_messages,
            max_bytes=request.max_bytes,
            tags=parse_tag_expression(request.tag_expression),
            suspend_ms=request.suspend_timeout_ms,
        )
        return _pulled(got, pb.PullResponse() if answer is None else answer)

    def subscribe(
        self, request: pb.Subscribe, client: str
    ) -> tuple[Credit, AsyncIterator[pb.PullResponse]]:
        """A push subscription's credit and batches, for the Exchange stream (Delivery.subscribe).

        Raises BrokerError for a bad credit; the batches raise it for anything else.
        """
        credit = Credit(self._s.holder, request.credit_messages, request.credit_bytes)

        async def batches() -> AsyncIterator[pb.PullResponse]:
            async for got in self._delivery.subscribe(
                client,
                group=request.group,
                topic_name=request.topic,
                queue_id=request.queue_id,
                offset=request.offset,
                max_messages=request.max_messages,
                max_bytes=request.max_bytes,
                tags=parse_tag_expression(request.tag_expression),
                client_id=request.client_id,
                lock_epoch=request.lock_epoch,
                credit=credit,
            ):
                yield _pulled(got, pb.PullResponse())

        return credit, batches()

    # ------------------------------------------------------------------ receive (pop)
    @answers_errors
    async def Receive(self, request: pb.ReceiveRequest, context: Context) -> pb.ReceiveResponse:
        """Take messages for a group, each hidden for its invisible duration (mockbroker/pop)."""
        return await self.receive(request, context.peer())

    async def receive(self, request: pb.ReceiveRequest, client: str) -> pb.ReceiveResponse:
        """Receive's work (raises BrokerError).

        `client` names the connection it came on: its reads take turns with other
        clients' (fairness), and it waits while the client is over its in-flight limit,
        as a pull does.
        """
        got = await self._s.pop.receive(
            request.group,
            request.topic,
            max_messages=request.max_messages,
            invisible_ms=request.invisible_duration_ms,
            queue_ids=request.queue_ids,
            tags=parse_tag_expression(request.tag_expression),
            fifo=request.fifo,
            max_attempts=request.max_delivery_attempts,
            wait_ms=request.wait_ms,
            client=client,
        )
        return pb.ReceiveResponse(
            records=b"".join(r.record for r in got),
            record_count=len(got),
            leases=[
                pb.Lease(
                    receipt_handle=r.receipt,
                    delivery_attempt=r.attempt,
                    invisible_until_ms=r.invisible_until_ms,
                )
                for r in got
            ],
        )

    @answers_errors
    async def Ack(self, request: pb.AckRequest, context: Context) -> pb.AckResponse:
        """Settle a received message by its receipt handle."""
        await self._s.pop.ack(request.group, request.receipt_handle)
        return pb.AckResponse()

    @answers_errors
    async def ChangeInvisibleDuration(
        self, request: pb.ChangeInvisibleDurationRequest, context: Context
    ) -> pb.ChangeInvisibleDurationResponse:
        """Hide a received message for another while, under a new receipt handle."""
        renewed = await self._s.pop.change_invisible_duration(
            request.group, request.receipt_handle, request.invisible_duration_ms
        )
        return pb.ChangeInvisibleDurationResponse(
            lease=pb.Lease(
                receipt_handle=renewed.receipt,
                delivery_attempt=renewed.attempt,
                invisible_until_ms=renewed.invisible_until_ms,
            )
        )

    @answers_errors
    async def QueryQueueOffsets(
        self, request: pb.QueryQueueOffsetsRequest, context: Context
    ) -> pb.QueryQueueOffsetsResponse:
        """A queue's min and max offsets, and the offset at a time if asked.

        The max offset is the end of what can be read (in sync mode, of what is synced).
        """
        topic = self._s.topic_queue(request.topic, request.queue_id)
        store = self._s.store
        end = store.end_offset(topic, request.queue_id)
        at_time = (
            min(store.offset_for_timestamp(topic, request.queue_id, request.timestamp_ms), end)
            if request.timestamp_ms
            else 0
        )
        return pb.QueryQueueOffsetsResponse(
            min_offset=store.queue(topic, request.queue_id).min_offset,
            max_offset=end,
            offset_at_time=at_time,
        )

    # ------------------------------------------------------------------ locks
    @answers_errors
    async def LockBatch(
        self, request: pb.LockBatchRequest, context: Context
    ) -> pb.LockBatchResponse:
        """Take or renew rebalance locks; answers the queues the caller now holds."""
        held = self._locks.take(
            request.group, request.client_id, _keys(request.queues), context.peer()
        )
        await self._s.locks.save()  # a grant is answered once it would survive a crash
        broker = self._s.config.broker_name
        return pb.LockBatchResponse(
            locked=[
                pb.LockedQueue(
                    queue=pb.MessageQueue(topic=t, broker_name=broker, queue_id=q), epoch=epoch
                )
                for (t, q), epoch in held.items()
            ]
        )

    @answers_errors
    async def UnlockBatch(
        self, request: pb.UnlockBatchRequest, context: Context
    ) -> pb.UnlockBatchResponse:
        """Release the caller's locks; another client's live ones stay and are listed."""
        refused = self._locks.release(
            request.group, request.client_id, _keys(request.queues), context.peer()
        )
        await self._s.locks.save()
        broker = self._s.config.broker_name
        return pb.UnlockBatchResponse(
            not_held=[pb.MessageQueue(topic=t, broker_name=broker, queue_id=q) for t, q in refused]
        )

    # ------------------------------------------------------------------ membership
    @answers_errors
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        """Register the client as a member of exactly the groups it names."""
        check_client_id(request.client_id)
        groups: dict[str, GroupMembership] = {}
        for g in request.consumer_groups:
            check_group(g.group)
            for name, enum, value in (
                ("consume_type", pb.ConsumeType, g.consume_type),
                ("message_model", pb.MessageModel, g.message_model),
            ):
                if not value:
                    raise invalid("INVALID_ARGUMENT", f"group {g.group!r}: {name} is missing")
                if value not in enum.values():  # proto3 enums take any number
                    raise invalid(
                        "INVALID_ARGUMENT", f"group {g.group!r}: {name} {value} is not defined"
                    )
            for sub in g.subscriptions:
                check_any_topic(sub.topic)
                parse_tag_expression(sub.expression)
            groups[g.group] = GroupMembership(
                pb.ConsumeType.Name(g.consume_type),
                pb.MessageModel.Name(g.message_model),
                tuple((s.topic, s.expression) for s in g.subscriptions),
            )
        for producer_group in request.producer_groups:
            check_group(producer_group)
        await self._s.topic_creation.retry_topics(  # concurrent members consume their retries
            [g for g, m in groups.items() if m.consume_type == "CONSUME_CONCURRENTLY"],
            client=context.peer(),
        )
        versions = self._s.groups.heartbeat(request.client_id, groups, context.peer())
        return pb.HeartbeatResponse(
            groups=[pb.GroupVersion(group=g, membership_version=v) for g, v in versions.items()],
            client_timeout_ms=int(self._s.groups.client_timeout_seconds * 1000),
        )

    @answers_errors
    async def UnregisterClient(
        self, request: pb.UnregisterClientRequest, context: Context
    ) -> pb.UnregisterClientResponse:
        """Leave every group and release every lock of the client."""
        check_client_id(request.client_id)
        self._s.groups.unregister(request.client_id)
        self._s.locks.release_client(request.client_id)
        await self._s.locks.save()
        return pb.UnregisterClientResponse()

    @answers_errors
    async def GetConsumerList(
        self, request: pb.GetConsumerListRequest, context: Context
    ) -> pb.GetConsumerListResponse:
        """The group's members, sorted."""
        check_group(request.group)
        return pb.GetConsumerListResponse(
            client_ids=self._s.groups.members(request.group),
            membership_version=self._s.groups.version(request.group),
        )

    async def WatchMembership(
        self, request: pb.WatchMembershipRequest | MalformedRequest, context: Context
    ) -> AsyncIterator[pb.MembershipChanged]:
        """Stream the group's membership on every change."""
        try:
            request = parsed(request)
            check_group(request.group)
        except BrokerError as exc:
            self.requests.refused("WatchMembership", exc)
            await abort(context, exc)
            return
        watch = self._s.groups.watch(request.group, request.known_version)
        # aclosing: the watch ends with the call, not whenever its generator is collected.
        async with self._stream_of(context, "WatchMembership"), contextlib.aclosing(watch):
            async for version, members in watch:
                yield pb.MembershipChanged(
                    group=request.group, membership_version=version, client_ids=members
                )

    @contextlib.asynccontextmanager
    async def _stream_of(self, context: Context, method: str) -> AsyncIterator[None]:
        """Count a long-lived stream against its connection while it is open.

        The end of the last one tells ConsumerGroups that the connection closed. The
        stream's end counts as the answer of its RPC.
        """
        peer = context.peer()
        self._s.groups.stream_opened(peer)
        try:
            yield
        except (asyncio.CancelledError, GeneratorExit):
            self.requests.cancelled(method)
            raise
        except Exception:
            self.requests.crashed(method)
            raise
        else:
            self.requests.answered(method)
        finally:
            self._s.groups.stream_closed(peer)

    # ------------------------------------------------------------------ offsets
    @answers_errors
    async def QueryConsumerOffset(
        self, request: pb.QueryConsumerOffsetRequest, context: Context
    ) -> pb.QueryConsumerOffsetResponse:
        """A group's committed offset for one queue, or found=false."""
        check_group(request.group)
        self._s.topic_queue(request.topic, request.queue_id)
        offset = self._s.offsets.get(request.group, request.topic, request.queue_id)
        if offset is None:
            return pb.QueryConsumerOffsetResponse(found=False, offset=-1)
        return pb.QueryConsumerOffsetResponse(found=True, offset=offset)

    @answers_errors
    async def CommitConsumerOffsets(
        self, request: pb.CommitConsumerOffsetsRequest, context: Context
    ) -> pb.CommitConsumerOffsetsResponse:
        """Record offsets durably, all or nothing; fenced by the queues' live locks."""
        self._s.known_group(request.group)
        self._s.groups.alive(request.client_id, context.peer())
        updates = (  # each checked as it comes, in the request's order
            OffsetUpdate(
                self._s.topic_queue(item.topic, item.queue_id),
                item.queue_id,
                item.offset,
                item.lock_epoch,
            )
            for item in request.offsets
        )
        await self._s.commits.commit(request.group, updates, Fenced(request.client_id))
        return pb.CommitConsumerOffsetsResponse()

    @answers_errors
    async def ParkKey(self, request: pb.ParkKeyRequest, context: Context) -> pb.ParkKeyResponse:
        """Park a sharding key of a queue the client holds (key mode's PARK policy)."""
        self._s.known_group(request.group)
        self._s.groups.alive(request.client_id, context.peer())
        topic = self._s.topic_queue(request.queue.topic, request.queue.queue_id)
        entry = await self._s.parking.park(
            request.group,
            topic,
            request.queue.queue_id,
            request.sharding_key,
            request.from_offset,
            request.reason,
            client_id=request.client_id,
            epoch=request.lock_epoch,
        )
        return pb.ParkKeyResponse(parked=parked_key_pb(entry, self._s.config.broker_name))

    # ------------------------------------------------------------------ retry, schedule
    @answers_errors
    async def SendBack(self, request: pb.SendBackRequest, context: Context) -> pb.SendBackResponse:
        """Return a failed message to the group's retry topic, or its dead-letter topic."""
        self._s.known_group(request.group)
        topic = self._s.topic_queue(request.queue.topic, request.queue.queue_id)
        sent = await self._s.retry.send_back(
            request.group,
            topic,
            request.queue.queue_id,
            request.queue_offset,
            delay_level=request.delay_level,
            max_reconsume_times=request.max_reconsume_times,
            reconsume_times=request.reconsume_times,
        )
        return pb.SendBackResponse(
            destination=pb.DEAD_LETTER if sent.dead_letter else pb.RETRY,
            topic=sent.topic,
            reconsume_times=sent.reconsume_times,
        )

    @answers_errors
    async def CancelScheduled(
        self, request: pb.CancelScheduledRequest, context: Context
    ) -> pb.CancelScheduledResponse:
        """Cancel a scheduled message before it falls due."""
        if request.topic:
            check_user_topic(request.topic)
        msg_id = message_id(request.msg_id)
        outcome = await self._s.scheduler.cancel(request.topic or None, msg_id)
        return pb.CancelScheduledResponse(
            result=pb.CANCELLED if outcome == CANCELLED else pb.ALREADY_DELIVERED
        )

    # ------------------------------------------------------------------ transactions
    @answers_errors
    async def SendHalfMessage(
        self, request: pb.SendHalfMessageRequest, context: Context
    ) -> pb.SendHalfMessageResponse:
        """Store one message as a half message of a producer group (mockbroker/transactions)."""
        client = context.peer()
        with self._s.limits.unary(client, request.ByteSize()):
            stored = await self._delivery.send_half(
                client, request.topic, request.queue_id, request.frame, request.producer_group
            )
        return pb.SendHalfMessageResponse(
            status=pb.SEND_OK if stored.durable else pb.FLUSH_DISK_TIMEOUT,
            transaction_id=stored.transaction_id,
            store_timestamp_ms=stored.store_timestamp_ms,
        )

    @answers_errors
    async def EndTransaction(
        self, request: pb.EndTransactionRequest, context: Context
    ) -> pb.EndTransactionResponse:
        """Commit or roll back a pending transaction; answered once that is durable."""
        if request.resolution not in (pb.TRANSACTION_COMMIT, pb.TRANSACTION_ROLLBACK):
            raise invalid(
                "INVALID_ARGUMENT",
                f"resolution {request.resolution} is neither TRANSACTION_COMMIT nor "
                "TRANSACTION_ROLLBACK",
            )
        await self._s.transactions.end(
            request.group, request.transaction_id, request.resolution == pb.TRANSACTION_COMMIT
        )
        return pb.EndTransactionResponse()

    async def WatchTransactionChecks(
        self, request: pb.WatchTransactionChecksRequest | MalformedRequest, context: Context
    ) -> AsyncIterator[pb.TransactionCheck]:
        """Stream check-backs of the group's pending transactions to this producer."""
        transactions = self._s.transactions
        try:
            request = parsed(request)
            check_group(request.group)
            check_client_id(request.client_id)
        except BrokerError as exc:
            self.requests.refused("WatchTransactionChecks", exc)
            await abort(context, exc)
            return
        async with (
            self._stream_of(context, "WatchTransactionChecks"),
            transactions.watching(request.group, request.client_id) as watcher,
        ):
            async for check in transactions.checks(watcher):
                yield pb.TransactionCheck(
                    transaction_id=check.transaction_id,
                    record=check.record,
                    check_times=check.check_times,
                    broker_name=self._s.config.broker_name,
                )


def _keys(queues: Iterable[pb.MessageQueue]) -> list[tuple[str, int]]:
    return [(q.topic, q.queue_id) for q in queues]


def parked_key_pb(entry: ParkedKey, broker_name: str) -> pb.ParkedKeyInfo:
    """A parked key as the wire has it."""
    return pb.ParkedKeyInfo(
        group=entry.group,
        queue=pb.MessageQueue(topic=entry.topic, broker_name=broker_name, queue_id=entry.queue_id),
        sharding_key=entry.key,
        reason=entry.reason,
        parked_at_ms=entry.parked_at_ms,
        through_offset=entry.through,
        parked_messages=len(entry.copies),
        released_at_ms=entry.released_at_ms,
    )


def _message_results(sent: SendOutcome) -> list[pb.SendPartResult]:
    """A batch with duplicates: each message's place (SendResponse.messages)."""
    status = pb.SEND_OK if sent.durable else pb.FLUSH_DISK_TIMEOUT
    return [
        pb.SendPartResult(
            status=status,
            queue_id=m.queue_id,
            first_queue_offset=m.offset,
            count=1,
            store_timestamp_ms=m.store_timestamp_ms,
            scheduled=sent.scheduled,
            duplicate=m.duplicate,
            msg_id=m.msg_id,
        )
        for m in sent.messages
    ]


#: PullStatus numbers by name: a dict lookup, where PullStatus.Value is a Python call.
_PULL_STATUS: dict[str, int] = dict(pb.PullStatus.items())


def _pulled(got: GetResult, answer: pb.PullResponse) -> pb.PullResponse:
    """Fill `answer` with what a read found."""
    answer.status = _PULL_STATUS[got.status]  # type: ignore[assignment]
    answer.next_offset = got.next_offset
    answer.min_offset = got.min_offset
    answer.max_offset = got.max_offset
    answer.records = got.records
    answer.record_count = got.count
    return answer


async def each_request(
    messages: AsyncIterator[pb.ExchangeRequests | MalformedRequest],
) -> AsyncIterator[pb.ExchangeRequest | MalformedRequest]:
    """The requests of an ExchangeBatched stream's messages, one by one, in order."""
    async for message in messages:
        if isinstance(message, MalformedRequest):
            yield message
            return
        for request in message.requests:
            yield request
