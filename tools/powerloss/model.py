"""What a power cut leaves of a directory: rebuilt from the journal powerloss.so wrote.

A process runs with tools/powerloss/powerloss.c preloaded (`environment()`), which appends
every change it makes under one directory to a journal: opens that create or truncate,
writes with their bytes, truncations, renames, unlinks, mkdirs, rmdirs, closes, and each
fsync/fdatasync as a begin and an end record. The process is then killed with SIGKILL (the
power cut; the page cache that a kill keeps is what this throws away). `rebuild()` replays
the journal over a snapshot of the directory taken before the process started, and writes
the directory as the disk would hold it after the power came back.

The model, that is, what the disk and file system are assumed to guarantee and no more:

1. Bytes written to a file (and its size) are durable once an fsync or fdatasync of that
   file began after the write returned, and returned successfully. A sync the process was
   killed in covers nothing. fdatasync counts as fsync: it persists the size too.
2. A name (a file created, renamed or unlinked; a directory made or removed) is durable
   once its directory was fsynced after the change. Syncing a file does not make its name
   durable (POSIX does not say so; ext4 often does it, nothing promises it). A rename
   within a directory is one atomic change; across directories it is two, one in each.
   A file whose name did not survive is gone, synced data and all.
3. Every change that no sync covered may be lost. The mode picks what survives of them:
   - "synced": nothing (the least a disk keeps);
   - "prefix": per file, a random prefix of its unsynced writes and truncations, in the
     order they were made, the last kept write possibly cut at a 512-byte sector;
   - "reorder": per file, each 4 KiB page as it was after a random prefix of the unsynced
     changes that touched it, and the size after another (the kernel writes dirty pages
     back in any order, each page whole, holding every write made to it before);
   and in the two last modes, per directory, a random prefix of its unsynced name changes
   (journaling file systems commit metadata in order).
4. Never-written bytes below a file's size read as zeros (a hole).
5. The snapshot is durable, and nothing but the traced process changes the directory while
   it runs. Not modelled: bit flips and disks that lie about fsync (the corruption tests
   cover damaged files), permissions and times, hard links and symlinks, mmap, fallocate.
   The preload records calls it cannot model (a shared writable mmap, a dup of a watched
   descriptor, ...) and `rebuild()` then refuses with ModelError rather than guess.

    python tools/powerloss/model.py snapshot DIR SNAPSHOT
    python tools/powerloss/model.py rebuild SNAPSHOT JOURNAL OUT [--mode M] [--seed N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("powerloss.c")
MODES = ("synced", "prefix", "reorder")
DIR_ENV = "ORDERMQ_POWERLOSS_DIR"
JOURNAL_ENV = "ORDERMQ_POWERLOSS_JOURNAL"
SYNC_DELAY_ENV = "ORDERMQ_POWERLOSS_SYNC_US"
_MANIFEST = "inodes.json"
_TREE = "tree"
_SECTOR = 512
_PAGE = 4096

_HEADER = struct.Struct("<IHHqqq")
(OPEN, WRITE, FTRUNCATE, TRUNCATE, SYNC_BEGIN, SYNC_END, CLOSE, RENAME, UNLINK, MKDIR, RMDIR,
 UNSUPPORTED) = range(1, 13)  # fmt: skip
_CREATED, _DIRECTORY = 1, 2


class ModelError(Exception):
    """The journal holds something the model cannot replay faithfully."""


class NoCompilerError(Exception):
    """No C compiler to build the preload library with."""


# ------------------------------------------------------------------ the preload library
def build(cache: Path | None = None) -> Path:
    """Compile powerloss.c (once per source version) and return the shared library's path."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise NoCompilerError("no C compiler (gcc or cc) to build the power-loss layer")
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    cache = cache or Path(tempfile.gettempdir()) / f"ordermq-powerloss-{os.getuid()}"
    library = cache / f"powerloss-{digest}.so"
    if library.exists():
        return library
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".{library.name}.{os.getpid()}"
    cmd = [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
           "-o", str(partial), str(SOURCE), "-ldl", "-lpthread"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr}")
    partial.replace(library)  # atomic: a concurrent build finds a whole file or none
    return library


def environment(
    library: Path, directory: Path, journal: Path, sync_delay_ms: float = 0.0
) -> dict[str, str]:
    """The environment variables that trace a process's changes under `directory`.

    `sync_delay_ms`: each fsync of a traced file takes that much longer, as on a slow disk.
    """
    return {
        "LD_PRELOAD": str(library),
        DIR_ENV: os.path.realpath(directory),
        JOURNAL_ENV: str(journal),
        SYNC_DELAY_ENV: str(round(sync_delay_ms * 1000)),
    }


