"""Consumer coordination over remoting: heartbeats, groups, queue locks, offsets, send-back.

On the same objects the gRPC front uses, so that RocketMQ clients and ordermq clients of
one group see each other: GET_CONSUMER_LIST_BY_GROUP lists both, both take their queue
locks from the one RebalanceLockManager, both commit into the one offset table.

- A remoting connection counts as a long-lived stream of its client (ConsumerGroups): a
  client whose connection closes (its process died) leaves its groups after
  `disconnect_grace_seconds`, as a gRPC client does.
- Every membership change of a group with remoting members is told to each of them with
  NOTIFY_CONSUMER_IDS_CHANGED (oneway), which makes RocketMQ clients rebalance at once.
- Any request on a connection counts as a sign of life of the clients that spoke on it
  (`RemotingClients.touch`): one that came back after its connection was reset keeps its
  membership and locks without waiting for its next heartbeat.
- Locks are taken and released by the core's rule (mockbroker/queue_locks.py), as over
  gRPC: a client id of 1-255 characters, a group that exists, a client that is a member
  of it, at most `client_max_locks` locks per client; a refusal is SYSTEM_ERROR naming
  why. Otherwise they follow RocketMQ's broker: a lease of `lock_lease_seconds` (60 s),
  renewed by the holder locking again, granted for what can be granted. ordermq's fencing
  epochs stay on the gRPC side: a RocketMQ client's lock excludes gRPC clients of the
  group and the other way round. A RocketMQ client's offset commit carries no epoch: it is
  refused while another client holds a live lock on the queue (a former owner's late
  commit would move the offset back under the new owner), and accepted otherwise, as
  RocketMQ accepts it.
  The rule is the core's (mockbroker/offset_commits.py), as for gRPC commits and a
  pull's commit bit; the committers are the client ids that spoke on the connection.
- QUERY_CONSUMER_OFFSET for a queue the group never committed answers 0 while the queue
  still holds its first message (RocketMQ's broker rule, so a consumer started after the
  producer reads from the start), else QUERY_NOT_FOUND (the client then starts where its
  consumeFromWhere says). UPDATE_CONSUMER_OFFSET sets the offset, backwards too (that is
  how RocketMQ's tools reset a group), within the queue's [min, max].
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.groups import GroupMembership
from mockbroker.offset_commits import OffsetUpdate, Unfenced
from mockbroker.queue_locks import QueueLocks
from mockbroker.retry import DEFAULT_MAX_RECONSUME_TIMES
from mockbroker.state import BrokerState, check_client_id
from mockbroker.store.message_store import parse_tag_expression
from mockbroker.topics import Topic, check_any_topic, check_group
from mockbroker.transactions import Check
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import Fields, RemotingCommand, RemotingError
from sdk._wire import RECORD

log = logging.getLogger("ordermq.broker.remoting")

#: ConsumeType and MessageModel by their ordinal (the C++ client sends numbers).
_CONSUME_TYPES = ("CONSUME_ACTIVELY", "CONSUME_PASSIVELY")
_MESSAGE_MODELS = ("BROADCASTING", "CLUSTERING")
#: The group every Java client's heartbeat names for its internal producer.
INNER_PRODUCER_GROUP = "CLIENT_INNER_PRODUCER"
#: Producer groups one connection answers check-backs for; more are not taken (logged).
MAX_PRODUCER_GROUPS = 64


class RemotingClients:
    """The connections of remoting clients, by client id, and their groups' watchers.

    A connection whose heartbeat names a producer group in its producerDataSet answers
    that group's transaction check-backs (CHECK_TRANSACTION_STATE, built by
    `check_request`) until it closes or unregisters the group.
    """

    def __init__(
        self,
        state: BrokerState,
        check_request: Callable[[Check], RemotingCommand] | None = None,
    ) -> None:
        self._state = state
        self._channels: dict[str, set[ClientChannel]] = {}
        self._clients_on: dict[ClientChannel, set[str]] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._check_request = check_request
        self._producers: dict[tuple[ClientChannel, str], asyncio.Task[None]] = {}

    def producer(self, client_id: str, channel: ClientChannel, groups: set[str]) -> None:
        """`client_id` produces for `groups` on `channel`: it answers their check-backs."""
        if self._check_request is None or channel.closed:
            return
        for group in groups - {INNER_PRODUCER_GROUP}:
            key = (channel, group)
            task = self._producers.get(key)
            if task is not None and not task.done():
                continue
            try:
                check_group(group)
            except BrokerError:
                continue  # its sends name the group too, and are refused for it
            if sum(1 for c, _ in self._producers if c is channel) >= MAX_PRODUCER_GROUPS:
                log.warning("remoting %s: producer group %s not taken for check-backs: the "
                            "connection answers for %d already", channel.peer, group,
                            MAX_PRODUCER_GROUPS)  # fmt: skip
                continue
            self._producers[key] = asyncio.create_task(
                self._answer_checks(channel, group, client_id), name=f"remoting-checks-{group}"
            )

    def producer_left(self, channel: ClientChannel, group: str) -> None:
        """`channel` no longer produces for `group` (UNREGISTER_CLIENT)."""
        task = self._producers.pop((channel, group), None)
        if task is not None:
            task.cancel()

    async def _answer_checks(self, channel: ClientChannel, group: str, client_id: str) -> None:
        assert self._check_request is not None
        transactions = self._state.transactions
        async with transactions.watching(group, client_id) as watcher:
            async for check in transactions.checks(watcher):
                try:
                    command = self._check_request(check)
                except Exception:  # a record the front cannot translate: logged, not fatal
                    log.exception("check-back of transaction %s cannot be sent",
                                  check.transaction_id)  # fmt: skip
                    continue
                await channel.send_oneway(command)

    def seen(self, client_id: str, channel: ClientChannel) -> None:
        """`client_id` spoke on `channel`."""
        if channel not in self._clients_on:
            self._clients_on[channel] = set()
            self._state.groups.stream_opened(channel.peer)
        self._clients_on[channel].add(client_id)
        self._channels.setdefault(client_id, set()).add(channel)

    def touch(self, channel: ClientChannel) -> None:
        """A request came on `channel`: its clients are alive, on it (ConsumerGroups.alive)."""
        for client_id in self._clients_on.get(channel, ()):
            self._state.groups.alive(client_id, channel.peer)

    def clients_on(self, channel: ClientChannel) -> set[str]:
        """The client ids that spoke on `channel`."""
        return set(self._clients_on.get(channel, ()))

    def connection_closed(self, channel: ClientChannel) -> None:
        """A remoting connection ended (the server calls this once per connection)."""
        for key in [k for k in self._producers if k[0] is channel]:
            self._producers.pop(key).cancel()
        for client_id in self._clients_on.pop(channel, set()):
            channels = self._channels.get(client_id)
            if channels is not None:
                channels.discard(channel)
                if not channels:
                    del self._channels[client_id]
            self._state.groups.stream_closed(channel.peer)

    def watch(self, group: str) -> None:
        """Tell the group's remoting members of every change of its membership."""
        task = self._watchers.get(group)
        if task is None or task.done():
            # From the version now, not when the task first runs: a member joining before
            # that (another heartbeat handled in between) would be told to nobody.
            since = self._state.groups.version(group)
            self._watchers[group] = asyncio.create_task(
                self._notify_changes(group, since), name=f"remoting-notify-{group}"
            )

    def close(self) -> None:
        """Stop the watchers (the broker is stopping)."""
        for task in self._watchers.values():
            task.cancel()
        for task in self._producers.values():
            task.cancel()

    async def _notify_changes(self, group: str, since: int) -> None:
        groups = self._state.groups
        watch = groups.watch(group, since)
        async with contextlib.aclosing(watch):
            async for _version, members in watch:
                channels = {c for m in members for c in self._channels.get(m, ())}
                if not channels:
                    return  # no remoting member left: the next one to join starts a watch
                # All at once: a member that reads nothing delays none of the others.
                await asyncio.gather(
                    *(
                        channel.send_oneway(
                            RemotingCommand(
                                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                ext_fields={"consumerGroup": group},
                            )
                        )
                        for channel in channels
                    )
                )


