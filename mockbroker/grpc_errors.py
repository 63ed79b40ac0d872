"""BrokerError -> gRPC status plus the `ordermq-reason` trailing metadata."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import grpc

from mockbroker.errors import BrokerError
from mockbroker.request_stats import RequestStats

REASON_KEY = "ordermq-reason"


class Servicer(Protocol):
    """A servicer whose unary handlers `answers_errors` wraps: it counts their answers."""

    requests: RequestStats


S = TypeVar("S", bound=Servicer)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[S, Req, Context], Awaitable[Resp]]


async def abort(context: Context, exc: BrokerError) -> None:
    """End the call with the error's status, message and reason."""
    context.set_trailing_metadata(((REASON_KEY, exc.reason),))
    await context.abort(exc.status, exc.message)


def answers_errors(handler: Handler[S, Req, Resp]) -> Handler[S, Req, Resp]:
    """Turn a BrokerError raised by a unary handler into its status; count every answer."""
    method = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self: S, request: Req, context: Context) -> Resp:
        try:
            answer = await handler(self, request, context)
        except BrokerError as exc:
            self.requests.refused(method, exc)
            await abort(context, exc)
            raise AssertionError("unreachable: abort raises") from exc
        except asyncio.CancelledError:
            self.requests.cancelled(method)
            raise
        except Exception:
            self.requests.crashed(method)
            raise
        self.requests.answered(method)
        return answer

    return wrapper