# ------------------------------------------------------------------ the snapshot
def snapshot(directory: Path, into: Path) -> None:
    """Copy `directory` to `into` with the inode numbers the journal will refer to."""
    inodes: dict[str, int] = {"": directory.stat().st_ino}
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            inodes[path.relative_to(directory).as_posix()] = path.lstat().st_ino
    into.mkdir(parents=True)
    shutil.copytree(directory, into / _TREE, symlinks=True)
    (into / _MANIFEST).write_text(json.dumps(inodes))


# ------------------------------------------------------------------ the journal
@dataclass(frozen=True)
class Record:
    """One journal record (see powerloss.c)."""

    seq: int
    type: int
    flags: int
    a: int
    b: int
    c: int
    payload: bytes


def read_journal(path: Path) -> Iterator[Record]:
    """The journal's records in order; a record the kill cut short is left out."""
    data = path.read_bytes() if path.exists() else b""
    at, seq = 0, 0
    while at + _HEADER.size <= len(data):
        size, kind, flags, a, b, c = _HEADER.unpack_from(data, at)
        if size < _HEADER.size or at + size > len(data):
            break
        yield Record(seq, kind, flags, a, b, c, data[at + _HEADER.size : at + size])
        at += size
        seq += 1


# ------------------------------------------------------------------ the replay
@dataclass(frozen=True)
class Write:
    """Bytes written at an offset of a file."""

    offset: int
    data: bytes


@dataclass(frozen=True)
class Truncate:
    """A file cut (or extended with zeros) to a length."""

    length: int


Op = Write | Truncate
Change = tuple[str, "Node | None"]  # a name set to a node, or removed (None)


@dataclass(eq=False)
class Node:
    """A file or directory: what is durable of it, and the changes made since."""

    ino: int
    is_dir: bool
    data: bytearray = field(default_factory=bytearray)
    #: Files: the changes no sync covered yet, with their journal positions.
    pending: list[tuple[int, Op]] = field(default_factory=list)
    #: Directories: the durable names, the names now, and unsynced changes of names.
    entries: dict[str, Node] = field(default_factory=dict)
    names: dict[str, Node] = field(default_factory=dict)
    changes: list[tuple[int, list[Change]]] = field(default_factory=list)

    def sync(self, before: int) -> None:
        """An fsync that began at journal position `before` returned."""
        if self.is_dir:
            for _, change in (c for c in self.changes if c[0] < before):
                _apply_names(self.entries, change)
            self.changes = [c for c in self.changes if c[0] >= before]
        else:
            for _, op in (p for p in self.pending if p[0] < before):
                _apply(self.data, op)
            self.pending = [p for p in self.pending if p[0] >= before]

    def change(self, seq: int, change: list[Change]) -> None:
        """Change names of this directory now; durable after its next sync."""
        _apply_names(self.names, change)
        self.changes.append((seq, change))


def _apply_names(names: dict[str, Node], change: list[Change]) -> None:
    for name, node in change:
        if node is None:
            names.pop(name, None)
        else:
            names[name] = node


def _apply(data: bytearray, op: Op) -> None:
    if isinstance(op, Truncate):
        if op.length < len(data):
            del data[op.length :]
        else:
            data.extend(bytes(op.length - len(data)))
    else:
        if len(data) < op.offset:
            data.extend(bytes(op.offset - len(data)))
        data[op.offset : op.offset + len(op.data)] = op.data