def coordination_handlers(state: BrokerState, clients: RemotingClients) -> dict[int, Handler]:
    """The handlers of consumer coordination's request codes."""
    handlers = _Coordination(state, clients)
    return {
        RequestCode.HEART_BEAT: handlers.heartbeat,
        RequestCode.UNREGISTER_CLIENT: handlers.unregister,
        RequestCode.GET_CONSUMER_LIST_BY_GROUP: handlers.consumer_list,
        RequestCode.LOCK_BATCH_MQ: handlers.lock_batch,
        RequestCode.UNLOCK_BATCH_MQ: handlers.unlock_batch,
        RequestCode.QUERY_CONSUMER_OFFSET: handlers.query_offset,
        RequestCode.UPDATE_CONSUMER_OFFSET: handlers.update_offset,
        RequestCode.CONSUMER_SEND_MSG_BACK: handlers.send_back,
    }


class _Coordination:
    def __init__(self, state: BrokerState, clients: RemotingClients) -> None:
        self._s = state
        self._clients = clients
        self._locks = QueueLocks(state)

    async def heartbeat(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        data = _json_body(request, "HeartbeatData")
        client_id = _text(data, "clientID")
        check_client_id(client_id)
        consumers = data.get("consumerDataSet") or []
        if not isinstance(consumers, list):
            raise RemotingError(ResponseCode.SYSTEM_ERROR, "consumerDataSet is not a list")
        groups = self._s.groups
        joined = {g: m for g, m in (_membership(c) for c in consumers)}
        if not joined:  # a producer's heartbeat: the client's consumer groups stay as they are
            joined = groups.groups_of(client_id)
        # RocketMQ's broker creates each group's retry topic at its first heartbeat; past
        # client_max_topics or on a full disk the heartbeat is refused whole
        await self._s.topic_creation.retry_topics(joined, client=channel.peer)
        self._clients.seen(client_id, channel)
        self._clients.producer(client_id, channel, _producer_groups(data))
        groups.heartbeat(client_id, joined, channel.peer)
        for group in joined:
            self._clients.watch(group)
        return request.response()

    async def unregister(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        client_id = fields.string("clientID")
        group = fields.optional_string("consumerGroup")
        groups, locks = self._s.groups, self._s.locks
        if group:
            left = groups.groups_of(client_id)
            if group in left:
                del left[group]
                groups.heartbeat(client_id, left, channel.peer)
                own = [q for q, view in locks.locks(group).items() if view.client_id == client_id]
                locks.unlock_batch(group, client_id, own)
        elif (producer := fields.optional_string("producerGroup")) is not None:
            self._clients.producer_left(channel, producer)
        else:
            groups.unregister(client_id)
            locks.release_client(client_id)
        await self._save_locks()
        return request.response()

    async def consumer_list(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand:
        group = Fields.of(request).string("consumerGroup")
        members = self._s.groups.members(group)
        if not members:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return request.response(body=_json({"consumerIdList": members}))

    async def lock_batch(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        group, client_id, queues = _lock_body(request)
        self._check_queues(queues)
        keys = [(t, q) for t, _b, q in queues]
        held = self._locks.take(group, client_id, keys, channel.peer)
        self._clients.seen(client_id, channel)
        await self._save_locks()  # a grant is answered once it would survive a crash
        granted = [
            {"brokerName": broker, "queueId": q, "topic": t}
            for t, broker, q in queues
            if (t, q) in held
        ]
        return request.response(body=_json({"lockOKMQSet": granted}))

    async def unlock_batch(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand:
        group, client_id, queues = _lock_body(request)
        self._check_queues(queues)
        self._locks.release(group, client_id, [(t, q) for t, _b, q in queues], channel.peer)
        await self._save_locks()
        return request.response()

    async def query_offset(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand:
        group, topic, queue_id = self._offset_key(request)
        # A client gives a queue up with its last offset, then the unlock, at once: the
        # new owner asks where to begin only once that offset is saved.
        await self._s.commits.settled(group, topic.name, queue_id)
        offset = self._s.offsets.get(group, topic.name, queue_id)
        if offset is None:
            if self._s.store.queue(topic, queue_id).min_offset != 0:
                raise RemotingError(
                    ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group"
                )
            offset = 0  # the queue still holds its first message: read it all
        return request.response(ext_fields={"offset": str(offset)})

    async def update_offset(
        self, request: RemotingCommand, channel: ClientChannel
    ) -> RemotingCommand:
        group, topic, queue_id = self._offset_key(request)
        offset = Fields.of(request).integer("commitOffset")
        committer = Unfenced(self._clients.clients_on(channel))
        await self._s.commits.commit(group, [OffsetUpdate(topic, queue_id, offset)], committer)
        return request.response()

    async def send_back(self, request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        group = fields.string("group")
        position = fields.integer("offset")
        delay_level = fields.integer("delayLevel", 0, bits=32)
        max_times = fields.integer("maxReconsumeTimes", DEFAULT_MAX_RECONSUME_TIMES, bits=32)
        _check(check_group, group)
        record = await asyncio.to_thread(self._s.store.read_at, position)
        if record is None:
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {position}"
            )
        _size, _crc, _magic, queue_id, queue_offset, _ts, times, topic_len = RECORD.unpack_from(
            record
        )
        topic_name = record[RECORD.size : RECORD.size + topic_len].decode()
        topic = self._s.topic_queue(topic_name, queue_id)
        limit = max_times if max_times > 0 else DEFAULT_MAX_RECONSUME_TIMES
        # delayLevel < 0: straight to the dead-letter topic, as RocketMQ does.
        await self._s.retry.send_back(
            group, topic, queue_id, queue_offset,
            delay_level=max(delay_level, 0), max_reconsume_times=limit,
            reconsume_times=limit if delay_level < 0 else times,
        )  # fmt: skip
        return request.response()

    def _check_queues(self, queues: list[tuple[str, str, int]]) -> None:
        """Refuse a lock request naming a queue this broker does not have."""
        name = self._s.config.broker_name
        for topic, broker, queue_id in queues:
            if broker != name:
                raise RemotingError(
                    ResponseCode.SYSTEM_ERROR,
                    f"mqSet: brokerName {broker!r} is not this broker, {name!r}",
                )
            self._s.topic_queue(topic, queue_id)  # TOPIC_NOT_FOUND, INVALID_TOPIC / _QUEUE

    def _offset_key(self, request: RemotingCommand) -> tuple[str, Topic, int]:
        fields = Fields.of(request)
        group, topic_name = fields.string("consumerGroup"), fields.string("topic")
        queue_id = fields.integer("queueId", bits=32)
        _check(check_group, group)
        topic = self._s.store.topics.find(topic_name)
        if topic is None:
            raise RemotingError(
                ResponseCode.QUERY_NOT_FOUND, f"topic {topic_name!r} does not exist"
            )
        if not 0 <= queue_id < topic.queue_count:
            raise RemotingError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId {queue_id} is illegal: {topic_name!r} has {topic.queue_count} queues",
            )
        return group, topic, queue_id

    async def _save_locks(self) -> None:
        try:
            await self._s.locks.save()
        except BrokerError as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, exc.message) from None


def _membership(data: Any) -> tuple[str, GroupMembership]:
    if not isinstance(data, dict):
        raise RemotingError(ResponseCode.SYSTEM_ERROR, "a ConsumerData is not an object")
    group = _text(data, "groupName")
    _check(check_group, group)
    subscriptions = []
    for sub in data.get("subscriptionDataSet") or []:
        topic = _text(sub, "topic") if isinstance(sub, dict) else ""
        expression = sub.get("subString") or "*"
        _check(check_any_topic, topic)
        if sub.get("expressionType", "TAG") == "TAG":
            _check(parse_tag_expression, expression)
        subscriptions.append((topic, expression))
    return group, GroupMembership(
        _enum(data.get("consumeType"), _CONSUME_TYPES, "consumeType"),
        _enum(data.get("messageModel"), _MESSAGE_MODELS, "messageModel"),
        tuple(subscriptions),
    )


def _enum(value: Any, names: tuple[str, ...], what: str) -> str:
    if isinstance(value, str) and value in names:
        return value
    if type(value) is int and 0 <= value < len(names):
        return names[value]
    raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{what} {value!r} is not one of {names}")


def _lock_body(request: RemotingCommand) -> tuple[str, str, list[tuple[str, str, int]]]:
    data = _json_body(request, "the lock batch")
    group, client_id = _text(data, "consumerGroup"), _text(data, "clientId")
    _check(check_group, group)
    queues = []
    for mq in data.get("mqSet") or []:
        if not isinstance(mq, dict) or type(mq.get("queueId")) is not int:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"mqSet holds {mq!r}")
        queues.append((_text(mq, "topic"), str(mq.get("brokerName") or ""), mq["queueId"]))
    return group, client_id, queues


def _producer_groups(data: dict[str, Any]) -> set[str]:
    """The producer groups a heartbeat names (entries that name none are skipped)."""
    producers = data.get("producerDataSet") or []
    if not isinstance(producers, list):
        raise RemotingError(ResponseCode.SYSTEM_ERROR, "producerDataSet is not a list")
    return {
        p["groupName"]
        for p in producers
        if isinstance(p, dict) and isinstance(p.get("groupName"), str) and p["groupName"]
    }


def _json_body(request: RemotingCommand, what: str) -> dict[str, Any]:
    try:
        data = json.loads(request.body)
    except (ValueError, RecursionError) as exc:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{what} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{what} is not a JSON object")
    return data


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{key} is missing or not a string")
    return value


def _check(check: Any, value: str) -> None:
    try:
        check(value)
    except BrokerError as exc:
        raise RemotingError(ResponseCode.SYSTEM_ERROR, exc.message) from None


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
