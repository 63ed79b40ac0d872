"""RocketMQ 5's call signature (MQv2-HMAC-SHA1) and the v2 front's checks, without a server.

The goldens were computed with openssl, not with the code under test:
    printf '%s' 20260315T081530Z | openssl dgst -sha1 -hmac consumer-secret
and the epoch of the date with `date -u -d 2026-03-15T08:15:30Z +%s`.
"""

from __future__ import annotations

from typing import Any

import pytest

from mockbroker._pb_v2.apache.rocketmq.v2 import definition_pb2 as v2
from mockbroker._pb_v2.apache.rocketmq.v2 import service_pb2 as svc
from mockbroker.acl import Acl, parse_acl_text
from mockbroker.fronts.v2.auth import V2Auth, parse_authorization, sign
from mockbroker.fronts.v2.status import V2Error
from sdk.testing import FakeClock

DATE = "20260315T081530Z"
DATE_EPOCH = 1773562530.0
GOLDEN = "883e7742847d917d0dd7150c34deb78f4c7b7ef4"  # HMAC-SHA1(consumer-secret, DATE)

RULES = """\
accounts:
  - accessKey: consumer-key
    secretKey: consumer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - orders=SUB
    groupPerms:
      - billing=SUB
"""


class Context:
    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:10.1.2.3:40000"


def signed(secret_signature: str = GOLDEN, date: str = DATE, key: str = "consumer-key") -> Context:
    authorization = (
        f"MQv2-HMAC-SHA1 Credential={key}, SignedHeaders=x-mq-date-time, "
        f"Signature={secret_signature}"
    )
    return Context([("x-mq-date-time", date), ("authorization", authorization)])


def auth(now: float = DATE_EPOCH) -> V2Auth:
    return V2Auth(Acl(parse_acl_text(RULES)), FakeClock(now))


def receive(topic: str = "orders", group: str = "billing") -> Any:
    queue = v2.MessageQueue(topic=v2.Resource(name=topic))
    return svc.ReceiveMessageRequest(group=v2.Resource(name=group), message_queue=queue)


def refusal(auth: V2Auth, method: str, context: Context, request: Any) -> str:
    with pytest.raises(V2Error) as caught:
        auth.check(method, context, request)
    assert caught.value.code == v2.UNAUTHORIZED  # 40100, for both kinds of refusal
    return caught.value.message


def test_the_signature_is_the_hex_hmac_sha1_of_the_date() -> None:
    assert sign("consumer-secret", DATE) == GOLDEN


def test_the_header_gives_the_key_before_any_slash_and_the_signature() -> None:
    header = (
        f"MQv2-HMAC-SHA1 Credential=ak/2026/x, SignedHeaders=x-mq-date-time, Signature={GOLDEN}"
    )
    assert parse_authorization(header) == ("ak", GOLDEN)
    with pytest.raises(V2Error):
        parse_authorization(f"AWS4-HMAC-SHA256 Credential=ak, Signature={GOLDEN}")
    with pytest.raises(V2Error):
        parse_authorization("MQv2-HMAC-SHA1 Credential")


def test_a_signed_call_within_the_window_passes() -> None:
    auth(DATE_EPOCH + 299).check("ReceiveMessage", signed(), receive())
    auth(DATE_EPOCH - 299).check("ReceiveMessage", signed(GOLDEN.upper()), receive())


def test_refusals_name_what_was_wrong() -> None:
    a = auth()
    assert "no accessKey" in refusal(a, "ReceiveMessage", Context([]), receive())
    assert "no account" in refusal(a, "ReceiveMessage", signed(key="nobody"), receive())
    wrong = "2e177eff565de0b0f7c1ad0de714387b712c7d6e"  # HMAC-SHA1(wrong-secret, DATE)
    assert "does not match" in refusal(a, "ReceiveMessage", signed(wrong), receive())
    assert "window" in refusal(auth(DATE_EPOCH + 301), "ReceiveMessage", signed(), receive())
    assert "not a date" in refusal(a, "ReceiveMessage", signed(date="yesterday"), receive())
    assert "may not" in refusal(a, "ReceiveMessage", signed(), receive(group="audit"))
    send = svc.SendMessageRequest(messages=[v2.Message(topic=v2.Resource(name="orders"))])
    assert "may not PUB" in refusal(a, "SendMessage", signed(), send)


def test_telemetry_is_checked_on_its_settings() -> None:
    a = auth()
    sub = v2.Subscription(
        group=v2.Resource(name="billing"),
        subscriptions=[v2.SubscriptionEntry(topic=v2.Resource(name="orders"))],
    )
    a.check("Telemetry", signed(), svc.TelemetryCommand(settings=v2.Settings(subscription=sub)))
    publishing = v2.Settings(publishing=v2.Publishing(topics=[v2.Resource(name="orders")]))
    refusal(a, "Telemetry", signed(), svc.TelemetryCommand(settings=publishing))
