"""Telemetry: the server's Settings answer to each client type, and refused settings."""

from __future__ import annotations

import pytest
from google.protobuf.duration_pb2 import Duration
from grpc import StatusCode

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker.errors import BrokerError
from mockbroker.fronts.v2.pop import GroupPolicy
from mockbroker.fronts.v2.status import code_of
from mockbroker.fronts.v2.telemetry import Sessions
from sdk._wire import DELAY_LEVEL_SECONDS, MAX_BODY_BYTES


def producer_settings() -> v2.Settings:
    """What rocketmq-python-client 5.1.2's producer writes first."""
    return v2.Settings(
        client_type=v2.PRODUCER,
        access_point=v2.Endpoints(scheme=v2.IPv4, addresses=[v2.Address(host="127.0.0.1", port=9)]),
        request_timeout=Duration(seconds=3),
        publishing=v2.Publishing(
            topics=[v2.Resource(name="orders")], max_body_size=128 * 1024 * 1024,
            validate_message_type=True,
        ),
        user_agent=v2.UA(language=v2.PYTHON, version="5.1.2"),
        metric=v2.Metric(on=False),
    )  # fmt: skip


def consumer_settings(group: str = "workers", kind: int = v2.PUSH_CONSUMER) -> v2.Settings:
    return v2.Settings(
        client_type=kind,
        request_timeout=Duration(seconds=3),
        subscription=v2.Subscription(
            group=v2.Resource(name=group),
            subscriptions=[
                v2.SubscriptionEntry(
                    topic=v2.Resource(name="orders"),
                    expression=v2.FilterExpression(type=v2.TAG, expression="A||B"),
                )
            ],
        ),
        user_agent=v2.UA(language=v2.PYTHON, version="5.1.2"),
    )


def policy_of(group: str) -> GroupPolicy:
    return GroupPolicy(fifo=group.startswith("fifo"), max_delivery_attempts=5)


def settle(settings: v2.Settings, sessions: Sessions | None = None, client: str = "c1") -> object:
    sessions = Sessions() if sessions is None else sessions
    sessions.opened(client)
    return sessions.settle(client, settings, policy_of)


def test_a_producer_gets_the_send_backoff_and_the_body_limit() -> None:
    answer = settle(producer_settings())
    assert answer.status.code == v2.OK
    s = answer.settings
    assert s.client_type == v2.PRODUCER and s.user_agent.version == "5.1.2"  # echoed
    assert s.backoff_policy.max_attempts == 3
    backoff = s.backoff_policy.exponential_backoff
    assert (backoff.initial, backoff.max, backoff.multiplier) == (
        Duration(nanos=10_000_000), Duration(seconds=1), 2.0,
    )  # fmt: skip
    assert s.publishing.max_body_size == MAX_BODY_BYTES
    assert s.publishing.validate_message_type
    assert not s.metric.on


@pytest.mark.parametrize(("group", "fifo"), [("workers", False), ("fifo-workers", True)])
def test_a_consumer_gets_its_groups_policy_and_the_redelivery_backoff(
    group: str, fifo: bool
) -> None:
    s = settle(consumer_settings(group)).settings
    assert s.subscription.fifo is fifo
    assert s.subscription.receive_batch_size == 32
    assert s.subscription.long_polling_timeout == Duration(seconds=30)
    assert s.backoff_policy.max_attempts == 5
    assert [d.seconds for d in s.backoff_policy.customized_backoff.next] == list(
        DELAY_LEVEL_SECONDS
    )
    assert s.subscription.subscriptions[0].expression.expression == "A||B"  # echoed


