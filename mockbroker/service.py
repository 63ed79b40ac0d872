"""MessagingService: what producers and consumers call.

Protobuf in, domain calls, protobuf out; every refusal is a BrokerError turned into its
status.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable

import grpc

from mockbroker.errors import BrokerError, invalid, out_of_range
from mockbroker.exchange import ExchangeStreams
from mockbroker.groups import GroupMembership
from mockbroker.grpc_errors import Context, abort, answers_errors
from mockbroker.schedule import CANCELLED
from mockbroker.state import BrokerState, check_client_id
from mockbroker.store.message_store import GetResult, PutResult, Written, parse_tag_expression
from mockbroker.store.records import CheckedFrame
from mockbroker.topics import (
    RETRY_PREFIX,
    Topic,
    check_any_topic,
    check_group,
    check_user_topic,
)
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import MAX_PULL_BYTES, MAX_PULL_MESSAGES, MAX_SEND_BYTES

#: Longest a pull may be held (RocketMQ clients wait 30 s for a pull's answer).
MAX_SUSPEND_MS = 60_000


class MessagingService(pb_grpc.MessagingServiceServicer):
    """Routing, send, pull, locks, membership, offsets, retry and scheduling."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state
        self.exchanges = ExchangeStreams(self.send, self.pull, state.limits)

    # ------------------------------------------------------------------ exchange
    async def Exchange(
        self, request_iterator: AsyncIterator[pb.ExchangeRequest], context: Context
    ) -> AsyncIterator[pb.ExchangeResponse]:
        """Send and Pull requests multiplexed on one stream (mockbroker/exchange.py)."""
        async with self._stream_of(context):
            async for answer in self.exchanges.serve(request_iterator, context.peer()):
                yield answer

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
            check_user_topic(request.topic)
            topic, _ = store.create_topic(request.topic, self._s.config.default_queues)
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
                )
                for qid in range(topic.queue_count)
            ]
        )

    @answers_errors
    async def Send(self, request: pb.SendRequest, context: Context) -> pb.SendResponse:
        """Append a batch of frames to one queue, or schedule it."""
        client = context.peer()
        with self._s.limits.unary(client, request.ByteSize()):
            return await self.send(request, client)

    async def send(self, request: pb.SendRequest, client: str) -> pb.SendResponse:
        """Send's work, for the unary RPC and the Exchange stream (raises BrokerError).

        `client` names the connection it came on (fairness between clients).
        """
        # Each read of a protobuf bytes field copies it: read the frames once.
        frames = request.frames
        topic_name = request.topic
        queue_id = request.queue_id
        check_user_topic(topic_name)
        if len(frames) > MAX_SEND_BYTES:
            raise BrokerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "BATCH_TOO_LARGE",
                f"the request carries {len(frames)} bytes of frames, "
                f"over the limit of {MAX_SEND_BYTES}",
            )
        store = self._s.store
        topic = store.topics.find(topic_name)
        if topic is None and self._s.config.auto_create_topics:
            topic, _ = store.create_topic(topic_name, self._s.config.default_queues)
        if topic is None:
            topic = store.topics.get(topic_name)
        topic.check_queue(queue_id)
        sliced = self._s.sliced
        if sliced is None:
            return await self._store_send(
                topic, queue_id, frames, store.check(frames), store.append
            )

        queue = (topic.name, queue_id)

        def write_now(checked: list[CheckedFrame]) -> Written | None:
            if _scheduled(checked) or sliced.writing(queue):
                return None  # append writes it, once the batch being written is whole
            return store.write(topic, queue_id, frames, checked)

        async with sliced.in_order(client, queue) as hold:
            checked, written = await sliced.check(client, frames, write_now)
            if written is None:
                return await self._store_send(
                    topic, queue_id, frames, checked, functools.partial(sliced.append, client, hold)
                )
        durable = await store.durable(written.end)
        return _send_response(
            queue_id,
            PutResult(written.first_offset, written.count, written.store_timestamp_ms, durable),
        )

    async def _store_send(
        self,
        topic: Topic,
        queue_id: int,
        frames: bytes,
        checked: list[CheckedFrame],
        append: Callable[[Topic, int, bytes, list[CheckedFrame]], Awaitable[PutResult]],
    ) -> pb.SendResponse:
        if _scheduled(checked):
            durable = await self._s.scheduler.schedule(topic, queue_id, frames, checked)
            return pb.SendResponse(
                status=pb.SEND_OK if durable else pb.FLUSH_DISK_TIMEOUT,
                queue_id=queue_id,
                first_queue_offset=-1,
                count=len(checked),
                store_timestamp_ms=int(self._s.clock.now() * 1000),
                scheduled=True,
            )
        return _send_response(queue_id, await append(topic, queue_id, frames, checked))

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
        check_group(request.group)
        if not 1 <= request.max_messages <= MAX_PULL_MESSAGES:
            raise invalid(
                "INVALID_ARGUMENT",
                f"max_messages {request.max_messages} is outside 1..{MAX_PULL_MESSAGES}",
            )
        if not 1 <= request.max_bytes <= MAX_PULL_BYTES:
            raise invalid(
                "INVALID_ARGUMENT", f"max_bytes {request.max_bytes} is outside 1..{MAX_PULL_BYTES}"
            )
        if not 0 <= request.suspend_timeout_ms <= MAX_SUSPEND_MS:
            raise invalid(
                "INVALID_ARGUMENT",
                f"suspend_timeout_ms {request.suspend_timeout_ms} is outside 0..{MAX_SUSPEND_MS}",
            )
        tags = parse_tag_expression(request.tag_expression)
        topic = self._s.topic_queue(request.topic, request.queue_id)
        deadline = self._s.clock.now() + request.suspend_timeout_ms / 1000
        offset = request.offset
        sliced = self._s.sliced
        while True:
            if self._s.limits.over(client):
                await self._s.limits.room(client)
            if sliced is None:
                got = self._s.store.get(
                    topic,
                    request.queue_id,
                    offset,
                    max_messages=request.max_messages,
                    max_bytes=request.max_bytes,
                    tags=tags,
                )
            else:
                got = await sliced.get(
                    client,
                    topic,
                    request.queue_id,
                    offset,
                    max_messages=request.max_messages,
                    max_bytes=request.max_bytes,
                    tags=tags,
                )
            caught_up = got.status == "NO_NEW_MESSAGE" or (
                got.status == "NO_MATCHED_MESSAGE" and got.next_offset == got.max_offset
            )
            if not caught_up or not request.suspend_timeout_ms:
                return _pull_response(got, answer)
            offset = got.next_offset
            if not await self._s.holder.wait((topic.name, request.queue_id), deadline):
                return _pull_response(got, answer)

    @answers_errors
    async def QueryQueueOffsets(
        self, request: pb.QueryQueueOffsetsRequest, context: Context
    ) -> pb.QueryQueueOffsetsResponse:
        """A queue's min and max offsets, and the offset at a time if asked."""
        topic = self._s.topic_queue(request.topic, request.queue_id)
        store = self._s.store
        cq = store.queue(topic, request.queue_id)
        at_time = (
            store.offset_for_timestamp(topic, request.queue_id, request.timestamp_ms)
            if request.timestamp_ms
            else 0
        )
        return pb.QueryQueueOffsetsResponse(
            min_offset=cq.min_offset, max_offset=cq.max_offset, offset_at_time=at_time
        )

    # ------------------------------------------------------------------ locks
    @answers_errors
    async def LockBatch(
        self, request: pb.LockBatchRequest, context: Context
    ) -> pb.LockBatchResponse:
        """Take or renew rebalance locks; answers the queues the caller now holds."""
        keys = self._lock_request(request.group, request.client_id, request.queues)
        held = self._s.locks.lock_batch(request.group, request.client_id, keys)
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
        keys = self._lock_request(request.group, request.client_id, request.queues)
        refused = self._s.locks.unlock_batch(request.group, request.client_id, keys)
        await self._s.locks.save()
        broker = self._s.config.broker_name
        return pb.UnlockBatchResponse(
            not_held=[pb.MessageQueue(topic=t, broker_name=broker, queue_id=q) for t, q in refused]
        )

    def _lock_request(
        self, group: str, client_id: str, queues: Iterable[pb.MessageQueue]
    ) -> list[tuple[str, int]]:
        self._s.known_group(group)
        check_client_id(client_id)
        for q in queues:
            self._s.topic_queue(q.topic, q.queue_id)
        return [(q.topic, q.queue_id) for q in queues]

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
            if g.consume_type == pb.CONSUME_TYPE_UNSPECIFIED:
                raise invalid("INVALID_ARGUMENT", f"group {g.group!r}: consume_type is missing")
            if g.message_model == pb.MESSAGE_MODEL_UNSPECIFIED:
                raise invalid("INVALID_ARGUMENT", f"group {g.group!r}: message_model is missing")
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
        store = self._s.store
        for name, membership in groups.items():
            retry = RETRY_PREFIX + name
            if membership.consume_type == "CONSUME_CONCURRENTLY" and not store.topics.find(retry):
                store.create_topic(retry, 1)  # concurrent members consume their retries
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
        self, request: pb.WatchMembershipRequest, context: Context
    ) -> AsyncIterator[pb.MembershipChanged]:
        """Stream the group's membership on every change."""
        try:
            check_group(request.group)
        except BrokerError as exc:
            await abort(context, exc)
            return
        async with self._stream_of(context):
            watch = self._s.groups.watch(request.group, request.known_version)
            async for version, members in watch:
                yield pb.MembershipChanged(
                    group=request.group, membership_version=version, client_ids=members
                )

    @contextlib.asynccontextmanager
    async def _stream_of(self, context: Context) -> AsyncIterator[None]:
        """Count a long-lived stream against its connection while it is open.

        The end of the last one tells ConsumerGroups that the connection closed.
        """
        peer = context.peer()
        self._s.groups.stream_opened(peer)
        try:
            yield
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
        store = self._s.store
        updates: dict[tuple[str, str, int], int] = {}
        for item in request.offsets:
            topic = self._s.topic_queue(item.topic, item.queue_id)
            cq = store.queue(topic, item.queue_id)
            if not cq.min_offset <= item.offset <= cq.max_offset:
                raise out_of_range(
                    "INVALID_OFFSET",
                    f"offset {item.offset} for {item.topic} queue {item.queue_id} is outside "
                    f"[{cq.min_offset}, {cq.max_offset}]",
                )
            self._s.locks.check_commit(
                request.group, (item.topic, item.queue_id), request.client_id, item.lock_epoch
            )
            updates[(request.group, item.topic, item.queue_id)] = item.offset
        if updates:
            await self._s.offsets.commit(updates)
        return pb.CommitConsumerOffsetsResponse()

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
        try:
            msg_id = bytes.fromhex(request.msg_id)
        except ValueError:
            msg_id = b""
        if len(msg_id) != 16:
            raise invalid(
                "INVALID_ARGUMENT", f"msg_id {request.msg_id!r} is not 32 hexadecimal digits"
            )
        outcome = await self._s.scheduler.cancel(request.topic or None, msg_id)
        return pb.CancelScheduledResponse(
            result=pb.CANCELLED if outcome == CANCELLED else pb.ALREADY_DELIVERED
        )


def _scheduled(checked: list[CheckedFrame]) -> bool:
    """True for a batch of scheduled messages; INVALID_DELIVERY_TIME for a mixed one."""
    scheduled = sum(1 for f in checked if f.due_ms)
    if scheduled and scheduled != len(checked):
        raise invalid(
            "INVALID_DELIVERY_TIME",
            "a batch is either all scheduled or all for now; send them separately",
        )
    return bool(scheduled)


def _send_response(queue_id: int, result: PutResult) -> pb.SendResponse:
    return pb.SendResponse(
        status=pb.SEND_OK if result.durable else pb.FLUSH_DISK_TIMEOUT,
        queue_id=queue_id,
        first_queue_offset=result.first_offset,
        count=result.count,
        store_timestamp_ms=result.store_timestamp_ms,
    )


def _pull_response(got: GetResult, answer: pb.PullResponse | None) -> pb.PullResponse:
    """The answer to a pull, filled into `answer` when given (no copy of its records)."""
    if answer is None:
        answer = pb.PullResponse()
    answer.status = pb.PullStatus.Value(got.status)
    answer.next_offset = got.next_offset
    answer.min_offset = got.min_offset
    answer.max_offset = got.max_offset
    answer.records = got.records
    answer.record_count = got.count
    return answer
