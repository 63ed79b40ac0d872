"""Which permission each operation needs, for every front, in one place.

RocketMQ's tables are PlainAccessResource.parse (remoting request codes and RocketMQ 5's
gRPC messages) and Permission.ADMIN_CODE; ordermq's own RPCs follow the RocketMQ operation
each one stands for. An operation with neither a topic nor a group permission only needs a
known account (RocketMQ checks no resource for request codes it does not list).
Exchange, ordermq's stream, is not here: each of its frames is checked as the RPC it carries.
"""

from __future__ import annotations

from dataclasses import dataclass

from mockbroker.acl.decisions import Acl, Resource
from mockbroker.acl.permissions import Permission
from mockbroker.acl.rules import RETRY_PREFIX
from sdk._remoting.codes import RequestCode


@dataclass(frozen=True)
class Needs:
    """What an operation needs on the topic and on the group it names."""

    topic: Permission = Permission.NONE
    group: Permission = Permission.NONE
    admin: bool = False


_SEND = Needs(topic=Permission.PUB)
_CONSUME = Needs(topic=Permission.SUB, group=Permission.SUB)
_GROUP = Needs(group=Permission.SUB)
_TOPIC_SUB = Needs(topic=Permission.SUB)
_ROUTE = Needs(topic=Permission.ANY)
_ADMIN = Needs(admin=True)
_KNOWN = Needs()

# RocketMQ's own admin request codes (Permission.ADMIN_CODE); not all of them are served.
_ADMIN_CODES = {
    17: "UPDATE_AND_CREATE_TOPIC",
    25: "UPDATE_BROKER_CONFIG",
    50: "UPDATE_AND_CREATE_ACL_CONFIG",
    51: "DELETE_ACL_CONFIG",
    52: "GET_BROKER_CLUSTER_ACL_INFO",
    200: "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
    207: "DELETE_SUBSCRIPTIONGROUP",
    215: "DELETE_TOPIC_IN_BROKER",
    513: "UPDATE_AND_CREATE_STATIC_TOPIC",
}

#: Remoting request code -> needs; a code not listed needs a known account only.
REQUEST_CODES: dict[int, Needs] = {
    RequestCode.SEND_MESSAGE: _SEND,
    RequestCode.SEND_MESSAGE_V2: _SEND,
    RequestCode.SEND_BATCH_MESSAGE: _SEND,
    RequestCode.CONSUMER_SEND_MSG_BACK: _GROUP,
    RequestCode.PULL_MESSAGE: _CONSUME,
    RequestCode.QUERY_MESSAGE: _TOPIC_SUB,
    # HEART_BEAT: SUB on each consumer group and each topic it subscribes to.
    RequestCode.HEART_BEAT: _CONSUME,
    RequestCode.UNREGISTER_CLIENT: _GROUP,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: _GROUP,
    RequestCode.UPDATE_CONSUMER_OFFSET: _CONSUME,
    **{code: _ADMIN for code in _ADMIN_CODES},
}

