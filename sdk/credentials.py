r"""Credentials for a broker with an ACL: `Credentials`, given to any client as `credentials=`.

Over ordermq's gRPC every call carries three metadata entries (docs/security.md,
"Accounts and permissions"):

    ordermq-access-key   the account's access key
    ordermq-date         when the call was signed, UTC milliseconds since the epoch
    ordermq-signature    base64(HMAC-SHA256(secret_key, string_to_sign))

    string_to_sign = method + "\\n" + date + "\\n" + hex(SHA-256(request))

`method` is the call's full gRPC path ("/ordermq.v1.MessagingService/Send"), `request`
the request message's deterministic serialization (empty for the Exchange stream, whose
opening is signed, not its frames). The secret key never travels: the broker, which has
it from its ACL file, computes the same signature and compares. A date further than the
broker's window (five minutes) from the broker's clock is refused, so a captured request
cannot be replayed later; TLS keeps it from being captured at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass, field

from sdk.errors import InvalidArgumentError

__all__ = [
    "ACCESS_KEY_HEADER",
    "DATE_HEADER",
    "SIGNATURE_HEADER",
    "Credentials",
    "request_digest",
    "sign",
    "signed_metadata",
    "string_to_sign",
]

ACCESS_KEY_HEADER = "ordermq-access-key"
DATE_HEADER = "ordermq-date"
SIGNATURE_HEADER = "ordermq-signature"


@dataclass(frozen=True)
class Credentials:
    """An account of the broker's ACL file: its access key and secret key.

    The secret key is left out of repr and str, so that logs never show it, and it is
    never sent: calls carry a signature made with it. Example::

        Producer("broker:8081", credentials=Credentials("orders-app", "s3cret-key"))

    Over rocketmq:// endpoints (RocketMQ remoting) requests are signed as RocketMQ's
    AclClientRPCHook signs them (HMAC-SHA1 over the request's fields and body), for an
    ordermq broker with an ACL file or Apache RocketMQ with plain ACL.
    """

    access_key: str
    secret_key: str = field(repr=False)

    def __post_init__(self) -> None:
        for name in ("access_key", "secret_key"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise InvalidArgumentError(f"Credentials.{name} must be a str, not {type(value)}")
            if not value or value != value.strip():
                raise InvalidArgumentError(
                    f"Credentials.{name} must be non-empty, without leading or trailing spaces"
                )
            if not value.isascii() or not value.isprintable():
                raise InvalidArgumentError(
                    f"Credentials.{name} must be printable ASCII (it travels as gRPC metadata)"
                    if name == "access_key"
                    else f"Credentials.{name} must be printable ASCII, as in the ACL file"
                )


def request_digest(body: bytes) -> str:
    """The hex SHA-256 of a serialized request, as signed."""
    return hashlib.sha256(body).hexdigest()


def string_to_sign(method: str, date_ms: int, body: bytes) -> bytes:
    """What is signed: the method's full path, the date and the request's digest."""
    return f"{method}\n{date_ms}\n{request_digest(body)}".encode()


def sign(secret_key: str, method: str, date_ms: int, body: bytes) -> str:
    """base64(HMAC-SHA256(secret_key, string_to_sign(method, date_ms, body)))."""
    mac = hmac.new(secret_key.encode(), string_to_sign(method, date_ms, body), hashlib.sha256)
    return base64.b64encode(mac.digest()).decode("ascii")


def signed_metadata(
    credentials: Credentials, method: str, date_ms: int, body: bytes
) -> tuple[tuple[str, str], ...]:
    """The three metadata entries of one signed call."""
    return (
        (ACCESS_KEY_HEADER, credentials.access_key),
        (DATE_HEADER, str(date_ms)),
        (SIGNATURE_HEADER, sign(credentials.secret_key, method, date_ms, body)),
    )
