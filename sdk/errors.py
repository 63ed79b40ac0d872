"""Exceptions raised by ordermq.

    OrderMQError                        root of everything ordermq raises
    ├── InvalidArgumentError (ValueError)   bad input; nothing was sent or changed
    │   ├── InvalidTopicError
    │   ├── InvalidGroupError
    │   ├── InvalidMessageError             body, properties, keys, delay
    │   ├── BatchTooLargeError
    │   ├── InvalidQueueError
    │   ├── InvalidOffsetError
    │   ├── InvalidTagExpressionError
    │   └── InvalidReceiptError             not a receipt of this broker, or replaced
    ├── ReceiptExpiredError                 the receipt's invisible time passed
    ├── TopicNotFoundError
    ├── TopicExistsError
    ├── GroupNotFoundError
    ├── MessageNotFoundError
    ├── TransactionNotFoundError            EndTransaction: not pending (unknown or ended)
    ├── ParkedKeyNotFoundError              ReleaseParkedKey: the key is not parked
    ├── WrongProducerGroupError             EndTransaction by another producer group
    ├── LockNotHeldError
    ├── StaleEpochError
    ├── CorruptRecordError
    ├── CorruptFileError                    a file kept on disk does not hold what it should
    ├── FlushFailedError                    fsync failed: the send is not acknowledged
    ├── FlushTimeoutError                   sync flush did not finish in time
    ├── NotSupportedError                   the broker does not serve this yet
    ├── ClientStateError                    used before start() or after shutdown()
    ├── BufferFullError                     the producer's send buffer is full (retriable)
    ├── TLSError                            no TLS connection: wrong CA, name, certificate
    ├── AuthenticationError                 ACL: no or unknown access key, bad signature
    ├── PermissionDeniedError               ACL: the account may not do this
    └── BrokerError                         any other refusal, with the broker's status
        ├── BrokerUnavailableError          retriable
        ├── BrokerBusyError                 retriable
        └── RequestTimeoutError             retriable

Errors that come from the broker keep its gRPC status name in `code`, its reason (the
protocol's ErrorReason) in `reason` and its words in the message. `retriable` says whether
sending the same request again may succeed.
"""

from __future__ import annotations


