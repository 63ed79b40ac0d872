"""Telemetry: a client's Settings in, the server's Settings out; who is connected as what.

Every RocketMQ 5 client opens a Telemetry stream to each endpoint and writes its Settings
first (client type, access point, request timeout, what it publishes or its group and
subscriptions, user agent, metrics). The server answers with the settings the client is to
use, status OK, as the Apache proxy merges them (ClientSettingsManager):

- producers: exponential send retry back-off (3 attempts, 10 ms doubling up to 1 s), the
  body size limit (4 MiB, the store's), message types checked against the route;
- consumers: `fifo` as the group's policy says, receive batch size, the long-polling
  timeout, and the redelivery back-off: the group's deliveries (17 by default) at
  RocketMQ's delay levels (1 s, 5 s, 10 s, 30 s, 1 min, ... 2 h).

A push consumer does not start without this answer within 10 s. The server also pushes
commands on the stream: a producer's transaction check-backs (service.py, as
RecoverOrphanedTransactionCommand; the producer answers with EndTransaction); no
reconnect, stack trace or message verification commands, and what clients write back to
commands is ignored.

`Sessions` remembers each client's settings while it has a Telemetry stream open, so that
its heartbeats register it with its subscriptions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker.fronts.v2.fields import duration_of, group_name, topic_name
from mockbroker.fronts.v2.pop import GroupPolicy
from mockbroker.fronts.v2.receiving import MAX_LONG_POLLING_SECONDS, MAX_RECEIVE_BATCH
from mockbroker.fronts.v2.status import V2Error
from sdk._remoting.command import RemotingError
from sdk._remoting.subscription import parse_subscription
from sdk._wire import DELAY_LEVEL_SECONDS, MAX_BODY_BYTES

#: The consumer types this broker serves (both pop: receive, ack, invisible time).
CONSUMER_TYPES = frozenset({v2.PUSH_CONSUMER, v2.SIMPLE_CONSUMER})
PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_SECONDS = 0.01
PRODUCER_BACKOFF_MAX_SECONDS = 1.0
PRODUCER_BACKOFF_MULTIPLIER = 2.0


@dataclass(frozen=True, slots=True)
class Session:
    """What a client said it is in its settings."""

    client_type: v2.ClientType.ValueType
    #: Its consumer group ("" for a producer).
    group: str
    #: (topic, tag expression) of a consumer's subscriptions.
    subscriptions: tuple[tuple[str, str], ...]


def check_client_type(client_type: v2.ClientType.ValueType) -> None:
    """UNSUPPORTED for the client types this broker does not serve; unknown ones refused."""
    if client_type == v2.PRODUCER or client_type in CONSUMER_TYPES:
        return
    if client_type in (v2.PULL_CONSUMER, v2.LITE_PUSH_CONSUMER, v2.LITE_SIMPLE_CONSUMER):
        raise V2Error(
            v2.UNSUPPORTED,
            f"{v2.ClientType.Name(client_type)} clients are not supported by this broker; "
            "use a Producer, PushConsumer or SimpleConsumer",
        )
    raise V2Error(
        v2.UNRECOGNIZED_CLIENT_TYPE, f"client type {client_type} is not one RocketMQ 5 defines"
    )


def session_of(settings: v2.Settings) -> Session:
    """The session a client's settings describe; V2Error naming what is wrong with them."""
    if not settings.HasField("client_type"):
        raise V2Error(v2.UNRECOGNIZED_CLIENT_TYPE, "the settings name no client_type")
    check_client_type(settings.client_type)
    if settings.client_type == v2.PRODUCER:
        for resource in settings.publishing.topics:
            topic_name(resource)
        return Session(settings.client_type, "", ())
    sub = settings.subscription
    if not sub.HasField("group"):
        raise V2Error(v2.ILLEGAL_CONSUMER_GROUP, "a consumer's settings name no group")
    group = group_name(sub.group)
    subscriptions = []
    for entry in sub.subscriptions:
        topic = topic_name(entry.topic)
        if entry.expression.type == v2.SQL:
            raise V2Error(
                v2.ILLEGAL_FILTER_EXPRESSION,
                f"topic {topic!r}: SQL92 filter expressions are not supported; filter by tag",
            )
        try:
            parse_subscription(entry.expression.expression)
        except RemotingError as exc:
            raise V2Error(v2.ILLEGAL_FILTER_EXPRESSION, f"topic {topic!r}: {exc.remark}") from None
        subscriptions.append((topic, entry.expression.expression or "*"))
    return Session(settings.client_type, group, tuple(subscriptions))


