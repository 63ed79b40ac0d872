"""The broker's dedup window (mockbroker/dedup.py): time and count bounds, on a fake clock.

Within the window a key is found with its first place; outside it (or once evicted by
the count bound, oldest first) it is not, so the broker stores the message again. Memory
follows the count bound, whatever the number of keys sent. A hypothesis state machine
checks the window against a plain model of the same rules.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mockbroker.dedup import (
    DedupWindow,
    Placed,
    digest,
    frame_keys,
    message_key,
    recent_keys,
)
from mockbroker.dedup_sends import DedupSends, rebuild
from mockbroker.store.message_store import MessageStore
from sdk import Message
from sdk._transport.codec import encode_message
from sdk._validation import RETRY_PREFIX
from sdk._wire import encode_frame, encode_properties
from sdk.testing import FakeClock
from tests.fuzzing import machine_settings

SYSTEM = RETRY_PREFIX + "group"


def key(n: int, topic: str = "orders") -> bytes:
    return digest(topic, b"i:" + n.to_bytes(16, "big"))


def test_a_key_is_found_within_the_window_and_not_after() -> None:
    clock = FakeClock()
    window = DedupWindow(60, 100, clock)
    window.add(key(1), 3, 42, 1000)
    clock.advance(60)
    assert window.find(key(1)) == Placed(3, 42, 1000)
    clock.advance(0.01)
    assert window.find(key(1)) is None
    assert len(window) == 0


def test_the_count_bound_drops_the_oldest_first() -> None:
    window = DedupWindow(600, 3, FakeClock())
    for n in range(5):
        window.add(key(n), 0, n, 0)
    assert [window.find(key(n)) is not None for n in range(5)] == [False, False, True, True, True]
    assert len(window) == 3


def test_keys_are_per_topic() -> None:
    window = DedupWindow(600, 10, FakeClock())
    window.add(key(1, "a"), 0, 7, 0)
    assert window.find(key(1, "b")) is None
    assert window.find(key(1, "a")) == Placed(0, 7, 0)


def test_a_key_added_again_after_expiry_keeps_its_new_place() -> None:
    clock = FakeClock()
    window = DedupWindow(10, 2, clock)
    window.add(key(1), 0, 1, 0)
    clock.advance(11)
    assert window.find(key(1)) is None
    window.add(key(1), 0, 9, 0)
    window.add(key(2), 0, 10, 0)  # the old slot of key 1 is long gone; its new one stays
    assert window.find(key(1)) == Placed(0, 9, 0)


def test_the_message_key_is_the_user_key_else_the_id() -> None:
    props = encode_properties({"IDEMPOTENCY_KEY": "order-7", "x": "y"})
    assert message_key(b"\1" * 16, props) == message_key(b"\2" * 16, props) == b"u:order-7"
    assert message_key(b"\1" * 16, memoryview(props)) == b"u:order-7"  # as frames give it
    assert message_key(b"\1" * 16, encode_properties({"x": "y"})) == b"i:" + b"\1" * 16
    assert message_key(b"\1" * 16, b"IDEMPOTENCY_KEY garbage") == b"i:" + b"\1" * 16


def test_frame_keys_reads_each_frame_and_gives_up_on_a_broken_one() -> None:
    frames = b"".join(
        encode_frame(msg_id=bytes([n]) * 16, born_timestamp_ms=0, body=b"x", tags=b"t")
        for n in range(3)
    )
    assert frame_keys("t", frames) == [digest("t", b"i:" + bytes([n]) * 16) for n in range(3)]
    assert frame_keys("t", frames[:-1]) is None
    full = encode_frame(
        msg_id=b"\x09" * 16, born_timestamp_ms=1, body=b"body", tags=b"tag", sharding_key=b"s",
        keys=[b"k1", b"k2"], properties=encode_properties({"IDEMPOTENCY_KEY": "order-7"}),
    )  # fmt: skip
    assert frame_keys("t", full) == [digest("t", b"u:order-7")]
    assert frame_keys("t", b"") is None


def test_recent_keys_keeps_the_newest_oldest_first() -> None:
    records = iter([("t", 0, n, 100 - n, bytes([n]) * 16, b"") for n in range(5)])
    kept = recent_keys(records, 2)
    assert [(ms, q, off) for ms, _, q, off in kept] == [(99, 0, 1), (100, 0, 0)]


def test_memory_follows_the_count_bound_not_the_keys_sent() -> None:
    """30 000 distinct keys through a window of 10 000: memory of 10 000, measured."""
    bound = 10_000
    tracemalloc.start()
    try:
        window = DedupWindow(3600, bound, FakeClock())
        for n in range(bound):
            window.add(key(n), n % 8, n, 0)
        full, _ = tracemalloc.get_traced_memory()
        for n in range(bound, 3 * bound):
            window.add(key(n), n % 8, n, 0)
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(window) == bound
    assert full / bound < 260, full / bound  # 210-230 bytes a key (docs/dedup.md)
    assert after < full * 1.5, (full, after)  # the dict's churn: never twice the size


@pytest.mark.parametrize(("seconds", "keys"), [(0, 1), (1, 0)])
def test_settings_are_checked(seconds: float, keys: int) -> None:
    with pytest.raises(ValueError):
        DedupWindow(seconds, keys, FakeClock())


WINDOW_S = 10
MAX_KEYS = 4


class WindowMachine(RuleBasedStateMachine):
    """The window against a model: a list of (key, place, added time), oldest first."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.window = DedupWindow(WINDOW_S, MAX_KEYS, self.clock)
        self.model: list[tuple[int, int, float]] = []

    def _live(self) -> list[tuple[int, int, float]]:
        now = self.clock.now()
        live = [e for e in self.model if now - e[2] <= WINDOW_S]
        return live[-MAX_KEYS:]

    @rule(n=st.integers(0, 6))
    def send(self, n: int) -> None:
        """What Delivery does: find, else add."""
        live = {k: place for k, place, _ in self._live()}
        found = self.window.find(key(n))
        assert (found.offset if found else None) == live.get(n)
        if found is None:
            offset = len(self.model)
            self.window.add(key(n), 0, offset, 0)
            self.model = [*self._live(), (n, offset, self.clock.now())]

    @rule(seconds=st.sampled_from([0.5, 3, 10, 11]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @invariant()
    def bounded(self) -> None:
        assert len(self.window) <= MAX_KEYS


TestWindowMachine = WindowMachine.TestCase
TestWindowMachine.settings = machine_settings(200, 1000, steps=(30, 60))


def test_the_rebuild_reads_the_log_in_order_and_keeps_only_indexed_user_records(
    tmp_path: Path,
) -> None:
    """Records of a deleted topic, of a system topic or before the window are not kept."""

    def frames(first: int, count: int, at: float) -> bytes:
        return b"".join(
            encode_message(
                Message("t", b"x", properties={"IDEMPOTENCY_KEY": f"k{n}"}),
                n.to_bytes(16, "big"),
                at,
            )
            for n in range(first, first + count)
        )

    async def scenario() -> None:
        clock = FakeClock(1_000_000.0)
        store = MessageStore(
            tmp_path, sync_flush=False, segment_bytes=64 << 10, flush_interval_seconds=1,
            sync_flush_timeout_seconds=5, clock=clock,
        )  # fmt: skip
        store.open()
        await store.start()
        for name in ("gone", "orders", SYSTEM):
            store.create_topic(name, 2)
        old = frames(0, 5, clock.now())
        store.write(store.topics.get("orders"), 0, old, store.check(old))
        clock.advance(120)  # those 5 are out of a 60 s window
        for i, name in enumerate(("gone", "orders", SYSTEM) * 40):
            batch = frames(100 + 10 * i, 10, clock.now())
            store.write(store.topics.get(name), i % 2, batch, store.check(batch))
        await store.delete_topic("gone")
        window = DedupWindow(60, 10_000, clock)
        assert rebuild(window, store, int(clock.now() * 1000)) == 400  # orders' 40 batches
        sends = DedupSends(window, store)
        key = digest("orders", b"u:k110")
        found = sends.sort("orders", frames(110, 1, clock.now()), [key])
        assert found is not None and found.firsts[0] is not None  # read back: still there
        assert sends.sort("orders", frames(0, 1, clock.now()), [digest("orders", b"u:k0")]).new
        await store.close()

    asyncio.run(scenario())
