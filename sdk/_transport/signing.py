"""Signing every gRPC call of a client that has credentials (sdk/credentials.py).

A grpc.aio client interceptor on the channel: it covers unary calls, WatchMembership's
server stream and the Exchange stream (whose opening metadata is signed, over an empty
request) without touching the call sites. A channel without credentials has none.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import Message

from sdk.clock import Clock
from sdk.credentials import Credentials, signed_metadata

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


class CallSigner(_UnaryUnary, _UnaryStream, _StreamStream):
    """Adds ordermq-access-key, ordermq-date and ordermq-signature to every call."""

    def __init__(self, credentials: Credentials, clock: Clock) -> None:
        self._credentials = credentials
        self._clock = clock

    def _signed(self, details: Details, body: bytes) -> Details:
        method = details.method
        path = method.decode() if isinstance(method, bytes) else str(method)
        date_ms = int(self._clock.now() * 1000)
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        for key, value in signed_metadata(self._credentials, path, date_ms, body):
            metadata[key] = value
        return Details(
            details.method, details.timeout, metadata, details.credentials, details.wait_for_ready
        )

    @staticmethod
    def _body(request: Any) -> bytes:
        if isinstance(request, Message):
            return request.SerializeToString(deterministic=True)
        return b""

    async def intercept_unary_unary(
        self, continuation: Any, client_call_details: Details,
        request: Any,
    ) -> Any:  # fmt: skip
        """Sign a unary call over its request."""
        return await continuation(self._signed(client_call_details, self._body(request)), request)

    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Details,
        request: Any,
    ) -> Any:  # fmt: skip
        """Sign a server-streaming call over its request."""
        return await continuation(self._signed(client_call_details, self._body(request)), request)

    async def intercept_stream_stream(
        self, continuation: Any, client_call_details: Details,
        request_iterator: AsyncIterable[Any] | Iterable[Any] | None,
    ) -> Any:  # fmt: skip
        """Sign a stream's opening (its frames are checked by the broker one by one)."""
        return await continuation(self._signed(client_call_details, b""), request_iterator)
