"""Talking to brokers: the Transport interface the cores use, and its implementations.

`connect` is where a client's transport is chosen, from the endpoints it was given; every
public client (Producer, PushConsumer, LitePullConsumer, their sdk.aio faces, the CLI)
goes through it. Endpoints written "host:port" are ordermq brokers, over ordermq's gRPC
protocol; "rocketmq://ns1:9876;ns2:9876" is a list of RocketMQ name servers, over
RocketMQ 4.x remoting (sdk/_transport/remoting_transport.py). Any other scheme is
refused with the forms accepted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sdk._transport.grpc_transport import GrpcTransport
from sdk._transport.protocol import Transport
from sdk._validation import check_clock
from sdk.clock import Clock
from sdk.credentials import Credentials
from sdk.errors import InvalidArgumentError
from sdk.tls import TLSConfig

__all__ = ["Transport", "connect", "split_endpoints"]

#: How endpoints name RocketMQ name servers (the remoting transport).
ROCKETMQ_SCHEME = "rocketmq://"

#: What `connect` accepts, for error messages.
ACCEPTED_FORMS = (
    "'host:port' (an ordermq broker, over gRPC), several as 'host1:port1;host2:port2' "
    "or as a list of 'host:port'; or 'rocketmq://ns1:9876;ns2:9876' (RocketMQ name "
    "servers, over RocketMQ remoting)"
)

#: An endpoint: a host name or IPv4 address, or an IPv6 address in brackets, and a port.
_HOST_PORT = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})")


def _endpoint_problem(address: str) -> str | None:
    """What makes `address` no 'host:port' endpoint, or None if nothing."""
    if not address:
        return "it names no host"
    found = _HOST_PORT.fullmatch(address)
    if found is None:
        return "it is not 'host:port'"
    if not 1 <= int(found[1]) <= 65535:
        return f"its port {found[1]} is outside 1..65535"
    return None


def split_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """'h1:p1;h2:p2' (or ',') or a list -> the endpoints; InvalidArgumentError when empty."""
    if isinstance(endpoints, str):
        items: Sequence[str] = endpoints.replace(",", ";").split(";")
    elif isinstance(endpoints, Sequence) and all(isinstance(e, str) for e in endpoints):
        items = endpoints
    else:
        raise InvalidArgumentError(
            f"endpoints must be a str or a list of str, not {endpoints!r}; "
            f"accepted: {ACCEPTED_FORMS}"
        )
    out = [e.strip() for e in items if e.strip()]
    if not out:
        raise InvalidArgumentError(
            f"endpoints must name at least one broker; accepted: {ACCEPTED_FORMS}"
        )
    return out


def connect(
    endpoints: str | Sequence[str],
    tls: TLSConfig | None = None,
    credentials: Credentials | None = None,
    clock: Clock | None = None,
) -> Transport:
    """The transport for `endpoints`, over TLS with `tls`; nothing connects until its first call.

    With `credentials` every call is signed for that account of the broker's ACL
    (sdk/credentials.py), dated by `clock`; over RocketMQ remoting it is signed as RocketMQ's
    AclClientRPCHook signs it (sdk/_remoting/acl_signature.py: no date, no clock).

    "rocketmq://" before the first endpoint makes them all RocketMQ name servers (it may
    be repeated before the others). InvalidArgumentError, naming the accepted forms, for
    endpoints it cannot serve.
    """
    addresses, rocketmq = check_connection(endpoints, tls, credentials, clock)
    if rocketmq:
        # Imported only here: a client of ordermq brokers never loads RocketMQ remoting.
        from sdk._transport.remoting_transport import RemotingTransport

        return RemotingTransport(addresses, tls, credentials)
    return GrpcTransport(addresses, tls, credentials, clock)


def check_connection(
    endpoints: str | Sequence[str],
    tls: TLSConfig | None,
    credentials: Credentials | None,
    clock: Clock | None,
) -> tuple[list[str], bool]:
    """The addresses `endpoints` names, and whether they are RocketMQ name servers.

    Every argument of `connect` is checked: InvalidArgumentError, naming what is accepted,
    for what no transport could use. Clients whose transport is made later (on start)
    call it where they are made.
    """
    addresses = split_endpoints(endpoints)
    rocketmq = addresses[0].startswith(ROCKETMQ_SCHEME)
    if rocketmq:
        addresses = [a.removeprefix(ROCKETMQ_SCHEME) for a in addresses]
    for address in addresses:
        scheme, found, _rest = address.partition("://")
        if found:
            problem: str | None = (
                "only the first endpoint's scheme chooses the transport"
                if scheme + "://" == ROCKETMQ_SCHEME
                else f"unknown scheme {scheme + '://'!r}"
            )
        else:
            problem = _endpoint_problem(address)
        if problem is not None:
            raise InvalidArgumentError(
                f"endpoint {address!r}: {problem}; accepted: {ACCEPTED_FORMS}"
            )
    if tls is not None and not isinstance(tls, TLSConfig):
        raise InvalidArgumentError(f"tls must be an sdk.TLSConfig or None, not {tls!r}")
    if credentials is not None and not isinstance(credentials, Credentials):
        raise InvalidArgumentError(
            f"credentials must be an sdk.Credentials or None, not {type(credentials).__name__}"
        )
    check_clock(clock)
    return addresses, rocketmq
