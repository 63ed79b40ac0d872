"""Every fenced code block in README.md and docs/ is a test, run by Sybil.

The repository's conftest.py hands README.md and docs/**.md to Sybil's pytest integration
(pytest's `testpaths` names them), so each block is one test item, run in the order of its
file, with the blocks above it in the same namespace: a later block may use what an
earlier one defined, as a reader would.

What happens to a block is set by the HTML comment right above it, visible in the
markdown source (and hidden in the rendered page):

| block | comment above it | the test |
|---|---|---|
| python | none | runs it |
| python, sh | `<!-- docs-test: xfail REASON -->` | runs it, expected to fail (strict) |
| sh | `<!-- docs-test: run -->` | runs it with bash (-e, -o pipefail); exit status 0 |
| sh | `<!-- docs-test: serve -->` | starts each command (a broker); once it serves, SIGTERM |
| python | `<!-- docs-test: sigterm [after "TEXT"] -->` | runs it; SIGTERM once it waits for one |
| any | `<!-- docs-test: same-as PATH -->` | its text equals the repository's file PATH |
| any | `<!-- docs-test: skip REASON -->` | not run, and says why (the reason is required) |
| any other | none | fails, naming the block: mark it |

A `<!-- docs-test-check: [xfail REASON]` comment (python up to its `-->`) runs in its
place, in the same namespace: after a block, to check what the block did (messages
really arrived, say). `<!-- docs-test-setup:` is the same before a block, to make what a
reader would already have (a consumer group, say). Both show in the source, not on the
rendered page.

Each file gets its own broker (`EmbeddedBroker`, a free port, data in a temporary
directory) and runs in a temporary working directory. Blocks address the broker as a
reader's would, `127.0.0.1:8081` or `localhost:8081`: the runner rewrites that address
to the test broker's (and `127.0.0.1:9108`, the metrics port, to its metrics address),
and shell blocks get `ORDERMQ_BROKER` and the virtualenv's `bin` first on PATH. Python
blocks get a `print` that also records what was printed (`docs_test.printed`), even from
listener threads, and `docs_test` itself for checks. Clients a file leaves running are
shut down after its last block, before its broker stops.
"""

from __future__ import annotations

import asyncio
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.evaluators.python import pad
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer, RawFencedCodeBlockLexer

from mockbroker import BrokerConfig, EmbeddedBroker
from sdk._transport.broker_client import BrokerClient

ROOT = Path(__file__).resolve().parent.parent
DOC_PATTERNS = ("README.md", "docs/*.md", "docs/*/*.md")
BROKER_ADDRESSES = ("127.0.0.1:8081", "localhost:8081")
METRICS_ADDRESSES = ("127.0.0.1:9108", "localhost:9108")
PYTHON = {"python", "py", "python3"}
SHELL = {"sh", "bash", "shell", "console"}
MARKER = re.compile(r"<!--[ \t]*docs-test:[ \t]*(?P<verb>[-\w]+)[ \t]*(?P<arg>.*?)[ \t]*-->\s*\Z")
PROGRAM_TIMEOUT = 60.0
WAIT_TIMEOUT = 10.0  # what a check or the runner waits for must come by then


@dataclass(frozen=True)
class Block:
    """One fenced block: its language, its text, and the marker above it (if any)."""

    language: str
    source: str
    verb: str
    arg: str
    line: int


