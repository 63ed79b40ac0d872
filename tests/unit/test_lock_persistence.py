"""The lock table on disk: what a broker restart keeps, and a missing or corrupt file."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mockbroker import lock_manager
from mockbroker.errors import BrokerError
from mockbroker.lock_manager import LOCK_FILE, RebalanceLockManager
from sdk.testing import FakeClock
from tests.fuzzing import machine_settings
from tests.support import KeyedOnly

Q0, Q1 = ("orders", 0), ("orders", 1)


def started(path: Path, clock: FakeClock, *, previous_run: bool = False) -> RebalanceLockManager:
    """A broker's lock manager after start: loaded from `path`."""
    locks = RebalanceLockManager(clock, lease_seconds=60, path=path)
    locks.load(previous_run=previous_run)
    return locks


def granted(
    locks: RebalanceLockManager, group: str, client: str, *queues: tuple[str, int]
) -> dict[tuple[str, int], int]:
    """lock_batch, then save, as the servicer does before it answers."""
    held = locks.lock_batch(group, client, queues)
    asyncio.run(locks.save())
    return held


def test_a_restart_keeps_the_locks_their_epochs_and_the_epoch_counter(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    before = started(path, FakeClock())
    epochs = granted(before, "g", "a", Q0, Q1)
    before.unlock_batch("g", "a", [Q1])
    asyncio.run(before.save())
    # The new broker's wall clock is an hour behind the old one's (a replaced machine, an
    # NTP step): epochs must not depend on it.
    clock = FakeClock(start=1_700_000_000.0 - 3600)
    after = started(path, clock)
    assert after.lock_batch("g", "b", [Q0, Q1]) == {Q1: max(epochs.values()) + 1}
    assert after.lock_batch("g", "a", [Q0]) == {Q0: epochs[Q0]}, "renewed at the same epoch"
    after.check_commit("g", Q0, "a", epochs[Q0])
    with pytest.raises(BrokerError) as foreign:
        after.check_commit("g", Q0, "b", 0)
    assert foreign.value.reason == "LOCK_NOT_HELD"


def test_a_loaded_lock_counts_as_renewed_at_start(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    old = FakeClock()
    epoch = granted(started(path, old), "g", "a", Q0)[Q0]
    old.advance(59)  # the owner renewed 59 s before the crash; its lease is almost over
    clock = FakeClock()
    after = started(path, clock)
    clock.advance(60)
    assert after.try_lock("g", Q0, "b") is None, "nobody else for one lease after start"
    clock.advance(0.001)
    taken = after.try_lock("g", Q0, "b")
    assert taken is not None and taken > epoch


def test_epochs_keep_growing_over_many_restarts(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    seen: list[int] = []
    for i in range(4):
        clock = FakeClock(start=1_700_000_000.0 - i)  # the wall clock even goes back
        locks = started(path, clock)
        clock.advance(61)  # the last owner's lease runs out: a new owner, a new epoch
        seen.append(granted(locks, "g", f"client-{i}", Q0)[Q0])
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_a_renewal_writes_nothing_and_a_grant_is_written_before_save_returns(
    tmp_path: Path,
) -> None:
    path = tmp_path / LOCK_FILE
    locks = started(path, FakeClock())
    written = path.stat().st_ino
    epoch = granted(locks, "g", "a", Q0)[Q0]
    assert path.stat().st_ino != written, "the grant was written (atomic replace)"
    owners = json.loads(path.read_text())["groups"]["g"]
    assert owners == [{"topic": "orders", "queue": 0, "granted": epoch, "owner": "a"}]
    written = path.stat().st_ino
    assert granted(locks, "g", "a", Q0) == {Q0: epoch}
    assert path.stat().st_ino == written, "a renewal by the owner costs no write"


def test_a_release_is_written_too(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    locks = started(path, FakeClock())
    granted(locks, "g", "a", Q0)
    assert locks.release_client("a") == 1
    asyncio.run(locks.save())
    after = started(path, FakeClock())
    assert after.try_lock("g", Q0, "b") is not None, "the lock of a client that left is gone"


def test_a_missing_file_on_a_fresh_data_directory_is_a_fresh_start(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    locks = started(path, FakeClock())
    assert path.exists(), "written at once, so that a later loss can be told apart"
    assert locks.try_lock("g", Q0, "a") is not None


def test_a_lost_table_grants_nothing_for_one_lease(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    clock = FakeClock()
    locks = started(path, clock, previous_run=True)  # offsets exist, the lock file does not
    assert locks.try_lock("g", Q0, "a") is None
    clock.advance(60.001)  # every lease a client could still believe in has run out
    assert locks.try_lock("g", Q0, "a") is not None


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b'{"format": 99, "next_epoch": 1, "groups": {}}',
        b'{"format": 1, "next_epoch": -5, "groups": {}}',
        b'{"format": 1, "next_epoch": 5, "groups": {"g": [{"topic": "t", "queue": 0}]}}',
        b'{"format": 1, "next_epoch": 5, "groups": {"g": [{"topic": "t", "queue": true, '
        b'"granted": 3, "owner": null}]}}',
        b"[]",
    ],
)
def test_a_corrupt_file_is_moved_aside_and_nothing_is_granted_for_one_lease(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / LOCK_FILE
    path.write_bytes(content)
    clock = FakeClock()
    locks = started(path, clock)
    assert (tmp_path / (LOCK_FILE + ".corrupt")).read_bytes() == content
    assert json.loads(path.read_text())["groups"] == {}
    assert "unreadable" in caplog.text
    assert locks.try_lock("g", Q0, "a") is None
    clock.advance(60.001)
    assert locks.try_lock("g", Q0, "a") is not None


def test_a_lock_table_that_cannot_be_written_refuses_the_answer(tmp_path: Path) -> None:
    path = tmp_path / LOCK_FILE
    locks = started(path, FakeClock())
    blocker = path.with_name(path.name + ".tmp")
    blocker.mkdir()  # the temporary file cannot be created: the write fails
    locks.lock_batch("g", "a", [Q0])
    with pytest.raises(BrokerError) as info:
        asyncio.run(locks.save())
    blocker.rmdir()
    assert (info.value.status.name, info.value.reason) == ("UNAVAILABLE", "STORE_UNAVAILABLE")
    asyncio.run(locks.save())  # once the disk takes writes again, the change is written
    assert json.loads(path.read_text())["groups"]["g"][0]["owner"] == "a"


def test_a_restarted_brokers_first_save_keeps_the_groups_it_loaded(tmp_path: Path) -> None:
    """The parts a save reuses are made for every group once the table is loaded."""
    path = tmp_path / LOCK_FILE
    granted(started(path, FakeClock()), "g0", "a", Q0)
    after = started(path, FakeClock())
    granted(after, "g1", "b", Q1)
    assert sorted(json.loads(path.read_bytes())["groups"]) == ["g0", "g1"]


def test_a_save_makes_again_only_the_parts_of_the_groups_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A grant costs its group's part of the file, not the table's size."""
    made: list[str] = []
    group_part = lock_manager._group_part

    def counted(group: str, *args: Any) -> str:
        made.append(group)
        return group_part(group, *args)

    monkeypatch.setattr(lock_manager, "_group_part", counted)
    path = tmp_path / LOCK_FILE
    locks = started(path, FakeClock())
    for n in range(50):
        granted(locks, f"g{n}", f"c{n}", Q0, Q1)
    made.clear()
    granted(locks, "g7", "c7", ("orders", 2))
    locks.unlock_batch("g9", "c9", [Q1])
    asyncio.run(locks.save())
    assert sorted(made) == ["g7", "g9"]
    after = started(path, FakeClock())
    assert after.locks("g7").keys() == {Q0, Q1, ("orders", 2)}
    assert after.locks("g9").keys() == {Q0} and after.locks("g10").keys() == {Q0, Q1}


def many_changed(path: Path, groups: int) -> RebalanceLockManager:
    """A loaded table whose `groups` groups each got a lock since its last save."""
    locks = started(path, FakeClock())
    for n in range(groups):
        locks.lock_batch(f"g{n}", f"c{n}", [Q0, Q1])
    return locks


def test_a_save_of_many_changed_groups_lets_the_loop_run_between_slices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mass expiry changes a thousand groups at once: their parts of the file are made
    SNAPSHOT_GROUPS_PER_TURN a turn, and the file written has every one of them."""
    path = tmp_path / LOCK_FILE
    groups = 3 * lock_manager.SNAPSHOT_GROUPS_PER_TURN
    locks = many_changed(path, groups)
    write = lock_manager.write_atomically
    turns_before_write: list[int] = []

    async def test() -> None:
        turns = 0
        saving = asyncio.ensure_future(locks.save())

        def counted_write(target: Path, data: bytes) -> None:
            turns_before_write.append(turns)
            write(target, data)

        monkeypatch.setattr(lock_manager, "write_atomically", counted_write)
        while not saving.done():
            turns += 1
            await asyncio.sleep(0)
        await saving

    asyncio.run(test())
    assert turns_before_write and turns_before_write[0] >= 3, turns_before_write
    after = started(path, FakeClock())
    assert all(after.locks(f"g{n}").keys() == {Q0, Q1} for n in range(groups))


def test_a_change_made_during_a_sliced_save_is_in_the_next_one(tmp_path: Path) -> None:
    """Groups changed between two slices of a save (already made, or not yet) are in the
    file once the save after the change returns."""
    path = tmp_path / LOCK_FILE
    groups = 3 * lock_manager.SNAPSHOT_GROUPS_PER_TURN
    locks = many_changed(path, groups)

    async def test() -> None:
        saving = asyncio.ensure_future(locks.save())
        await asyncio.sleep(0)  # the first slice is made
        locks.release_client("c0")  # in the first slice, made already
        locks.release_client(f"c{groups - 1}")  # in a slice not made yet (or made)
        granted_new = locks.lock_batch("g-new", "n", [Q0])
        await saving
        assert granted_new
        await locks.save()

    asyncio.run(test())
    after = started(path, FakeClock())
    assert after.locks("g0") == {} and after.locks(f"g{groups - 1}") == {}
    assert after.locks("g-new").keys() == {Q0} and after.locks("g1").keys() == {Q0, Q1}


def test_a_save_cancelled_between_slices_leaves_its_groups_to_the_next(tmp_path: Path) -> None:
    """A save cancelled while it makes the groups' parts loses none of their changes."""
    path = tmp_path / LOCK_FILE
    groups = 3 * lock_manager.SNAPSHOT_GROUPS_PER_TURN
    locks = many_changed(path, groups)

    async def test() -> None:
        saving = asyncio.ensure_future(locks.save())
        await asyncio.sleep(0)
        saving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await saving
        await locks.save()

    asyncio.run(test())
    after = started(path, FakeClock())
    assert all(after.locks(f"g{n}").keys() == {Q0, Q1} for n in range(groups))


def test_a_lock_request_counts_the_clients_locks_without_looking_at_every_lock(
    tmp_path: Path,
) -> None:
    """client_max_locks is checked at every lock request (renewals too), and a leaving
    client's locks dropped, from what is kept per client, not by a look at every
    group's locks."""
    locks = started(tmp_path / LOCK_FILE, FakeClock())
    for n in range(50):
        locks.lock_batch(f"g{n}", f"c{n % 5}", [Q0, Q1])
    locks._table = KeyedOnly(locks._table)  # type: ignore[assignment]
    assert locks.lock_batch("g7", "c2", [Q0, Q1], renew_only=True, max_held=20) == {
        Q0: locks.locks("g7")[Q0].epoch,
        Q1: locks.locks("g7")[Q1].epoch,
    }
    with pytest.raises(BrokerError) as refused:
        locks.lock_batch("g-new", "c2", [Q0, Q1, ("orders", 2)], max_held=22)
    assert refused.value.reason == "TOO_MANY_LOCKS"
    assert "holds 20 locks and asks for 3 more" in refused.value.message
    assert locks.release_client("c2") == 20, "a client that leaves: its own locks only"
    assert locks.locks("g7") == {} and len(locks.locks("g8")) == 2


def full_disk(path: Path, data: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


GROUPS = st.sampled_from(["g0", "g1"])
CLIENTS = st.sampled_from(["a", "b"])
QUEUES = st.lists(
    st.tuples(st.sampled_from(["t0", "t1"]), st.integers(0, 1)), min_size=1, max_size=3
)


class LockFileMachine(RuleBasedStateMachine):
    """Grants, unlocks, leaving clients, deletions, expiry, saves on a full disk and
    restarts in any order: after each save, the file holds exactly what serializing the
    whole table would."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.clock = FakeClock()
        self.locks = started(self.dir / LOCK_FILE, self.clock)

    def teardown(self) -> None:
        shutil.rmtree(self.dir)

    @rule(group=GROUPS, client=CLIENTS, queues=QUEUES, limit=st.none() | st.integers(0, 5))
    def lock(
        self, group: str, client: str, queues: list[tuple[str, int]], limit: int | None
    ) -> None:
        with contextlib.suppress(BrokerError):  # TOO_MANY_LOCKS changes nothing
            self.locks.lock_batch(group, client, queues, max_held=limit)

    @rule(group=GROUPS, client=CLIENTS, queues=QUEUES)
    def unlock(self, group: str, client: str, queues: list[tuple[str, int]]) -> None:
        self.locks.unlock_batch(group, client, queues)

    @rule(client=CLIENTS)
    def leave(self, client: str) -> None:
        self.locks.release_client(client)

    @rule(topic=st.sampled_from(["t0", "t1"]))
    def delete_topic(self, topic: str) -> None:
        self.locks.forget(lambda _group, queue: queue[0] == topic)

    @rule(seconds=st.sampled_from([1, 61]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule()
    def save_on_a_full_disk(self) -> None:
        with pytest.MonkeyPatch.context() as patched:
            patched.setattr(lock_manager, "write_atomically", full_disk)
            with contextlib.suppress(BrokerError):  # none when nothing changed
                asyncio.run(self.locks.save())

    @rule()
    def restart(self) -> None:
        """What was saved, loaded by a new broker (changes never saved were never answered)."""
        self.locks = started(self.dir / LOCK_FILE, self.clock)

    @invariant()
    def each_clients_locks_are_its_entries(self) -> None:
        owners: dict[str, set[tuple[str, tuple[str, int]]]] = {}
        for group, entries in self.locks._table.items():
            for queue, entry in entries.items():
                owners.setdefault(entry[0], set()).add((group, queue))
        assert self.locks._held == owners

    @rule()
    def save(self) -> None:
        asyncio.run(self.locks.save())
        on_disk = json.loads((self.dir / LOCK_FILE).read_bytes())
        locks, granted_ = self.locks._table, self.locks._granted
        whole = {
            group: [
                {"topic": t, "queue": q, "granted": epoch,
                 "owner": locks[group][(t, q)][0] if (t, q) in locks.get(group, {})
                 else None}
                for (t, q), epoch in sorted(queues.items())
            ]
            for group, queues in granted_.items()
        }  # fmt: skip
        assert on_disk["groups"] == whole
        assert list(on_disk["groups"]) == sorted(whole)
        assert on_disk["next_epoch"] == self.locks._next_epoch


#: `make test-stateful` (HYPOTHESIS_PROFILE=long) explores far more interleavings.
LockFileMachine.TestCase.settings = machine_settings(60, 500, steps=(25, 50))
test_lock_file_state_machine = LockFileMachine.TestCase
