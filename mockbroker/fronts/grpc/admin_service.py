"""AdminService: topics, consumer progress, offset resets and broker status."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

import grpc

from mockbroker.backup import Backups
from mockbroker.deletion import delete_group, delete_topic
from mockbroker.errors import BrokerError, invalid, not_found, out_of_range
from mockbroker.fronts.grpc.service import parked_key_pb
from mockbroker.fronts.grpc_errors import Context, answers_errors
from mockbroker.fronts.message_lookup import find_by_any_id, kept
from mockbroker.state import BrokerState
from mockbroker.store.files import bytes_on_disk
from mockbroker.topics import (
    Topic,
    TopicRetention,
    check_any_topic,
    check_group,
    check_user_topic,
    is_system_topic,
)
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._pb.ordermq.v1 import ordermq_pb2_grpc as pb_grpc
from sdk._version import __version__
from sdk._wire import RECORD
from sdk.log import log_event

log = logging.getLogger("mockbroker.admin")
#: BrowseQueue answers at most this many bytes of records (at least one record).
BROWSE_MAX_BYTES = 4 * 1024 * 1024


class AdminService(pb_grpc.AdminServiceServicer):
    """Operators' calls."""

    def __init__(self, state: BrokerState) -> None:
        self._s = state
        self.requests = state.requests
        self._backups = Backups(state.store, state.clock)

    @answers_errors
    async def CreateTopic(
        self, request: pb.CreateTopicRequest, context: Context
    ) -> pb.CreateTopicResponse:
        """Create a topic with a queue count (idempotent for the same count)."""
        retention = retention_from_pb(request.retention) if request.HasField("retention") else None
        topic, created = await self._s.topic_creation.create(
            request.topic, request.queue_count, retention
        )
        return pb.CreateTopicResponse(topic=self._info(topic, describe=False), created=created)

    @answers_errors
    async def SetTopicRetention(
        self, request: pb.SetTopicRetentionRequest, context: Context
    ) -> pb.SetTopicRetentionResponse:
        """Change a user topic's own retention (zeros: back to the broker's default)."""
        check_user_topic(request.topic)
        retention = retention_from_pb(request.retention)
        topic = await self._s.store.set_topic_retention(request.topic, retention)
        return pb.SetTopicRetentionResponse(topic=self._info(topic, describe=False))

    @answers_errors
    async def ListParkedKeys(
        self, request: pb.ListParkedKeysRequest, context: Context
    ) -> pb.ListParkedKeysResponse:
        """The keys parked for a group (or every group), and those released not yet passed."""
        if request.group:
            check_group(request.group)
        name = self._s.config.broker_name
        await self._s.parking.forget_passed()
        entries = self._s.parking.entries(request.group or None)
        return pb.ListParkedKeysResponse(keys=[parked_key_pb(e, name) for e in entries])

    @answers_errors
    async def ReleaseParkedKey(
        self, request: pb.ReleaseParkedKeyRequest, context: Context
    ) -> pb.ReleaseParkedKeyResponse:
        """Send a parked key's messages back to the end of their queue, in order."""
        topic = self._s.topic_queue(request.queue.topic, request.queue.queue_id)
        entry = await self._s.parking.release(
            request.group, topic, request.queue.queue_id, request.sharding_key
        )
        return pb.ReleaseParkedKeyResponse(
            released=parked_key_pb(entry, self._s.config.broker_name)
        )

    @answers_errors
    async def DeleteTopic(
        self, request: pb.DeleteTopicRequest, context: Context
    ) -> pb.DeleteTopicResponse:
        """Delete a user topic (refused while live consumers subscribe, unless forced)."""
        done = await delete_topic(self._s, request.topic, force=request.force)
        return pb.DeleteTopicResponse(
            topic=done.topic, queue_count=done.queue_count, groups=done.groups
        )

    @answers_errors
    async def DeleteGroup(
        self, request: pb.DeleteGroupRequest, context: Context
    ) -> pb.DeleteGroupResponse:
        """Delete a consumer group (refused while it has live members, unless forced)."""
        done = await delete_group(self._s, request.group, force=request.force)
        return pb.DeleteGroupResponse(
            group=done.group,
            topics=done.topics,
            deleted_topics=done.deleted_topics,
            members=done.members,
        )

    @answers_errors
    async def ListTopics(
        self, request: pb.ListTopicsRequest, context: Context
    ) -> pb.ListTopicsResponse:
        """Every topic; the broker's own only on request."""
        return pb.ListTopicsResponse(
            topics=[
                self._info(t, describe=False)
                for t in self._s.store.topics.all()
                if request.include_system or not is_system_topic(t.name)
            ]
        )

    @answers_errors
    async def DescribeTopic(
        self, request: pb.DescribeTopicRequest, context: Context
    ) -> pb.DescribeTopicResponse:
        """A topic with the min and max offset of each queue."""
        check_any_topic(request.topic)
        topic = self._s.store.topics.get(request.topic)
        return pb.DescribeTopicResponse(topic=self._info(topic, describe=True))

    @answers_errors
    async def ListGroups(
        self, request: pb.ListGroupsRequest, context: Context
    ) -> pb.ListGroupsResponse:
        """Every group with members now or committed offsets."""
        groups, offsets = self._s.groups, self._s.offsets
        out = pb.ListGroupsResponse()
        for name in sorted(self._s.existing_groups()):
            members = groups.membership(name)
            first = next(iter(members.values()), None)
            topics = {t for (g, t, _q) in offsets.committed() if g == name}
            for m in members.values():
                topics |= {t for t, _ in m.subscriptions}
            out.groups.append(
                pb.GroupSummary(
                    group=name,
                    members=len(members),
                    consume_type=first.consume_type if first else "",
                    message_model=first.message_model if first else "",
                    topics=sorted(topics),
                )
            )
        return out

    @answers_errors
    async def ConsumerProgress(
        self, request: pb.ConsumerProgressRequest, context: Context
    ) -> pb.ConsumerProgressResponse:
        """Per queue: broker max offset, committed offset, lag, lock owner and epoch."""
        self._s.known_group(request.group)
        store, group = self._s.store, request.group
        if request.topic:
            topics = [self._s.topic_queue(request.topic, 0)]
        else:
            names = {t for (g, t, _q) in self._s.offsets.committed() if g == group}
            names |= {t for (t, _q) in self._s.locks.locks(group)}
            for membership in self._s.groups.membership(group).values():
                names |= {t for t, _ in membership.subscriptions}
            topics = [t for n in sorted(names) if (t := store.topics.find(n)) is not None]
        locks = self._s.locks.locks(group)
        out = pb.ConsumerProgressResponse(client_ids=self._s.groups.members(group))
        broker = self._s.config.broker_name
        for topic in topics:
            for qid in range(topic.queue_count):
                cq = store.queue(topic, qid)
                max_offset = cq.max_offset
                committed = self._s.offsets.get(group, topic.name, qid)
                lock = locks.get((topic.name, qid))
                live = lock is not None and lock.live
                out.queues.append(
                    pb.QueueProgress(
                        queue=pb.MessageQueue(topic=topic.name, broker_name=broker, queue_id=qid),
                        broker_max_offset=max_offset,
                        consumer_offset=-1 if committed is None else committed,
                        lag=max_offset - max(committed or 0, cq.min_offset),
                        lock_owner=lock.client_id if lock is not None and live else "",
                        lock_epoch=lock.epoch if lock is not None and live else 0,
                        broker_min_offset=cq.min_offset,
                        skipped=self._s.offsets.skipped(group, topic.name, qid),
                    )
                )
        return out

    @answers_errors
    async def ResetOffset(
        self, request: pb.ResetOffsetRequest, context: Context
    ) -> pb.ResetOffsetResponse:
        """Move a stopped group's offsets to an offset, a time, the start or the end."""
        check_group(request.group)
        check_any_topic(request.topic)
        store = self._s.store
        topic = store.topics.get(request.topic)
        queues = range(topic.queue_count) if request.queue_id == -1 else [request.queue_id]
        for qid in queues:
            topic.check_queue(qid)
        target = request.WhichOneof("target")
        if target is None:
            raise invalid(
                "INVALID_ARGUMENT", "say where to: offset, timestamp_ms, earliest or latest"
            )
        members = self._s.groups.members(request.group)
        if members and not request.force:
            raise BrokerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                "INVALID_ARGUMENT",
                f"group {request.group!r} has {len(members)} live member(s); stop them or force",
            )
        updates = {
            (request.group, topic.name, qid): self._target_offset(topic, qid, request, target)
            for qid in queues
        }
        for (group, name, qid), offset in updates.items():
            await self._s.pop.reset(group, name, qid, offset)  # a receiving group starts over
        await self._s.offsets.commit(updates)
        log_event(log, logging.WARNING, "offset.reset",
                  f"offsets of {request.group} on {topic.name} reset ({target})",
                  group=request.group, topic=topic.name,
                  offsets={q: o for (_, _, q), o in updates.items()})  # fmt: skip
        return pb.ResetOffsetResponse(
            offsets=[
                pb.OffsetCommit(topic=t, queue_id=q, offset=o) for (_, t, q), o in updates.items()
            ]
        )

    def _target_offset(
        self, topic: Topic, qid: int, request: pb.ResetOffsetRequest, target: str
    ) -> int:
        store = self._s.store
        low, high = store.queue(topic, qid).min_offset, store.end_offset(topic, qid)
        if target == "earliest":
            return low
        if target == "latest":
            return high
        if target == "timestamp_ms":
            return min(store.offset_for_timestamp(topic, qid, request.timestamp_ms), high)
        if not low <= request.offset <= high:
            raise out_of_range(
                "INVALID_OFFSET",
                f"offset {request.offset} for {topic.name} queue {qid} is outside [{low}, {high}]",
            )
        return request.offset

    @answers_errors
    async def QueryMessageById(
        self, request: pb.QueryMessageByIdRequest, context: Context
    ) -> pb.QueryMessagesResponse:
        """The stored copies of a message (original, retries, dead letter), newest first.

        Any id a client prints names it: ordermq's, RocketMQ 4.x's UNIQ_KEY and
        offsetMsgId, RocketMQ 5's (mockbroker/fronts/message_lookup.py).
        """
        records = await asyncio.to_thread(
            find_by_any_id, self._s.store, request.msg_id, skip=self._half_record
        )
        if not records:
            raise not_found("MESSAGE_NOT_FOUND", f"no stored message {request.msg_id.strip()}")
        return pb.QueryMessagesResponse(records=b"".join(records), record_count=len(records))

    @answers_errors
    async def QueryMessagesByKey(
        self, request: pb.QueryMessagesByKeyRequest, context: Context
    ) -> pb.QueryMessagesResponse:
        """Messages of a topic carrying a key, newest first (at most max_messages, 1..1000)."""
        check_any_topic(request.topic)
        self._s.store.topics.get(request.topic)
        if not request.key:
            raise invalid("INVALID_ARGUMENT", "key is empty")
        limit = request.max_messages or 32
        if not 1 <= limit <= 1000:
            raise invalid("INVALID_ARGUMENT", f"max_messages {limit} is outside 1..1000")
        found = self._s.store.records_by_key(request.topic, request.key)
        records = await asyncio.to_thread(kept, found, limit, self._half_record)
        return pb.QueryMessagesResponse(records=b"".join(records), record_count=len(records))

    @answers_errors
    async def BrowseQueue(
        self, request: pb.BrowseQueueRequest, context: Context
    ) -> pb.BrowseQueueResponse:
        """A queue's stored messages from an offset, in order (at most max_messages, 1..1000).

        Nothing is delivered or counted as served; a transaction's half message is left out.
        """
        check_any_topic(request.topic)
        store = self._s.store
        topic = store.topics.get(request.topic)
        topic.check_queue(request.queue_id)
        limit = request.max_messages or 32
        if not 1 <= limit <= 1000:
            raise invalid("INVALID_ARGUMENT", f"max_messages {limit} is outside 1..1000")
        qid = request.queue_id
        low, high = store.queue(topic, qid).min_offset, store.end_offset(topic, qid)
        if not low <= request.offset <= high:
            raise out_of_range(
                "INVALID_OFFSET",
                f"offset {request.offset} of {topic.name} queue {qid} is outside [{low}, {high}]",
            )
        end = min(high, request.offset + limit)

        def read() -> list[bytes]:
            out: list[bytes] = []
            size = 0
            for offset in range(request.offset, end):
                record = store.read_record(topic, qid, offset)
                if size and size + len(record) > BROWSE_MAX_BYTES:
                    break
                position = store.queue(topic, qid).entry(offset)[0]
                size += len(record)
                out.append(b"" if self._half_record(position, record) else record)
            return out

        read_records = await asyncio.to_thread(read)
        records = [r for r in read_records if r]
        return pb.BrowseQueueResponse(
            records=b"".join(records), record_count=len(records), min_offset=low,
            max_offset=high, next_offset=request.offset + len(read_records),
        )  # fmt: skip

    def _half_record(self, position: int, record: bytes) -> bool:
        """True for a transaction's half message: lookups skip it (message_lookup.py)."""
        queue_offset = RECORD.unpack_from(record)[4]
        return self._s.transactions.is_half(position, queue_offset)

    @answers_errors
    async def BrokerStatus(
        self, request: pb.BrokerStatusRequest, context: Context
    ) -> pb.BrokerStatusResponse:
        """Uptime, sizes, counters and what recovery found."""
        store = self._s.store
        rate_in, rate_out = self._s.rates.rates()
        return pb.BrokerStatusResponse(
            messages_in_per_second=rate_in,
            messages_out_per_second=rate_out,
            broker_name=self._s.config.broker_name,
            version=__version__,
            uptime_ms=int((self._s.clock.now() - self._s.started) * 1000),
            flush_mode=self._s.config.flush_mode,
            commit_log_bytes=store.commitlog.total_bytes(),
            disk_bytes=bytes_on_disk(store.data_dir),
            messages_stored=store.stats.messages_stored,
            messages_served=store.stats.messages_served,
            recovered_from_crash=store.recovery.crashed,
            truncated_bytes_at_recovery=store.recovery.truncated_bytes,
            corrupt_records_detected=store.stats.corrupt_records_detected,
            topic_count=sum(not is_system_topic(t.name) for t in store.topics.all()),
            held_pulls=self._s.holder.held,
            **self._retention_status(),
        )

    # ---- Backup ----
    @answers_errors
    async def Backup(self, request: pb.BackupRequest, context: Context) -> pb.BackupResponse:
        """A consistent copy of the data directory, as of now, in a directory on this machine."""
        report = await self._backups.backup(request.directory)
        log_event(
            log, logging.INFO, "backup",
            f"backup written to {report.directory}: {report.bytes} bytes, "
            f"commit log up to {report.commit_log_end}, {report.seconds:.1f}s",
            directory=str(report.directory), bytes=report.bytes,
            commit_log_end=report.commit_log_end,
        )  # fmt: skip
        return pb.BackupResponse(
            directory=str(report.directory),
            commit_log_end=report.commit_log_end,
            messages=report.messages,
            files=report.files,
            bytes=report.bytes,
            duration_ms=int(report.seconds * 1000),
        )

    # ---- end Backup ----

    def _retention_status(self) -> dict[str, Any]:
        """BrokerStatus's disk and retention fields."""
        store = self._s.store
        disk = store.disk
        return {
            "disk_total_bytes": disk.total_bytes if disk is not None else 0,
            "disk_free_bytes": disk.free_bytes if disk is not None else 0,
            "disk_used_ratio": disk.ratio if disk is not None else 0.0,
            "sends_refused": store.refusing_sends,
            "retention_hours": self._s.config.retention_hours,
            "oldest_stored_timestamp_ms": store.oldest_timestamp_ms(),
            "retention_deleted_messages": store.retention_stats.messages_deleted,
            "retention_expired_messages": store.retention_stats.messages_expired,
            "retention": [
                pb.TopicRetention(
                    topic=topic.name,
                    min_offsets=[
                        store.queue(topic, q).min_offset for q in range(topic.queue_count)
                    ],
                )
                for topic in store.topics.all()
                if not is_system_topic(topic.name)
            ],
        }

    def _info(self, topic: Topic, *, describe: bool) -> pb.TopicInfo:
        store = self._s.store
        info = pb.TopicInfo(
            topic=topic.name,
            queue_count=topic.queue_count,
            broker_name=self._s.config.broker_name,
            retention=pb.RetentionSettings(
                hours=topic.retention.hours or 0.0,
                bytes_per_queue=topic.retention.bytes_per_queue or 0,
            ),
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


def retention_from_pb(settings: pb.RetentionSettings) -> TopicRetention:
    """A request's retention settings (zeros: the broker's defaults); INVALID_ARGUMENT if bad."""
    if not math.isfinite(settings.hours) or settings.hours < 0 or settings.bytes_per_queue < 0:
        raise invalid(
            "INVALID_ARGUMENT",
            f"retention hours {settings.hours!r} and bytes per queue "
            f"{settings.bytes_per_queue} must be positive (0: the broker's default)",
        )
    return TopicRetention(settings.hours or None, settings.bytes_per_queue or None)