#: ordermq's gRPC (MessagingService and AdminService) method -> needs.
ORDERMQ_RPCS: dict[str, Needs] = {
    "QueryRoute": _ROUTE,
    "Send": _SEND,
    "Pull": _CONSUME,
    "QueryQueueOffsets": _ROUTE,
    "LockBatch": _CONSUME,
    "UnlockBatch": _CONSUME,
    # Heartbeat: once per consumer group it names (RocketMQ checks no producer group).
    "Heartbeat": _GROUP,
    "UnregisterClient": _GROUP,
    "GetConsumerList": _GROUP,
    "WatchMembership": _GROUP,
    "QueryConsumerOffset": _CONSUME,
    "CommitConsumerOffsets": _CONSUME,
    "SendBack": _GROUP,
    # CancelScheduled: PUB on the message's topic (the front looks it up if not given).
    "CancelScheduled": _SEND,
    "Receive": _CONSUME,
    "Ack": _CONSUME,
    # Transactions: a half message is a send (RocketMQ checks PUB on its topic); ending
    # one and answering check-backs name only the producer group (RocketMQ checks none).
    "SendHalfMessage": _SEND,
    "EndTransaction": _KNOWN,
    "WatchTransactionChecks": _KNOWN,
    "ChangeInvisibleDuration": _CONSUME,
    # Parking a key: as a commit, by the queue's holder; listing and releasing: an operator's.
    "ParkKey": _CONSUME,
    "ListParkedKeys": _KNOWN,
    "ReleaseParkedKey": _ADMIN,
    # RocketMQ lists topic creation as admin; ordermq adds ResetOffset, which rewinds a group.
    "CreateTopic": _ADMIN,
    "DeleteTopic": _ADMIN,
    "DeleteGroup": _ADMIN,
    "SetTopicRetention": _ADMIN,
    "ResetOffset": _ADMIN,
    "ListTopics": _KNOWN,
    "ListGroups": _KNOWN,
    "DescribeTopic": _KNOWN,
    "ConsumerProgress": _KNOWN,
    "QueryMessageById": _KNOWN,
    "QueryMessagesByKey": _TOPIC_SUB,
    "BrowseQueue": _TOPIC_SUB,
    "BrokerStatus": _KNOWN,
    # Backup writes files on the broker's machine.
    "Backup": _ADMIN,
}

#: RocketMQ 5's gRPC (apache.rocketmq.v2.MessagingService) method -> needs.
V2_RPCS: dict[str, Needs] = {
    "QueryRoute": _ROUTE,
    # Heartbeat and NotifyClientTermination: the group's SUB when a consumer sends them.
    "Heartbeat": _GROUP,
    "NotifyClientTermination": _GROUP,
    "SendMessage": _SEND,
    "RecallMessage": _SEND,
    "EndTransaction": _SEND,
    "QueryAssignment": _CONSUME,
    "ReceiveMessage": _CONSUME,
    "AckMessage": _CONSUME,
    "ForwardMessageToDeadLetterQueue": _CONSUME,
    "ChangeInvisibleDuration": _CONSUME,
    # Telemetry's settings: PUB on published topics; SUB on the group and its topics.
    "Telemetry": _CONSUME,
}


def wanted(
    needs: Needs, *, topic: str | None = None, group: str | None = None
) -> list[tuple[Resource, Permission]]:
    """The (resource, permission) pairs to check for one request.

    ValueError if the operation needs a topic or a group and none is given. Sending to a
    retry topic wants SUB on its group, as in RocketMQ (a consumer's send-back).
    """
    out: list[tuple[Resource, Permission]] = []
    if needs.topic:
        if topic is None:
            raise ValueError("this operation is checked against a topic, and none was given")
        perm = needs.topic
        if perm == Permission.PUB and topic.startswith(RETRY_PREFIX):
            perm = Permission.SUB
        out.append((Resource.topic(topic), perm))
    if needs.group:
        if group is None:
            raise ValueError("this operation is checked against a group, and none was given")
        out.append((Resource.group(group), needs.group))
    if needs.admin:
        if topic is not None:
            target = Resource.topic(topic)
        elif group is not None:
            target = Resource.group(group)
        else:
            target = Resource.broker()
        out.append((target, Permission.ADMIN))
    return out


def authorize(
    acl: Acl,
    access_key: str | None,
    remote_address: str,
    needs: Needs,
    *,
    topic: str | None = None,
    group: str | None = None,
) -> None:
    """Check every permission one request needs (AclDenied at the first refused).

    An operation that needs no resource still needs a known account, unless the address
    is white.
    """
    pairs = wanted(needs, topic=topic, group=group)
    if not pairs:
        acl.authenticate(access_key, remote_address)
    for resource, permission in pairs:
        acl.check(access_key, remote_address, resource, permission)
