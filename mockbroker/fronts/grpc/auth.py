"""The ACL on ordermq's gRPC: who signed a call, and whether its account may do it.

Every call of MessagingService and AdminService passes here before its handler when the
broker has an ACL file (add_service wraps the handlers; Exchange checks its opening here
and each frame as the RPC it carries). The scheme is sdk/credentials.py's: the access
key, a date and an HMAC-SHA256 signature over the method, the date and the request's
digest, in the call's metadata. A refusal is a BrokerError (UNAUTHENTICATED or
PERMISSION_DENIED) raised before the handler runs: nothing is stored, locked or moved.

The secret key is read from the rules to compute the expected signature and never
logged; the messages name the access key, the resource and the permission only.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from mockbroker.acl import (
    ORDERMQ_RPCS,
    Acl,
    AclDenied,
    DenyReason,
    Needs,
    Permission,
    authorize,
)
from mockbroker.errors import BrokerError
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk.clock import Clock
from sdk.credentials import ACCESS_KEY_HEADER, DATE_HEADER, SIGNATURE_HEADER, sign

#: How far a call's date may be from the broker's clock, either way (seconds).
WINDOW_SECONDS = 300.0

#: What one request touches: (topic, group) pairs, each checked against the RPC's needs.
Targets = list[tuple[str | None, str | None]]


def client_host(peer: str) -> str:
    """The client's address in a gRPC peer string: 'ipv4:10.0.0.1:5' -> '10.0.0.1'.

    'ipv6:[::1]:5' -> '::1' (and '%2525'-escaped zones are left as they are); anything
    else ('unix:...') is returned whole, and matches no address pattern but '*'.
    """
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6" and rest.startswith("["):
        return rest[1:].partition("]")[0]
    return peer


@dataclass(frozen=True)
class Caller:
    """Who made a call: the access key it carried (None: none) and its host."""

    access_key: str | None
    host: str


def _denied(exc: AclDenied) -> BrokerError:
    if exc.reason is DenyReason.UNAUTHENTICATED:
        return BrokerError(grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", str(exc))
    return BrokerError(grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", str(exc))


def _unauthenticated(message: str) -> BrokerError:
    return BrokerError(grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", message)


class GrpcAuth:
    """Checks signatures and permissions of ordermq's gRPC calls against one Acl."""

    def __init__(
        self,
        acl: Acl,
        clock: Clock,
        *,
        topic_of_scheduled: Callable[[bytes], str | None] = lambda _msg_id: None,
        window_seconds: float = WINDOW_SECONDS,
    ) -> None:
        self._acl = acl
        self._clock = clock
        self._window_ms = int(window_seconds * 1000)
        self._topic_of_scheduled = topic_of_scheduled

    # ------------------------------------------------------------------ who
    def caller(self, method_path: str, context: Any, request: Message | None) -> Caller:
        """Check the call's signature; the caller, or BrokerError UNAUTHENTICATED.

        `request` is the call's request message (None for a stream's opening, signed
        over no bytes). White addresses need no signature, as in RocketMQ.
        """
        metadata: dict[str, str] = {}
        for key, value in context.invocation_metadata() or ():
            metadata[key] = value if isinstance(value, str) else value.decode("latin-1")
        return self.signed_caller(method_path, metadata, client_host(context.peer()), request)

    def signed_caller(
        self, method_path: str, metadata: dict[str, str], host: str, request: Message | None
    ) -> Caller:
        """`caller` for a call from `host` whose signature headers are in `metadata`.

        The Exchange port's hello carries the same three values as a frame.
        """
        access_key = metadata.get(ACCESS_KEY_HEADER) or None
        if not self._acl.signature_required(access_key, host):
            return Caller(access_key, host)
        try:
            secret = self._acl.secret_of(access_key or "")
        except AclDenied as exc:
            raise _denied(exc) from None
        date_text = metadata.get(DATE_HEADER)
        signature = metadata.get(SIGNATURE_HEADER)
        if date_text is None or signature is None:
            missing = DATE_HEADER if date_text is None else SIGNATURE_HEADER
            raise _unauthenticated(
                f"accessKey {access_key!r}: the call carries no {missing} (sign every call: "
                "docs/security.md, Accounts and permissions)"
            )
        try:
            date_ms = int(date_text)
        except ValueError:
            raise _unauthenticated(
                f"accessKey {access_key!r}: {DATE_HEADER} {date_text[:40]!r} is not UTC "
                "milliseconds"
            ) from None
        now_ms = int(self._clock.now() * 1000)
        if abs(now_ms - date_ms) > self._window_ms:
            raise _unauthenticated(
                f"accessKey {access_key!r}: the call was signed {(now_ms - date_ms) / 1000:+.0f}s "
                f"from the broker's time, outside its window of {self._window_ms / 1000:g}s "
                "(an expired or replayed request, or a client clock out of time)"
            )
        body = b"" if request is None else request.SerializeToString(deterministic=True)
        expected = sign(secret, method_path, date_ms, body)
        if not hmac.compare_digest(expected.encode(), signature.encode("latin-1")):
            raise _unauthenticated(
                f"accessKey {access_key!r}: the signature does not match (a wrong secret key, "
                "or the request changed on the way)"
            )
        return Caller(access_key, host)

    # ------------------------------------------------------------------ what
    def authorize(self, caller: Caller, method: str, request: Message) -> None:
        """Check every permission `method` with this request needs; BrokerError if refused."""
        needs = ORDERMQ_RPCS[method]
        try:
            self._authorize(caller, needs, self._targets(method, request))
        except AclDenied as exc:
            raise _denied(exc) from None

    def _authorize(self, caller: Caller, needs: Needs, targets: Targets) -> None:
        if not targets:
            self._acl.authenticate(caller.access_key, caller.host)
        for topic, group in targets:
            # An RPC that names only part of what it needs is checked on what it names.
            part = Needs(
                topic=needs.topic if topic is not None else Permission.NONE,
                group=needs.group if group is not None else Permission.NONE,
                admin=needs.admin,
            )
            if not (part.topic or part.group or part.admin):
                self._acl.authenticate(caller.access_key, caller.host)
                continue
            authorize(self._acl, caller.access_key, caller.host, part, topic=topic, group=group)

    def _targets(self, method: str, request: Any) -> Targets:
        getter = _TARGETS.get(method)
        if getter is not None:
            return getter(request)
        if method == "CancelScheduled":
            topic = request.topic or self._topic_of_scheduled(_msg_id(request.msg_id))
            return [(topic, None)] if topic else []
        return [(_field(request, "topic"), _field(request, "group"))]


