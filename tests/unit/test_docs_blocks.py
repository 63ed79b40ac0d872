"""The docs runner (tests/docs_blocks.py) sees every block, and a bad block fails."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sybil import Document, Example

from tests.docs_blocks import (
    DOC_PATTERNS,
    ROOT,
    DocsTest,
    fence_count,
    parse_blocks,
    parse_checks,
    xfail_reason,
)


def doc_files() -> list[Path]:
    return sorted(p for pattern in DOC_PATTERNS for p in ROOT.glob(pattern))


def examples(text: str, path: Path) -> list[Example]:
    document = Document(text, str(path))
    for parser in (parse_blocks, parse_checks):
        for region in parser(document):
            document.add(region)
    document.namespace["docs_test"] = DocsTest(
        SimpleNamespace(address="127.0.0.1:1"),  # type: ignore[arg-type]  # never connected
        path.parent,
    )
    return list(document.examples())


def outcome(example: Example) -> str:
    """'passed', 'skipped' or the failure's text."""
    try:
        example.evaluate()
    except pytest.skip.Exception:
        return "skipped"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "passed"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fenced_block_of_the_docs_is_a_test(path: Path) -> None:
    text = path.read_text()
    blocks = [e for e in examples(text, path) if e.region.evaluator is not None]
    checks = text.count("<!-- docs-test-check:") + text.count("<!-- docs-test-setup:")
    assert len(blocks) == fence_count(text) + checks


def test_a_block_that_is_neither_run_nor_exempt_fails(tmp_path: Path) -> None:
    text = "Text.\n\n```ini\n[Unit]\n```\n\n<!-- docs-test: serve -->\n```text\nx\n```\n"
    results = [outcome(e) for e in examples(text, tmp_path / "page.md")]
    assert len(results) == 2
    assert all("neither run nor exempt" in r for r in results), results


def test_an_exemption_needs_a_reason_and_then_skips(tmp_path: Path) -> None:
    text = "<!-- docs-test: skip -->\n```sh\nrm -rf /\n```\n"
    text += "<!-- docs-test: skip a unit file -->\n```ini\n[Unit]\n```\n"
    results = [outcome(e) for e in examples(text, tmp_path / "page.md")]
    assert "needs a reason" in results[0]
    assert results[1] == "skipped"


def test_a_failing_python_block_fails_and_blocks_share_a_namespace(tmp_path: Path) -> None:
    text = "```python\nx = 2\n```\n\n```python\nassert x == 3, 'x is 2'\n```\n"
    results = [outcome(e) for e in examples(text, tmp_path / "page.md")]
    assert results == ["passed", "AssertionError: x is 2"]


def test_a_same_as_block_must_match_its_file(tmp_path: Path) -> None:
    text = "<!-- docs-test: same-as pyproject.toml -->\n```toml\n[project]\n```\n"
    results = [outcome(e) for e in examples(text, tmp_path / "page.md")]
    assert "differs from pyproject.toml" in results[0]


def test_the_reader_s_broker_address_becomes_the_test_broker_s(tmp_path: Path) -> None:
    text = '```python\naddress = "127.0.0.1:8081"\n```\n'
    (example,) = examples(text, tmp_path / "page.md")
    assert outcome(example) == "passed"
    assert example.namespace["address"] == "127.0.0.1:1"


def test_checks_and_blocks_carry_their_xfail_reason(tmp_path: Path) -> None:
    text = (
        "<!-- docs-test: xfail not merged yet -->\n```python\nx = 1\n```\n"
        "<!-- docs-test-check: xfail same\nassert x == 1\n-->\n"
    )
    reasons: list[Any] = [xfail_reason(e.region) for e in examples(text, tmp_path / "page.md")]
    assert reasons == ["not merged yet", "same"]
