"""The broker's committed-offset table: a commit is visible only once it is on disk, and
a save writes what changed."""

from __future__ import annotations

import asyncio
import errno
import shutil
import tempfile
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mockbroker import offsets as offsets_module
from mockbroker.errors import BrokerError
from mockbroker.offsets import ConsumerOffsets, OffsetKey
from tests.fuzzing import machine_settings
from tests.support import KeyedOnly

T = TypeVar("T")


def full_disk(path: Path, data: bytes) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_commit_that_cannot_be_saved_fails_and_leaves_the_offsets_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "offsets.json"

    async def main() -> None:
        table = ConsumerOffsets(path)
        await table.commit({("g", "t", 0): 5})
        with monkeypatch.context() as patched:
            patched.setattr(offsets_module, "write_atomically", full_disk)
            with pytest.raises(BrokerError) as refused:
                await table.commit({("g", "t", 0): 9, ("h", "t", 1): 3})
        assert (refused.value.status.name, refused.value.reason) == ("UNAVAILABLE", "DISK_FULL")
        assert table.get("g", "t", 0) == 5, "the refused commit is not answered to queries"
        assert table.get("h", "t", 1) is None and "h" not in table.groups()
        await table.commit({("g", "t", 2): 1})  # the next save holds only what succeeded

    asyncio.run(main())
    reloaded = ConsumerOffsets(path)
    reloaded.load()
    assert sorted(reloaded.committed()) == [("g", "t", 0), ("g", "t", 2)]
    assert reloaded.get("g", "t", 0) == 5


def test_a_commit_is_not_answered_to_queries_before_it_is_saved(tmp_path: Path) -> None:
    async def main() -> tuple[int | None, int | None]:
        table = ConsumerOffsets(tmp_path / "offsets.json")
        commit = asyncio.ensure_future(table.commit({("g", "t", 0): 7}))
        await asyncio.sleep(0)  # the commit has started its save, in a thread
        during = table.get("g", "t", 0)
        await commit
        return during, table.get("g", "t", 0)

    assert asyncio.run(main()) == (None, 7)


def test_a_save_makes_again_only_the_parts_of_the_groups_that_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit costs its group's part of the file, not the table's size: with 50
    groups saved, one group's commit serializes that group alone (in both sections)."""
    made: list[str] = []
    group_json = offsets_module._group_json

    def counted(group: str, *args: Any) -> str | None:
        made.append(group)
        return group_json(group, *args)

    monkeypatch.setattr(offsets_module, "_group_json", counted)
    path = tmp_path / "offsets.json"

    async def main() -> None:
        table = ConsumerOffsets(path)
        await table.commit({(f"g{n}", "t", q): 10 * n + q for n in range(50) for q in range(4)})
        assert len(made) == 2 * 50
        made.clear()
        await table.commit({("g7", "t", 1): 99})
        assert made == ["g7", "g7"]

    asyncio.run(main())
    reloaded = ConsumerOffsets(path)
    reloaded.load()
    assert len(reloaded.committed()) == 200
    assert reloaded.get("g7", "t", 1) == 99 and reloaded.get("g8", "t", 1) == 81


def test_a_trimmed_queue_counts_its_groups_skipped_messages_without_looking_at_the_rest(
    tmp_path: Path,
) -> None:
    """Retention trims queue after queue: each looks at its own groups' offsets only."""
    table = ConsumerOffsets(tmp_path / "offsets.json")
    table.accept({(f"g{n}", f"t{n % 10}", q): 100 for n in range(100) for q in range(4)})
    table._table = KeyedOnly(table._table)  # type: ignore[assignment]
    table.note_trimmed("t3", 2, 40, 150)
    skipped = {g: table.skipped(g, "t3", 2) for g in (f"g{n}" for n in range(100))}
    assert skipped == {f"g{n}": (50 if n % 10 == 3 else 0) for n in range(100)}


