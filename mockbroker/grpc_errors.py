"""BrokerError -> gRPC status plus the `ordermq-reason` trailing metadata."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

from mockbroker.errors import BrokerError

REASON_KEY = "ordermq-reason"

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[Any, Req, Context], Awaitable[Resp]]


async def abort(context: Context, exc: BrokerError) -> None:
    """End the call with the error's status, message and reason."""
    context.set_trailing_metadata(((REASON_KEY, exc.reason),))
    await context.abort(exc.status, exc.message)


def answers_errors(handler: Handler[Req, Resp]) -> Handler[Req, Resp]:
    """Turn a BrokerError raised by a unary handler into its status."""

    @functools.wraps(handler)
    async def wrapper(self: Any, request: Req, context: Context) -> Resp:
        try:
            return await handler(self, request, context)
        except BrokerError as exc:
            await abort(context, exc)
            raise AssertionError("unreachable: abort raises") from exc

    return wrapper
