"""The ACL on the remoting broker port: RocketMQ's signature, then the request's permissions.

Every request passes here before its handler when the broker has an ACL file, as through
RocketMQ's broker RPC hook (PlainAccessValidator.parse and validate): the AccessKey and
Signature ext fields (sdk/_remoting/acl_signature.py) unless the address is white, then
the permissions REQUEST_CODES lists for the request code, on the topic and group the
request names (SEND_MESSAGE_V2's one-letter `b`, a heartbeat's consumer groups and their
subscriptions). A refusal is answered as RocketMQ answers it, SYSTEM_ERROR with the
AclException in the remark, before the handler runs: nothing is stored, locked or moved.

The name server port is not checked: RocketMQ's name server has no ACL.
"""

from __future__ import annotations

import json
from typing import Any

from mockbroker.acl import REQUEST_CODES, Acl, AclDenied, DenyReason, Needs, Permission, authorize
from sdk._remoting.acl_signature import ACCESS_KEY, ACL_EXCEPTION, SIGNATURE, verify
from sdk._remoting.codes import RequestCode, ResponseCode
from sdk._remoting.command import RemotingCommand, RemotingError

#: What one request touches: (topic, group) pairs, each checked against the code's needs.
Targets = list[tuple[str | None, str | None]]


class RemotingAuth:
    """Checks the signature and permissions of remoting requests against one Acl."""

    def __init__(self, acl: Acl) -> None:
        self._acl = acl

    def check(self, request: RemotingCommand, host: str) -> None:
        """RemotingError (SYSTEM_ERROR, the AclException) unless the request may run."""
        try:
            access_key = self._authenticate(request, host)
            self._authorize(request, access_key, host)
        except AclDenied as exc:
            raise RemotingError(ResponseCode.SYSTEM_ERROR, f"{ACL_EXCEPTION}: {exc}") from None

    def _authenticate(self, request: RemotingCommand, host: str) -> str | None:
        fields = request.ext_fields or {}
        access_key = fields.get(ACCESS_KEY) or None
        if not self._acl.signature_required(access_key, host):
            return access_key
        secret = self._acl.secret_of(access_key or "")  # AclDenied for none or unknown
        if SIGNATURE not in fields:
            raise AclDenied(
                DenyReason.UNAUTHENTICATED,
                f"accessKey {access_key!r}: the request carries no Signature",
            )
        if not verify(fields, request.body, secret):
            raise AclDenied(
                DenyReason.UNAUTHENTICATED,
                f"accessKey {access_key!r}: the signature does not match (a wrong secret"
                " key, or the request changed on the way)",
            )
        return access_key

    def _authorize(self, request: RemotingCommand, access_key: str | None, host: str) -> None:
        needs = REQUEST_CODES.get(request.code, Needs())
        targets = _targets(request) if (needs.topic or needs.group) else []
        if not targets and not needs.admin:
            self._acl.authenticate(access_key, host)
            return
        for topic, group in targets or [(None, None)]:
            # A request that names only part of what it needs is checked on what it names
            # (the handler refuses it for the part missing).
            part = Needs(
                topic=needs.topic if topic is not None else Permission.NONE,
                group=needs.group if group is not None else Permission.NONE,
                admin=needs.admin,
            )
            if not (part.topic or part.group or part.admin):
                self._acl.authenticate(access_key, host)
                continue
            authorize(self._acl, access_key, host, part, topic=topic, group=group)


def _targets(request: RemotingCommand) -> Targets:
    fields = request.ext_fields or {}
    code = request.code
    if code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE):
        return [(fields.get("b") or fields.get("topic"), None)]
    if code in (RequestCode.SEND_MESSAGE, RequestCode.QUERY_MESSAGE):
        return [(fields.get("topic"), None)]
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return [(None, fields.get("group"))]
    if code == RequestCode.HEART_BEAT:
        return _heartbeat(request.body)
    # PULL_MESSAGE, UPDATE_CONSUMER_OFFSET, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP
    return [(fields.get("topic"), fields.get("consumerGroup"))]


def _heartbeat(body: bytes) -> Targets:
    """Each consumer group and each topic it subscribes to (a producer's: none)."""
    try:
        data: Any = json.loads(body)
    except (ValueError, RecursionError):
        return []  # the handler refuses it
    consumers = data.get("consumerDataSet") if isinstance(data, dict) else None
    targets: Targets = []
    for consumer in consumers if isinstance(consumers, list) else []:
        if not isinstance(consumer, dict):
            continue
        group = consumer.get("groupName")
        if isinstance(group, str) and group:
            targets.append((None, group))
        subscriptions = consumer.get("subscriptionDataSet")
        for sub in subscriptions if isinstance(subscriptions, list) else []:
            topic = sub.get("topic") if isinstance(sub, dict) else None
            if isinstance(topic, str) and topic:
                targets.append((topic, None))
    return targets
