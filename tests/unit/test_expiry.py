"""Clients gone: their locks released at once, and each logged, some clients a turn."""

from __future__ import annotations

import asyncio
import logging

import pytest

from mockbroker import expiry
from mockbroker.expiry import release_gone
from mockbroker.lock_manager import RebalanceLockManager
from sdk.testing import FakeClock


def test_many_clients_gone_at_once_are_released_at_once_and_logged_with_turns_between(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A partition ends thousands of clients together: their locks are all released in
    the turn they leave their groups (the other members rebalance on that), and the
    loop gets a turn every CLIENTS_PER_TURN clients logged."""
    clients = 3 * expiry.CLIENTS_PER_TURN
    locks = RebalanceLockManager(FakeClock())
    for n in range(clients):
        locks.lock_batch(f"g{n}", f"c{n}", [("orders", 0), ("orders", 1)])
    gone = {f"c{n}": "silent for 120 s" for n in range(clients)}
    turns: list[int] = []
    held_after_first_turn: list[int] = []

    async def test() -> int:
        count = 0
        releasing = asyncio.ensure_future(release_gone(locks, gone))
        while not releasing.done():
            count += 1
            await asyncio.sleep(0)
            if count == 1:
                held_after_first_turn.append(sum(len(locks.locks(f"g{n}")) for n in range(clients)))
        turns.append(count)
        return await releasing

    with caplog.at_level(logging.WARNING, logger="mockbroker"):
        assert asyncio.run(test()) == 2 * clients
    assert turns[0] >= 3, turns
    assert held_after_first_turn == [0]
    assert all(locks.locks(f"g{n}") == {} for n in range(clients))
    expired = [r.getMessage() for r in caplog.records if "expired" in r.getMessage()]
    assert len(expired) == clients
    assert expired[0] == "client c0 expired (silent for 120 s); 2 lock(s) released"
