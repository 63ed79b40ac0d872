"""Stream messages that carry several requests or answers (ExchangeBatched).

Shared by the SDK's stream writer and the broker's: how several serialized messages
become one without being parsed or copied into another message, and how long a writer
lets the event loop run before it takes what is queued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

#: Most turns of the event loop `settled` waits.
SETTLE_TURNS = 8


async def settled(queue: asyncio.Queue[Any]) -> None:
    """Let the event loop turn while `queue` grows (at most SETTLE_TURNS turns).

    A stream's writer calls it before taking what is queued: requests whose callers are
    ready to run, and answers whose requests are about to finish (one send handing its
    queue to the next, say), join the message being written rather than each the next.
    A turn costs microseconds; a stream message, tens.
    """
    for _ in range(SETTLE_TURNS):
        size = queue.qsize()
        await asyncio.sleep(0)
        if queue.qsize() == size:
            return


def join_repeated(serialized: Iterable[bytes]) -> bytes:
    """Serialized messages as one message holding them in its repeated field 1.

    What putting them into the field and serializing would give, without parsing them or
    copying them into another message (ExchangeRequests, ExchangeResponses).
    """
    pieces: list[bytes | bytearray] = []
    for item in serialized:
        n = len(item)
        head = bytearray(b"\x0a")  # field 1, length-delimited
        while n >= 0x80:
            head.append(n & 0x7F | 0x80)
            n >>= 7
        head.append(n)
        pieces += (head, item)
    return b"".join(pieces)
