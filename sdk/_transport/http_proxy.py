"""The HTTP CONNECT proxy gRPC would use for a host, and a tunnel through it.

ordermq's gRPC channels go through the proxy that gRPC's C core takes from the
environment; the Exchange port's connections (sdk/_transport/exchange_port.py) must take
the same way, or a client that may reach the broker only through its proxy would try the
port directly and wait for nothing. The rules are gRPC's (its default proxy mapper):

- the proxy is the first of `grpc_proxy`, `https_proxy`, `http_proxy` that is set: an
  `http://[user:password@]host[:port]` URI (port 443 when left out; the user and password
  go as Basic proxy authorization); another scheme, or a value that does not parse, means
  no proxy;
- the first of `no_grpc_proxy`, `no_proxy` that is set lists, comma-separated, the hosts
  reached directly: a name matches the host it ends, an address range in CIDR notation
  (10.0.0.0/8) the addresses in it.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

log = logging.getLogger("ordermq.transport")

PROXY_VARIABLES = ("grpc_proxy", "https_proxy", "http_proxy")
NO_PROXY_VARIABLES = ("no_grpc_proxy", "no_proxy")


@dataclass(frozen=True)
class HttpProxy:
    """An HTTP CONNECT proxy: where it listens, and the authorization it asks for."""

    host: str
    port: int
    #: The Proxy-Authorization header's value (None: none sent).
    authorization: str | None = None

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def proxy_for(host: str, environ: Mapping[str, str] | None = None) -> HttpProxy | None:
    """The proxy gRPC would go through to reach `host` (a name or an address); None: none."""
    env = os.environ if environ is None else environ
    name, value = next(((n, env[n]) for n in PROXY_VARIABLES if env.get(n)), ("", ""))
    if not value:
        return None
    proxy = _parse(value)
    if proxy is None:
        log.warning("%s=%r is not an http:// URI: no proxy is used (as gRPC does)", name, value)
        return None
    exempt = next((env[n] for n in NO_PROXY_VARIABLES if env.get(n)), "")
    if any(_matches(entry.strip(), host) for entry in exempt.split(",") if entry.strip()):
        return None
    return proxy


def _parse(value: str) -> HttpProxy | None:
    try:
        uri = urlsplit(value)
        port = uri.port
    except ValueError:
        return None
    if uri.scheme != "http" or not uri.hostname:
        return None
    authorization = None
    if uri.username is not None:
        credentials = f"{unquote(uri.username)}:{unquote(uri.password or '')}"
        authorization = "Basic " + base64.b64encode(credentials.encode()).decode()
    return HttpProxy(uri.hostname, port if port is not None else 443, authorization)


def _matches(entry: str, host: str) -> bool:
    if "/" in entry:
        try:
            return ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False)
        except ValueError:
            return False
    return host.lower().endswith(entry.lower())


async def open_tunnel(
    proxy: HttpProxy, host: str, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to host:port through `proxy` (HTTP CONNECT), ready for its bytes.

    OSError when the proxy cannot be reached or does not open the tunnel (its status
    line in the message).
    """
    reader, writer = await asyncio.open_connection(proxy.host, proxy.port)
    try:
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        head = f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n"
        if proxy.authorization is not None:
            head += f"Proxy-Authorization: {proxy.authorization}\r\n"
        writer.write((head + "\r\n").encode())
        try:
            answer = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:  # over the reader's limit (64 KiB)
            raise OSError(f"the HTTP proxy {proxy} answered CONNECT {target} at length") from None
        except asyncio.IncompleteReadError:
            raise OSError(f"the HTTP proxy {proxy} closed the connection to {target}") from None
        status = answer.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status.split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/") or parts[1] != "200":
            raise OSError(f"the HTTP proxy {proxy} answered {status[:200]!r} to CONNECT {target}")
    except BaseException:
        writer.transport.abort()
        raise
    return reader, writer
