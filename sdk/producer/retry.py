"""The send retry policy: which failures are retried, how long to wait, where to go.

Only failures that say so (`OrderMQError.retriable`: unavailable, deadline exceeded, busy)
are retried; bad input, flush failures and flush timeouts never are. Keyed (ordered)
sends always retry the same queue; keyless ones may move to another.

A failed request holds back the later messages of its queue: they are not sent after it
(the spool keeps them until it succeeds; the accumulator and send_batch fail them with
EarlierSendFailedError), so the broker never stores a later message of a queue while an
earlier one is missing. A flush timeout holds nothing back: those messages are stored.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from sdk.errors import FlushTimeoutError, OrderMQError
from sdk.message import MessageQueue

T = TypeVar("T")
_sleep = asyncio.sleep  # a module attribute, so that tests can record the waits


class EarlierSendFailedError(OrderMQError):
    """Not sent: an earlier message of the same queue failed, and this one would overtake it.

    `cause` is the earlier failure. To keep the queue's order, send the earlier messages
    again first, then these.
    """

    def __init__(self, where: str, cause: BaseException) -> None:
        super().__init__(
            f"not sent, to keep the order of {where}: an earlier message for it failed: {cause}"
        )
        self.cause = cause
        self.__cause__ = cause


def describe(queue: MessageQueue) -> str:
    """'orders queue 3 on broker-a', for messages about a queue."""
    return f"{queue.topic} queue {queue.queue_id} on {queue.broker_name}"


def is_retriable(exc: BaseException) -> bool:
    """True for failures a second attempt may fix."""
    return isinstance(exc, OrderMQError) and exc.retriable


def holds_back(exc: BaseException) -> bool:
    """True when a failed request must keep the later messages of its queue from going out.

    A flush timeout does not: the broker stored the messages (their fsync is unconfirmed).
    """
    return not isinstance(exc, FlushTimeoutError)


def backoff_delay(failed_attempts: int, backoff: float, backoff_max: float) -> float:
    """The wait after failed attempt `failed_attempts` (1-based): see `with_retries`."""
    return min(backoff * 2.0 ** (failed_attempts - 1), backoff_max) + random.uniform(0, backoff)


async def with_retries(
    attempt: Callable[[int], Awaitable[T]],
    *,
    retry_times: int,
    backoff: float,
    backoff_max: float,
    before_retry: Callable[[BaseException], Awaitable[None]] | None = None,
    failure: BaseException | None = None,
) -> T:
    """Call `attempt(n)` (n = 0, 1, ...) until it succeeds, fails for good, or runs out.

    The wait after failed attempt n (1-based) is min(backoff * 2^(n-1), backoff_max) plus
    up to `backoff` of jitter. `failure`: attempt 0 was made already (a part of a shared
    request) and failed so; it counts as one, with the same wait and `before_retry` after.
    """

    def wait(failed_attempts: int) -> float:
        return backoff_delay(failed_attempts, backoff, backoff_max)

    if failure is not None:
        if retry_times == 0 or not is_retriable(failure):
            raise failure
        if before_retry is not None:
            await before_retry(failure)
    else:
        # The first attempt runs bare: tenacity's machinery costs ~20 us per call, and
        # almost every send succeeds first time.
        try:
            return await attempt(0)
        except BaseException as exc:
            if retry_times == 0 or not is_retriable(exc):
                raise
            if before_retry is not None:
                await before_retry(exc)
    await _sleep(wait(1))

    async def before_sleep(state: RetryCallState) -> None:
        if before_retry is not None and state.outcome is not None:
            exc = state.outcome.exception()
            if exc is not None:
                await before_retry(exc)

    number = 1
    async for trial in AsyncRetrying(
        retry=retry_if_exception(is_retriable),
        stop=stop_after_attempt(retry_times),
        wait=lambda state: wait(state.attempt_number + 1),
        sleep=_sleep,
        before_sleep=before_sleep,
        reraise=True,
    ):
        with trial:
            result = await attempt(number)
            number += 1
            return result
        number += 1
    raise AssertionError("unreachable: tenacity reraises")
