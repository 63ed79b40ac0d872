"""Errors the broker answers with: a gRPC status, a reason name and a message.

The reason names are the ErrorReason values of the protocol; the servicer sends them as
the `ordermq-reason` trailing metadata so that clients map them to exception classes.
"""

from __future__ import annotations

from grpc import StatusCode


class BrokerError(Exception):
    """A request the broker refuses; nothing was changed by it."""

    def __init__(self, status: StatusCode, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message


def invalid(reason: str, message: str) -> BrokerError:
    """An INVALID_ARGUMENT refusal."""
    return BrokerError(StatusCode.INVALID_ARGUMENT, reason, message)


def out_of_range(reason: str, message: str) -> BrokerError:
    """An OUT_OF_RANGE refusal (queue ids, offsets)."""
    return BrokerError(StatusCode.OUT_OF_RANGE, reason, message)


def not_found(reason: str, message: str) -> BrokerError:
    """A NOT_FOUND refusal."""
    return BrokerError(StatusCode.NOT_FOUND, reason, message)