@dataclass
class Replay:
    """The journal replayed over a snapshot: every node, durable part and pending part."""

    root: Node
    records: int = 0
    syncs: int = 0
    _fds: dict[int, Node] = field(default_factory=dict)
    _open_syncs: dict[int, tuple[Node, int]] = field(default_factory=dict)

    @classmethod
    def load(cls, snap: Path) -> Replay:
        """The snapshot's tree as durable nodes."""
        inodes: dict[str, int] = json.loads((snap / _MANIFEST).read_text())
        tree = snap / _TREE
        root = Node(inodes[""], True)
        nodes = {"": root}
        for rel in sorted(inodes, key=lambda r: r.count("/")):
            if not rel:
                continue
            path = tree / rel
            node = Node(inodes[rel], path.is_dir())
            if not node.is_dir:
                node.data = bytearray(path.read_bytes())
            parent = nodes[rel.rpartition("/")[0]]
            name = rel.rpartition("/")[2]
            parent.entries[name] = parent.names[name] = node
            nodes[rel] = node
        return cls(root)

    def run(self, journal: Path) -> None:
        """Replay every record of `journal`."""
        for record in read_journal(journal):
            self.records += 1
            self._step(record)

    def _step(self, r: Record) -> None:
        if r.type == OPEN:
            self._open(r)
        elif r.type == WRITE:
            self._fd(r).pending.append((r.seq, Write(r.b, r.payload)))
        elif r.type == FTRUNCATE:
            self._fd(r).pending.append((r.seq, Truncate(r.b)))
        elif r.type == TRUNCATE:
            self._lookup(r.payload.decode()).pending.append((r.seq, Truncate(r.b)))
        elif r.type == SYNC_BEGIN:
            self._open_syncs[r.b] = (self._fd(r), r.seq)
        elif r.type == SYNC_END:
            node, began = self._open_syncs.pop(r.b)
            node.sync(began)
            self.syncs += 1
        elif r.type == CLOSE:
            self._fds.pop(r.a, None)
        elif r.type == RENAME:
            old, new = (p.decode() for p in r.payload.split(b"\0"))
            self._rename(r.seq, old, new)
        elif r.type in (UNLINK, RMDIR):
            parent, name = self._parent(r.payload.decode())
            if name not in parent.names:
                raise ModelError(f"record {r.seq}: removes {r.payload!r}, which is unknown")
            parent.change(r.seq, [(name, None)])
        elif r.type == MKDIR:
            parent, name = self._parent(r.payload.decode())
            parent.change(r.seq, [(name, Node(r.c, True))])
        elif r.type == UNSUPPORTED:
            raise ModelError(f"the traced process made a call the model does not cover: "
                             f"{r.payload.decode(errors='replace')}")  # fmt: skip
        else:
            raise ModelError(f"record {r.seq}: unknown type {r.type}")

    def _open(self, r: Record) -> None:
        rel = r.payload.decode()
        if r.flags & _CREATED:
            parent, name = self._parent(rel)
            node = Node(r.c, bool(r.flags & _DIRECTORY))
            parent.change(r.seq, [(name, node)])
        else:
            node = self._lookup(rel)
            if node.ino != r.c:
                raise ModelError(f"record {r.seq}: {rel!r} is inode {r.c}, the model has "
                                 f"{node.ino}: a change went unrecorded")  # fmt: skip
            if r.b & os.O_TRUNC and not node.is_dir:
                node.pending.append((r.seq, Truncate(0)))
        self._fds[r.a] = node

    def _rename(self, seq: int, old: str, new: str) -> None:
        if old == new:
            return
        src, old_name = self._parent(old)
        dst, new_name = self._parent(new)
        node = src.names.get(old_name)
        if node is None:
            raise ModelError(f"record {seq}: renames {old!r}, which is unknown")
        if src is dst:
            src.change(seq, [(old_name, None), (new_name, node)])
        else:
            src.change(seq, [(old_name, None)])
            dst.change(seq, [(new_name, node)])

    def _fd(self, r: Record) -> Node:
        node = self._fds.get(r.a)
        if node is None:
            raise ModelError(f"record {r.seq}: descriptor {r.a} was never opened")
        return node

    def _lookup(self, rel: str) -> Node:
        node = self.root
        for part in filter(None, rel.split("/")):
            child = node.names.get(part)
            if child is None:
                raise ModelError(f"{rel!r} is not in the model (a change went unrecorded?)")
            node = child
        return node

    def _parent(self, rel: str) -> tuple[Node, str]:
        head, _, name = rel.rpartition("/")
        parent = self._lookup(head)
        if not parent.is_dir or not name:
            raise ModelError(f"{rel!r} has no directory to change")
        return parent, name


# ------------------------------------------------------------------ what survives
@dataclass
class Rebuilt:
    """What a rebuild kept and lost."""

    records: int = 0
    syncs: int = 0
    files: int = 0
    unsynced_writes: int = 0  # writes and truncations no sync covered
    unsynced_bytes_lost: int = 0
    unsynced_name_changes: int = 0
    name_changes_lost: int = 0


