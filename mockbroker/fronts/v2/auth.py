"""The ACL on the RocketMQ 5 front: the clients' signature, then the request's permissions.

RocketMQ 5's clients sign every call in its gRPC metadata (the official Python client's
rocketmq/v5/util/signature.py, the Java client's rpc/Signature.java; RocketMQ's proxy
reads them in auth/.../DefaultAuthenticationContextBuilder.java):

- ``x-mq-date-time``: the date, ``%Y%m%dT%H%M%SZ`` (e.g. ``20260101T120000Z``);
- ``authorization``: ``MQv2-HMAC-SHA1 Credential=<accessKey>, SignedHeaders=x-mq-date-time,
  Signature=<hex>``, the signature being the lowercase hex HMAC-SHA1 of the date's
  characters under the secret key. The proxy reads Credential up to its first ``/``.

The proxy signs no request bytes and does not look at the date; this front also refuses a
date more than WINDOW_SECONDS from the broker's clock (which bounds a replay). Note that
the Java and Python clients format their local time with the ``Z``: run them in UTC.

The permissions are V2_RPCS's, on the topic and group the request names, as the proxy's
DefaultAuthorizationContextBuilder takes them (Telemetry: its settings, each time the
client writes them). A refusal is answered as the proxy answers both an authentication
and an authorization failure (ResponseBuilder.buildStatus): status UNAUTHORIZED (40100)
in the response, before the handler runs, so nothing is stored, locked or moved.
FORBIDDEN (40300) is the proxy's answer for a queue without permission, not an account.

The secret key is only used to compute the expected signature; the messages name the
access key, the resource and the permission.
"""

from __future__ import annotations

import calendar
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker.acl import V2_RPCS, Acl, AclDenied, DenyReason, Needs, Permission, authorize
from mockbroker.fronts.grpc.auth import client_host
from mockbroker.fronts.v2.status import V2Error
from sdk.clock import Clock

#: The gRPC metadata keys the clients sign with.
AUTHORIZATION_HEADER = "authorization"
DATE_TIME_HEADER = "x-mq-date-time"
#: The scheme's name, first in the authorization header.
ALGORITHM = "MQv2-HMAC-SHA1"
DATE_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
#: How far a call's date may be from the broker's clock, either way (seconds).
WINDOW_SECONDS = 300.0

#: What one request touches: (topic, group) pairs, each checked against the RPC's needs.
Targets = list[tuple[str | None, str | None]]


def sign(secret_key: str, date_time: str) -> str:
    """The signature of a date: lowercase hex HMAC-SHA1 of its characters (UTF-8)."""
    key = secret_key.encode("utf-8")
    return hmac.new(key, date_time.encode("utf-8"), hashlib.sha1).hexdigest()


def parse_authorization(header: str) -> tuple[str | None, str | None]:
    """(access key, signature) of an authorization header; None for a part it lacks.

    V2Error UNAUTHORIZED when it is not ``<algorithm> key=value, ...``.
    """
    algorithm, _, rest = header.partition(" ")
    if not rest or algorithm != ALGORITHM:
        raise _refused(
            f"the authorization header is not {ALGORITHM} Credential=..., "
            "SignedHeaders=x-mq-date-time, Signature=..."
        )
    access_key: str | None = None
    signature: str | None = None
    for item in rest.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep:
            raise _refused(f"the authorization header has an item without '=': {item[:40]!r}")
        if name == "Credential":
            access_key = value.split("/", 1)[0] or None
        elif name == "Signature":
            signature = value
    return access_key, signature


def _refused(message: str) -> V2Error:
    return V2Error(v2.UNAUTHORIZED, message)


def _date_seconds(text: str) -> float:
    try:
        return float(calendar.timegm(time.strptime(text, DATE_TIME_FORMAT)))
    except ValueError:
        raise _refused(
            f"{DATE_TIME_HEADER} {text[:40]!r} is not a date like 20260101T120000Z"
        ) from None


