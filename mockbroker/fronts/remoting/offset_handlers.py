"""GET_MAX_OFFSET, GET_MIN_OFFSET, GET_EARLIEST_MSG_STORETIME, SEARCH_OFFSET_BY_TIMESTAMP.

As RocketMQ's broker answers them: a queue that does not exist (yet) has offsets 0 and no
earliest time (-1); the max offset is exclusive (the next offset to be written; in sync
mode, the end of what is synced).
"""

from __future__ import annotations

from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.state import BrokerState
from mockbroker.topics import Topic
from sdk._remoting.codes import RequestCode
from sdk._remoting.command import Fields, RemotingCommand


def offset_handlers(state: BrokerState) -> dict[int, Handler]:
    """The handlers of the offset queries, on the broker's store."""

    def queue(request: RemotingCommand) -> tuple[Topic | None, int]:
        fields = Fields.of(request)
        name, queue_id = fields.string("topic"), fields.integer("queueId", bits=32)
        topic = state.store.topics.find(name)
        if topic is None or not 0 <= queue_id < topic.queue_count:
            return None, queue_id
        return topic, queue_id

    def offset_reply(request: RemotingCommand, offset: int) -> RemotingCommand:
        return request.response(ext_fields={"offset": str(offset)})

    async def max_offset(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        topic, queue_id = queue(request)
        return offset_reply(
            request, 0 if topic is None else state.store.end_offset(topic, queue_id)
        )

    async def min_offset(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        topic, queue_id = queue(request)
        found = 0 if topic is None else state.store.queue(topic, queue_id).min_offset
        return offset_reply(request, found)

    async def earliest_time(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        topic, queue_id = queue(request)
        stamp = -1
        if topic is not None:
            cq = state.store.queue(topic, queue_id)
            if cq.min_offset < state.store.end_offset(topic, queue_id):
                stamp = state.store.offset_store_timestamp_ms(topic, queue_id, cq.min_offset)
        return request.response(ext_fields={"timestamp": str(stamp)})

    async def search(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        timestamp = Fields.of(request).integer("timestamp")
        topic, queue_id = queue(request)
        found = 0
        if topic is not None:
            end = state.store.end_offset(topic, queue_id)
            found = min(state.store.offset_for_timestamp(topic, queue_id, timestamp), end)
        return offset_reply(request, found)

    return {
        RequestCode.GET_MAX_OFFSET: max_offset,
        RequestCode.GET_MIN_OFFSET: min_offset,
        RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_time,
        RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search,
    }
