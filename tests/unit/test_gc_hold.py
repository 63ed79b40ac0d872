"""Automatic garbage collections held off for a block (mockbroker/gc_hold.py)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from mockbroker.gc_hold import CollectionHold


@pytest.fixture(autouse=True)
def collections_as_they_were() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_collections_are_off_in_the_block_and_back_on_after_it() -> None:
    hold = CollectionHold()
    with hold.held():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_holds_give_collections_back_after_the_last() -> None:
    """Two scrapes at once, in two threads: the first to end leaves them off."""
    hold = CollectionHold()
    first_in, second_done = threading.Event(), threading.Event()
    seen: list[bool] = []

    def second() -> None:
        first_in.wait()
        with hold.held():
            pass
        seen.append(gc.isenabled())
        second_done.set()

    thread = threading.Thread(target=second)
    thread.start()
    with hold.held():
        first_in.set()
        second_done.wait()
    thread.join()
    assert seen == [False]
    assert gc.isenabled()


def test_a_process_with_collections_off_keeps_them_off() -> None:
    gc.disable()
    with CollectionHold().held():
        pass
    assert not gc.isenabled()


def test_a_block_that_raises_gives_collections_back() -> None:
    hold = CollectionHold()
    with pytest.raises(RuntimeError), hold.held():
        raise RuntimeError("scrape failed")
    assert gc.isenabled()
