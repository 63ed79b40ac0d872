"""DELETE_TOPIC_IN_BROKER and DELETE_SUBSCRIPTIONGROUP, on the core's deletions.

RocketMQ's headers: `topic` (DeleteTopicRequestHeader); `groupName` and, since 4.9,
`cleanOffset` (DeleteSubscriptionGroupRequestHeader). ordermq keeps no group config apart
from its offsets, so a group's deletion always takes its offsets (cleanOffset is not read).
RocketMQ deletes whatever its clients are doing; here, as on the admin service, a deletion
is refused while live consumers use the topic or group, unless the request carries
ordermq's own field `force=true` (mqadmin never sends it).
"""

from __future__ import annotations

from collections.abc import Awaitable

from mockbroker.deletion import delete_group, delete_topic
from mockbroker.errors import BrokerError
from mockbroker.fronts.remoting.channel import ClientChannel, Handler
from mockbroker.fronts.remoting.errors import refusal
from mockbroker.state import BrokerState
from sdk._remoting.codes import RequestCode
from sdk._remoting.command import Fields, RemotingCommand


def admin_handlers(state: BrokerState) -> dict[int, Handler]:
    """The handlers of the deletion codes (admin-only: mockbroker/acl/operations.py)."""

    def forced(fields: Fields) -> bool:
        return (fields.optional_string("force") or "").lower() == "true"

    async def answer(request: RemotingCommand, deletion: Awaitable[object]) -> RemotingCommand:
        try:
            await deletion
        except BrokerError as exc:
            raise refusal(exc) from None
        return request.response()

    async def topic(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        name = fields.string("topic")
        return await answer(request, delete_topic(state, name, force=forced(fields)))

    async def group(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        name = fields.string("groupName")
        return await answer(request, delete_group(state, name, force=forced(fields)))

    return {
        RequestCode.DELETE_TOPIC_IN_BROKER: topic,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: group,
    }
