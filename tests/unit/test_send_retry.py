"""The send retry policy, per kind of failure (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from sdk.errors import (
    BrokerBusyError,
    BrokerUnavailableError,
    FlushFailedError,
    FlushTimeoutError,
    InvalidMessageError,
    OrderMQError,
    RequestTimeoutError,
    TopicNotFoundError,
    error_from_status,
)
from sdk.producer import retry
from sdk.producer.retry import with_retries


def run(failures: list[OrderMQError], retry_times: int = 2) -> tuple[int, str | Exception]:
    calls = 0
    retried: list[str] = []

    async def attempt(n: int) -> str:
        nonlocal calls
        assert n == calls
        calls += 1
        if failures:
            raise failures.pop(0)
        return "stored"

    async def before_retry(exc: BaseException) -> None:
        retried.append(type(exc).__name__)

    async def main() -> str:
        return await with_retries(
            attempt, retry_times=retry_times, backoff=0.001, backoff_max=0.002,
            before_retry=before_retry,
        )  # fmt: skip

    outcome: str | Exception
    try:
        outcome = asyncio.run(main())
    except OrderMQError as exc:
        outcome = exc
    return calls, outcome


@pytest.mark.parametrize("error", [BrokerUnavailableError, RequestTimeoutError, BrokerBusyError])
def test_retriable_failures_are_retried(error: type[OrderMQError]) -> None:
    calls, outcome = run([error("x"), error("y")])
    assert (calls, outcome) == (3, "stored")


@pytest.mark.parametrize(
    "error", [InvalidMessageError, FlushFailedError, FlushTimeoutError, TopicNotFoundError]
)
def test_other_failures_are_raised_at_once(error: type[OrderMQError]) -> None:
    calls, outcome = run([error("no")])
    assert calls == 1 and isinstance(outcome, error)


def test_retries_stop_after_retry_times_and_raise_the_last_failure() -> None:
    calls, outcome = run([BrokerUnavailableError(f"down {i}") for i in range(5)], retry_times=2)
    assert calls == 3
    assert isinstance(outcome, BrokerUnavailableError) and str(outcome) == "down 2"


def test_waits_double_from_backoff_up_to_the_cap_plus_jitter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retry, "_sleep", sleep)
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: high)  # the most jitter

    async def attempt(n: int) -> str:
        if n < 5:
            raise BrokerUnavailableError(f"down {n}")
        return "stored"

    got = asyncio.run(retry.with_retries(attempt, retry_times=5, backoff=0.1, backoff_max=0.5))
    assert got == "stored"
    assert waits == pytest.approx([0.1 + 0.1, 0.2 + 0.1, 0.4 + 0.1, 0.5 + 0.1, 0.5 + 0.1])


def test_a_send_refused_for_the_clients_in_flight_limit_is_retried_after_a_back_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retry, "_sleep", sleep)
    refused = "this client already has 70000000 bytes of requests in flight"

    async def attempt(n: int) -> str:
        if n < 2:
            raise error_from_status("RESOURCE_EXHAUSTED", "CLIENT_OVER_LIMIT", refused)
        return "stored"

    got = asyncio.run(retry.with_retries(attempt, retry_times=2, backoff=0.1, backoff_max=0.5))
    assert got == "stored"
    assert len(waits) == 2 and waits[0] >= 0.1 and waits[1] >= 0.2


def test_no_retries_when_told_so() -> None:
    calls, outcome = run([BrokerUnavailableError("down")], retry_times=0)
    assert calls == 1 and isinstance(outcome, BrokerUnavailableError)


def test_a_failure_already_had_counts_as_the_first_attempt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As for a part of a shared request: the same attempts, waits and before_retry as if
    attempt 0 had been made here."""
    waits: list[float] = []
    calls: list[int] = []
    retried: list[str] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(retry, "_sleep", sleep)
    monkeypatch.setattr(retry.random, "uniform", lambda low, high: 0.0)  # no jitter

    async def attempt(n: int) -> str:
        calls.append(n)
        raise BrokerUnavailableError(f"down {n}")

    async def before_retry(exc: BaseException) -> None:
        retried.append(str(exc))

    def run_after(failure: OrderMQError, retry_times: int) -> OrderMQError:
        with pytest.raises(OrderMQError) as info:
            asyncio.run(
                with_retries(
                    attempt,
                    retry_times=retry_times,
                    backoff=0.1,
                    backoff_max=1.0,
                    before_retry=before_retry,
                    failure=failure,
                )
            )
        return info.value

    assert str(run_after(BrokerUnavailableError("down 0"), retry_times=2)) == "down 2"
    assert calls == [1, 2] and retried == ["down 0", "down 1"]
    assert waits == pytest.approx([0.1, 0.2])
    calls.clear()
    waits.clear()
    retried.clear()
    for failure, retry_times in [
        (BrokerUnavailableError("down"), 0),
        (TopicNotFoundError("no"), 2),
    ]:
        assert run_after(failure, retry_times) is failure
    assert calls == [] and waits == [] and retried == []