def test_a_trim_looks_only_at_the_groups_left_behind(tmp_path: Path) -> None:
    """The usual trim deletes what the groups read long ago: it looks at none of them, or
    at those it found behind before (an abandoned group) and those that went back."""
    table = ConsumerOffsets(tmp_path / "offsets.json")
    table.accept({(f"g{n}", "t", q): 100 + 10 * n for n in range(50) for q in range(4)})
    table.accept({("abandoned", "t", 1): 30})
    looked = LookedAt(table._table)
    table._table = looked
    table.note_trimmed("t", 0, 0, 100)  # every group of queue 0 is at 100 or past it
    table.note_trimmed("t", 1, 20, 60)  # "abandoned" went under the floor when it committed
    assert looked.keys_seen == [("abandoned", "t", 1)]
    assert table.skipped("abandoned", "t", 1) == 30
    table.note_trimmed("t", 1, 60, 70)
    assert table.skipped("abandoned", "t", 1) == 40
    table.note_trimmed("t", 1, 70, 105)  # over the floor (100): every group is looked at
    assert len(set(looked.keys_seen)) == 51
    assert table.skipped("abandoned", "t", 1) == 75
    assert [table.skipped(f"g{n}", "t", 1) for n in range(3)] == [5, 0, 0]
    looked.keys_seen.clear()
    table.accept({("g0", "t", 1): 200, ("g9", "t", 1): 40})  # g0 caught up, g9 went back
    table.note_trimmed("t", 1, 105, 108)  # under the new floor (110, g1's)
    assert sorted(looked.keys_seen) == [("abandoned", "t", 1), ("g0", "t", 1), ("g9", "t", 1)]
    assert table.skipped("abandoned", "t", 1) == 78
    assert table.skipped("g9", "t", 1) == 3
    assert table.skipped("g0", "t", 1) == 5


class LookedAt(dict[OffsetKey, int]):
    """A table that notes which offsets a trim looked at."""

    def __init__(self, table: dict[OffsetKey, int]) -> None:
        super().__init__(table)
        self.keys_seen: list[OffsetKey] = []

    def get(self, key: OffsetKey, default: Any = None) -> Any:
        self.keys_seen.append(key)
        return super().get(key, default)


@pytest.mark.parametrize("change", ["commit", "forget"])
def test_a_change_whose_save_fails_after_a_trim_looked_is_counted_by_the_next_trim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A trim while a save is on its way sees the change; the failed save takes it back,
    and the queue's floor must go back down with it."""
    table = ConsumerOffsets(tmp_path / "offsets.json")
    started, go = threading.Event(), threading.Event()

    def slow_full_disk(path: Path, data: bytes) -> None:
        started.set()
        go.wait(5)
        full_disk(path, data)

    async def main() -> None:
        await table.commit({("g", "t", 0): 30, ("h", "t", 0): 500})
        monkeypatch.setattr(offsets_module, "write_atomically", slow_full_disk)
        if change == "commit":
            saving = asyncio.ensure_future(table.commit({("g", "t", 0): 500}))
        else:
            saving = asyncio.ensure_future(table.forget(lambda key: key[0] == "g"))
        await asyncio.to_thread(started.wait, 5)
        table.note_trimmed("t", 0, 0, 100)  # "g" at 500, or gone, as far as it can tell
        go.set()
        with pytest.raises(BrokerError, match="No space left"):
            await saving
        table.note_trimmed("t", 0, 100, 200)  # "g" is back at 30

    asyncio.run(main())
    assert table.skipped("g", "t", 0) == 100
    assert table.skipped("h", "t", 0) == 0


KEYS = st.tuples(st.sampled_from(["g0", "g1", "g2"]), st.sampled_from(["t0", "t1"]),
                 st.integers(0, 2))  # fmt: skip
UPDATES = st.dictionaries(KEYS, st.integers(0, 1000), min_size=1, max_size=5)


