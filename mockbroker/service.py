"""gRPC servicers: protobuf in, domain calls, protobuf out; BrokerError -> status.

Methods of the protocol that no handler here overrides answer UNIMPLEMENTED (the
generated base classes do that); they arrive with the coordination features.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from mockbroker.errors import BrokerError, invalid, not_implemented, out_of_range
from mockbroker.offsets import ConsumerOffsets
from mockbroker.store.message_store import MessageStore, parse_tag_expression
from mockbroker.topics import (
    check_any_topic,
    check_group,
    check_user_topic,
    is_system_topic,
)
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._wire import MAX_PULL_BYTES, MAX_PULL_MESSAGES, MAX_SEND_BYTES
from sdk.clock import Clock

if TYPE_CHECKING:
    from mockbroker.config import BrokerConfig

REASON_KEY = "ordermq-reason"
VERSION = "0.1.0"

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[Any, Req, grpc.aio.ServicerContext[Any, Any]], Awaitable[Resp]]


def answers_errors(handler: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Turn a BrokerError raised by `handler` into its gRPC status and reason metadata."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Req, context: grpc.aio.ServicerContext[Any, Any]) -> Resp:
        try:
            return await handler(self, request, context)
        except BrokerError as exc:
            context.set_trailing_metadata(((REASON_KEY, exc.reason),))
            await context.abort(exc.status, exc.message)
            raise AssertionError("unreachable: abort raises") from exc

    return wrapper


class BrokerState:
    """What the servicers share: configuration, store, offsets and the start time."""

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        offsets: ConsumerOffsets,
        clock: Clock,
    ) -> None:
        self.config = config
        self.store = store
        self.offsets = offsets
        self.clock = clock
        self.started = clock.now()
        self.address = ""


def _not_yet(feature: str) -> BrokerError:
    return not_implemented(f"{feature} is not served by this broker version yet")


class MessagingService(pb_grpc.MessagingServiceServicer):
    """Routing, send, pull and consumer offsets."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state

    @answers_errors
    async def QueryRoute(
        self, request: pb.QueryRouteRequest, context: grpc.aio.ServicerContext[Any, Any]
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
    async def Send(
        self, request: pb.SendRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SendResponse:
        """Append a batch of frames to one queue."""
        check_user_topic(request.topic)
        if len(request.frames) > MAX_SEND_BYTES:
            raise BrokerError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                "BATCH_TOO_LARGE",
                f"the request carries {len(request.frames)} bytes of frames, "
                f"over the limit of {MAX_SEND_BYTES}",
            )
        store = self._s.store
        topic = store.topics.find(request.topic)
        if topic is None and self._s.config.auto_create_topics:
            topic, _ = store.create_topic(request.topic, self._s.config.default_queues)
        if topic is None:
            topic = store.topics.get(request.topic)
        result = await store.put(topic, request.queue_id, request.frames)
        return pb.SendResponse(
            status=pb.SEND_OK if result.durable else pb.FLUSH_DISK_TIMEOUT,
            queue_id=request.queue_id,
            first_queue_offset=result.first_offset,
            count=result.count,
            store_timestamp_ms=result.store_timestamp_ms,
        )

    @answers_errors
    async def Pull(
        self, request: pb.PullRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PullResponse:
        """Read from one queue by offset."""
        check_group(request.group)
        check_any_topic(request.topic)
        if not 1 <= request.max_messages <= MAX_PULL_MESSAGES:
            raise invalid(
                "INVALID_ARGUMENT",
                f"max_messages {request.max_messages} is outside 1..{MAX_PULL_MESSAGES}",
            )
        if not 1 <= request.max_bytes <= MAX_PULL_BYTES:
            raise invalid(
                "INVALID_ARGUMENT", f"max_bytes {request.max_bytes} is outside 1..{MAX_PULL_BYTES}"
            )
        if request.suspend_timeout_ms < 0:
            raise invalid("INVALID_ARGUMENT", "suspend_timeout_ms must not be negative")
        tags = parse_tag_expression(request.tag_expression)
        store = self._s.store
        topic = store.topics.get(request.topic)
        got = store.get(
            topic,
            request.queue_id,
            request.offset,
            max_messages=request.max_messages,
            max_bytes=request.max_bytes,
            tags=tags,
        )
        return pb.PullResponse(
            status=pb.PullStatus.Value(got.status),
            next_offset=got.next_offset,
            min_offset=got.min_offset,
            max_offset=got.max_offset,
            records=got.records,
            record_count=got.count,
        )

    @answers_errors
    async def QueryConsumerOffset(
        self, request: pb.QueryConsumerOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.QueryConsumerOffsetResponse:
        """A group's committed offset for one queue, or found=false."""
        check_group(request.group)
        check_any_topic(request.topic)
        self._s.store.topics.get(request.topic).check_queue(request.queue_id)
        offset = self._s.offsets.get(request.group, request.topic, request.queue_id)
        if offset is None:
            return pb.QueryConsumerOffsetResponse(found=False, offset=-1)
        return pb.QueryConsumerOffsetResponse(found=True, offset=offset)

    @answers_errors
    async def CommitConsumerOffsets(
        self,
        request: pb.CommitConsumerOffsetsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.CommitConsumerOffsetsResponse:
        """Record offsets durably, all or nothing."""
        check_group(request.group)
        store = self._s.store
        updates: dict[tuple[str, str, int], int] = {}
        for item in request.offsets:
            check_any_topic(item.topic)
            topic = store.topics.get(item.topic)
            cq = store.queue(topic, item.queue_id)
            if not cq.min_offset <= item.offset <= cq.max_offset:
                raise out_of_range(
                    "INVALID_OFFSET",
                    f"offset {item.offset} for {item.topic} queue {item.queue_id} is outside "
                    f"[{cq.min_offset}, {cq.max_offset}]",
                )
            updates[(request.group, item.topic, item.queue_id)] = item.offset
        if updates:
            await self._s.offsets.commit(updates)
        return pb.CommitConsumerOffsetsResponse()

    # Coordination (rebalance locks, membership, retry and scheduling) is the next step of
    # the broker; until it lands these answer UNIMPLEMENTED with the reason NOT_IMPLEMENTED.
    @answers_errors
    async def LockBatch(
        self, request: pb.LockBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.LockBatchResponse:
        """Not served yet: rebalance locks."""
        raise _not_yet("LockBatch")

    @answers_errors
    async def UnlockBatch(
        self, request: pb.UnlockBatchRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UnlockBatchResponse:
        """Not served yet: rebalance locks."""
        raise _not_yet("UnlockBatch")

    @answers_errors
    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.HeartbeatResponse:
        """Not served yet: group membership."""
        raise _not_yet("Heartbeat")

    @answers_errors
    async def GetConsumerList(
        self, request: pb.GetConsumerListRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetConsumerListResponse:
        """Not served yet: group membership."""
        raise _not_yet("GetConsumerList")

    async def WatchMembership(
        self, request: pb.WatchMembershipRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.MembershipChanged]:
        """Not served yet: group membership."""
        context.set_trailing_metadata(((REASON_KEY, "NOT_IMPLEMENTED"),))
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            "WatchMembership is not served by this broker version yet",
        )
        yield pb.MembershipChanged()  # pragma: no cover - abort raises

    @answers_errors
    async def SendBack(
        self, request: pb.SendBackRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SendBackResponse:
        """Not served yet: retry and dead-letter topics."""
        raise _not_yet("SendBack")

    @answers_errors
    async def CancelScheduled(
        self, request: pb.CancelScheduledRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CancelScheduledResponse:
        """Not served yet: delayed delivery."""
        raise _not_yet("CancelScheduled")


class AdminService(pb_grpc.AdminServiceServicer):
    """Topic administration and broker status."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state

    @answers_errors
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateTopicResponse:
        """Create a topic with a queue count (idempotent for the same count)."""
        check_user_topic(request.topic)
        topic, created = self._s.store.create_topic(request.topic, request.queue_count)
        return pb.CreateTopicResponse(topic=self._info(topic.name, describe=False), created=created)

    @answers_errors
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTopicsResponse:
        """Every topic, system topics only on request."""
        return pb.ListTopicsResponse(
            topics=[
                self._info(t.name, describe=False)
                for t in self._s.store.topics.all()
                if request.include_system or not is_system_topic(t.name)
            ]
        )

    @answers_errors
    async def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeTopicResponse:
        """A topic with the min and max offset of each queue."""
        check_any_topic(request.topic)
        return pb.DescribeTopicResponse(topic=self._info(request.topic, describe=True))

    @answers_errors
    async def BrokerStatus(
        self, request: pb.BrokerStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.BrokerStatusResponse:
        """Uptime, sizes, counters and what recovery found."""
        store = self._s.store
        return pb.BrokerStatusResponse(
            broker_name=self._s.config.broker_name,
            version=VERSION,
            uptime_ms=int((self._s.clock.now() - self._s.started) * 1000),
            flush_mode=self._s.config.flush_mode,
            commit_log_bytes=store.commitlog.total_bytes(),
            disk_bytes=sum(p.stat().st_size for p in store.data_dir.rglob("*") if p.is_file()),
            messages_stored=store.stats.messages_stored,
            messages_served=store.stats.messages_served,
            recovered_from_crash=store.recovery.crashed,
            truncated_bytes_at_recovery=store.recovery.truncated_bytes,
            corrupt_records_detected=store.stats.corrupt_records_detected,
            topic_count=len(store.topics.all()),
            held_pulls=0,
        )

    @answers_errors
    async def ConsumerProgress(
        self, request: pb.ConsumerProgressRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ConsumerProgressResponse:
        """Not served yet: arrives with consumer groups."""
        raise _not_yet("ConsumerProgress")

    @answers_errors
    async def ResetOffset(
        self, request: pb.ResetOffsetRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ResetOffsetResponse:
        """Not served yet: arrives with consumer groups."""
        raise _not_yet("ResetOffset")

    @answers_errors
    async def QueryMessageById(
        self, request: pb.QueryMessageByIdRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.QueryMessagesResponse:
        """Not served yet: needs the message id index."""
        raise _not_yet("QueryMessageById")

    @answers_errors
    async def QueryMessagesByKey(
        self, request: pb.QueryMessagesByKeyRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.QueryMessagesResponse:
        """Not served yet: needs the message key index."""
        raise _not_yet("QueryMessagesByKey")

    def _info(self, name: str, *, describe: bool) -> pb.TopicInfo:
        store = self._s.store
        topic = store.topics.get(name)
        info = pb.TopicInfo(
            topic=topic.name, queue_count=topic.queue_count, broker_name=self._s.config.broker_name
        )
        if describe:
            for qid in range(topic.queue_count):
                cq = store.queue(topic, qid)
                info.queues.append(
                    pb.QueueStats(
                        queue_id=qid,
                        min_offset=cq.min_offset,
                        max_offset=cq.max_offset,
                        last_store_timestamp_ms=store.last_store_timestamp_ms(topic, qid),
                    )
                )
        return info
