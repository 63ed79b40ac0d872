"""README.md and docs/*.md are test files: every code block in them runs (tests/docs_blocks.py).

This conftest sits at the root because pytest asks a conftest to collect only the files
below it.
"""

from tests.docs_blocks import docs_test, pytest_collect_file, pytest_collection_modifyitems

__all__ = ["docs_test", "pytest_collect_file", "pytest_collection_modifyitems"]