@dataclass
class _Survivor:
    mode: str
    rng: random.Random
    stats: Rebuilt
    contents: dict[int, bytes] = field(default_factory=dict)

    def content(self, node: Node) -> bytes:
        key = id(node)
        if key not in self.contents:
            self.contents[key] = self._content(node)
        return self.contents[key]

    def _content(self, node: Node) -> bytes:
        data = bytearray(node.data)
        pending = node.pending
        self.stats.unsynced_writes += len(pending)
        kept = 0
        if self.mode == "prefix":
            n = self.rng.randint(0, len(pending))
            for _, op in pending[:n]:
                _apply(data, op)
            kept = sum(_size(op) for _, op in pending[:n])
            if n < len(pending) and isinstance(torn := pending[n][1], Write):
                kept += self._torn(data, torn)
        elif self.mode == "reorder":
            data, kept = _written_back(data, [op for _, op in pending], self.rng)
        self.stats.unsynced_bytes_lost += sum(_size(op) for _, op in pending) - kept
        return bytes(data)

    def _torn(self, data: bytearray, op: Write) -> int:
        cuts = [c for c in range(1, len(op.data)) if (op.offset + c) % _SECTOR == 0]
        if not cuts or self.rng.random() < 0.5:
            return 0
        cut = self.rng.choice(cuts)
        _apply(data, Write(op.offset, op.data[:cut]))
        return cut

    def names(self, node: Node) -> dict[str, Node]:
        names = dict(node.entries)
        changes = node.changes
        n = 0 if self.mode == "synced" else self.rng.randint(0, len(changes))
        for _, change in changes[:n]:
            _apply_names(names, change)
        self.stats.unsynced_name_changes += len(changes)
        self.stats.name_changes_lost += len(changes) - n
        return names


def _size(op: Op) -> int:
    return len(op.data) if isinstance(op, Write) else 0


def _touched(op: Op, size: int) -> range:
    """The pages whose content `op` changes, on a file of `size` bytes."""
    if isinstance(op, Write):
        return range(op.offset // _PAGE, -(-(op.offset + len(op.data)) // _PAGE))
    return range(op.length // _PAGE, -(-size // _PAGE)) if op.length < size else range(0)


def _written_back(base: bytearray, ops: list[Op], rng: random.Random) -> tuple[bytearray, int]:
    """The file after page-sized write-back in any order; (content, written bytes kept).

    Each 4 KiB page holds what it held after a random prefix of the ops that changed it
    (the page was written back then, or never); the size is that after a random prefix of
    all ops (it is written back on its own).
    """
    touches: dict[int, list[int]] = {}
    sizes = [len(base)]
    for i, op in enumerate(ops):
        for page in _touched(op, sizes[-1]):
            touches.setdefault(page, []).append(i)
        end = op.offset + len(op.data) if isinstance(op, Write) else 0
        sizes.append(max(sizes[-1], end) if isinstance(op, Write) else op.length)
    upto = {p: i[k - 1] + 1 if (k := rng.randint(0, len(i))) else 0 for p, i in touches.items()}
    pages = {p: bytearray(base[p * _PAGE : (p + 1) * _PAGE].ljust(_PAGE, b"\0")) for p in upto}
    kept = 0
    for i, op in enumerate(ops):
        for page in (p for p in _touched(op, sizes[i]) if i < upto[p]):
            lo = page * _PAGE
            buf = pages[page]
            if isinstance(op, Write):
                start, end = max(lo, op.offset), min(lo + _PAGE, op.offset + len(op.data))
                buf[start - lo : end - lo] = op.data[start - op.offset : end - op.offset]
                kept += end - start
            else:  # bytes past a truncation read as zeros if the file grows again
                start = max(lo, op.length) - lo
                buf[start:] = bytes(_PAGE - start)
    size = sizes[rng.randint(0, len(ops))]
    data = bytearray(base).ljust(max([size, len(base)] + [(p + 1) * _PAGE for p in pages]), b"\0")
    for page, buf in pages.items():
        data[page * _PAGE : (page + 1) * _PAGE] = buf
    return data[:size].ljust(size, b"\0"), kept


def rebuild(snap: Path, journal: Path, out: Path, mode: str, rng: random.Random) -> Rebuilt:
    """Write to `out` (new) what a power cut at the journal's end leaves of the snapshot."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    replay = Replay.load(snap)
    replay.run(journal)
    survivor = _Survivor(mode, rng, Rebuilt(replay.records, replay.syncs))
    _materialize(replay.root, out, survivor)
    return survivor.stats


def _materialize(node: Node, path: Path, survivor: _Survivor) -> None:
    if node.is_dir:
        path.mkdir()
        for name, child in sorted(survivor.names(node).items()):
            _materialize(child, path / name, survivor)
    else:
        path.write_bytes(survivor.content(node))
        survivor.stats.files += 1


# ------------------------------------------------------------------ command line
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot", help="copy a directory before a traced run")
    snap.add_argument("directory", type=Path)
    snap.add_argument("snapshot", type=Path)
    again = sub.add_parser("rebuild", help="what a power cut leaves, into a new directory")
    again.add_argument("snapshot", type=Path)
    again.add_argument("journal", type=Path)
    again.add_argument("out", type=Path)
    again.add_argument("--mode", choices=MODES, default="synced")
    again.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "snapshot":
        snapshot(args.directory, args.snapshot)
    else:
        stats = rebuild(args.snapshot, args.journal, args.out, args.mode, random.Random(args.seed))
        print(stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