def _field(request: Any, name: str) -> str | None:
    """A request's `name` field, if it has one and it is set."""
    descriptor = request.DESCRIPTOR
    if name not in descriptor.fields_by_name:
        return None
    value = getattr(request, name)
    return value or None


def _msg_id(text: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        return b""


def _receipt_topic(receipt_handle: str) -> str | None:
    from mockbroker.pop.receipts import parse_receipt

    try:
        return parse_receipt(receipt_handle).topic
    except BrokerError:
        return None  # the handler refuses it: INVALID_RECEIPT_HANDLE


def _queues(group: str, topics: Iterable[str]) -> Targets:
    names = sorted(set(topics))
    return [(t, group or None) for t in names] or [(None, group or None)]


def _heartbeat(r: pb.HeartbeatRequest) -> Targets:
    return [(None, g.group) for g in r.consumer_groups]


_TARGETS: dict[str, Callable[[Any], Targets]] = {
    "LockBatch": lambda r: _queues(r.group, (q.topic for q in r.queues)),
    "UnlockBatch": lambda r: _queues(r.group, (q.topic for q in r.queues)),
    "CommitConsumerOffsets": lambda r: _queues(r.group, (o.topic for o in r.offsets)),
    "Heartbeat": _heartbeat,
    # It names no group: a known account unregisters its client id (see docs/security.md).
    "UnregisterClient": lambda r: [],
    "SendBack": lambda r: [(None, r.group or None)],
    "Ack": lambda r: [(_receipt_topic(r.receipt_handle), r.group or None)],
    "ChangeInvisibleDuration": lambda r: [(_receipt_topic(r.receipt_handle), r.group or None)],
}
