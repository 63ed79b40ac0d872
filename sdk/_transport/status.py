"""One place that turns gRPC errors into ordermq exceptions."""

from __future__ import annotations

from typing import Any

import grpc

from sdk.errors import OrderMQError, error_from_status

REASON_KEY = "ordermq-reason"


def to_ordermq_error(exc: grpc.aio.AioRpcError) -> OrderMQError:
    """The exception that says what the broker said."""
    reason = None
    metadata: Any = exc.trailing_metadata() or ()
    for key, value in metadata:
        if key == REASON_KEY:
            reason = value if isinstance(value, str) else value.decode()
    code = exc.code().name
    details = exc.details() or code
    return error_from_status(code, reason, details)
