"""The power-loss layer itself (tools/powerloss): proven on small programs, not trusted.

Each test runs a few lines of Python under the preload library, in a child process, on a
fresh directory, and rebuilds the directory as a power cut at the end would leave it; or it
replays a journal written by hand, for orderings a program cannot produce on demand (a write
racing an fsync, a kill in the middle of one).
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.system.powerloss import library
from tools.powerloss.model import (
    CLOSE,
    OPEN,
    SYNC_BEGIN,
    SYNC_END,
    WRITE,
    ModelError,
    Rebuilt,
    environment,
    read_journal,
    rebuild,
    snapshot,
)

pytestmark = pytest.mark.system


class Traced:
    """A directory, a program run on it under the preload, and rebuilds of what it left."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.dir = tmp / "d"
        self.dir.mkdir()
        self.snap = tmp / "snapshot"
        self.journal = tmp / "journal"
        self.rebuilds = 0

    def run(self, code: str, *, before: dict[str, bytes] | None = None) -> None:
        """Write `before` into the directory untraced, then run `code` (D is the directory)."""
        for name, data in (before or {}).items():
            (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.dir / name).write_bytes(data)
        snapshot(self.dir, self.snap)
        program = "import os\nfrom pathlib import Path\nD = Path(os.environ['D'])\n"
        program += textwrap.dedent(code)
        env = {**os.environ, "D": str(self.dir), **environment(library(), self.dir, self.journal)}
        done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True)
        assert done.returncode == 0, done.stderr.decode()

    def after(self, mode: str = "synced", seed: int = 0) -> dict[str, bytes | None]:
        """Every path the rebuild holds: file -> content, directory -> None."""
        return files(self.rebuild(mode, seed))

    def rebuild(self, mode: str = "synced", seed: int = 0) -> Path:
        self.rebuilds += 1
        out = self.tmp / f"rebuilt-{self.rebuilds}"
        rebuild(self.snap, self.journal, out, mode, random.Random(seed))
        return out

    def stats(self, mode: str = "synced") -> Rebuilt:
        self.rebuilds += 1
        return rebuild(self.snap, self.journal, self.tmp / f"rebuilt-{self.rebuilds}", mode,
                       random.Random(0))  # fmt: skip


def files(root: Path) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[Path(dirpath, name).relative_to(root).as_posix()] = None
        for name in filenames:
            path = Path(dirpath, name)
            out[path.relative_to(root).as_posix()] = path.read_bytes()
    return out


@pytest.fixture
def traced(tmp_path: Path) -> Traced:
    return Traced(tmp_path)


# ---------------------------------------------------------------------- data
def test_a_write_without_fsync_is_lost_and_one_with_fsync_kept(traced: Traced) -> None:
    traced.run("""
        a = os.open(D / "a", os.O_RDWR)
        os.pwrite(a, b"synced", 0)
        os.fsync(a)
        os.pwrite(a, b"-later", 6)
        b = os.open(D / "b", os.O_RDWR)
        os.pwrite(b, b"fdatasynced", 0)
        os.fdatasync(b)
        c = os.open(D / "c", os.O_RDWR)
        os.write(c, b"never synced")
    """, before={"a": b"", "b": b"", "c": b"old"})  # fmt: skip
    assert traced.after() == {"a": b"synced", "b": b"fdatasynced", "c": b"old"}


def test_appends_land_at_the_end_and_truncations_count_once_synced(traced: Traced) -> None:
    traced.run("""
        with open(D / "log", "ab") as f:
            f.write(b"+one")
            f.flush()
            os.fsync(f.fileno())
        t = os.open(D / "cut", os.O_RDWR)
        os.ftruncate(t, 2)
        os.fsync(t)
        os.ftruncate(t, 1)
        w = os.open(D / "wiped", os.O_RDWR | os.O_TRUNC)
        os.close(w)
    """, before={"log": b"start", "cut": b"abcdef", "wiped": b"kept"})  # fmt: skip
    assert traced.after() == {"log": b"start+one", "cut": b"ab", "wiped": b"kept"}


