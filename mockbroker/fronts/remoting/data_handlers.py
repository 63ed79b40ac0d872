"""The data path of RocketMQ's broker protocol: sends, pulls, and messages by id or key.

SEND_MESSAGE (10), SEND_MESSAGE_V2 (310, the same header with one-letter keys) and
SEND_BATCH_MESSAGE (320) store messages; PULL_MESSAGE (11) reads a queue, holding the
request while there is nothing to read; VIEW_MESSAGE_BY_ID (33) reads the message at a
commit-log position and QUERY_MESSAGE (12) finds messages by key or UNIQ_KEY.

Each handler translates its request at the edge (translate.py) and then makes the calls
ordermq's gRPC front makes: sends and pulls go through mockbroker/delivery.py (the same
checks in the same order, fair turns between clients, long polling), offsets through the
same offset table, so a message sent here is read over gRPC and the other way round.
Only a send to a retry topic goes to the store itself, as the retry service does.

Refusals are RocketMQ's codes: a BrokerError of the core becomes the code RocketMQ's
broker gives in that situation, its remark the core's reason. Every handler answers
(none raises RemotingError), and the replies that RocketMQ clients read extFields from
always carry them, values as strings.

Choices where ordermq and RocketMQ differ, or RocketMQ leaves room:

- Sends to `%RETRY%<group>` are accepted as RocketMQ accepts them (the Java consumer's
  fallback when CONSUMER_SEND_MSG_BACK fails): into the group's one-queue retry topic, or
  into `%DLQ%<group>` without delay once `reconsumeTimes` reaches the header's
  `maxReconsumeTimes` (default 16). The reconsume count is kept for those only (Java
  producers send 0 elsewhere). Sends to `%DLQ%...` and `rmq_sys_...` are refused
  (NO_PERMISSION); a batch to a retry topic, a compressed batch and delays in a batch are
  refused (MESSAGE_ILLEGAL).
- A pull's `commitOffset` (sysFlag 0x1) is committed by the core's rule of committing
  an offset (mockbroker/offset_commits.py), as UPDATE_CONSUMER_OFFSET and gRPC commits
  are: not while another client holds the queue's lock, not outside the queue's
  [min, max], and only forward, past the latest accepted commit (one still being saved
  counts). RocketMQ's broker stores whatever it is sent, and a pull still in flight from
  a consumer that has since lost the queue in a rebalance carries an older offset than
  the new owner's, which would move the group back. Moving an offset back on purpose is
  UPDATE_CONSUMER_OFFSET's job. The pull is served whether or not it committed.
- A pull without the subscription bit (0x4) filters by what the group's members
  subscribed in their heartbeats (ConsumerGroups), else by the request's `subscription`
  field when it has one, else not at all (RocketMQ clients filter by tag again, so an
  unfiltered pull delivers nothing wrong). Tag filtering is exact, by tag string.
- QUERY_MESSAGE with `_UNIQUE_KEY_QUERY=true` ignores the time range: ordermq's message
  ids carry no time, so the range a Java client derives from one means nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from mockbroker.dedup import first_id
from mockbroker.delivery import MAX_SUSPEND_MS, Delivery, SendOutcome
from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.fronts.remoting.coordination import RemotingClients
from mockbroker.fronts.remoting.errors import refusal
from mockbroker.offset_commits import OffsetUpdate, Unfenced
from mockbroker.retry import DEFAULT_MAX_RECONSUME_TIMES
from mockbroker.state import BrokerState
from mockbroker.store.consumequeue import ConsumeQueue
from mockbroker.store.message_store import GetResult
from mockbroker.topics import (
    HALF_TOPIC,
    SCHEDULE_TOPIC,
    SYSTEM_PREFIX,
    Topic,
    check_group,
    check_user_topic,
)
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import Fields, RemotingCommand, RemotingError
from sdk._remoting.message_ids import (
    SocketAddress,
    UniqKeyGenerator,
    create_offset_msg_id,
)
from sdk._remoting.message_layout import (
    COMPRESSED_FLAG,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageLayoutError,
    decode_batch,
)
from sdk._remoting.properties import decode_properties
from sdk._remoting.subscription import parse_subscription
from sdk._remoting.translate import (
    IncomingMessage,
    encode_served,
    illegal,
    is_transactional,
    msg_id_for_uniq_key,
    rocketmq_uniq_key,
    to_frame,
)
from sdk._validation import DLQ_PREFIX, RETRY_PREFIX
from sdk._wire import (
    FRAME_FIELDS,
    FRAME_LEN_PREFIX,
    MAX_PULL_MESSAGES,
    MAX_SEND_BYTES,
    RECORD,
    iter_records,
)

log = logging.getLogger("mockbroker.remoting")

#: What RocketMQ's broker names its region when none is configured (BrokerConfig).
DEFAULT_REGION = "DefaultRegion"
#: At most this many bytes of records per pull answer (one larger message still goes).
PULL_MAX_BYTES = 4 * 1024 * 1024
#: QUERY_MESSAGE's limits: maxMsgsNumBatch, and defaultQueryMaxNum for a UNIQ_KEY query.
QUERY_MAX_NUM = 64
UNIQUE_QUERY_MAX_NUM = 32
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"

# PullSysFlag bits.
PULL_COMMIT_OFFSET = 0x1
PULL_SUSPEND = 0x2
PULL_SUBSCRIPTION = 0x4
PULL_CLASS_FILTER = 0x8
PULL_LITE = 0x10

#: SendMessageRequestHeaderV2's one-letter keys and the V1 names they stand for.
V2_FIELDS = {
    "a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
    "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
    "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch",
    "n": "brokerName",
}  # fmt: skip


def data_handlers(
    state: BrokerState, clients: RemotingClients, *, store_host: Callable[[], str] | None = None
) -> dict[int, Handler]:
    """The handlers of the data path's request codes, on the broker's core.

    `clients` tells which client ids spoke on a connection (a pull's commit bit commits
    for them). `store_host` answers "ip:port" where RocketMQ clients reach this broker's
    remoting port: offsetMsgIds name it (default: the broker's gRPC address).
    """
    handlers = DataHandlers(state, clients, store_host or (lambda: state.address))
    return {
        RequestCode.SEND_MESSAGE: handlers.send_message,
        RequestCode.SEND_MESSAGE_V2: handlers.send_message_v2,
        RequestCode.SEND_BATCH_MESSAGE: handlers.send_batch_message,
        RequestCode.PULL_MESSAGE: handlers.pull_message,
        RequestCode.VIEW_MESSAGE_BY_ID: handlers.view_message_by_id,
        RequestCode.QUERY_MESSAGE: handlers.query_message,
    }


@dataclass(frozen=True, slots=True)
class SendHeader:
    """SendMessageRequestHeader, read from V1 names."""

    producer_group: str
    topic: str
    queue_id: int
    sys_flag: int
    born_timestamp_ms: int
    flag: int
    properties: str
    reconsume_times: int
    max_reconsume_times: int | None

    @classmethod
    def read(cls, fields: Fields) -> SendHeader:
        """The header's fields; RemotingError SYSTEM_ERROR names a missing or bad one."""
        max_times = fields.optional_string("maxReconsumeTimes")
        return cls(
            producer_group=fields.string("producerGroup"),
            topic=fields.string("topic"),
            queue_id=fields.integer("queueId", bits=32),
            sys_flag=fields.integer("sysFlag", bits=32),
            born_timestamp_ms=fields.integer("bornTimestamp"),
            flag=fields.integer("flag", bits=32),
            properties=fields.optional_string("properties", "") or "",
            reconsume_times=fields.integer("reconsumeTimes", 0, bits=32),
            max_reconsume_times=None
            if max_times is None
            else fields.integer("maxReconsumeTimes", bits=32),
        )


class DataHandlers:
    """The data path's handlers, sharing the broker's state."""

    def __init__(
        self, state: BrokerState, clients: RemotingClients, store_host: Callable[[], str]
    ) -> None:
        self._s = state
        self._clients = clients
        self._store_host_text = store_host
        self._store_host: tuple[str, SocketAddress] | None = None
        self._uniq_keys: UniqKeyGenerator | None = None
        self._delivery = Delivery(state)

    # ------------------------------------------------------------------ send
    async def send_message(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """SEND_MESSAGE (10): one message, or a batch when the header says so."""
        return await self._send(request, channel, Fields.of(request))

    async def send_message_v2(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """SEND_MESSAGE_V2 (310): SEND_MESSAGE with one-letter header keys."""
        return await self._send(request, channel, _v1_fields(request))

    async def send_batch_message(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """SEND_BATCH_MESSAGE (320): a batch of messages for one queue, all or none stored."""
        return await self._send(request, channel, _v1_fields(request), batch=True)

    async def _send(
        self, request: RemotingCommand, channel: ClientChannel, fields: Fields, batch: bool = False
    ) -> RemotingCommand | None:
        ext = {"MSG_REGION": DEFAULT_REGION, "TRACE_ON": "true"}
        try:
            header = SendHeader.read(fields)
            batch = batch or fields.boolean("batch")
            code, reply = await self._store_send(request, channel, header, batch)
        except RemotingError as exc:
            if request.is_oneway:
                log.debug("oneway send from %s refused: %s", channel.peer, exc.remark)
                return None
            return request.response(exc.code, remark=exc.remark, ext_fields=ext)
        if request.is_oneway:
            return None
        return request.response(code, ext_fields={**reply, **ext})

    async def _store_send(
        self, request: RemotingCommand, channel: ClientChannel, header: SendHeader, batch: bool
    ) -> tuple[int, dict[str, str]]:
        """Check and store; (response code, reply fields)."""
        try:
            if header.topic.startswith(RETRY_PREFIX):
                return await self._send_back(request, channel, header, batch)
            if header.topic.startswith((DLQ_PREFIX, SYSTEM_PREFIX)):
                raise RemotingError(
                    ResponseCode.NO_PERMISSION,
                    f"sending to topic {header.topic!r} is forbidden: only the broker writes to it",
                )
            check_user_topic(header.topic)  # before the messages' checks, as Delivery does
            if is_transactional(header.sys_flag, decode_properties(header.properties)):
                return await self._send_half(request, channel, header, batch)
            queue_id = self._queue_id(header.topic, header.queue_id, self._s.config.default_queues)
            frames = self._frames(request, channel, header, header.topic, batch)
            sent = await self._delivery.send(channel.peer, header.topic, queue_id, frames)
        except BrokerError as exc:
            raise refusal(exc) from None
        queue_id = sent.queue_id if sent.duplicate else queue_id  # a duplicate: its first's
        store = self._s.store
        if sent.messages and not sent.scheduled:
            return self._sent_each(sent, store.topics.get(header.topic))
        if sent.scheduled:
            index, first = store.queue(store.topics.get(SCHEDULE_TOPIC), 0), sent.schedule_offset
        else:
            index, first = store.queue(store.topics.get(header.topic), queue_id), sent.first_offset
        return self._sent(sent.durable, index, first, sent.count, queue_id)

    async def _send_back(
        self, request: RemotingCommand, channel: ClientChannel, header: SendHeader, batch: bool
    ) -> tuple[int, dict[str, str]]:
        """A send to `%RETRY%<group>`: into the retry topic, or the dead-letter topic.

        Like the retry service, it stores into the broker's own topics (created on first
        use, one queue each), keeping the reconsume count; the checks and their order are
        Delivery.send's.
        """
        if batch:
            raise illegal(f"a batch cannot be sent to the retry topic {header.topic!r}")
        group = header.topic[len(RETRY_PREFIX) :]
        check_group(group)
        limit = header.max_reconsume_times
        dead = header.reconsume_times >= (DEFAULT_MAX_RECONSUME_TIMES if limit is None else limit)
        name = DLQ_PREFIX + group if dead else header.topic
        queue_id = self._queue_id(name, -1 if dead else header.queue_id, 1)
        frames = self._frames(request, channel, header, name, batch, unscheduled=dead)
        store = self._s.store
        checked = store.check(frames)
        store.check_accepting_sends()
        topic = await self._s.topic_creation.system_topic(name)
        times = header.reconsume_times
        if checked[0].due_ms:
            put = await self._s.scheduler.schedule_stored(
                topic, queue_id, frames, checked, reconsume_times=times
            )
            index = store.queue(store.topics.get(SCHEDULE_TOPIC), 0)
        else:
            put = await store.append(topic, queue_id, frames, checked, reconsume_times=times)
            index = store.queue(topic, queue_id)
        return self._sent(put.durable, index, put.first_offset, put.count, queue_id)

    async def _send_half(
        self, request: RemotingCommand, channel: ClientChannel, header: SendHeader, batch: bool
    ) -> tuple[int, dict[str, str]]:
        """A transaction's half message (sysFlag PREPARED, or TRAN_MSG=true).

        Unseen until committed (mockbroker/transactions.py). The reply's queueOffset is
        its offset in the half queue and its msgId names its commit-log position, as
        RocketMQ's do: the producer ends it with those (END_TRANSACTION).
        """
        if batch:
            raise illegal("a batch cannot carry transactional messages; send them one by one")
        kind = header.sys_flag & TRANSACTION_TYPE_MASK
        if kind not in (0, TRANSACTION_PREPARED_TYPE):
            raise illegal(
                f"sysFlag {header.sys_flag} sends a transaction's commit or rollback; "
                "a transactional message is sent prepared, then ended with END_TRANSACTION"
            )
        queue_id = self._queue_id(header.topic, header.queue_id, self._s.config.default_queues)
        frame = self._frames(request, channel, header, header.topic, batch, half=True)
        stored = await self._delivery.send_half(
            channel.peer, header.topic, queue_id, frame, header.producer_group
        )
        store = self._s.store
        index = store.queue(store.topics.get(HALF_TOPIC), 0)
        return self._sent(stored.durable, index, stored.half_offset, 1, queue_id)

    def _sent(
        self, durable: bool, index: ConsumeQueue, first: int, count: int, queue_id: int
    ) -> tuple[int, dict[str, str]]:
        """The reply to a stored send: one offsetMsgId per message, from its index entry."""
        host = self._host()
        msg_ids = ",".join(
            create_offset_msg_id(host, position) for position, _, _ in index.read(first, count)
        )
        code = ResponseCode.SUCCESS if durable else ResponseCode.FLUSH_DISK_TIMEOUT
        return code, {"msgId": msg_ids, "queueId": str(queue_id), "queueOffset": str(first)}

    def _sent_each(self, sent: SendOutcome, topic: Topic) -> tuple[int, dict[str, str]]:
        """The reply to a batch with duplicates: each message's offsetMsgId from its place.

        queueId and queueOffset are the first message's; ordermq's fields `queueIds`,
        `queueOffsets` and `uniqKeys` (a duplicate's: its first copy's) give each one's.
        """
        host, store = self._host(), self._s.store
        places = sent.messages
        offset_ids = [
            create_offset_msg_id(host, store.queue(topic, p.queue_id).entry(p.offset)[0])
            for p in places
        ]
        code = ResponseCode.SUCCESS if sent.durable else ResponseCode.FLUSH_DISK_TIMEOUT
        return code, {
            "msgId": ",".join(offset_ids),
            "queueId": str(places[0].queue_id),
            "queueOffset": str(places[0].offset),
            "queueIds": ",".join(str(p.queue_id) for p in places),
            "queueOffsets": ",".join(str(p.offset) for p in places),
            "uniqKeys": ",".join(first_id(p) if p.duplicate else "" for p in places),
        }

    def _queue_id(self, topic_name: str, asked: int, new_topic_queues: int) -> int:
        """The queue a send asked for; a random one of the topic's when it asked for < 0."""
        if asked >= 0:
            return asked
        topic = self._s.store.topics.find(topic_name)
        return random.randrange(topic.queue_count if topic else new_topic_queues)

    def _frames(
        self,
        request: RemotingCommand,
        channel: ClientChannel,
        header: SendHeader,
        topic: str,
        batch: bool,
        *,
        unscheduled: bool = False,
        half: bool = False,
    ) -> bytes:
        """The request's messages as ordermq frames (the store checks them next)."""
        if len(request.body) > MAX_SEND_BYTES:
            raise illegal(
                f"the request carries {len(request.body)} bytes of messages, over the "
                f"limit of {MAX_SEND_BYTES}"
            )
        now_ms = int(self._s.clock.now() * 1000)
        frames = [
            to_frame(
                message,
                now_ms=now_ms,
                new_uniq_key=self._new_uniq_key,
                unscheduled=unscheduled,
                half=half,
            )
            for message in self._messages(request, channel, header, topic, batch)
        ]
        if batch and any(_scheduled_frame(frame) for frame in frames):
            raise illegal("a batch cannot carry delayed messages; send them one by one")
        return b"".join(frames)

    def _messages(
        self,
        request: RemotingCommand,
        channel: ClientChannel,
        header: SendHeader,
        topic: str,
        batch: bool,
    ) -> Iterator[IncomingMessage]:
        born_host = _peer_address(channel)
        properties = decode_properties(header.properties)
        if not batch:
            yield IncomingMessage(
                topic, request.body, properties, header.flag, header.sys_flag,
                header.born_timestamp_ms, born_host,
            )  # fmt: skip
            return
        if header.sys_flag & COMPRESSED_FLAG:
            raise illegal("a batch cannot be compressed; RocketMQ's producers never do")
        try:
            elements = decode_batch(request.body)
        except MessageLayoutError as exc:
            raise illegal(f"the batch body does not parse: {exc}") from None
        if not elements:
            raise illegal("the batch carries no messages")
        for element in elements:
            # The batch's own properties follow each message's and win, as in RocketMQ.
            yield IncomingMessage(
                topic, element.body, {**element.properties, **properties},
                element.flag, header.sys_flag, header.born_timestamp_ms, born_host,
            )  # fmt: skip

    def _new_uniq_key(self) -> str:
        """A UNIQ_KEY for a message that came without one, made as a Java client makes it."""
        if self._uniq_keys is None:
            self._uniq_keys = UniqKeyGenerator(self._host().ip, self._s.clock)
        return self._uniq_keys.next()

    def _host(self) -> SocketAddress:
        text = self._store_host_text()
        if self._store_host is None or self._store_host[0] != text:
            self._store_host = (text, resolve_store_host(text))
        return self._store_host[1]

    # ------------------------------------------------------------------ pull
    async def pull_message(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """PULL_MESSAGE (11): read a queue from an offset, held while there is nothing new."""
        try:
            return await self._pull(request, channel)
        except RemotingError as exc:
            return request.response(exc.code, remark=exc.remark, ext_fields={})
        except BrokerError as exc:
            error = refusal(exc)
            return request.response(error.code, remark=error.remark, ext_fields={})

    async def _pull(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        group = fields.string("consumerGroup")
        topic_name = fields.string("topic")
        queue_id = fields.integer("queueId", bits=32)
        offset = fields.integer("queueOffset")
        max_messages = fields.integer("maxMsgNums", bits=32)
        sys_flag = fields.integer("sysFlag", bits=32)
        commit_offset = fields.integer("commitOffset", 0)
        suspend_ms = fields.integer("suspendTimeoutMillis", 0)
        topic = self._pulled_queue(group, topic_name, queue_id, max_messages)
        tags = self._tag_filter(group, topic_name, sys_flag, fields)
        if sys_flag & PULL_COMMIT_OFFSET:
            await self._commit_forward(group, topic, queue_id, commit_offset, channel)
        got = await self._delivery.pull(
            channel.peer,
            group=group,
            topic_name=topic_name,
            queue_id=queue_id,
            offset=offset,
            max_messages=min(max_messages, MAX_PULL_MESSAGES),
            max_bytes=PULL_MAX_BYTES,
            tags=tags,
            suspend_ms=min(max(suspend_ms, 0), MAX_SUSPEND_MS) if sys_flag & PULL_SUSPEND else 0,
        )
        # The queue's index says where each record lies in the commit log.
        positions = _positions(self._s.store.queue(topic, queue_id), got.records)
        return self._pull_reply(request, got, offset, positions)

    def _pulled_queue(self, group: str, topic_name: str, queue_id: int, max_messages: int) -> Topic:
        """The topic of a pull's queue, its request checked with RocketMQ's codes."""
        try:
            check_group(group)
        except BrokerError as exc:
            raise RemotingError(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, exc.message) from None
        topic = self._s.store.topics.find(topic_name)
        if topic is None:
            raise RemotingError(
                ResponseCode.TOPIC_NOT_EXIST, f"topic {topic_name!r} does not exist"
            )
        if not 0 <= queue_id < topic.queue_count:
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId {queue_id} is illegal: topic {topic_name!r} has queues "
                f"0..{topic.queue_count - 1}",
            )
        if max_messages < 1:
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR, f"maxMsgNums {max_messages} must be at least 1"
            )
        return topic

    def _pull_reply(
        self, request: RemotingCommand, got: GetResult, asked: int, positions: list[int]
    ) -> RemotingCommand:
        ext = {
            "suggestWhichBrokerId": "0",
            "nextBeginOffset": str(got.next_offset),
            "minOffset": str(got.min_offset),
            "maxOffset": str(got.max_offset),
        }
        if got.status == "FOUND":
            body = encode_served(got.records, positions, self._host())
            return request.response(ResponseCode.SUCCESS, remark="FOUND", ext_fields=ext, body=body)
        if got.status == "NO_MATCHED_MESSAGE":
            code, remark = ResponseCode.PULL_RETRY_IMMEDIATELY, "NO_MATCHED_MESSAGE"
        elif got.status == "NO_NEW_MESSAGE":
            code = ResponseCode.PULL_NOT_FOUND
            remark = "NO_MESSAGE_IN_QUEUE" if got.max_offset == 0 else "OFFSET_OVERFLOW_ONE"
        else:  # OFFSET_ILLEGAL
            code = ResponseCode.PULL_OFFSET_MOVED
            if got.max_offset == 0:
                remark = "NO_MESSAGE_IN_QUEUE"
            elif asked < got.min_offset:
                remark = "OFFSET_TOO_SMALL"
            else:
                remark = "OFFSET_OVERFLOW_BADLY"
        return request.response(code, remark=remark, ext_fields=ext)

    def _tag_filter(
        self, group: str, topic: str, sys_flag: int, fields: Fields
    ) -> frozenset[bytes] | None:
        """The tags a pull reads (None: all), from the request or the group's heartbeats."""
        expression = fields.optional_string("subscription")
        kind = fields.optional_string("expressionType")
        if not sys_flag & PULL_SUBSCRIPTION:
            registered = self._registered_expression(group, topic)
            if registered is not None:
                expression, kind = registered, None
        if kind not in (None, "", "TAG"):
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR,
                f"the broker does not filter messages by {kind}; subscribe by tag",
            )
        return parse_subscription(expression)

    def _registered_expression(self, group: str, topic: str) -> str | None:
        for membership in self._s.groups.membership(group).values():
            for subscribed, expression in membership.subscriptions:
                if subscribed == topic:
                    return expression
        return None

    async def _commit_forward(
        self, group: str, topic: Topic, queue_id: int, offset: int, channel: ClientChannel
    ) -> None:
        """Commit a pull's commitOffset by the core's rule, forward only.

        RocketMQ's broker stores the commit bit's offset unchecked, and no RocketMQ
        broker fails a pull for it: a commit the rule refuses (a client that does not hold
        the queue's lock, an offset outside the queue, or not past the latest accepted
        commit) is dropped, and the pull is served. The client sends its offset again
        with UPDATE_CONSUMER_OFFSET, which does answer a refusal.
        """
        committer = Unfenced(self._clients.clients_on(channel))
        update = OffsetUpdate(topic, queue_id, offset)
        try:
            await self._s.commits.commit_forward(group, update, committer)
        except BrokerError as exc:  # not saved, and taken back; the pull is still served
            log.error("cannot save %s's offset %d of %s queue %d: %s",
                      group, offset, topic.name, queue_id, exc.message)  # fmt: skip

    # ------------------------------------------------------------------ view, query
    async def view_message_by_id(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """VIEW_MESSAGE_BY_ID (33): the message at a commit-log offset (an offsetMsgId's)."""
        try:
            position = Fields.of(request).integer("offset")
        except RemotingError as exc:
            return request.response(exc.code, remark=exc.remark)
        record = self._s.store.read_at(position)
        if record is None:
            return request.response(
                ResponseCode.SYSTEM_ERROR, remark=f"can not find message by the offset, {position}"
            )
        body = encode_served(record, [position], self._host())
        return request.response(ResponseCode.SUCCESS, body=body)

    async def query_message(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand | None:
        """QUERY_MESSAGE (12): a topic's messages with a key (KEYS or UNIQ_KEY), newest first."""
        fields = Fields.of(request)
        try:
            topic = fields.string("topic")
            key = fields.string("key")
            max_num = fields.integer("maxNum", bits=32)
            begin = fields.integer("beginTimestamp")
            end = fields.integer("endTimestamp")
        except RemotingError as exc:
            return request.response(exc.code, remark=exc.remark)
        unique = fields.values.get(UNIQUE_KEY_QUERY) == "true"
        limit = UNIQUE_QUERY_MAX_NUM if unique else min(max_num, QUERY_MAX_NUM)
        window = None if unique else (begin, end)
        hits = await asyncio.to_thread(self._query, topic, key, limit, window)
        if not hits:
            return request.response(
                ResponseCode.QUERY_NOT_FOUND,
                remark="can not find message, maybe time range not correct",
            )
        host = self._host()
        ext = {
            "indexLastUpdateTimestamp": str(int(self._s.clock.now() * 1000)),
            "indexLastUpdatePhyoffset": str(self._s.store.commitlog.end),
        }
        body = b"".join(encode_served(record, [position], host) for position, record in hits)
        return request.response(ResponseCode.SUCCESS, ext_fields=ext, body=body)

    def _query(
        self, topic: str, key: str, limit: int, window: tuple[int, int] | None
    ) -> list[tuple[int, bytes]]:
        """Up to `limit` (position, record) of `topic` with `key` as a key or a UNIQ_KEY.

        Scheduled copies still waiting are not answered (RocketMQ indexes them under its
        schedule topic).
        """
        store = self._s.store
        found: dict[int, bytes] = {}
        if limit <= 0:
            return []
        candidates = itertools.chain(
            ((p, r, False) for p, r in store.records_by_key(topic, key)),
            ((p, r, True) for p, r in store.records_by_id(msg_id_for_uniq_key(key))),
        )
        for position, data, by_id in candidates:
            [record] = iter_records(data, verify_crc=False)
            if record.topic != topic or record.delay_level or record.deliver_at_ms:
                continue
            if by_id and rocketmq_uniq_key(record) != key:
                continue
            if self._s.transactions.is_half(position, record.queue_offset):
                continue  # a transaction's half message (mockbroker/fronts/message_lookup.py)
            if window is not None and not window[0] <= record.store_timestamp_ms <= window[1]:
                continue
            found.setdefault(position, data)
            if len(found) >= limit:
                break
        return list(found.items())


def _positions(queue: ConsumeQueue, records: bytes) -> list[int]:
    """The commit-log position of each stored record of `queue` in `records`."""
    offsets: list[int] = []
    pos = 0
    while pos < len(records):
        size, _crc, _magic, _queue_id, queue_offset, _ts, _times, _tl = RECORD.unpack_from(
            records, pos
        )
        offsets.append(queue_offset)
        pos += size
    if not offsets:
        return []
    entries = queue.read(offsets[0], offsets[-1] - offsets[0] + 1)
    return [entries[offset - offsets[0]][0] for offset in offsets]


def _scheduled_frame(frame: bytes) -> bool:
    """True for a frame (with its length prefix) with a deliver-at time or a delay level."""
    _id, _born, deliver_at, level, *_ = FRAME_FIELDS.unpack_from(frame, FRAME_LEN_PREFIX.size)
    return bool(deliver_at or level)


def _v1_fields(request: RemotingCommand) -> Fields:
    """A V2 header's fields under their V1 names."""
    values = request.ext_fields or {}
    return Fields({v1: values[v2] for v2, v1 in V2_FIELDS.items() if v2 in values})


def _peer_address(channel: ClientChannel) -> SocketAddress | None:
    try:
        return SocketAddress.parse(channel.peer)
    except ValueError:
        return None


def resolve_store_host(text: str) -> SocketAddress:
    """'host:port' as an address; a host name is looked up (once per name: it is cached)."""
    try:
        return SocketAddress.parse(text)
    except ValueError:
        pass
    host, _, port = text.rpartition(":")
    try:
        info = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        return SocketAddress.parse(f"[{info[0][4][0]}]:{port}")
    except (OSError, ValueError, IndexError):
        log.warning("store host %r is not an address; offsetMsgIds name 127.0.0.1", text)
        return SocketAddress(bytes([127, 0, 0, 1]), int(port) if port.isdigit() else 0)


__all__ = [
    "DEFAULT_REGION",
    "PULL_COMMIT_OFFSET",
    "PULL_LITE",
    "PULL_SUBSCRIPTION",
    "PULL_SUSPEND",
    "V2_FIELDS",
    "DataHandlers",
    "SendHeader",
    "data_handlers",
    "resolve_store_host",
]
