"""A RocketMQ name server brokers register with (`python -m mockbroker.namesrv`).

`EmbeddedNameServer` runs one in a background thread; `NameServer` on a running loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mockbroker.namesrv.embedded import EmbeddedNameServer
    from mockbroker.namesrv.server import NameServer

__all__ = ["EmbeddedNameServer", "NameServer"]


def __getattr__(name: str) -> Any:
    # Lazy: the broker's config reads names from registration.py without the server.
    if name == "EmbeddedNameServer":
        from mockbroker.namesrv.embedded import EmbeddedNameServer

        return EmbeddedNameServer
    if name == "NameServer":
        from mockbroker.namesrv.server import NameServer

        return NameServer
    raise AttributeError(name)
