"""The send retry policy: which failures are retried, how long to wait, where to go.

Only failures that say so (`OrderMQError.retriable`: unavailable, deadline exceeded, busy)
are retried; bad input, flush failures and flush timeouts never are. Keyed (ordered)
sends always retry the same queue; keyless ones may move to another.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
    wait_random,
)

from sdk.errors import OrderMQError

T = TypeVar("T")


def is_retriable(exc: BaseException) -> bool:
    """True for failures a second attempt may fix."""
    return isinstance(exc, OrderMQError) and exc.retriable


async def with_retries(
    attempt: Callable[[int], Awaitable[T]],
    *,
    retry_times: int,
    backoff: float,
    backoff_max: float,
    before_retry: Callable[[BaseException], Awaitable[None]] | None = None,
) -> T:
    """Call `attempt(n)` (n = 0, 1, ...) until it succeeds, fails for good, or runs out."""

    async def before_sleep(state: RetryCallState) -> None:
        if before_retry is not None and state.outcome is not None:
            exc = state.outcome.exception()
            if exc is not None:
                await before_retry(exc)

    number = 0
    async for trial in AsyncRetrying(
        retry=retry_if_exception(is_retriable),
        stop=stop_after_attempt(retry_times + 1),
        wait=wait_exponential(multiplier=backoff, max=backoff_max) + wait_random(0, backoff),
        before_sleep=before_sleep,
        reraise=True,
    ):
        with trial:
            result = await attempt(number)
            number += 1
            return result
        number += 1
    raise AssertionError("unreachable: tenacity reraises")
