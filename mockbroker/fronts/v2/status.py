"""RocketMQ 5's answers: a `Status` (code, message) inside each response, never a gRPC error.

The v2 front answers every request it can parse with gRPC OK and puts the outcome in the
response's `status` (the codes of `apache.rocketmq.v2.Code`), as the Apache proxy does;
the clients turn the codes into their exceptions. `V2Error` is a refusal of the front
itself; `status_of` turns a refusal of the core (a BrokerError, whose reason names what
was wrong) into the code a Java proxy gives in that situation, with the core's message.
"""

from __future__ import annotations

from typing import TypeAlias

from grpc import StatusCode

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker.errors import BrokerError

#: A v2 status code (a value of apache.rocketmq.v2.Code).
Code: TypeAlias = v2.Code.ValueType

#: Core refusals by reason (mockbroker's ErrorReason names, and the pop core's).
_CODES_BY_REASON: dict[str, Code] = {
    "INVALID_TOPIC": v2.ILLEGAL_TOPIC,
    "TOPIC_NOT_FOUND": v2.TOPIC_NOT_FOUND,
    "INVALID_GROUP": v2.ILLEGAL_CONSUMER_GROUP,
    "GROUP_NOT_FOUND": v2.CONSUMER_GROUP_NOT_FOUND,
    "EMPTY_BODY": v2.MESSAGE_BODY_EMPTY,
    "BODY_TOO_LARGE": v2.MESSAGE_BODY_TOO_LARGE,
    "PROPERTIES_TOO_LARGE": v2.MESSAGE_PROPERTIES_TOO_LARGE,
    "BATCH_TOO_LARGE": v2.PAYLOAD_TOO_LARGE,
    "INVALID_DELIVERY_TIME": v2.ILLEGAL_DELIVERY_TIME,
    "INVALID_TAG_EXPRESSION": v2.ILLEGAL_FILTER_EXPRESSION,
    # A message id or key the broker does not know. Never v2's MESSAGE_NOT_FOUND: the
    # clients read that one as "nothing to receive" and report success.
    "MESSAGE_NOT_FOUND": v2.NOT_FOUND,
    "NOT_IMPLEMENTED": v2.NOT_IMPLEMENTED,
    "CLIENT_OVER_LIMIT": v2.TOO_MANY_REQUESTS,
    # The pop core's refusals (ReceiveMessage, AckMessage, ChangeInvisibleDuration,
    # ForwardMessageToDeadLetterQueue: see pop.py).
    "INVALID_RECEIPT_HANDLE": v2.INVALID_RECEIPT_HANDLE,
    "RECEIPT_EXPIRED": v2.INVALID_RECEIPT_HANDLE,
    "INVALID_INVISIBLE_TIME": v2.ILLEGAL_INVISIBLE_TIME,
}
#: The others by gRPC status: what the proxy's catch-all would say.
_CODES_BY_STATUS: dict[StatusCode, Code] = {
    StatusCode.INVALID_ARGUMENT: v2.BAD_REQUEST,
    StatusCode.OUT_OF_RANGE: v2.BAD_REQUEST,
    StatusCode.FAILED_PRECONDITION: v2.BAD_REQUEST,
    StatusCode.NOT_FOUND: v2.NOT_FOUND,
    StatusCode.ALREADY_EXISTS: v2.BAD_REQUEST,
    StatusCode.RESOURCE_EXHAUSTED: v2.TOO_MANY_REQUESTS,
    StatusCode.UNIMPLEMENTED: v2.NOT_IMPLEMENTED,
    # DISK_FULL, STORE_UNAVAILABLE, FLUSH_FAILED: the broker's SERVICE_NOT_AVAILABLE, which
    # the proxy answers as an internal error (the clients retry a send on it).
}


class V2Error(Exception):
    """A request the v2 front refuses before calling the core; nothing was changed."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def status(self) -> v2.Status:
        """The refusal as a v2 Status."""
        return v2.Status(code=self.code, message=self.message)


def ok() -> v2.Status:
    """Status OK, worded as the proxy words it."""
    return v2.Status(code=v2.OK, message="OK")


def code_of(exc: BrokerError) -> Code:
    """The v2 code for a refusal of the core."""
    code = _CODES_BY_REASON.get(exc.reason)
    if code is None:
        code = _CODES_BY_STATUS.get(exc.status, v2.INTERNAL_SERVER_ERROR)
    return code


def status_of(exc: BrokerError | V2Error) -> v2.Status:
    """The v2 Status answering a refusal, with its specific message."""
    if isinstance(exc, V2Error):
        return exc.status()
    return v2.Status(code=code_of(exc), message=exc.message)


__all__ = ["Code", "V2Error", "code_of", "ok", "status_of"]
