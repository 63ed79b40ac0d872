"""Fixtures the unit tests share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A fresh event loop, for tests that drive the store's coroutines step by step."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
