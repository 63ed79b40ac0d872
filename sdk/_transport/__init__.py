"""Talking to brokers: the Transport interface the cores use, and its implementations.

`connect` is where a client's transport is chosen, from the endpoints it was given; every
public client (Producer, PushConsumer, LitePullConsumer, their sdk.aio faces, the CLI)
goes through it. Today there is one transport, ordermq's gRPC protocol, for endpoints
written as "host:port". An endpoint with a scheme ("name://...") names its transport;
no scheme is known yet, so one is refused with the forms accepted.
"""

from __future__ import annotations

from collections.abc import Sequence

from sdk._transport.grpc_transport import GrpcTransport
from sdk._transport.protocol import Transport
from sdk.errors import InvalidArgumentError

__all__ = ["Transport", "connect", "split_endpoints"]

#: What `connect` accepts, for error messages.
ACCEPTED_FORMS = (
    "'host:port' (an ordermq broker, over gRPC), several as 'host1:port1;host2:port2' "
    "or as a list of 'host:port'"
)


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


def connect(endpoints: str | Sequence[str]) -> Transport:
    """The transport for `endpoints`; nothing connects until its first call.

    InvalidArgumentError, naming the accepted forms, for endpoints it cannot serve.
    """
    addresses = split_endpoints(endpoints)
    for address in addresses:
        scheme, found, _rest = address.partition("://")
        if found:
            raise InvalidArgumentError(
                f"endpoint {address!r}: unknown scheme {scheme + '://'!r}; accepted: "
                f"{ACCEPTED_FORMS}"
            )
    return GrpcTransport(addresses)
