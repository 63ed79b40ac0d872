"""MessageIndex: the sizes it reports (a failed write rolls back to them) follow its files."""

from __future__ import annotations

import os
from pathlib import Path

from mockbroker.store.message_index import MessageIndex


def file_sizes(directory: Path) -> tuple[int, int]:
    return os.path.getsize(directory / "ids"), os.path.getsize(directory / "keys")


def test_the_sizes_follow_the_files_through_writes_roll_backs_and_a_torn_entry(
    tmp_path: Path,
) -> None:
    (tmp_path / "ids").write_bytes(bytes(24 + 5))  # one entry and a torn one
    index = MessageIndex(tmp_path)
    try:
        assert index.sizes() == file_sizes(tmp_path) == (24, 0), "the torn entry cut off"
        index.add("t", [100, 200], [b"a" * 16, b"b" * 16], [(100, b"k1\0k2")])
        before = index.sizes()
        assert before == file_sizes(tmp_path) == (3 * 24, 2 * 16)
        index.add("t", [300], [b"c" * 16], [(300, b"k3")])
        assert index.sizes() == file_sizes(tmp_path) == (4 * 24, 3 * 16)
        index.roll_back(before)
        assert index.sizes() == file_sizes(tmp_path) == before
        assert [*index.positions_of_id(b"c" * 16)] == [], "rolled back"
        assert [*index.positions_of_id(b"b" * 16)] == [200]
        index.add("t", [400], [b"d" * 16], [])
        assert index.sizes() == file_sizes(tmp_path) == (4 * 24, 2 * 16)
    finally:
        index.close()
