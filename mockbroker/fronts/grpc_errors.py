"""BrokerError -> gRPC status plus the `ordermq-reason` trailing metadata.

Also the registration of the services: a request that does not parse reaches its handler
as a MalformedRequest and is answered INVALID_ARGUMENT (a raising deserializer would make
gRPC answer UNKNOWN and log a traceback).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from mockbroker.errors import BrokerError, invalid
from mockbroker.request_stats import RequestStats

if TYPE_CHECKING:
    from mockbroker.fronts.grpc.auth import GrpcAuth

REASON_KEY = "ordermq-reason"


class Servicer(Protocol):
    """A servicer whose unary handlers `answers_errors` wraps: it counts their answers."""

    requests: RequestStats


S = TypeVar("S", bound=Servicer)
Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context = grpc.aio.ServicerContext[Any, Any]
Handler = Callable[[S, Req, Context], Awaitable[Resp]]


class MalformedRequest:
    """A request whose bytes do not parse as its message type, as it reaches the handler.

    Malformed protobuf, or a string field that is not UTF-8.
    """

    __slots__ = ("error",)

    def __init__(self, error: BrokerError) -> None:
        self.error = error


def parsed(request: Req | MalformedRequest) -> Req:
    """`request`, or its INVALID_ARGUMENT when it did not parse."""
    if isinstance(request, MalformedRequest):
        raise request.error
    return request


async def abort(context: Context, exc: BrokerError) -> None:
    """End the call with the error's status, message and reason."""
    context.set_trailing_metadata(((REASON_KEY, exc.reason),))
    await context.abort(exc.status, exc.message)


def answers_errors(handler: Handler[S, Req, Resp]) -> Handler[S, Req, Resp]:
    """Turn a BrokerError raised by a unary handler, or a malformed request, into its status.

    Every answer is counted.
    """
    method = handler.__name__

    @functools.wraps(handler)
    async def wrapper(self: S, request: Req, context: Context) -> Resp:
        try:
            answer = await handler(self, parsed(request), context)
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


def deserializer(cls: type[Message]) -> Callable[[bytes], Message | MalformedRequest]:
    """`cls`'s parser: a MalformedRequest (INVALID_ARGUMENT) for bytes that do not parse."""
    parse = cls.FromString

    def deserialize(data: bytes) -> Message | MalformedRequest:
        try:
            return parse(data)
        except DecodeError as exc:
            return MalformedRequest(
                invalid("INVALID_ARGUMENT", f"the request does not parse: {exc}")
            )

    return deserialize


def _serializer(cls: type[Message]) -> Callable[[Message | bytes], bytes]:
    """`cls`'s serializer, passing bytes through: a handler may answer serialized already.

    ExchangeBatched joins its answers serialized (sdk._batching.join_repeated).
    """
    serialize = cls.SerializeToString

    def serializer(message: Message | bytes) -> bytes:
        return message if isinstance(message, bytes) else serialize(message)

    return serializer


_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def _guarded(
    behavior: Callable[..., Any], path: str, method: str, auth: GrpcAuth, stats: RequestStats,
    streaming: bool,
) -> Callable[..., Any]:  # fmt: skip
    """A handler that checks the ACL (signature, then permissions) before `behavior` runs.

    A request that did not parse goes to the handler, which refuses it (INVALID_ARGUMENT)
    without doing anything: there is nothing to check the signature over.
    """

    async def admit(request: object, context: Context) -> None:
        if isinstance(request, MalformedRequest):
            return
        assert isinstance(request, Message)
        try:
            auth.authorize(auth.caller(path, context, request), method, request)
        except BrokerError as exc:
            stats.refused(method, exc)
            await abort(context, exc)

    if streaming:

        async def guarded_stream(request: object, context: Context) -> AsyncIterator[Any]:
            await admit(request, context)
            async for answer in behavior(request, context):
                yield answer

        return guarded_stream

    async def guarded(request: object, context: Context) -> Any:
        await admit(request, context)
        return await behavior(request, context)

    return guarded


def add_service(
    server: grpc.aio.Server,
    service: ServiceDescriptor,
    servicer: object,
    auth: GrpcAuth | None = None,
) -> None:
    """Serve every RPC of `service` by the servicer's method of the same name.

    What the generated add_*Servicer_to_server does, with a deserializer that hands a
    request that does not parse to the handler as a MalformedRequest. With `auth` (the
    broker's ACL) every RPC with a single request is checked before its handler runs;
    a stream of requests (Exchange) checks its own.
    """

    def behavior(method: MethodDescriptor) -> Callable[..., Any]:
        handler: Callable[..., Any] = getattr(servicer, method.name)
        if auth is None or method.client_streaming:
            return handler
        path = f"/{service.full_name}/{method.name}"
        stats: RequestStats = getattr(servicer, "requests")  # noqa: B009 (a Servicer's)
        return _guarded(handler, path, method.name, auth, stats, method.server_streaming)

    handlers = {
        method.name: _HANDLER_KINDS[(method.client_streaming, method.server_streaming)](
            behavior(method),
            request_deserializer=deserializer(GetMessageClass(method.input_type)),
            response_serializer=_serializer(GetMessageClass(method.output_type)),
        )
        for method in service.methods
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
    # grpc-stubs predates the registered handlers (a faster dispatch than the generic one).
    server.add_registered_method_handlers(service.full_name, handlers)  # type: ignore[attr-defined]


def message_id(text: str) -> bytes:
    """The 16 bytes of a message id given as 32 hex digits (INVALID_ARGUMENT otherwise)."""
    try:
        msg_id = bytes.fromhex(text)
    except ValueError:
        msg_id = b""
    if len(msg_id) != 16:
        raise invalid("INVALID_ARGUMENT", f"msg_id {text!r} is not 32 hexadecimal digits")
    return msg_id