class V2Auth:
    """Checks the signature and permissions of RocketMQ 5 calls against one Acl."""

    def __init__(self, acl: Acl, clock: Clock, *, window_seconds: float = WINDOW_SECONDS) -> None:
        self._acl = acl
        self._clock = clock
        self._window = window_seconds

    def check(self, method: str, context: Any, request: Any) -> None:
        """V2Error UNAUTHORIZED unless the call's signer may make this request."""
        host = client_host(context.peer())
        try:
            access_key = self._authenticate(context, host)
            needs = V2_RPCS.get(method, Needs())
            if method == "Telemetry":  # publishing: PUB on its topics; subscribing: SUB
                publishing = _publishing(request)
                self._authorize(access_key, host, Needs(topic=Permission.PUB), publishing)
                if publishing and not request.settings.HasField("subscription"):
                    return
            self._authorize(access_key, host, needs, _targets(method, request))
        except AclDenied as exc:
            raise _refused(str(exc)) from None

    def _authenticate(self, context: Any, host: str) -> str | None:
        metadata: dict[str, str] = {}
        for key, value in context.invocation_metadata() or ():
            metadata[key] = value if isinstance(value, str) else value.decode("latin-1")
        header = metadata.get(AUTHORIZATION_HEADER)
        access_key, signature = parse_authorization(header) if header else (None, None)
        if not self._acl.signature_required(access_key, host):
            return access_key
        secret = self._acl.secret_of(access_key or "")  # AclDenied for none or unknown
        date_text = metadata.get(DATE_TIME_HEADER)
        if date_text is None or signature is None:
            missing = DATE_TIME_HEADER if date_text is None else "Signature"
            message = f"accessKey {access_key!r}: the call carries no {missing}"
            raise AclDenied(DenyReason.UNAUTHENTICATED, message)
        offset = self._clock.now() - _date_seconds(date_text)
        if abs(offset) > self._window:
            raise AclDenied(
                DenyReason.UNAUTHENTICATED,
                f"accessKey {access_key!r}: the call was signed {offset:+.0f}s from the broker's "
                f"time, outside its window of {self._window:g}s (an expired or replayed "
                "request, or a client clock out of time: the clients must run in UTC)",
            )
        expected = sign(secret, date_text)
        if not hmac.compare_digest(expected.encode(), signature.lower().encode("latin-1")):
            raise AclDenied(
                DenyReason.UNAUTHENTICATED,
                f"accessKey {access_key!r}: the signature does not match (a wrong secret key)",
            )
        return access_key

    def _authorize(self, access_key: str | None, host: str, needs: Needs, targets: Targets) -> None:
        if not targets:
            self._acl.authenticate(access_key, host)
        for topic, group in targets:
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


def _name(resource: v2.Resource) -> str | None:
    return resource.name or None


def _consumer_group(request: Any) -> Targets:
    # A producer's heartbeat or termination names no group: a known account is enough.
    return [(None, _name(request.group))] if request.group.name else []


def _send(request: svc.SendMessageRequest) -> Targets:
    return [(t, None) for t in sorted({m.topic.name for m in request.messages} - {""})]


def _publishing(request: svc.TelemetryCommand) -> Targets:
    settings = request.settings
    if not settings.HasField("publishing"):
        return []
    return [(t.name, None) for t in settings.publishing.topics if t.name]


def _telemetry(request: svc.TelemetryCommand) -> Targets:
    settings = request.settings
    targets: Targets = []
    if settings.HasField("subscription"):
        sub = settings.subscription
        group = _name(sub.group)
        targets += [(e.topic.name, group) for e in sub.subscriptions if e.topic.name]
        if group is not None and not sub.subscriptions:
            targets.append((None, group))
    return targets


_TARGETS: dict[str, Callable[[Any], Targets]] = {
    "QueryRoute": lambda r: [(_name(r.topic), None)],
    "Heartbeat": _consumer_group,
    "NotifyClientTermination": _consumer_group,
    "SendMessage": _send,
    "RecallMessage": lambda r: [(_name(r.topic), None)],
    "EndTransaction": lambda r: [(_name(r.topic), None)],
    "QueryAssignment": lambda r: [(_name(r.topic), _name(r.group))],
    "ReceiveMessage": lambda r: [(_name(r.message_queue.topic), _name(r.group))],
    "AckMessage": lambda r: [(_name(r.topic), _name(r.group))],
    "ForwardMessageToDeadLetterQueue": lambda r: [(_name(r.topic), _name(r.group))],
    "ChangeInvisibleDuration": lambda r: [(_name(r.topic), _name(r.group))],
    "Telemetry": _telemetry,
}


def _targets(method: str, request: Any) -> Targets:
    getter = _TARGETS.get(method)
    return getter(request) if getter is not None else []


__all__ = [
    "ALGORITHM",
    "AUTHORIZATION_HEADER",
    "DATE_TIME_FORMAT",
    "DATE_TIME_HEADER",
    "WINDOW_SECONDS",
    "V2Auth",
    "parse_authorization",
    "sign",
]
