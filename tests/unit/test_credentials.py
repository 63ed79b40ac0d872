"""The signature of ordermq's gRPC calls: fixed inputs give a fixed signature.

The expected values were computed with openssl, independently of the code:
    printf '/ordermq.v1.MessagingService/Send\\n1700000000000\\n<sha256 of "hello">' |
    openssl dgst -sha256 -hmac secret-key -binary | base64
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from mockbroker.acl import Acl, parse_acl_text
from mockbroker.errors import BrokerError
from mockbroker.fronts.grpc.auth import GrpcAuth, client_host
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk.credentials import Credentials, request_digest, sign, signed_metadata, string_to_sign
from sdk.testing import FakeClock

SEND = "/ordermq.v1.MessagingService/Send"
DATE = 1_700_000_000_000
HELLO_SHA256 = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


def test_the_string_to_sign_is_method_date_and_digest() -> None:
    assert request_digest(b"hello") == HELLO_SHA256
    assert string_to_sign(SEND, DATE, b"hello") == f"{SEND}\n{DATE}\n{HELLO_SHA256}".encode()


def test_fixed_inputs_give_a_fixed_signature() -> None:
    assert (
        sign("secret-key", SEND, DATE, b"hello") == "LMCNKOQV6aiUY5lvjUYHcdwZ7qM6/C/Nhfhrkqh+A68="
    )
    exchange = "/ordermq.v1.MessagingService/Exchange"
    assert sign("secret-key", exchange, DATE, b"") == "iNgm5Qoi50pLOZXaaHiqOHvW16ExaYf2HZL39Fmxz5Y="


@pytest.mark.parametrize(
    "changed",
    [
        ("secret-kez", SEND, DATE, b"hello"),
        ("secret-key", "/ordermq.v1.MessagingService/Pull", DATE, b"hello"),
        ("secret-key", SEND, DATE + 1, b"hello"),
        ("secret-key", SEND, DATE, b"hellp"),
    ],
    ids=["secret", "method", "date", "request"],
)
def test_each_input_changes_the_signature(changed: tuple[str, str, int, bytes]) -> None:
    assert sign(*changed) != sign("secret-key", SEND, DATE, b"hello")


def test_signed_metadata_carries_key_date_and_signature_never_the_secret() -> None:
    metadata = dict(signed_metadata(Credentials("access-key", "secret-key"), SEND, DATE, b"hello"))
    assert metadata == {
        "ordermq-access-key": "access-key",
        "ordermq-date": str(DATE),
        "ordermq-signature": "LMCNKOQV6aiUY5lvjUYHcdwZ7qM6/C/Nhfhrkqh+A68=",
    }
    assert "secret-key" not in repr(metadata)


@pytest.mark.parametrize(
    ("peer", "host"),
    [
        ("ipv4:127.0.0.1:50321", "127.0.0.1"),
        ("ipv6:[::1]:50321", "::1"),
        ("ipv6:[2001:db8::7]:1", "2001:db8::7"),
        ("unix:/tmp/sock", "unix:/tmp/sock"),
    ],
)
def test_the_client_host_of_a_grpc_peer(peer: str, host: str) -> None:
    assert client_host(peer) == host


ACL = """\
accounts:
  - accessKey: access-key
    secretKey: secret-key
    defaultTopicPerm: PUB
"""


def context(metadata: tuple[tuple[str, str], ...]) -> object:
    return SimpleNamespace(invocation_metadata=lambda: metadata, peer=lambda: "ipv4:10.1.1.1:5")


def test_the_broker_accepts_its_own_scheme_within_the_window_only() -> None:
    clock = FakeClock(start=DATE / 1000)
    auth = GrpcAuth(Acl(parse_acl_text(ACL, "acl.yml")), clock)
    request = pb.SendRequest(topic="orders", queue_id=1, frames=b"x")
    body = request.SerializeToString(deterministic=True)
    good = signed_metadata(Credentials("access-key", "secret-key"), SEND, DATE, body)
    assert auth.caller(SEND, context(good), request).access_key == "access-key"
    clock.advance(300)
    assert auth.caller(SEND, context(good), request).host == "10.1.1.1"  # the edge: still in
    clock.advance(1)
    with pytest.raises(BrokerError) as e:
        auth.caller(SEND, context(good), request)
    assert e.value.status == grpc.StatusCode.UNAUTHENTICATED and "window" in e.value.message
    missing = good[:2]
    with pytest.raises(BrokerError, match="carries no ordermq-signature"):
        auth.caller(SEND, context(missing), request)