class OrderMQError(Exception):
    """Root of every exception ordermq raises."""

    retriable = False

    def __init__(self, message: str, *, code: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason


class InvalidArgumentError(OrderMQError, ValueError):
    """Bad input: nothing was sent or changed."""


class InvalidTopicError(InvalidArgumentError):
    """A topic name that is malformed or reserved for the broker."""


class InvalidGroupError(InvalidArgumentError):
    """A malformed producer or consumer group name."""


class InvalidMessageError(InvalidArgumentError):
    """A message that breaks a limit: empty or oversized body, properties, keys, delay."""


class BatchTooLargeError(InvalidArgumentError):
    """A batch over the per-request size limit."""


class InvalidQueueError(InvalidArgumentError):
    """A queue id outside the topic's queues."""


class InvalidOffsetError(InvalidArgumentError):
    """An offset outside the queue's [min, max]."""


class InvalidTagExpressionError(InvalidArgumentError):
    """A tag expression that is not '*' or tags joined by '||'."""


class InvalidReceiptError(InvalidArgumentError):
    """A receipt handle that does not settle its message; using it changed nothing.

    The broker did not hand it out, it is another group's, or it is no longer the message's
    current one (a change of invisible duration gave the message a new one).
    """


class ReceiptExpiredError(OrderMQError):
    """The receipt's invisible time passed before the ack or change arrived.

    The message is visible again and may be (or have been) delivered to another receive:
    processing it again must be harmless. Receive it again to settle it.
    """


class TopicNotFoundError(OrderMQError):
    """The topic does not exist (and was not created)."""


class TopicExistsError(OrderMQError):
    """The topic exists with another queue count."""


class GroupNotFoundError(OrderMQError):
    """No such consumer group."""


class GroupHasMembersError(OrderMQError):
    """A deletion refused: the group (or a group of the topic) has live members; force it."""


class SystemTopicError(InvalidTopicError):
    """The broker's own topic (retry, dead letter, rmq_sys_, TBW102): not deleted by name."""


class MessageNotFoundError(OrderMQError):
    """No message with that id or key."""


class LockNotHeldError(OrderMQError):
    """The queue's lock belongs to another client."""


class NotAMemberError(OrderMQError):
    """A lock request from a client that has not joined the consumer group (or has left it).

    The client's next heartbeat joins it again; consumers do this on their own.
    """


class StaleEpochError(OrderMQError):
    """A commit or renewal carried an older fencing epoch than the lock's."""


class TLSError(OrderMQError):
    """A connection the broker and the client could not agree on TLS for; not retried.

    The broker's certificate is not signed by the client's CA or does not carry the
    name connected to, the broker wants a client certificate and got none (or one it does
    not trust), or only one side speaks TLS. The message says which, when it can.
    """


class WrongProtocolError(OrderMQError):
    """The address answers another protocol than the client's endpoints chose; not retried.

    An ordermq gRPC client at a RocketMQ remoting port (a name server's 9876) or at a
    RocketMQ 5 gRPC port, or a `rocketmq://` client at a gRPC port. The message names
    what answers there and what to give instead.
    """


class AuthenticationError(OrderMQError):
    """The broker's ACL does not know the caller; not retried.

    No credentials where the broker wants them, an access key no account has, a
    signature made with another secret key, or a request date outside the broker's window
    (a clock off by more than it, or a replayed request). Give the client
    credentials=sdk.Credentials(access_key, secret_key) of an account in the broker's ACL
    file, and keep its clock in time.
    """


class PermissionDeniedError(OrderMQError):
    """The broker's ACL refuses this account this operation; not retried.

    The message names the access key, the topic, group or broker, and the permission
    wanted (PUB, SUB, or ADMIN for admin operations). Nothing was stored, locked or
    committed by the refused request.
    """


class CorruptRecordError(OrderMQError):
    """A stored record failed its CRC check; the broker does not serve it."""


class CorruptFileError(OrderMQError):
    """A file kept on disk does not hold what it should; nothing was loaded from it.

    A broadcasting consumer's offsets, the broker's topics or offsets. The message names
    the file and the fault.
    """


class DataFormatError(CorruptFileError):
    """A data directory is in a format this version does not read (a newer one wrote it).

    Nothing in it was read or changed; the message names the formats.
    """


class TransactionNotFoundError(OrderMQError):
    """The transaction is not pending at its broker: unknown, or ended the other way."""


class ParkedKeyNotFoundError(OrderMQError):
    """The key is not parked for the group in that queue (never, or released already)."""


class WrongProducerGroupError(OrderMQError):
    """The transaction belongs to another producer group."""


class FlushFailedError(OrderMQError):
    """The broker's fsync failed: the message is not acknowledged."""


class FlushTimeoutError(OrderMQError):
    """Sync flush did not finish in time: the message is stored, its fsync unconfirmed."""


class NotSupportedError(OrderMQError):
    """The broker does not serve this feature."""


class UnsupportedByTransportError(NotSupportedError):
    """What the client was asked cannot be done over the transport its endpoints chose.

    `transport` names it ("rocketmq://" for RocketMQ remoting); the message says what
    does work there instead.
    """

    def __init__(self, message: str, *, transport: str) -> None:
        super().__init__(f"{message} (not supported over {transport})", code="UNSUPPORTED")
        self.transport = transport


class ClientStateError(OrderMQError):
    """A client used before start() or after shutdown()."""


class BufferFullError(OrderMQError):
    """The producer's send buffer is full: the broker is slow or unreachable."""

    retriable = True


class BrokerError(OrderMQError):
    """A broker refusal with no more specific class."""


class BrokerUnavailableError(BrokerError):
    """The broker cannot be reached or refuses writes for now."""

    retriable = True


class BrokerBusyError(BrokerError):
    """The broker sheds load; try again shortly."""

    retriable = True


class RequestTimeoutError(BrokerError):
    """The call's deadline passed before the broker answered."""

    retriable = True


#: The protocol's ErrorReason names -> exception classes.
ERRORS_BY_REASON: dict[str, type[OrderMQError]] = {
    "INVALID_TOPIC": InvalidTopicError,
    "TOPIC_NOT_FOUND": TopicNotFoundError,
    "TOPIC_EXISTS": TopicExistsError,
    "INVALID_QUEUE": InvalidQueueError,
    "INVALID_GROUP": InvalidGroupError,
    "EMPTY_BODY": InvalidMessageError,
    "BODY_TOO_LARGE": InvalidMessageError,
    "PROPERTIES_TOO_LARGE": InvalidMessageError,
    "BATCH_TOO_LARGE": BatchTooLargeError,
    "MALFORMED_FRAME": InvalidMessageError,
    "INVALID_OFFSET": InvalidOffsetError,
    "INVALID_ARGUMENT": InvalidArgumentError,
    "INVALID_TAG_EXPRESSION": InvalidTagExpressionError,
    "INVALID_DELIVERY_TIME": InvalidMessageError,
    "LOCK_NOT_HELD": LockNotHeldError,
    "STALE_EPOCH": StaleEpochError,
    "FLUSH_FAILED": FlushFailedError,
    "STORE_UNAVAILABLE": BrokerUnavailableError,
    "CORRUPT_RECORD": CorruptRecordError,
    "MESSAGE_NOT_FOUND": MessageNotFoundError,
    "GROUP_NOT_FOUND": GroupNotFoundError,
    "NOT_IMPLEMENTED": NotSupportedError,
    "DISK_FULL": BrokerUnavailableError,  # retriable: sends resume once space is freed
    "CLIENT_OVER_LIMIT": BrokerBusyError,
    "TOO_MANY_OPEN_FILES": BrokerUnavailableError,  # an operator must raise the limit
    "RECEIPT_EXPIRED": ReceiptExpiredError,
    "INVALID_RECEIPT_HANDLE": InvalidReceiptError,
    "INVALID_INVISIBLE_TIME": InvalidArgumentError,
    "NOT_A_MEMBER": NotAMemberError,
    "TOO_MANY_LOCKS": BrokerBusyError,  # retriable once some are unlocked
    "TOO_MANY_TOPICS": BrokerError,  # not retriable: an operator raises the limit
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": PermissionDeniedError,
    "GROUP_HAS_MEMBERS": GroupHasMembersError,
    "SYSTEM_TOPIC": SystemTopicError,
    "TRANSACTION_NOT_FOUND": TransactionNotFoundError,
    "PARKED_KEY_NOT_FOUND": ParkedKeyNotFoundError,
    "WRONG_PRODUCER_GROUP": WrongProducerGroupError,
}

#: gRPC status names -> exception classes, for statuses that carry no reason.
ERRORS_BY_STATUS: dict[str, type[OrderMQError]] = {
    "UNAVAILABLE": BrokerUnavailableError,
    "DEADLINE_EXCEEDED": RequestTimeoutError,
    "RESOURCE_EXHAUSTED": BrokerBusyError,
    "UNIMPLEMENTED": NotSupportedError,
    "INVALID_ARGUMENT": InvalidArgumentError,
    "UNAUTHENTICATED": AuthenticationError,
    "PERMISSION_DENIED": PermissionDeniedError,
}


def error_from_status(code: str, reason: str | None, message: str) -> OrderMQError:
    """The exception for a broker answer with gRPC status `code` and `reason`."""
    cls = ERRORS_BY_REASON.get(reason or "") or ERRORS_BY_STATUS.get(code, BrokerError)
    return cls(message, code=code, reason=reason)
