"""The console as a client of its own broker, for what the `ordermq` command does as one.

Resending dead letters sends messages and commits a marker group's offset, and finding a
sharding key's messages pulls a queue: the command does both through sdk/message_admin.py
with a client of the broker, and so does the console, through the broker's own ordermq
gRPC front (signed with the console user's account when the broker has an ACL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sdk._transport import connect
from sdk._transport.broker_client import BrokerClient
from sdk._transport.grpc_transport import GrpcTransport
from sdk.credentials import Credentials
from sdk.errors import NotSupportedError
from sdk.message import Message
from sdk.producer import Producer
from sdk.tls import TLSConfig

T = TypeVar("T")

#: How long the console waits for its own broker to answer one of its client's calls.
CLIENT_TIMEOUT_SECONDS = 30.0


class DataPath:
    """Clients of the broker's ordermq gRPC front at `address()`, over TLS with `tls`.

    `refusal`, when set, says why the console cannot be a client (say, the broker
    requires client certificates): every call raises NotSupportedError with it.
    """

    def __init__(
        self, address: Callable[[], str], tls: TLSConfig | None = None, refusal: str = ""
    ) -> None:
        self._address = address
        self._tls = tls
        self._refusal = refusal

    def call(
        self, body: Callable[[BrokerClient], Awaitable[T]], credentials: Credentials | None
    ) -> T:
        """Run `body` with a client of the broker (in this thread, on a loop of its own)."""
        self._check()

        async def main() -> T:
            transport = connect(self._address(), self._tls, credentials)
            try:
                if not isinstance(transport, GrpcTransport):
                    raise NotSupportedError("the console's broker speaks ordermq's gRPC")
                async with asyncio.timeout(CLIENT_TIMEOUT_SECONDS):
                    return await body(transport.client(transport.endpoints[0]))
            finally:
                await transport.close()

        return asyncio.run(main())

    def sender(self, credentials: Credentials | None) -> _Sender:
        """A producer of the broker, to send messages with (close it when done)."""
        self._check()
        producer = Producer(self._address(), tls=self._tls, credentials=credentials)
        producer.start()
        return _Sender(producer)

    def _check(self) -> None:
        if self._refusal:
            raise NotSupportedError(self._refusal)


class _Sender:
    """A Producer's send, closed with the context."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def send(self, message: Message) -> None:
        """Send `message` (its sharding key picks the queue, as for any producer)."""
        self._producer.send(message)

    def __enter__(self) -> _Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self._producer.shutdown()