class OffsetTableMachine(RuleBasedStateMachine):
    """Commits, failed saves, deletions, retention's counts and restarts in any order:
    queries answer exactly what was saved, and the file read back holds exactly that."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.path = self.dir / "offsets.json"
        self.loop = asyncio.new_event_loop()
        self.table = ConsumerOffsets(self.path)
        self.saved: dict[OffsetKey, int] = {}
        self.skipped: dict[OffsetKey, int] = {}  # what skipped() answers
        self.skipped_saved: dict[OffsetKey, int] = {}  # what the file holds
        self.disk_full = False

    def teardown(self) -> None:
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()
        shutil.rmtree(self.dir)

    def run(self, work: Awaitable[T]) -> T:
        async def with_disk() -> T:
            if not self.disk_full:
                return await work
            with pytest.MonkeyPatch.context() as patched:
                patched.setattr(offsets_module, "write_atomically", full_disk)
                return await work

        return self.loop.run_until_complete(with_disk())

    @rule()
    def restart(self) -> None:
        """A new broker's table, loaded from the file."""
        self.table = ConsumerOffsets(self.path)
        self.table.load()
        self.skipped = dict(self.skipped_saved)

    @rule(full=st.booleans())
    def disk(self, full: bool) -> None:
        self.disk_full = full

    @rule(updates=UPDATES)
    def commit(self, updates: dict[OffsetKey, int]) -> None:
        try:
            self.run(self.table.commit(updates))
        except BrokerError:
            assert self.disk_full
            return
        assert not self.disk_full
        self.saved.update(updates)
        self.skipped_saved = dict(self.skipped)

    @rule(which=st.sampled_from(["g0", "g1", "t0", "t1"]))
    def forget(self, which: str) -> None:
        def match(key: OffsetKey) -> bool:
            return which in (key[0], key[1])

        expected = sorted(k for k in self.saved if match(k))
        skipped = [k for k in self.skipped if match(k)]
        try:
            gone = self.run(self.table.forget(match))
        except BrokerError:
            assert self.disk_full and (expected or skipped)
            return
        assert gone == expected
        if expected or skipped:
            assert not self.disk_full
            for key in expected:
                del self.saved[key]
            for key in skipped:
                del self.skipped[key]
            self.skipped_saved = dict(self.skipped)

    @rule(topic=st.sampled_from(["t0", "t1"]), queue=st.integers(0, 2),
          old_min=st.integers(0, 500), more=st.integers(1, 500))  # fmt: skip
    def trim(self, topic: str, queue: int, old_min: int, more: int) -> None:
        new_min = old_min + more
        self.table.note_trimmed(topic, queue, old_min, new_min)
        for key, committed in self.saved.items():
            if key[1:] == (topic, queue) and committed < new_min:
                self.skipped[key] = self.skipped.get(key, 0) + new_min - max(committed, old_min)

    @invariant()
    def queries_answer_what_was_saved(self) -> None:
        assert sorted(self.table.committed()) == sorted(self.saved)
        assert self.table.groups() == {g for g, _, _ in self.saved}
        for key, offset in self.saved.items():
            assert self.table.get(*key) == self.table.latest(*key) == offset
            assert self.table.skipped(*key) == self.skipped.get(key, 0)

    @invariant()
    def the_indexes_hold_no_more_than_what_is_there(self) -> None:
        """What a save and a trim look at stays within what the table holds (the rest
        of a forgotten group is dropped at the next save)."""
        if self.table._changed:
            return  # a failed save: kept for the next one
        there = self.table._table.keys() | self.table._skipped.keys()
        assert set().union(*self.table._keys.values()) == there
        assert set().union(*self.table._queue_keys.values()) == there

    @invariant()
    def each_offset_is_at_or_above_its_queues_floor_or_a_laggard(self) -> None:
        """Else a trim would pass over a group that had not read what it deleted."""
        for key, offset in self.table._table.items():
            queue = key[1:]
            if key not in self.table._laggards.get(queue, ()):
                assert self.table._floors[queue] <= offset

    @invariant()
    def the_file_holds_what_was_saved(self) -> None:
        reloaded = ConsumerOffsets(self.path)
        reloaded.load()
        assert sorted(reloaded.saved()) == sorted((*k, v) for k, v in self.saved.items())
        for key in self.saved:
            assert reloaded.skipped(*key) == self.skipped_saved.get(key, 0)


#: `make test-stateful` (HYPOTHESIS_PROFILE=long) explores far more interleavings.
OffsetTableMachine.TestCase.settings = machine_settings(40, 500, steps=(25, 50))
test_offset_table_state_machine = OffsetTableMachine.TestCase