def test_a_session_keeps_a_consumers_group_and_subscriptions_while_a_stream_is_open() -> None:
    sessions = Sessions()
    settle(consumer_settings(kind=v2.SIMPLE_CONSUMER), sessions, "c1")
    session = sessions.get("c1")
    assert session is not None
    assert (session.client_type, session.group, session.subscriptions) == (
        v2.SIMPLE_CONSUMER, "workers", (("orders", "A||B"),),
    )  # fmt: skip
    sessions.opened("c1")  # a second stream (the client rebuilt it)
    sessions.closed("c1")
    assert sessions.get("c1") is not None
    sessions.closed("c1")
    assert sessions.get("c1") is None and sessions.count == 0


def test_settings_written_after_the_last_stream_closed_are_not_kept() -> None:
    sessions = Sessions()
    answer = sessions.settle("late", consumer_settings(), policy_of)
    assert answer.status.code == v2.OK
    assert sessions.get("late") is None


@pytest.mark.parametrize(
    ("settings", "code", "words"),
    [
        (v2.Settings(), v2.UNRECOGNIZED_CLIENT_TYPE, "no client_type"),
        (v2.Settings(client_type=99), v2.UNRECOGNIZED_CLIENT_TYPE, "99"),
        (v2.Settings(client_type=v2.PULL_CONSUMER), v2.UNSUPPORTED, "PULL_CONSUMER"),
        (v2.Settings(client_type=v2.LITE_PUSH_CONSUMER), v2.UNSUPPORTED, "LITE_PUSH_CONSUMER"),
        (v2.Settings(client_type=v2.PUSH_CONSUMER), v2.ILLEGAL_CONSUMER_GROUP, "no group"),
        (consumer_settings("no spaces please"), v2.ILLEGAL_CONSUMER_GROUP, "no spaces please"),
    ],
)
def test_settings_that_cannot_be_served_are_answered_with_why(
    settings: v2.Settings, code: int, words: str
) -> None:
    sessions = Sessions()
    answer = settle(settings, sessions)
    assert answer.status.code == code and words in answer.status.message
    assert not answer.HasField("settings")
    assert sessions.get("c1") is None


def test_a_sql_subscription_is_refused() -> None:
    settings = consumer_settings()
    settings.subscription.subscriptions[0].expression.type = v2.SQL
    answer = settle(settings)
    assert answer.status.code == v2.ILLEGAL_FILTER_EXPRESSION


@pytest.mark.parametrize(
    ("reason", "status", "code"),
    [
        ("INVALID_TOPIC", StatusCode.INVALID_ARGUMENT, v2.ILLEGAL_TOPIC),
        ("TOPIC_NOT_FOUND", StatusCode.NOT_FOUND, v2.TOPIC_NOT_FOUND),
        ("BODY_TOO_LARGE", StatusCode.INVALID_ARGUMENT, v2.MESSAGE_BODY_TOO_LARGE),
        ("EMPTY_BODY", StatusCode.INVALID_ARGUMENT, v2.MESSAGE_BODY_EMPTY),
        ("PROPERTIES_TOO_LARGE", StatusCode.INVALID_ARGUMENT, v2.MESSAGE_PROPERTIES_TOO_LARGE),
        ("INVALID_DELIVERY_TIME", StatusCode.INVALID_ARGUMENT, v2.ILLEGAL_DELIVERY_TIME),
        ("MESSAGE_NOT_FOUND", StatusCode.NOT_FOUND, v2.NOT_FOUND),
        ("DISK_FULL", StatusCode.UNAVAILABLE, v2.INTERNAL_SERVER_ERROR),
        ("CLIENT_OVER_LIMIT", StatusCode.RESOURCE_EXHAUSTED, v2.TOO_MANY_REQUESTS),
        ("INVALID_QUEUE", StatusCode.OUT_OF_RANGE, v2.BAD_REQUEST),
        ("SOMETHING_NEW", StatusCode.INVALID_ARGUMENT, v2.BAD_REQUEST),
    ],
)
def test_core_refusals_become_the_codes_a_java_proxy_gives(
    reason: str, status: StatusCode, code: int
) -> None:
    assert code_of(BrokerError(status, reason, "why")) == code