# ---------------------------------------------------------------------- names
def test_a_new_file_needs_its_directory_synced(traced: Traced) -> None:
    traced.run("""
        for name in ("kept", "lost"):
            fd = os.open(D / name, os.O_RDWR | os.O_CREAT, 0o644)
            os.write(fd, name.encode())
            os.fsync(fd)
            if name == "kept":
                d = os.open(D, os.O_RDONLY | os.O_DIRECTORY)
                os.fsync(d)
                os.close(d)
    """)  # fmt: skip
    assert traced.after() == {"kept": b"kept"}


def test_a_rename_or_unlink_needs_its_directory_synced(traced: Traced) -> None:
    traced.run("""
        def sync_dir():
            d = os.open(D, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(d)
            os.close(d)
        os.replace(D / "new1", D / "target1")
        os.replace(D / "new2", D / "target2")
        os.unlink(D / "gone")
        sync_dir()
        os.replace(D / "new3", D / "target3")
        os.unlink(D / "stays")
    """, before={f"new{i}": f"new{i}".encode() for i in (1, 2, 3)}
       | {f"target{i}": b"old" for i in (1, 2, 3)} | {"gone": b"", "stays": b"s"})  # fmt: skip
    assert traced.after() == {
        "target1": b"new1",
        "target2": b"new2",
        "new3": b"new3",
        "target3": b"old",
        "stays": b"s",
    }


def test_a_new_directory_needs_its_parent_synced(traced: Traced) -> None:
    traced.run("""
        for name in ("kept", "lost"):
            (D / name).mkdir()
            fd = os.open(D / name / "f", os.O_RDWR | os.O_CREAT, 0o644)
            os.write(fd, b"x")
            os.fsync(fd)
            sub = os.open(D / name, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(sub)
            os.close(sub)
            if name == "kept":
                top = os.open(D / "kept" / "..", os.O_RDONLY | os.O_DIRECTORY)
                os.fsync(top)
    """)  # fmt: skip
    assert traced.after() == {"kept": None, "kept/f": b"x"}


def test_an_atomic_replace_gives_the_old_or_the_new_content(traced: Traced) -> None:
    traced.run("""
        from mockbroker.store.files import write_atomically
        write_atomically(D / "table", b"new")
        tmp = os.open(D / "other.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(tmp, b"unsynced")
        os.close(tmp)
        os.replace(D / "other.tmp", D / "other")
    """, before={"table": b"old", "other": b"old"})  # fmt: skip
    assert traced.after() == {"table": b"new", "other": b"old"}
    for seed in range(30):  # the rename may survive without the data it was meant to name
        assert traced.after("prefix", seed)["other"] in (b"old", b"", b"unsynced")


# ---------------------------------------------------------------------- unsynced writes
def test_prefix_mode_keeps_writes_in_order_and_may_tear_the_last(traced: Traced) -> None:
    traced.run("""
        fd = os.open(D / "f", os.O_RDWR)
        for i in range(8):
            os.pwrite(fd, bytes([65 + i]) * 1000, i * 1000)
    """, before={"f": b""})  # fmt: skip
    full = b"".join(bytes([65 + i]) * 1000 for i in range(8))
    seen = {traced.after("prefix", seed)["f"] for seed in range(60)}
    assert all(full.startswith(s) for s in seen), "only a prefix of the writes survives"
    assert {b"", full} <= seen
    assert any(s and len(s) % 1000 for s in seen), "a torn write cut at a sector"


def test_reorder_mode_keeps_any_pages_and_holes_read_as_zeros(traced: Traced) -> None:
    traced.run("""
        fd = os.open(D / "f", os.O_RDWR)
        os.pwrite(fd, b"s" * 100, 0)
        os.fsync(fd)
        os.pwrite(fd, b"x" * 4096 * 4, 100)
    """, before={"f": b""})  # fmt: skip
    later_without_earlier = False
    for seed in range(40):
        data = traced.after("reorder", seed)["f"]
        assert data is not None and data[:100] == b"s" * 100
        pages = [data[i : i + 4096] for i in range(0, len(data), 4096)]
        assert set(data[100:]) <= {0, ord("x")}
        later_without_earlier |= any(0 in p for p in pages[:-1]) and ord("x") in pages[-1]
    assert later_without_earlier, "a later page survives an earlier one"


