"""Queue selection: the contract's sharding formula and the selectors."""

from __future__ import annotations

import collections
import subprocess
import sys

import mmh3
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sdk import (
    Message,
    MessageQueue,
    RoundRobinSelector,
    SelectMessageQueueByHash,
    SelectMessageQueueByRandom,
    shard_index,
)
from sdk.errors import InvalidArgumentError

QUEUES = [MessageQueue("t", "b", i) for i in range(8)]


def test_sharding_follows_the_published_formula() -> None:
    for key in ["order-1", "账户-7", "", "x" * 300]:
        expected = mmh3.hash(key.encode("utf-8"), 0, signed=False) % 8
        assert shard_index(key, 8) == expected


@given(st.text(max_size=64), st.integers(min_value=1, max_value=1024))
def test_any_text_key_follows_the_published_formula(key: str, queues: int) -> None:
    assert shard_index(key, queues) == mmh3.hash(key.encode("utf-8"), 0, signed=False) % queues


def test_a_key_that_is_not_utf8_text_is_refused_clearly() -> None:
    with pytest.raises(InvalidArgumentError, match="not UTF-8 text: it holds a lone surrogate"):
        shard_index("order-\ud800", 8)
    with pytest.raises(InvalidArgumentError, match="a sharding key is a str, not int"):
        shard_index(42, 8)  # type: ignore[arg-type]


def test_known_values_never_change_between_releases() -> None:
    # Producers in other languages compute these too; changing them breaks ordering.
    assert [shard_index(k, 8) for k in ("order-1", "order-2", "device-42")] == [
        mmh3.hash(b"order-1", 0, signed=False) % 8,
        mmh3.hash(b"order-2", 0, signed=False) % 8,
        mmh3.hash(b"device-42", 0, signed=False) % 8,
    ]
    assert shard_index("hello", 8) == 2613040991 % 8


def test_the_same_key_selects_the_same_queue_in_another_process() -> None:
    keys = [f"key-{i}" for i in range(50)]
    code = (
        "import sys; from sdk import shard_index; print([shard_index(k, 8) for k in sys.argv[1:]])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, *keys], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str([shard_index(k, 8) for k in keys])


def test_ten_thousand_keys_spread_evenly_over_eight_queues() -> None:
    counts = collections.Counter(shard_index(f"order-{i}", 8) for i in range(10_000))
    assert set(counts) == set(range(8))
    # One bin's count has a standard deviation of about 33 (2.6 %), so "a few percent"
    # is 8 %; the chi-squared statistic (7 degrees of freedom) stays under its p=0.001
    # critical value unless the hash is biased.
    chi2 = sum((n - 1250) ** 2 / 1250 for n in counts.values())
    assert chi2 < 24.32, counts
    for n in counts.values():
        assert abs(n - 1250) / 1250 < 0.08, counts


def test_no_queues_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError):
        shard_index("k", 0)


def test_hash_selector_uses_arg_with_the_same_formula() -> None:
    m = Message("t", b"x")
    assert SelectMessageQueueByHash()(QUEUES, m, "order-1") == QUEUES[shard_index("order-1", 8)]
    assert SelectMessageQueueByHash()(QUEUES, m, 42) == QUEUES[shard_index("42", 8)]


def test_round_robin_visits_every_queue_in_turn() -> None:
    rr = RoundRobinSelector()
    m = Message("t", b"x")
    assert [rr(QUEUES, m, None).queue_id for _ in range(10)] == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1]


def test_random_selector_stays_within_the_queues() -> None:
    import random

    sel = SelectMessageQueueByRandom(random.Random(7))
    picks = {sel(QUEUES, Message("t", b"x"), None) for _ in range(200)}
    assert picks == set(QUEUES)
