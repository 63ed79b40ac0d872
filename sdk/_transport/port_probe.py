"""Which protocol answers at an address a client could not talk to.

Asked only on the failure path of a first connection, to tell "this is the port of
another protocol" from "the broker is down": a client of ordermq's gRPC pointed at a
RocketMQ remoting port (a name server's 9876) waits for HTTP/2 that never comes, and a
`rocketmq://` client pointed at a gRPC port reads HTTP/2 frames as remoting frames.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sdk._remoting.codec import encode, read_command
from sdk._remoting.codes import RequestCode
from sdk._remoting.command import RemotingCommand
from sdk._transport.exchange_port import read_greeting
from sdk._wire import EXCHANGE_PORT_PREAMBLE

#: What an HTTP/2 client sends first (RFC 9113, 3.4), then an empty SETTINGS frame.
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
#: An HTTP/2 server's first frame is SETTINGS: type 0x4 in the 9-byte frame header.
_SETTINGS_TYPE = 4
#: A remoting answer to the probe is small; anything bigger is not one.
_MAX_PROBE_FRAME = 64 * 1024
_PROBE_OPAQUE = 1

T = TypeVar("T")


async def speaks_http2(address: str, timeout: float = 1.0) -> bool:
    """Whether `address` ("host:port") answers as a plain-text HTTP/2 (gRPC) server."""
    head = await _ask(address, HTTP2_PREFACE + _EMPTY_SETTINGS, lambda r: r.readexactly(9), timeout)
    return head is not None and head[3] == _SETTINGS_TYPE


async def speaks_remoting(address: str, timeout: float = 1.0) -> bool:
    """Whether `address` ("host:port") answers a RocketMQ remoting request.

    Any answer counts (a name server's cluster info, a broker's "not supported", an ACL
    refusal): only a remoting server frames one.
    """
    probe = RemotingCommand(code=int(RequestCode.GET_BROKER_CLUSTER_INFO), opaque=_PROBE_OPAQUE)
    answer = await _ask(
        address, encode(probe), lambda r: read_command(r, _MAX_PROBE_FRAME), timeout
    )
    return answer is not None and answer.is_response and answer.opaque == _PROBE_OPAQUE


async def speaks_exchange_port(address: str, timeout: float = 1.0) -> bool:
    """Whether `address` ("host:port") is an ordermq broker's Exchange port (framed TCP).

    It greets the preamble with a frame of ExchangeResponses without answers.
    """
    greeting = await _ask(address, EXCHANGE_PORT_PREAMBLE, read_greeting, timeout)
    return greeting is not None


async def _ask(
    address: str,
    send: bytes,
    read: Callable[[asyncio.StreamReader], Awaitable[T]],
    timeout: float,
) -> T | None:
    """What `read` reads of `address`'s answer to `send`; None if it answers nothing."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except (OSError, TimeoutError, ValueError):
        return None
    try:
        writer.write(send)
        async with asyncio.timeout(timeout):
            return await read(reader)
    except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
        return None  # FrameError is a ValueError
    finally:
        writer.close()
