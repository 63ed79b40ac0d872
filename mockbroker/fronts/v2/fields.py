"""Checks of the fields v2 requests share: resources, durations, the client id header."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from google.protobuf.duration_pb2 import Duration

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker.errors import BrokerError
from mockbroker.fronts.v2.status import Code, V2Error, code_of
from mockbroker.state import check_client_id
from mockbroker.topics import check_any_topic, check_group

#: The header every RocketMQ 5 client sends with its client id.
CLIENT_ID_HEADER = "x-mq-client-id"
_MAX_DURATION_SECONDS = 315_576_000_000  # protobuf's limit (10 000 years)


def _name(resource: v2.Resource, what: str, check: Callable[[str], None]) -> str:
    if resource.resource_namespace:
        raise V2Error(
            v2.BAD_REQUEST,
            f"{what} {resource.name!r} is in namespace {resource.resource_namespace!r}: "
            "this broker has no namespaces (configure the client without one)",
        )
    try:
        check(resource.name)
    except BrokerError as exc:
        raise V2Error(code_of(exc), exc.message) from None
    return resource.name


def topic_name(resource: v2.Resource) -> str:
    """The topic a resource names: a user topic or a group's retry or dead-letter topic."""
    return _name(resource, "topic", check_any_topic)


def group_name(resource: v2.Resource) -> str:
    """The consumer group a resource names (ILLEGAL_CONSUMER_GROUP when malformed)."""
    return _name(resource, "consumer group", check_group)


def seconds(duration: Duration, what: str, code: Code) -> float:
    """A Duration as float seconds; `code` when it is negative or malformed."""
    if not (0 <= duration.seconds <= _MAX_DURATION_SECONDS and 0 <= duration.nanos < 10**9):
        raise V2Error(
            code,
            f"{what} of {duration.seconds} s and {duration.nanos} ns is not a valid "
            "non-negative duration",
        )
    return duration.seconds + duration.nanos / 1e9


def duration_of(value: float) -> Duration:
    """A Duration of `value` seconds (non-negative)."""
    out = Duration()
    out.FromNanoseconds(round(value * 1e9))
    return out


def client_id(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    """The client id in a call's headers; CLIENT_ID_REQUIRED without one."""
    found = next((v for k, v in metadata or () if k == CLIENT_ID_HEADER), None)
    if not found:
        raise V2Error(
            v2.CLIENT_ID_REQUIRED, f"the request has no {CLIENT_ID_HEADER} header naming the client"
        )
    value = found if isinstance(found, str) else found.decode("utf-8", "replace")
    try:
        check_client_id(value)
    except BrokerError as exc:
        raise V2Error(v2.BAD_REQUEST, f"{CLIENT_ID_HEADER}: {exc.message}") from None
    return value


__all__ = ["CLIENT_ID_HEADER", "client_id", "duration_of", "group_name", "seconds", "topic_name"]
