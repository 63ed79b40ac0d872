"""Allocation strategies: RocketMQ's exact splits and their edge cases."""

from __future__ import annotations

import pytest

from sdk.consumer.allocate import (
    AllocateMessageQueueAveragely,
    AllocateMessageQueueAveragelyByCircle,
    AllocateMessageQueueConsistentHash,
)
from sdk.errors import InvalidArgumentError
from sdk.message import MessageQueue

STRATEGIES = [
    AllocateMessageQueueAveragely(),
    AllocateMessageQueueAveragelyByCircle(),
    AllocateMessageQueueConsistentHash(),
]


def queues(n: int) -> list[MessageQueue]:
    return [MessageQueue("t", "b", i) for i in range(n)]


def ids(split: list[list[MessageQueue]]) -> list[list[int]]:
    return [[q.queue_id for q in part] for part in split]


@pytest.mark.parametrize(
    ("n", "c", "expected"),
    [
        (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
        (8, 2, [[0, 1, 2, 3], [4, 5, 6, 7]]),
        (10, 4, [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]),
        (3, 5, [[0], [1], [2], [], []]),
        (1, 1, [[0]]),
    ],
)
def test_averagely_matches_rocketmq(n: int, c: int, expected: list[list[int]]) -> None:
    cids = [f"c{i}" for i in range(c)]
    got = [AllocateMessageQueueAveragely().allocate("g", cid, queues(n), cids) for cid in cids]
    assert ids(got) == expected


def test_by_circle_deals_like_cards() -> None:
    cids = ["a", "b", "c"]
    got = [AllocateMessageQueueAveragelyByCircle().allocate("g", c, queues(8), cids) for c in cids]
    assert ids(got) == [[0, 3, 6], [1, 4, 7], [2, 5]]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
def test_every_queue_goes_to_exactly_one_member(strategy: object) -> None:
    for c in range(1, 12):
        cids = [f"client-{i}" for i in range(c)]
        parts = [strategy.allocate("g", cid, queues(8), list(reversed(cids))) for cid in cids]  # type: ignore[attr-defined]
        flat = [q for part in parts for q in part]
        assert sorted(flat) == queues(8) and len(flat) == 8


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: type(s).__name__)
def test_unknown_client_gets_nothing_and_empty_inputs_are_errors(strategy: object) -> None:
    allocate = strategy.allocate  # type: ignore[attr-defined]
    assert allocate("g", "stranger", queues(4), ["a", "b"]) == []
    with pytest.raises(InvalidArgumentError):
        allocate("g", "a", [], ["a"])
    with pytest.raises(InvalidArgumentError):
        allocate("g", "a", queues(4), [])
    with pytest.raises(InvalidArgumentError):
        allocate("g", "", queues(4), ["a"])


def test_consistent_hash_moves_only_the_leavers_queues() -> None:
    strategy = AllocateMessageQueueConsistentHash()
    mqs = queues(64)
    before_ids = ["a", "b", "c", "d"]
    before = {cid: set(strategy.allocate("g", cid, mqs, before_ids)) for cid in before_ids}
    after_ids = ["a", "b", "c"]
    after = {cid: set(strategy.allocate("g", cid, mqs, after_ids)) for cid in after_ids}
    for cid in after_ids:
        assert before[cid] <= after[cid], f"{cid} lost queues when d left"
    assert set().union(*after.values()) == set(mqs)
