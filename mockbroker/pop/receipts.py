"""Receipt handles: what a receive hands out with each message, and an ack gives back.

A handle is opaque to clients (URL-safe base64 without padding) and names the delivery
completely: group, topic, queue, offset, the lease's random 64-bit nonce and its
invisible-until time (milliseconds on the broker's clock). Every delivery and every
change of invisible duration draws a new nonce, so an older handle of the same message
no longer matches (it is stale), and a handle cannot be guessed for a message one did
not receive. The time lets the broker say why a handle no longer works: its lease ran
out (RECEIPT_EXPIRED) or it was replaced (INVALID_RECEIPT_HANDLE).
"""

from __future__ import annotations

import base64
import binascii
import secrets
import struct
from dataclasses import dataclass

from grpc import StatusCode

from mockbroker.errors import BrokerError, invalid
from mockbroker.topics import check_any_topic, check_group

_VERSION = 1
# version, queue offset, queue id, invisible-until ms, nonce, group length; then the group
# and the topic (ASCII, as names are).
_HEAD = struct.Struct("<BqiqQB")
#: Longest handle text: the head and two names of at most 127 characters, in base64.
MAX_RECEIPT_LENGTH = (_HEAD.size + 2 * 127 + 2) // 3 * 4


@dataclass(frozen=True, slots=True)
class Receipt:
    """One delivery of one message to one group."""

    group: str
    topic: str
    queue_id: int
    offset: int
    nonce: int
    deadline_ms: int

    def encode(self) -> str:
        """The handle text."""
        group = self.group.encode()
        raw = _HEAD.pack(
            _VERSION, self.offset, self.queue_id, self.deadline_ms, self.nonce, len(group)
        )
        return base64.urlsafe_b64encode(raw + group + self.topic.encode()).rstrip(b"=").decode()


def new_nonce() -> int:
    """A random lease nonce; never 0 (0 marks a message settled without a receipt)."""
    return secrets.randbits(64) or 1


def parse_receipt(text: str) -> Receipt:
    """The receipt a handle names; INVALID_RECEIPT_HANDLE when it is not one this broker makes."""
    if not text or len(text) > MAX_RECEIPT_LENGTH:
        raise invalid_receipt(f"receipt handle of {len(text)} characters is not one of ours")
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        version, offset, queue_id, deadline_ms, nonce, group_len = _HEAD.unpack_from(raw)
        group = raw[_HEAD.size : _HEAD.size + group_len].decode("ascii")
        topic = raw[_HEAD.size + group_len :].decode("ascii")
        if version != _VERSION or len(group) != group_len or offset < 0 or queue_id < 0:
            raise ValueError("fields out of range")
        if nonce == 0 or deadline_ms <= 0:
            raise ValueError("no lease")
        check_group(group)
        check_any_topic(topic)
    except (binascii.Error, struct.error, ValueError, BrokerError):
        raise invalid_receipt(f"receipt handle {text[:40]!r} is not one of ours") from None
    return Receipt(group, topic, queue_id, offset, nonce, deadline_ms)


def invalid_receipt(message: str) -> BrokerError:
    """INVALID_ARGUMENT / INVALID_RECEIPT_HANDLE: a handle that is not one this broker makes."""
    return invalid("INVALID_RECEIPT_HANDLE", message)


def stale_receipt(message: str) -> BrokerError:
    """FAILED_PRECONDITION / INVALID_RECEIPT_HANDLE: no longer the message's current handle."""
    return BrokerError(StatusCode.FAILED_PRECONDITION, "INVALID_RECEIPT_HANDLE", message)


def receipt_expired(receipt: Receipt) -> BrokerError:
    """FAILED_PRECONDITION / RECEIPT_EXPIRED: the receipt's invisible time has passed."""
    return BrokerError(
        StatusCode.FAILED_PRECONDITION,
        "RECEIPT_EXPIRED",
        f"the receipt for {receipt.topic} queue {receipt.queue_id} offset {receipt.offset} "
        f"expired at {receipt.deadline_ms} ms: the message became visible again and may be "
        "delivered to another receive; receive it again to settle it",
    )
