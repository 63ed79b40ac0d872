"""Signing every call of a client that has credentials (sdk/credentials.py).

A grpc.aio client interceptor on the channel: it covers unary calls, WatchMembership's
server stream and the Exchange stream (whose opening metadata is signed, over an empty
request) without touching the call sites. A channel without credentials has none. On an
Exchange port, the connection's hello frame carries the same signature (signed_hello).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk.clock import Clock
from sdk.credentials import Credentials, sign, signed_metadata

Details = grpc.aio.ClientCallDetails

# grpc-stubs makes the interceptor classes generic; at run time they are not.
if TYPE_CHECKING:
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    _StreamStream = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor
    _StreamStream = grpc.aio.StreamStreamClientInterceptor


def signed_hello(credentials: Credentials, clock: Clock, method_path: str) -> pb.ExchangeHello:
    """The Exchange port's hello for `credentials`, dated now.

    Signed as the opening of a call of `method_path` (over no bytes), which it stands for.
    """
    date_ms = int(clock.now() * 1000)
    signature = sign(credentials.secret_key, method_path, date_ms, b"")
    return pb.ExchangeHello(access_key=credentials.access_key, date_ms=date_ms, signature=signature)


class CallSigner:
    """Adds ordermq-access-key, ordermq-date and ordermq-signature to a call's metadata."""

    def __init__(self, credentials: Credentials, clock: Clock) -> None:
        self._credentials = credentials
        self._clock = clock

    def signed(self, details: Details, request: Any) -> Details:
        """The call's details with its signature, over `request` (None: no bytes)."""
        body = (
            request.SerializeToString(deterministic=True) if isinstance(request, Message) else b""
        )
        method = details.method
        path = method.decode() if isinstance(method, bytes) else str(method)
        date_ms = int(self._clock.now() * 1000)
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        for key, value in signed_metadata(self._credentials, path, date_ms, body):
            metadata[key] = value
        return Details(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    def interceptors(self) -> list[Any]:
        """One interceptor per kind of call (a channel files each under one kind only)."""
        return [_SignUnary(self), _SignUnaryStream(self), _SignStream(self)]


class _SignUnary(_UnaryUnary):
    def __init__(self, signer: CallSigner) -> None:
        self._signer = signer

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> Any:
        return await continuation(self._signer.signed(client_call_details, request), request)


class _SignUnaryStream(_UnaryStream):
    def __init__(self, signer: CallSigner) -> None:
        self._signer = signer

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Details, request: Any
    ) -> Any:
        return await continuation(self._signer.signed(client_call_details, request), request)


class _SignStream(_StreamStream):
    """The Exchange stream: its opening is signed (its frames are checked one by one)."""

    def __init__(self, signer: CallSigner) -> None:
        self._signer = signer

    async def intercept_stream_stream(
        self,
        continuation: Any,
        client_call_details: Details,
        request_iterator: AsyncIterable[Any] | Iterable[Any] | None,
    ) -> Any:
        return await continuation(self._signer.signed(client_call_details, None), request_iterator)