def test_reorder_mode_writes_a_page_back_whole_as_of_some_moment(traced: Traced) -> None:
    traced.run("""
        fd = os.open(D / "f", os.O_RDWR)
        os.pwrite(fd, b"a" * 100, 0)
        os.pwrite(fd, b"b" * 100, 100)  # the same page: never kept without the first
        os.ftruncate(fd, 150)
    """, before={"f": b""})  # fmt: skip
    allowed = {b"", b"a" * 100, b"a" * 100 + b"b" * 100, b"a" * 100 + b"b" * 50}
    seen = set()
    for seed in range(60):
        data = traced.after("reorder", seed)["f"]
        assert data is not None
        seen.add(data.rstrip(b"\0"))
    assert seen <= allowed and len(seen) >= 3, seen


# ---------------------------------------------------------------------- the journal itself
def test_only_the_watched_directory_is_journaled(traced: Traced, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    traced.run(f"""
        Path({str(outside)!r}).write_bytes(b"elsewhere")
        (D / "inside").write_bytes(b"here")
    """)  # fmt: skip
    records = list(read_journal(traced.journal))
    assert {r.payload for r in records if r.type == OPEN} == {b"inside"}
    assert outside.read_bytes() == b"elsewhere"


def test_calls_the_model_cannot_replay_make_the_rebuild_refuse(traced: Traced) -> None:
    traced.run("""
        import mmap
        fd = os.open(D / "m", os.O_RDWR)
        with mmap.mmap(fd, 4) as m:
            m[:2] = b"zz"
    """, before={"m": b"abcd"})  # fmt: skip
    with pytest.raises(ModelError, match="shared writable mapping"):
        traced.rebuild()


def write_journal(path: Path, records: list[tuple[int, int, int, int, bytes]]) -> None:
    """Records as powerloss.c writes them: (type, a, b, c, payload)."""
    with path.open("wb") as f:
        for kind, a, b, c, payload in records:
            f.write(struct.pack("<IHHqqq", 32 + len(payload), kind, 0, a, b, c) + payload)


def test_an_fsync_covers_only_what_was_written_before_it_began(traced: Traced) -> None:
    (traced.dir / "f").write_bytes(b"")
    snapshot(traced.dir, traced.snap)
    ino = (traced.dir / "f").stat().st_ino
    write_journal(traced.journal, [
        (OPEN, 3, os.O_RDWR, ino, b"f"),
        (WRITE, 3, 0, 0, b"before"),
        (SYNC_BEGIN, 3, 1, 0, b""),
        (WRITE, 3, 6, 0, b"-during"),  # written while the fsync ran
        (SYNC_END, 3, 1, 0, b""),
        (SYNC_BEGIN, 3, 2, 0, b""),  # the power went during this one
        (CLOSE, 3, 0, 0, b""),
    ])  # fmt: skip
    assert traced.after() == {"f": b"before"}
    with traced.journal.open("ab") as f:  # a record the kill cut short is ignored
        f.write(struct.pack("<IHHqqq", 40, SYNC_END, 0, 3, 2, 0)[:20])
    assert traced.after() == {"f": b"before"}


def test_the_rebuild_counts_what_it_dropped(traced: Traced) -> None:
    traced.run("""
        fd = os.open(D / "f", os.O_RDWR)
        os.write(fd, b"12345")
        os.close(os.open(D / "g", os.O_RDWR | os.O_CREAT, 0o644))
    """, before={"f": b""})  # fmt: skip
    stats = traced.stats()
    assert (stats.files, stats.unsynced_writes, stats.unsynced_bytes_lost) == (1, 1, 5)
    assert (stats.unsynced_name_changes, stats.name_changes_lost) == (1, 1)
