"""A client connection as the remoting front's request handlers see it, and the handler type."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from sdk._remoting.command import RemotingCommand


class ClientChannel(Protocol):
    """One client connection, as handlers see it."""

    @property
    def peer(self) -> str:
        """The remote address, "host:port"."""
        ...

    @property
    def closed(self) -> bool:
        """True once the connection is gone."""
        ...

    async def send_oneway(self, command: RemotingCommand) -> None:
        """Send a broker-to-client oneway request (e.g. NOTIFY_CONSUMER_IDS_CHANGED).

        Never raises for a closed or failing connection: the request is dropped.
        """
        ...


#: A request handler: answers the request (None for a oneway request that needs no
#: answer) or raises RemotingError.
Handler = Callable[[RemotingCommand, ClientChannel], Awaitable[RemotingCommand | None]]
