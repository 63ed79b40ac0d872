"""Every duration of the clients' configs is checked where the config is made.

Before, NaN, infinite and (for integers) negative durations, and intervals of 0, were
accepted: `PushConsumerConfig(heartbeat_interval=0)` made a consumer heartbeat in a loop
with no wait, `ProducerConfig(send_timeout=math.nan)` gave every send a deadline it
never met, `LitePullConsumerConfig(rebalance_interval=-1)` rebalanced without pause.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from sdk import AccumulatorConfig, LitePullConsumerConfig, ProducerConfig, PushConsumerConfig
from sdk.errors import InvalidArgumentError

CONFIGS: list[type[Any]] = [
    ProducerConfig,
    AccumulatorConfig,
    PushConsumerConfig,
    LitePullConsumerConfig,
]
#: The durations that may be 0 (no wait); every other one must be above 0.
MAY_BE_ZERO = {
    "ProducerConfig": {"retry_backoff", "retry_backoff_max"},
    "AccumulatorConfig": {"linger", "block_timeout"},
    "PushConsumerConfig": {"pull_suspend", "pull_error_backoff", "flow_control_backoff",
                           "shutdown_timeout"},
    "LitePullConsumerConfig": {"pull_suspend", "pull_error_backoff", "flow_control_backoff"},
}  # fmt: skip


def durations() -> list[tuple[type[Any], str]]:
    return [
        (config, f.name)
        for config in CONFIGS
        for f in dataclasses.fields(config)
        if f.type == "float"
    ]


def test_every_config_has_durations_to_check() -> None:
    counts = {config.__name__: 0 for config in CONFIGS}
    for config, _ in durations():
        counts[config.__name__] += 1
    assert all(counts.values()), counts


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, -1, -0.5, True, "1", None],
    ids=["nan", "inf", "-inf", "-1", "-0.5", "bool", "str", "none"],
)  # fmt: skip
@pytest.mark.parametrize(("config", "name"), durations(), ids=lambda v: getattr(v, "__name__", v))
def test_a_duration_that_is_no_finite_number_of_seconds_is_refused(
    config: type[Any], name: str, bad: object
) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"{config.__name__}\.{name} must be"):
        config(**{name: bad})


@pytest.mark.parametrize(("config", "name"), durations(), ids=lambda v: getattr(v, "__name__", v))
def test_zero_is_refused_where_it_would_spin_and_accepted_where_it_means_no_wait(
    config: type[Any], name: str
) -> None:
    if name in MAY_BE_ZERO[config.__name__]:
        # retry_backoff_max may not be below retry_backoff
        extra = {"retry_backoff": 0} if name == "retry_backoff_max" else {}
        assert getattr(config(**{name: 0}, **extra), name) == 0
    else:
        with pytest.raises(InvalidArgumentError, match=rf"{name} must be .* above 0, not 0"):
            config(**{name: 0})


def test_the_defaults_and_an_int_number_of_seconds_are_accepted() -> None:
    for config in CONFIGS:
        config()
    assert PushConsumerConfig(heartbeat_interval=5).heartbeat_interval == 5
    assert ProducerConfig(send_timeout=3).send_timeout == 3


def test_the_producers_accumulator_must_be_an_accumulator_config() -> None:
    with pytest.raises(InvalidArgumentError, match="accumulator must be an AccumulatorConfig"):
        ProducerConfig(accumulator=0)  # type: ignore[arg-type]
    assert ProducerConfig(accumulator=None).accumulator is None


def counts() -> list[tuple[type[Any], str]]:
    return [
        (config, f.name)
        for config in CONFIGS
        for f in dataclasses.fields(config)
        if f.type in ("int", "int | None")
    ]


@pytest.mark.parametrize(
    "bad", [2.5, 1.0, True, "5", math.nan], ids=["2.5", "1.0", "bool", "str", "nan"]
)
@pytest.mark.parametrize(("config", "name"), counts(), ids=lambda v: getattr(v, "__name__", v))
def test_a_count_that_is_no_int_is_refused_by_name(
    config: type[Any], name: str, bad: object
) -> None:
    # Before, a float was kept: LitePullConsumerConfig(pull_batch_size=2.5) made every pull
    # fail in the background, and the consumer polled nothing.
    with pytest.raises(InvalidArgumentError, match=rf"{config.__name__}\.{name} must be an int"):
        config(**{name: bad})


@pytest.mark.parametrize("spool_dir", ["/dev/null", "spool\0dir"], ids=["device", "nul"])
def test_a_spool_dir_no_spool_can_be_kept_in_is_refused(spool_dir: str) -> None:
    # Before, /dev/null was kept and the producer's start failed with FileExistsError.
    with pytest.raises(InvalidArgumentError, match=r"ProducerConfig\.spool_dir"):
        ProducerConfig(spool_dir=Path(spool_dir))


def test_a_lite_pull_byte_threshold_beyond_1_gib_is_refused() -> None:
    # Before, 2**63 was kept: it is the credit each queue's subscription asks for, beyond
    # the wire's int64, so every subscribe failed in the background and nothing was polled.
    problem = (
        r"pull_threshold_bytes_for_queue must be within 1 MiB..1 GiB .* not 9223372036854775808"
    )
    with pytest.raises(InvalidArgumentError, match=problem):
        LitePullConsumerConfig(pull_threshold_bytes_for_queue=2**63)
    assert LitePullConsumerConfig(pull_threshold_bytes_for_queue=1024 * 1024 * 1024)