class DocsTest:
    """What the blocks of one file share: the broker, the directory, what was printed."""

    def __init__(self, broker: EmbeddedBroker, workdir: Path) -> None:
        self.broker = broker
        self.address = broker.address
        self.workdir = workdir
        self.printed: list[str] = []
        self.namespace: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def metrics_address(self) -> str:
        """host:port of the broker's metrics endpoint."""
        return f"127.0.0.1:{self.broker.broker.metrics_port}"

    def print(self, *args: Any, **kwargs: Any) -> None:
        """print(), recording the line for checks (listener threads print too)."""
        if kwargs.get("file") is None:
            line = kwargs.get("sep", " ").join(map(str, args))
            with self._lock:
                self.printed.append(line)
        print(*args, **kwargs)

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        """Poll `condition` until it holds; fail after WAIT_TIMEOUT seconds."""
        deadline = time.monotonic() + WAIT_TIMEOUT
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {WAIT_TIMEOUT:.0f} s waiting for {what}")
            time.sleep(0.02)

    def wait_for_printed(self, text: str, count: int = 1) -> list[str]:
        """Wait until `count` printed lines contain `text`; return those lines."""

        def found() -> list[str]:
            with self._lock:
                return [line for line in self.printed if text in line]

        self.wait_for(lambda: len(found()) >= count, f"{count} printed line(s) with {text!r}")
        return found()

    def rewrite(self, source: str) -> str:
        """The block with the reader's broker (and metrics) address replaced by the test's."""
        for address in BROKER_ADDRESSES:
            source = source.replace(address, self.address)
        for address in METRICS_ADDRESSES:
            if address in source:
                source = source.replace(address, self.metrics_address)
        return source

    def env(self) -> dict[str, str]:
        """Environment for shell blocks and programs."""
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "ORDERMQ_BROKER": self.address,
            "PYTHONUNBUFFERED": "1",
        }

    def shutdown_clients(self) -> None:
        """Shut down the SDK clients the blocks left running, the last made first."""
        clients = [v for v in self.namespace.values() if _is_sdk_client(v)]
        for client in reversed(clients):
            client.shutdown()


def _is_sdk_client(value: object) -> bool:
    module = type(value).__module__
    return module.startswith("sdk.") and callable(getattr(value, "shutdown", None))


# ---------------------------------------------------------------------------- parsing
def _marker_above(document: Document, start: int) -> tuple[str, str]:
    """(verb, argument) of the `<!-- docs-test: ... -->` comment ending right above `start`."""
    before = document.text[:start]
    opening = before.rfind("<!--")
    match = MARKER.search(before, opening) if opening >= 0 else None
    if match is None:
        return "", ""
    return match["verb"], match["arg"]


def parse_blocks(document: Document) -> Iterator[Region]:
    """One region per fenced block, whatever its language, with its evaluator."""
    lexer = RawFencedCodeBlockLexer(info_pattern=re.compile(r"(?P<info>[^\n]*)$\n", re.M))
    for region in lexer(document):
        info = region.lexemes["info"].strip()
        verb, arg = _marker_above(document, region.start)
        line = document.text.count("\n", 0, region.start) + 1
        block = Block(info.split()[0] if info else "", region.lexemes["source"], verb, arg, line)
        region.parsed = block
        region.evaluator = evaluator_for(block)
        yield region


def parse_checks(document: Document) -> Iterator[Region]:
    """One region per `<!-- docs-test-check: ... -->` or `<!-- docs-test-setup: ... -->`."""
    lexer = DirectiveInHTMLCommentLexer("docs-test-(?:check|setup)")
    for region in lexer(document):
        arguments = (region.lexemes.get("arguments") or "").strip()
        verb, _, reason = arguments.partition(" ")
        line = document.text.count("\n", 0, region.start) + 1
        block = Block("python", region.lexemes["source"], verb, reason, line)
        region.parsed = block
        region.evaluator = run_python
        yield region


def evaluator_for(block: Block) -> Callable[[Example], str | None]:
    """What the test of `block` does (see the module's table)."""
    language = block.language.lower()
    if block.verb == "skip":
        return skip
    if block.verb == "same-as":
        return same_as
    if language in PYTHON and block.verb in ("", "xfail"):
        return run_python
    if language in PYTHON and block.verb == "sigterm":
        return run_until_sigterm
    if language in SHELL and block.verb in ("run", "xfail"):
        return run_shell
    if language in SHELL and block.verb == "serve":
        return serve
    return unmarked


def xfail_reason(region: Region) -> str | None:
    """The reason of a block's or check's `xfail` marker, None if it has none."""
    block = region.parsed
    if isinstance(block, Block) and block.verb == "xfail":
        return block.arg or "(no reason given)"
    return None


