"""The core's refusals (BrokerError) as RocketMQ response codes."""

from __future__ import annotations

from grpc import StatusCode

from mockbroker.errors import BrokerError
from sdk._remoting.codes import ResponseCode
from sdk._remoting.command import RemotingError

#: Core refusals by reason, as RocketMQ's codes; others by status (see refusal()).
_CODES_BY_REASON = {
    "MALFORMED_FRAME": ResponseCode.MESSAGE_ILLEGAL,
    "EMPTY_BODY": ResponseCode.MESSAGE_ILLEGAL,
    "BODY_TOO_LARGE": ResponseCode.MESSAGE_ILLEGAL,
    "PROPERTIES_TOO_LARGE": ResponseCode.MESSAGE_ILLEGAL,
    "INVALID_DELIVERY_TIME": ResponseCode.MESSAGE_ILLEGAL,
    "TOPIC_NOT_FOUND": ResponseCode.TOPIC_NOT_EXIST,
    "DISK_FULL": ResponseCode.SERVICE_NOT_AVAILABLE,
    "STORE_UNAVAILABLE": ResponseCode.SERVICE_NOT_AVAILABLE,
}


def refusal(exc: BrokerError) -> RemotingError:
    """The RocketMQ answer to a refusal of the core, its remark the core's reason."""
    code = _CODES_BY_REASON.get(exc.reason)
    if code is None:
        unavailable = exc.status == StatusCode.UNAVAILABLE
        code = ResponseCode.SERVICE_NOT_AVAILABLE if unavailable else ResponseCode.SYSTEM_ERROR
    return RemotingError(code, exc.message)