def server_settings(settings: v2.Settings, session: Session, policy: GroupPolicy) -> v2.Settings:
    """The client's settings, merged with what this server imposes."""
    out = v2.Settings()
    out.CopyFrom(settings)
    backoff = out.backoff_policy
    if session.client_type == v2.PRODUCER:
        backoff.max_attempts = PRODUCER_MAX_ATTEMPTS
        backoff.exponential_backoff.initial.CopyFrom(duration_of(PRODUCER_BACKOFF_INITIAL_SECONDS))
        backoff.exponential_backoff.max.CopyFrom(duration_of(PRODUCER_BACKOFF_MAX_SECONDS))
        backoff.exponential_backoff.multiplier = PRODUCER_BACKOFF_MULTIPLIER
        out.publishing.max_body_size = MAX_BODY_BYTES
        out.publishing.validate_message_type = True
        return out
    backoff.max_attempts = policy.max_delivery_attempts
    backoff.customized_backoff.next.extend(duration_of(s) for s in DELAY_LEVEL_SECONDS)
    sub = out.subscription
    sub.fifo = policy.fifo
    sub.receive_batch_size = MAX_RECEIVE_BATCH
    sub.long_polling_timeout.CopyFrom(duration_of(MAX_LONG_POLLING_SECONDS))
    return out


class Sessions:
    """Each client's session while it has a Telemetry stream open."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._streams: dict[str, int] = {}

    def opened(self, client_id: str) -> None:
        """A Telemetry stream of the client began."""
        self._streams[client_id] = self._streams.get(client_id, 0) + 1

    def closed(self, client_id: str) -> None:
        """One ended; with its last one, the client's session is forgotten."""
        left = self._streams.get(client_id, 0) - 1
        if left > 0:
            self._streams[client_id] = left
            return
        self._streams.pop(client_id, None)
        self._sessions.pop(client_id, None)

    def settle(
        self,
        client_id: str,
        settings: v2.Settings,
        policy_of: Callable[[str], GroupPolicy],
    ) -> svc.TelemetryCommand:
        """Record the client's settings; the answer: the server's settings, or why not."""
        try:
            session = session_of(settings)
        except V2Error as exc:
            return command(exc.status())
        if client_id in self._streams:  # not after its last stream ended (a late write)
            self._sessions[client_id] = session
        policy = policy_of(session.group) if session.group else GroupPolicy()
        answer = command(v2.Status(code=v2.OK, message="OK"))
        answer.settings.CopyFrom(server_settings(settings, session, policy))
        return answer

    def get(self, client_id: str) -> Session | None:
        """The client's session, if it has one."""
        return self._sessions.get(client_id)

    def drop(self, client_id: str) -> None:
        """Forget the client's session (it terminated)."""
        self._sessions.pop(client_id, None)

    @property
    def count(self) -> int:
        """How many clients have a session."""
        return len(self._sessions)


def command(status: v2.Status) -> svc.TelemetryCommand:
    """A TelemetryCommand carrying `status`."""
    return svc.TelemetryCommand(status=status)


__all__ = [
    "CONSUMER_TYPES",
    "Session",
    "Sessions",
    "check_client_type",
    "command",
    "server_settings",
    "session_of",
]
