"""Requests answered per RPC and status code, refusals per reason, and send durations.

Counted on the broker's event loop as requests are answered (one dictionary update per
request, not per message) and read by the metrics collector on the same loop.

A Send or Pull counts under its RPC's name whether it came as a unary call or on an
Exchange stream. The streaming RPCs (Exchange, WatchMembership) count once, when the
stream ends; a request on an Exchange stream that is neither a send nor a pull counts
as a refused Exchange request.
"""

from __future__ import annotations

from mockbroker.errors import BrokerError
from mockbroker.histogram import Histogram

OK = "OK"
CANCELLED = "CANCELLED"
UNKNOWN = "UNKNOWN"
#: The reason of a failure that was not a BrokerError (a bug): gRPC answers UNKNOWN.
UNEXPECTED = "UNEXPECTED"


class RequestStats:
    """Counters of one broker's answered requests."""

    def __init__(self) -> None:
        #: (method, status code name) -> requests answered with it, OK included.
        self.by_code: dict[tuple[str, str], int] = {}
        #: (method, status code name, reason) -> requests refused or failed.
        self.errors: dict[tuple[str, str, str], int] = {}
        #: Seconds from a send's arrival at the send handler to its answer (sends answered
        #: SEND_OK or FLUSH_DISK_TIMEOUT; refused sends are not timed).
        self.send_seconds = Histogram()

    def answered(self, method: str) -> None:
        """A request of `method` was answered OK."""
        self._count(method, OK)

    def cancelled(self, method: str) -> None:
        """A request of `method` was cancelled by its client (or its stream closed)."""
        self._count(method, CANCELLED)

    def refused(self, method: str, exc: BrokerError) -> None:
        """A request of `method` was refused with `exc`."""
        self._error(method, exc.status.name, exc.reason)

    def failed(self, method: str, code: str, reason: str) -> None:
        """A request of `method` was answered with a protocol's own error code.

        RocketMQ 5's API answers gRPC OK with the outcome inside the response: `code` is
        that outcome's name (TOPIC_NOT_FOUND, BAD_REQUEST, ...).
        """
        self._error(method, code, reason)

    def crashed(self, method: str) -> None:
        """A request of `method` failed with an unexpected exception (answered UNKNOWN)."""
        self._error(method, UNKNOWN, UNEXPECTED)

    def _count(self, method: str, code: str) -> None:
        key = (method, code)
        self.by_code[key] = self.by_code.get(key, 0) + 1

    def _error(self, method: str, code: str, reason: str) -> None:
        self._count(method, code)
        key = (method, code, reason)
        self.errors[key] = self.errors.get(key, 0) + 1
