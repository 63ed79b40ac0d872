"""RocketMQ's remoting ACL signature (AclClientRPCHook / AclUtils / PlainAccessValidator).

The expected signatures were computed with openssl, not with the code under test: the
values of the ext fields sorted by key ("AccessKey" sorts before the lower-case keys),
then the body, signed with HMAC-SHA1 and base64-encoded.
"""

from __future__ import annotations

from sdk._remoting.acl_signature import (
    ACL_EXCEPTION,
    AclRefusal,
    acl_refusal,
    signed_fields,
    verify,
)
from sdk._remoting.codes import ResponseCode

SECRET = "12345678"

# SEND_MESSAGE_V2's header (SendMessageRequestHeaderV2's one-letter keys) with a body.
SEND_V2 = {
    "a": "please_rename_unique_group_name", "b": "TopicTest", "c": "TBW102", "d": "4",
    "e": "0", "f": "0", "g": "1700000000000", "h": "0", "i": "TAGS\x01TagA\x02",
    "j": "0", "k": "false", "m": "false",
}  # fmt: skip
SEND_BODY = b"Hello RocketMQ"
# { printf '%s' RocketMQ please_rename_unique_group_name TopicTest TBW102 4 0 0 \
#     1700000000000 0; printf 'TAGS\001TagA\002'; printf '%s' 0 false false 'Hello RocketMQ'; } \
#   | openssl dgst -sha1 -hmac 12345678 -binary | base64
SEND_V2_SIGNATURE = "Y7BBHtdTnSm/T5GWK0f3b4Xk8jw="

# PULL_MESSAGE's header, no body.
PULL = {
    "consumerGroup": "cg_orders", "topic": "TopicTest", "queueId": "0", "queueOffset": "0",
    "maxMsgNums": "32", "sysFlag": "6", "commitOffset": "0", "suspendTimeoutMillis": "20000",
    "subscription": "*", "subVersion": "0", "expressionType": "TAG",
}  # fmt: skip
# Sorted: AccessKey commitOffset consumerGroup expressionType maxMsgNums queueId queueOffset
# subVersion subscription suspendTimeoutMillis sysFlag topic:
# printf '%s' RocketMQ 0 cg_orders TAG 32 0 0 0 '*' 20000 6 TopicTest \
#   | openssl dgst -sha1 -hmac 12345678 -binary | base64
PULL_SIGNATURE = "4EjC6HCfZoDZtSbAh9MigSstl+A="


def test_send_message_v2_with_a_body() -> None:
    fields = signed_fields(SEND_V2, SEND_BODY, "RocketMQ", SECRET)
    assert fields["AccessKey"] == "RocketMQ"
    assert fields["Signature"] == SEND_V2_SIGNATURE
    assert {k: v for k, v in fields.items() if k not in ("AccessKey", "Signature")} == SEND_V2


def test_pull_message_without_a_body() -> None:
    assert signed_fields(PULL, b"", "RocketMQ", SECRET)["Signature"] == PULL_SIGNATURE


def test_a_signature_already_there_is_not_signed() -> None:
    again = signed_fields({**PULL, "Signature": "stale"}, b"", "RocketMQ", SECRET)
    assert again["Signature"] == PULL_SIGNATURE


def test_verify_accepts_the_right_secret_only() -> None:
    fields = signed_fields(SEND_V2, SEND_BODY, "RocketMQ", SECRET)
    assert verify(fields, SEND_BODY, SECRET)
    assert not verify(fields, SEND_BODY, "87654321")
    assert not verify(fields, SEND_BODY + b"!", SECRET)  # the body is signed
    assert not verify({**fields, "b": "OtherTopic"}, SEND_BODY, SECRET)
    unsigned = {k: v for k, v in fields.items() if k != "Signature"}
    assert not verify(unsigned, SEND_BODY, SECRET)


def test_unique_key_query_flag_signed_or_not() -> None:
    query = {"topic": "TopicTest", "key": "k1", "maxNum": "32", "beginTimestamp": "0",
             "endTimestamp": "1"}  # fmt: skip
    # The Java client adds the flag before signing; RocketMQ's broker signs without it.
    by_java_client = signed_fields({**query, "_UNIQUE_KEY_QUERY": "true"}, b"", "ak", SECRET)
    assert verify(by_java_client, b"", SECRET)
    by_broker_rule = {**signed_fields(query, b"", "ak", SECRET), "_UNIQUE_KEY_QUERY": "true"}
    assert verify(by_broker_rule, b"", SECRET)


def test_acl_refusals_are_told_apart() -> None:
    def kind(message: str) -> AclRefusal | None:
        return acl_refusal(ResponseCode.SYSTEM_ERROR, f"{ACL_EXCEPTION}: {message}")

    # RocketMQ 4.9's PlainPermissionManager messages.
    assert kind("No accessKey is configured") is AclRefusal.UNAUTHENTICATED
    assert kind("No acl config for rocketmq2") is AclRefusal.UNAUTHENTICATED
    assert kind("Check signature failed for accessKey=rocketmq2") is AclRefusal.UNAUTHENTICATED
    assert kind("No default permission for topic:TopicTest") is AclRefusal.PERMISSION_DENIED
    assert (
        kind("Need admin permission for request code=17, but accessKey=rocketmq2 is not")
        is AclRefusal.PERMISSION_DENIED
    )
    assert acl_refusal(ResponseCode.SYSTEM_ERROR, "disk error") is None
    assert acl_refusal(ResponseCode.NO_PERMISSION, f"{ACL_EXCEPTION}: x") is None
