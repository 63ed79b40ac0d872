"""Counting the data directory's disk space while the broker renames and deletes files."""

from __future__ import annotations

import threading
from pathlib import Path

from mockbroker.store.files import bytes_on_disk, write_atomically
from mockbroker.store.retention import file_probe


def test_files_under_every_level_are_counted_by_their_blocks(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "top").write_bytes(b"x" * 10)
    (tmp_path / "a" / "b" / "deep").write_bytes(b"y" * 5000)
    (tmp_path / "empty").touch()

    counted = bytes_on_disk(tmp_path)

    expected = sum(p.stat().st_blocks * 512 for p in tmp_path.rglob("*") if p.is_file())
    assert counted == expected > 0


def test_a_file_renamed_away_while_counting_takes_nothing(tmp_path: Path) -> None:
    # The lock table is saved through locks.json.tmp, renamed over locks.json: a count that
    # listed the temporary file must not fail when it is gone (a BrokerStatus call did).
    stop = threading.Event()

    def save_again_and_again() -> None:
        while not stop.is_set():
            write_atomically(tmp_path / "locks.json", b"{}" * 2000)

    saver = threading.Thread(target=save_again_and_again)
    saver.start()
    try:
        for _ in range(3000):
            assert bytes_on_disk(tmp_path) >= 0
    finally:
        stop.set()
        saver.join()


def test_the_simulated_disk_counts_the_directory_the_same_way(tmp_path: Path) -> None:
    settings = tmp_path / "disk.json"
    settings.write_text('{"total_bytes": 1000000, "other_used_bytes": 7}')
    data = tmp_path / "data"
    data.mkdir()
    (data / "segment").write_bytes(b"z" * 9000)

    usage = file_probe(settings, data)()

    assert usage.used_bytes == 7 + bytes_on_disk(data)
