"""The data directory's FORMAT marker: written when missing, another format refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from mockbroker.store.data_format import CURRENT_FORMAT, FORMAT_FILE
from mockbroker.store.message_store import MessageStore
from sdk.errors import CorruptFileError, DataFormatError
from sdk.testing import FakeClock


def open_and_close(data_dir: Path) -> MessageStore:
    store = MessageStore(
        data_dir,
        sync_flush=False,
        segment_bytes=1 << 20,
        flush_interval_seconds=60,
        sync_flush_timeout_seconds=5,
        clock=FakeClock(),
    )
    store.open()
    asyncio.run(store.close())
    return store


def listing(data_dir: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(data_dir)): p.read_bytes() for p in data_dir.rglob("*") if p.is_file()
    }


def test_a_new_directory_is_marked_with_the_current_format(tmp_path: Path) -> None:
    open_and_close(tmp_path)
    assert json.loads((tmp_path / FORMAT_FILE).read_text())["format"] == CURRENT_FORMAT


def test_a_directory_from_before_the_marker_opens_and_is_marked(tmp_path: Path) -> None:
    open_and_close(tmp_path)
    (tmp_path / FORMAT_FILE).unlink()
    open_and_close(tmp_path)
    assert (tmp_path / FORMAT_FILE).exists()


def test_a_directory_in_a_newer_format_is_refused_and_left_untouched(tmp_path: Path) -> None:
    open_and_close(tmp_path)
    (tmp_path / FORMAT_FILE).write_text('{"format": 2, "written_by": "9.0.0"}')
    before = listing(tmp_path)
    with pytest.raises(DataFormatError) as refused:
        open_and_close(tmp_path)
    assert "data format 2, written by ordermq 9.0.0" in str(refused.value)
    assert f"reads format {CURRENT_FORMAT} only" in str(refused.value)
    assert listing(tmp_path) == before, "nothing was read into or changed"


@pytest.mark.parametrize("content", ["", "{", '{"format": "1"}', '{"format": 0}', "[]"])
def test_an_unreadable_marker_is_a_corrupt_file(tmp_path: Path, content: str) -> None:
    open_and_close(tmp_path)
    (tmp_path / FORMAT_FILE).write_text(content)
    with pytest.raises(CorruptFileError, match="FORMAT is unreadable"):
        open_and_close(tmp_path)