# ---------------------------------------------------------------------------- evaluators
def _docs_test(example: Example) -> DocsTest:
    docs_test = example.namespace["docs_test"]
    assert isinstance(docs_test, DocsTest)
    docs_test.namespace = example.namespace
    return docs_test


def _where(example: Example) -> str:
    block: Block = example.parsed
    path = Path(example.path)
    return f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{block.line}"


def unmarked(example: Example) -> str:
    """A block that is neither run nor exempt: the failure says how to mark it."""
    block: Block = example.parsed
    marker = f"docs-test: {block.verb} {block.arg}".strip() if block.verb else "no marker"
    return (
        f"{_where(example)}: a ```{block.language or '(no language)'} block with {marker} is "
        "neither run nor exempt. Put one of these right above it: <!-- docs-test: run --> "
        "(shell), <!-- docs-test: same-as PATH -->, <!-- docs-test: skip REASON -->"
    )


def skip(example: Example) -> str:
    """An exempt block: the reason shows in pytest's summary."""
    block: Block = example.parsed
    if not block.arg:
        return f"{_where(example)}: docs-test: skip needs a reason"
    pytest.skip(f"{_where(example)}: {block.arg}")


def same_as(example: Example) -> str | None:
    """The block shows a file of the repository exactly."""
    block: Block = example.parsed
    path = ROOT / block.arg
    if not path.is_file():
        return f"{_where(example)}: same-as names {block.arg}, which does not exist"
    if block.source.rstrip() != path.read_text().rstrip():
        return f"{_where(example)}: the block differs from {block.arg}: copy one to the other"
    return None


def run_python(example: Example) -> None:
    """Run the block in the file's namespace, with the test broker's address."""
    __tracebackhide__ = True
    docs_test = _docs_test(example)
    block: Block = example.parsed
    example.namespace.setdefault("print", docs_test.print)
    source = pad(docs_test.rewrite(block.source), block.line)
    exec(compile(source, example.path, "exec", dont_inherit=True), example.namespace)
    example.namespace.pop("__builtins__", None)


def _failed(example: Example, what: str, proc: subprocess.CompletedProcess[str]) -> str:
    return (
        f"{_where(example)}: {what} exited with {proc.returncode}\n"
        f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )


def run_shell(example: Example) -> str | None:
    """Run the block with bash in the file's directory; every command must succeed."""
    docs_test = _docs_test(example)
    block: Block = example.parsed
    script = "set -euo pipefail\n" + docs_test.rewrite(block.source)
    proc = subprocess.run(
        ["bash", "-c", script], cwd=docs_test.workdir, env=docs_test.env(),
        capture_output=True, text=True, timeout=PROGRAM_TIMEOUT,
    )  # fmt: skip
    return _failed(example, "the block", proc) if proc.returncode else None


def _commands(source: str) -> Iterable[str]:
    """The block's commands: lines without comments, `\\` continuations joined."""
    joined = source.replace("\\\n", " ")
    for line in joined.splitlines():
        command = line.split(" #", 1)[0].strip()
        if command and not command.startswith("#"):
            yield command


def _own_port(command: str) -> str:
    """The command with its ports replaced by 0 (free ones), so nothing clashes."""
    command = re.sub(r"--port[ =]\d+", "--port 0", command)
    command = re.sub(r"--metrics-port[ =]\d+", "--metrics-port 0", command)
    command = re.sub(r"--(remoting|namesrv|v2)-port[ =]\d+", r"--\1-port 0", command)
    return command if "--port" in command else command + " --port 0"


