"""Producer settings: deadlines, retries, and the optional accumulator and spool."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sdk._validation import check_counts, check_durations
from sdk.errors import InvalidArgumentError

#: Longer than the broker's default sync-flush wait (5 s), so that a flush timeout is
#: reported by the broker rather than hidden behind a client deadline.
DEFAULT_SEND_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class AccumulatorConfig:
    """Gather concurrent sends into shared requests (opt-in).

    Messages wait per queue; one request carries the ready queues' messages (one part
    per queue). `linger=0` is natural batching: what arrives while a request is in
    flight rides the next one.

    Attributes:
        batch_max_messages: A queue's messages go once it holds this many (at most this
            many per queue in one request)...
        batch_max_bytes: ... or this many bytes of frames...
        linger: ... or its first message has waited this long (seconds).
        max_requests_in_flight: Requests of the producer in flight at once.
        buffer_max_messages: Messages accepted but not yet sent, over all queues.
        when_full: "block" waits up to `block_timeout` for room; "fail" raises
            BufferFullError at once.
        block_timeout: Longest a send waits for room when the buffer is full.
    """

    batch_max_messages: int = 500
    batch_max_bytes: int = 1024 * 1024
    linger: float = 0.005
    max_requests_in_flight: int = 2
    buffer_max_messages: int = 100_000
    when_full: Literal["block", "fail"] = "block"
    block_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_counts(self)
        check_durations(self, zero=frozenset({"linger", "block_timeout"}))
        if not 1 <= self.batch_max_messages <= 10_000:
            raise InvalidArgumentError("batch_max_messages must be within 1..10000")
        if not 1024 <= self.batch_max_bytes <= 16 * 1024 * 1024:
            raise InvalidArgumentError("batch_max_bytes must be within 1 KiB..16 MiB")
        if not 0 <= self.linger <= 10:
            raise InvalidArgumentError("linger must be within 0..10 seconds")
        if not 1 <= self.max_requests_in_flight <= 64:
            raise InvalidArgumentError("max_requests_in_flight must be within 1..64")
        if self.buffer_max_messages < self.batch_max_messages:
            raise InvalidArgumentError("buffer_max_messages must be at least batch_max_messages")
        if self.when_full not in ("block", "fail"):
            raise InvalidArgumentError("when_full must be 'block' or 'fail'")
        if self.block_timeout < 0:
            raise InvalidArgumentError("block_timeout must not be negative")


#: The producer's default accumulator: natural batching (no linger).
NATURAL_BATCHING = AccumulatorConfig(linger=0)


@dataclass(frozen=True)
class ProducerConfig:
    """Tuning of a producer; every duration is in seconds.

    Attributes:
        send_timeout: Deadline of one send attempt.
        retry_times: Extra attempts after a retriable failure (unavailable, deadline
            exceeded, busy). RocketMQ's default is 2. Invalid input is never retried.
        retry_backoff: First wait between attempts; doubles, with jitter.
        retry_backoff_max: Longest wait between attempts.
        route_refresh_interval: Routes are re-read this often, and after routing errors.
        accumulator: Gather concurrent sends into shared requests. The default,
            `AccumulatorConfig(linger=0)`, is natural batching: a send goes at once when
            nothing is in flight, and the sends that come meanwhile share the next
            request (None: every send is its own request). A producer with a
            `spool_dir` has none by default (the spool batches).
        spool_dir: Keep accepted messages in an fsync-ed file here until the broker has
            them: sends return once spooled, and survive a broker outage or a producer
            crash (None: no spool).
    """

    send_timeout: float = DEFAULT_SEND_TIMEOUT_SECONDS
    retry_times: int = 2
    retry_backoff: float = 0.05
    retry_backoff_max: float = 2.0
    route_refresh_interval: float = 30.0
    accumulator: AccumulatorConfig | None = NATURAL_BATCHING
    spool_dir: Path | None = None

    def __post_init__(self) -> None:
        check_counts(self)
        check_durations(self, zero=frozenset({"retry_backoff", "retry_backoff_max"}))
        if not (self.accumulator is None or isinstance(self.accumulator, AccumulatorConfig)):
            raise InvalidArgumentError(
                "accumulator must be an AccumulatorConfig or None, "
                f"not {type(self.accumulator).__name__}"
            )
        if not 0 <= self.retry_times <= 16:
            raise InvalidArgumentError("retry_times must be within 0..16")
        if self.retry_backoff < 0 or self.retry_backoff_max < self.retry_backoff:
            raise InvalidArgumentError("retry_backoff must be >= 0 and <= retry_backoff_max")
        if self.spool_dir is not None:
            object.__setattr__(self, "spool_dir", Path(self.spool_dir))
            check_spool_dir(self.spool_dir)
            if self.accumulator is NATURAL_BATCHING:  # the default: the spool batches
                object.__setattr__(self, "accumulator", None)


def check_spool_dir(spool_dir: Path) -> None:
    """InvalidArgumentError for a spool_dir no spool can be kept in.

    One that holds a NUL character, or names a file or device that is there already
    (the producer's start failed with an OSError).
    """
    if "\0" in str(spool_dir):
        raise InvalidArgumentError(f"ProducerConfig.spool_dir {str(spool_dir)!r} holds a NUL")
    if spool_dir.exists() and not spool_dir.is_dir():
        raise InvalidArgumentError(
            f"ProducerConfig.spool_dir {str(spool_dir)!r} must be a directory (or where one "
            "can be made), not an existing file"
        )
