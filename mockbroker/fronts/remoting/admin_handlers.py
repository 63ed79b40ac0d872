"""DELETE_TOPIC_IN_BROKER and DELETE_SUBSCRIPTIONGROUP, on the core's deletions.

RocketMQ's headers: `topic` (DeleteTopicRequestHeader); `groupName` and, since 4.9,
`cleanOffset` (DeleteSubscriptionGroupRequestHeader). ordermq keeps no group config apart
from its offsets, so a group's deletion always takes its offsets (cleanOffset is not read).
RocketMQ deletes whatever its clients are doing; here, as on the admin service, a deletion
is refused while live consumers use the topic or group, unless the request carries
ordermq's own field `force=true` (mqadmin never sends it).
"""

from __future__ import annotations

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

    async def topic(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        try:
            await delete_topic(state, fields.string("topic"), force=forced(fields))
        except BrokerError as exc:
            raise refusal(exc) from None
        return request.response()

    async def group(request: RemotingCommand, channel: ClientChannel) -> RemotingCommand:
        fields = Fields.of(request)
        try:
            await delete_group(state, fields.string("groupName"), force=forced(fields))
        except BrokerError as exc:
            raise refusal(exc) from None
        return request.response()

    return {
        RequestCode.DELETE_TOPIC_IN_BROKER: topic,
        RequestCode.DELETE_SUBSCRIPTIONGROUP: group,
    }