def serve(example: Example) -> str | None:
    """Start each command of the block (a broker), wait until it serves, stop it cleanly."""
    docs_test = _docs_test(example)
    block: Block = example.parsed
    for command in _commands(block.source):
        proc = subprocess.Popen(
            ["bash", "-c", "exec " + _own_port(command)], cwd=docs_test.workdir,
            env=docs_test.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], WAIT_TIMEOUT)
        line = proc.stdout.readline() if ready else ""
        if line.startswith("mockbroker listening on "):
            # The broker prints its ready line just before it installs its SIGTERM handler;
            # once it has answered a call, its loop is past that point.
            asyncio.run(_broker_status(line.split()[-1]))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=PROGRAM_TIMEOUT)
        if not line.startswith("mockbroker listening on "):
            return f"{_where(example)}: `{command}` did not serve: {line!r}\n{err}"
        if proc.returncode:
            return f"{_where(example)}: `{command}` stopped with {proc.returncode}\n{err}"
    return None


async def _broker_status(address: str) -> None:
    client = BrokerClient(address)
    try:
        await client.broker_status()
    finally:
        await client.close()


def run_until_sigterm(example: Example) -> str | None:
    """Run the block; once it waits for SIGTERM (its handler is in place), send it one.

    With `sigterm after "TEXT"`, only once the block has also printed TEXT (a listener
    got its messages); after WAIT_TIMEOUT without it, SIGTERM ends the wait anyway and the
    test fails. Until the block's handler is in place the runner's own takes SIGTERM, so
    neither the default action nor ordermq's exit handler can end the test process.
    """
    docs_test = _docs_test(example)
    block: Block = example.parsed
    after = re.fullmatch(r"(?:after\s+\"(?P<text>.*)\")?", block.arg)
    if after is None:
        return f'{_where(example)}: sigterm takes `after "TEXT"`, not {block.arg!r}'
    early: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: early.append(signum))
    ours = signal.getsignal(signal.SIGTERM)
    done = threading.Event()
    missing: list[str] = []

    def printed() -> bool:
        return after["text"] is None or any(after["text"] in line for line in docs_test.printed)

    def send_once_waiting() -> None:
        deadline = time.monotonic() + WAIT_TIMEOUT
        while not done.wait(0.01):
            if signal.getsignal(signal.SIGTERM) is ours:
                continue
            if printed() or time.monotonic() > deadline:
                if not printed():
                    missing.append(after["text"])
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGTERM)
                return

    sender = threading.Thread(target=send_once_waiting, name="docs-sigterm")
    sender.start()
    try:
        run_python(example)
    finally:
        done.set()
        sender.join()
        signal.signal(signal.SIGTERM, previous)
    if early:
        return f"{_where(example)}: SIGTERM came before the block waited for it"
    if missing:
        return f"{_where(example)}: the block never printed {missing[0]!r}"
    return None


# ---------------------------------------------------------------------------- pytest
SYBIL = Sybil(
    parsers=[parse_blocks, parse_checks],
    patterns=DOC_PATTERNS,
    path=str(ROOT),
    fixtures=["docs_test"],
)
#: pytest's hook that makes README.md and docs/*.md test files (conftest.py exports it).
pytest_collect_file = SYBIL.pytest()


@pytest.fixture(scope="module")
def docs_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsTest]:
    """One per markdown file: a broker, a working directory, what its blocks printed."""
    workdir = tmp_path_factory.mktemp("docs")
    config = BrokerConfig(data_dir=workdir / ".broker", metrics_port=0)
    with EmbeddedBroker(config) as broker, pytest.MonkeyPatch.context() as mp:
        mp.chdir(workdir)
        env = DocsTest(broker, workdir)
        try:
            yield env
        finally:
            env.shutdown_clients()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Blocks and checks marked `xfail REASON` are strict xfails; all are marked `docs`."""
    for item in items:
        example = getattr(item, "example", None)
        if not isinstance(example, Example):
            continue
        item.add_marker(pytest.mark.docs)
        if (reason := xfail_reason(example.region)) is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def fence_count(text: str) -> int:
    """Fenced blocks in a markdown text, counted independently of Sybil's lexer."""
    count, fence = 0, ""
    for line in text.splitlines():
        stripped = line.strip()
        if not fence:
            if m := re.match(r"(`{3,}|~{3,})", stripped):
                fence, count = m.group(1), count + 1
        elif stripped.startswith(fence) and not stripped[len(fence) :].strip():
            fence = ""
    return count
