"""MessageIndex: entries wait in memory and are written in one go; the sizes it reports
(a failed write rolls back to them) count both; a checkpoint writes what it covers."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from mockbroker.store import message_index as message_index_module
from mockbroker.store.checkpoint import read_checkpoint
from mockbroker.store.message_index import _ID_ENTRY, PENDING_BYTES, MessageIndex
from mockbroker.store.message_store import MessageStore
from sdk._wire import encode_frame
from tests.unit.test_consume_queue_tail import checkpoint, crash_and_reopen, open_store


def file_sizes(directory: Path) -> tuple[int, int]:
    return os.path.getsize(directory / "ids"), os.path.getsize(directory / "keys")


def ids(first: int, n: int) -> list[bytes]:
    return [i.to_bytes(16, "big") for i in range(first, first + n)]


def test_the_sizes_count_the_entries_in_memory_through_writes_roll_backs_and_a_torn_entry(
    tmp_path: Path,
) -> None:
    (tmp_path / "ids").write_bytes(bytes(24 + 5))  # one entry and a torn one
    index = MessageIndex(tmp_path)
    try:
        assert index.sizes() == file_sizes(tmp_path) == (24, 0), "the torn entry cut off"
        index.add("t", [100, 200], [b"a" * 16, b"b" * 16], [(100, b"k1\0k2")])
        before = index.sizes()
        assert before == (3 * 24, 2 * 16)
        assert file_sizes(tmp_path) == (24, 0), "kept in memory"
        assert [*index.positions_of_id(b"b" * 16)] == [200], "found in memory"
        assert [*index.positions_of_key("t", b"k2")] == [100]
        index.write_pending()
        assert file_sizes(tmp_path) == before
        index.add("t", [300], [b"c" * 16], [(300, b"k3")])
        assert index.sizes() == (4 * 24, 3 * 16)
        index.roll_back(before)  # only memory to cut
        assert index.sizes() == file_sizes(tmp_path) == before
        assert [*index.positions_of_id(b"c" * 16)] == [], "rolled back"
        assert [*index.positions_of_id(b"b" * 16)] == [200]
        index.add("t", [400], [b"d" * 16], [])
        index.write_pending()
        assert index.sizes() == file_sizes(tmp_path) == (4 * 24, 2 * 16)
    finally:
        index.close()


def test_entries_are_written_once_they_fill_the_memory_and_a_roll_back_cuts_the_file(
    tmp_path: Path,
) -> None:
    index = MessageIndex(tmp_path)
    try:
        fill = PENDING_BYTES // _ID_ENTRY.size
        index.add("t", list(range(fill - 1)), ids(0, fill - 1), [])
        assert file_sizes(tmp_path) == (0, 0)
        before = index.sizes()
        index.add("t", [fill - 1, fill], ids(fill - 1, 2), [])  # over PENDING_BYTES
        assert file_sizes(tmp_path) == index.sizes() == ((fill + 1) * 24, 0), "one write"
        assert [*index.positions_of_id(ids(fill, 1)[0])] == [fill]
        index.roll_back(before)  # the failed batch's entries are in the file now
        assert index.sizes() == file_sizes(tmp_path) == before
        assert [*index.positions_of_id(ids(fill, 1)[0])] == []
        assert [*index.positions_of_id(ids(3, 1)[0])] == [3]
    finally:
        index.close()


def test_a_write_the_full_disk_refuses_keeps_the_entries_for_the_next_try(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = MessageIndex(tmp_path)
    try:
        index.add("t", [1, 2], ids(0, 2), [(2, b"k")])
        written = []
        real_write = os.write

        def half_then_full(fd: int, data: bytes | memoryview) -> int:
            if written:
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(fd)
            return real_write(fd, bytes(data)[:30])  # a short write tearing an entry

        monkeypatch.setattr(message_index_module.os, "write", half_then_full)
        with pytest.raises(OSError):
            index.write_pending()
        assert file_sizes(tmp_path) == (24, 0), "whole entries only: the torn one cut off"
        assert [*index.positions_of_id(ids(1, 1)[0])] == [2], "the rest still in memory"
        assert [*index.positions_of_id(ids(0, 1)[0])] == [1]
        monkeypatch.setattr(message_index_module.os, "write", real_write)
        index.write_pending()
        assert file_sizes(tmp_path) == index.sizes() == (2 * 24, 16)
        assert [*index.positions_of_id(ids(0, 1)[0])] == [1]
    finally:
        index.close()


def send(loop: asyncio.AbstractEventLoop, store: MessageStore, n: int) -> list[bytes]:
    topic = store.topics.get("t")
    sent = []
    for _ in range(n):
        msg_id = os.urandom(16)
        frame = encode_frame(msg_id=msg_id, born_timestamp_ms=1, body=b"x" * 50, keys=[b"k"])
        loop.run_until_complete(store.put(topic, 0, frame))
        sent.append(msg_id)
    return sent


def test_a_checkpoint_writes_the_index_entries_it_covers_and_recovery_indexes_the_rest(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(loop, tmp_path)
    store.create_topic("t", 1)
    before = send(loop, store, 3)
    assert file_sizes(tmp_path / "index") == (0, 0), "kept in memory"
    assert all(store.find_by_id(i) for i in before), "found in memory"
    checkpoint(loop, store)
    assert file_sizes(tmp_path / "index") == (3 * 24, 3 * 16)
    after = send(loop, store, 2)  # in memory only: the crash loses their entries
    store = crash_and_reopen(loop, store, monkeypatch)
    assert store.recovery.records_replayed == 2
    assert all(len(store.find_by_id(i)) == 1 for i in before + after)
    assert len(store.find_by_key("t", "k")) == 5
    loop.run_until_complete(store.close())
    assert file_sizes(tmp_path / "index") == (5 * 24, 5 * 16), "written at close"


def test_index_entries_the_full_disk_will_not_take_hold_the_checkpoint_back(
    loop: asyncio.AbstractEventLoop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(loop, tmp_path)
    store.create_topic("t", 1)
    send(loop, store, 2)
    checkpoint(loop, store)
    later = send(loop, store, 3)

    real_write = os.write

    def no_room_for_the_index(fd: int, data: bytes | memoryview) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "index")):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)  # the checkpoint's own write has room

    with monkeypatch.context() as patched:
        patched.setattr(message_index_module.os, "write", no_room_for_the_index)
        checkpoint(loop, store)
    assert read_checkpoint(tmp_path / "checkpoint").counts == {"t/0": 2}
    assert store.flusher is not None and store.flusher.failure is None, "not a failed store"
    store = crash_and_reopen(loop, store, monkeypatch)
    assert store.recovery.records_replayed == 3
    assert all(len(store.find_by_id(i)) == 1 for i in later)
    loop.run_until_complete(store.close())


def test_a_lookup_in_a_thread_while_the_loop_adds_and_writes_entries_misses_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lookup may run in a worker thread (the admin front's find): the loop may add
    # entries, and write them, between the lookup's copy of those in memory and its
    # reading of the file's size. Simulated here at that point, wherever the scan reads
    # the size (the file's, or the index's own count).
    index = MessageIndex(tmp_path)
    try:
        index.add("t", [1, 2], ids(0, 2), [])
        index.write_pending()
        index.add("t", [3], ids(2, 1), [])
        armed = [True]

        def the_loop_meanwhile() -> None:
            if armed[0]:
                armed[0] = False
                index.add("t", [4], ids(3, 1), [])  # a later send
                index.write_pending()  # a checkpoint

        class SizesRead(dict[int, int]):
            def __getitem__(self, fd: int) -> int:
                the_loop_meanwhile()
                return super().__getitem__(fd)

        real_fstat = os.fstat

        def fstat(fd: int) -> os.stat_result:
            the_loop_meanwhile()
            return real_fstat(fd)

        index._sizes = SizesRead(index._sizes)
        monkeypatch.setattr(message_index_module.os, "fstat", fstat)
        found = set(index.positions_of_id(ids(2, 1)[0]))
        assert not armed[0], "the loop ran during the lookup"
        assert found == {3}, "in memory when the lookup began: found"
        for n, position in ((0, 1), (1, 2), (3, 4)):
            assert [*index.positions_of_id(ids(n, 1)[0])] == [position]
    finally:
        index.close()
