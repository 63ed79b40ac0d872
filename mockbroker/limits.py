"""How much of each client's data the broker holds at once, and the limit on it.

A client (a connection: its gRPC peer) has the broker hold the messages of its sends until
they are stored and the messages of its pulls' answers until they are handed to gRPC.
Past `max_bytes` the broker takes no more from it: its Exchange stream reads no further
requests (but the one it was already waiting for) and its pulls wait before reading (the
client waits, held back by gRPC's flow control), and a unary Send is refused with
RESOURCE_EXHAUSTED (CLIENT_OVER_LIMIT), which clients retry after a back-off. A request
is always taken when the client has nothing else in flight, however large. So a client
sending or pulling flat out costs the broker about `max_bytes` of memory, plus a request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Hashable, Iterator

from grpc import StatusCode

from mockbroker.errors import BrokerError


class ClientLimits:
    """Bytes held per client, and waiting for room under the limit."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._held: dict[Hashable, int] = {}
        self._room: dict[Hashable, asyncio.Event] = {}
        #: Unary sends refused for being over the limit.
        self.refused = 0

    def held(self, client: Hashable) -> int:
        """Bytes of `client`'s data the broker holds."""
        return self._held.get(client, 0)

    def over(self, client: Hashable) -> bool:
        """True when `client` is at or past the limit."""
        return self._held.get(client, 0) >= self.max_bytes

    def hold(self, client: Hashable, n: int) -> None:
        """Count `n` more bytes for `client` (negative: release them)."""
        held = self._held.get(client, 0) + n
        if held:
            self._held[client] = held
        else:
            self._held.pop(client, None)
        if held < self.max_bytes and (room := self._room.pop(client, None)) is not None:
            room.set()

    async def room(self, client: Hashable) -> None:
        """Return once `client` is under the limit."""
        while self.over(client):
            room = self._room.get(client)
            if room is None:
                room = self._room[client] = asyncio.Event()
            await room.wait()

    @contextlib.contextmanager
    def unary(self, client: Hashable, n: int) -> Iterator[None]:
        """Hold `n` bytes for a unary call; CLIENT_OVER_LIMIT when the client is over."""
        if self.over(client):
            self.refused += 1
            raise BrokerError(
                StatusCode.RESOURCE_EXHAUSTED,
                "CLIENT_OVER_LIMIT",
                f"this client already has {self.held(client)} bytes of requests in flight, "
                f"at or over the broker's limit of {self.max_bytes} per client "
                f"(client_max_in_flight_bytes); retry once some are answered",
            )
        self.hold(client, n)
        try:
            yield
        finally:
            self.hold(client, -n)
