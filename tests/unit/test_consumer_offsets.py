"""The broker's committed-offset table: a commit is visible only once it is on disk."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest

from mockbroker import offsets as offsets_module
from mockbroker.errors import BrokerError
from mockbroker.offsets import ConsumerOffsets


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
