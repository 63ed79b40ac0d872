from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig, EmbeddedBroker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """An embedded broker on port 0 with its data in a temporary directory."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker")) as b:
        yield b


@pytest.fixture
def sync_broker(tmp_path: Path) -> Iterator[EmbeddedBroker]:
    """Like `broker`, in sync flush mode."""
    with EmbeddedBroker(BrokerConfig(data_dir=tmp_path / "broker", flush_mode="sync")) as b:
        yield b
