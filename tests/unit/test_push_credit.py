"""Push delivery's credit accounting: the broker's (mockbroker/push.py), the client's view."""

from __future__ import annotations

import asyncio

import pytest

from mockbroker.errors import BrokerError
from mockbroker.lock_manager import RebalanceLockManager
from mockbroker.long_polling import PullHolder
from mockbroker.push import MAX_CREDIT, Credit
from sdk._transport.protocol import CreditWindow
from sdk.testing import FakeClock


def test_the_broker_sends_while_both_credits_last_and_spends_each_batch() -> None:
    credit = Credit(PullHolder(FakeClock()), 5, 1000)
    assert credit.open and credit.batch_bytes(4096) == 1000
    credit.spend(3, 600)
    assert (credit.messages, credit.bytes, credit.sent) == (2, 400, 3)
    assert credit.batch_bytes(4096) == 400
    credit.spend(1, 500)  # one record may go past the byte credit, as with max_bytes
    assert not credit.open  # 1 message left, no bytes
    credit.grant(0, 100)  # pays the debt only
    assert not credit.open and credit.bytes == 0
    credit.grant(0, 1)
    assert credit.open and credit.batch_bytes(4096) == 1


def test_no_byte_credit_means_no_byte_limit() -> None:
    credit = Credit(PullHolder(FakeClock()), 2, 0)
    assert credit.bytes is None and credit.batch_bytes(4096) == 4096
    credit.spend(2, 10_000)
    assert not credit.open
    credit.grant(1, 0)
    assert credit.open


@pytest.mark.parametrize("messages, size", [(-1, 0), (0, -1), (MAX_CREDIT + 1, 0)])
def test_a_bad_credit_is_refused(messages: int, size: int) -> None:
    with pytest.raises(BrokerError) as caught:
        Credit(PullHolder(FakeClock()), messages, size)
    assert caught.value.status.name == "INVALID_ARGUMENT"
    credit = Credit(PullHolder(FakeClock()), 1, 1)
    with pytest.raises(BrokerError):
        credit.grant(messages, size)
    assert (credit.messages, credit.bytes) == (1, 1)


def test_credit_never_grows_past_its_bound() -> None:
    credit = Credit(PullHolder(FakeClock()), MAX_CREDIT, 0)
    with pytest.raises(BrokerError):
        credit.grant(1, 0)
    assert credit.messages == MAX_CREDIT


def test_a_grant_wakes_the_subscription_waiting_for_it() -> None:
    async def main() -> None:
        clock = FakeClock()
        holder = PullHolder(clock)
        credit = Credit(holder, 0, 0)
        waiter = asyncio.create_task(holder.wait_any([credit.key], clock.now() + 60))
        await asyncio.sleep(0)
        assert not waiter.done()
        credit.grant(1, 0)
        assert await waiter

    asyncio.run(main())


def test_the_lock_check_refuses_another_owner_and_another_epoch() -> None:
    locks = RebalanceLockManager(FakeClock())
    epoch = locks.try_lock("g", ("t", 0), "a")
    assert epoch is not None
    locks.check_lock("g", ("t", 0), "a", epoch)
    with pytest.raises(BrokerError) as caught:
        locks.check_lock("g", ("t", 0), "a", epoch + 1)
    assert caught.value.reason == "STALE_EPOCH"
    with pytest.raises(BrokerError) as caught:
        locks.check_lock("g", ("t", 0), "b", epoch)
    assert caught.value.reason == "LOCK_NOT_HELD"
    locks.unlock_batch("g", "a", [("t", 0)])
    with pytest.raises(BrokerError) as caught:
        locks.check_lock("g", ("t", 0), "a", epoch)
    assert caught.value.reason == "LOCK_NOT_HELD"


def test_the_client_grants_only_the_room_its_cache_has() -> None:
    window = CreditWindow()
    # An empty cache of 100 messages / 1000 bytes, nothing outstanding: all of it.
    assert window.to_grant(100, 1000, 0, 0, 50) == (100, 1000)
    window.granted(100, 1000)
    assert window.to_grant(100, 1000, 0, 0, 50) == (0, 0)
    window.received(60, 300)  # 60 messages (300 bytes) arrived and wait in the cache
    assert (window.messages, window.bytes) == (40, 700)
    assert window.to_grant(100, 1000, 60, 300, 50) == (0, 0)
    # 49 consumed: less than the minimum grant, and the bytes are not half free.
    assert window.to_grant(100, 1000, 11, 55, 50) == (0, 0)
    # 50 consumed: the room of 50 is granted, with the bytes' room.
    assert window.to_grant(100, 1000, 10, 50, 50) == (50, 250)


def test_the_client_view_keeps_the_brokers_byte_debt_and_pays_it() -> None:
    window = CreditWindow()
    window.granted(10, 100)
    window.received(10, 150)  # the broker went past the byte credit by one record
    assert (window.messages, window.bytes) == (0, -50)
    # Half the bytes free is enough to grant, however few messages are; the grant pays
    # the debt too, so that the broker is left with the room (60 bytes), as here.
    assert window.to_grant(10, 100, 10, 40, 5) == (0, 110)
    credit = Credit(PullHolder(FakeClock()), 10, 100)
    credit.spend(10, 150)
    credit.grant(0, 110)
    window.granted(0, 110)
    assert credit.bytes == window.bytes == 60
