"""BusyPollSelector: the standalone broker's waits poll first while requests come densely,
and sleep as a plain epoll wait does once they do not (the clock is a fake)."""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mockbroker import BrokerConfig
from mockbroker.__main__ import _broker_loop, build_parser, parse_args
from mockbroker.busy_poll import BusyPollSelector, PollingEventLoop, ThreadWork, available_cores
from mockbroker.metrics import busy_poll_families

SPIN = 0.0004


class Ticks:
    """A clock that moves `step` seconds each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0
        self.step = 0.00005

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def ticks() -> Ticks:
    return Ticks()


@pytest.fixture
def selector(pair: tuple[socket.socket, socket.socket], ticks: Ticks) -> Iterator[BusyPollSelector]:
    """A selector spinning SPIN on the clock `ticks`, watching pair[0] for reads."""
    selector = BusyPollSelector(SPIN, timer=ticks)
    selector.register(pair[0], 1)  # EVENT_READ
    yield selector
    selector.close()


def test_what_is_ready_is_found_while_spinning(
    pair: tuple[socket.socket, socket.socket], selector: BusyPollSelector
) -> None:
    pair[1].send(b"x")
    assert [key.fileobj for key, _ in selector.select(None)] == [pair[0]]
    assert (selector.spins_hit, selector.spins_missed) == (1, 0)


def test_a_quiet_spin_stops_the_spinning_until_a_wait_ends_within_a_spin(
    pair: tuple[socket.socket, socket.socket], ticks: Ticks, selector: BusyPollSelector
) -> None:
    assert selector.select(0.002) == [], "nothing came: the spin, then the rest of the wait"
    assert (selector.spins_hit, selector.spins_missed) == (0, 1)
    assert ticks.now >= SPIN, "it spun a whole spin first"
    pair[1].send(b"x")
    reads = ticks.now
    assert selector.select(None)
    assert ticks.now - reads <= 3 * ticks.step, "no spin: one wait, read the clock twice"
    assert (selector.spins_hit, selector.spins_missed) == (0, 1)
    pair[0].recv(1)
    pair[1].send(b"x")  # that wait ended within a spin: the next one spins again
    assert selector.select(None)
    assert (selector.spins_hit, selector.spins_missed) == (1, 1)


def test_a_wait_longer_than_a_spin_keeps_it_from_spinning(
    pair: tuple[socket.socket, socket.socket], ticks: Ticks, selector: BusyPollSelector
) -> None:
    assert selector.select(0.002) == []
    pair[1].send(b"x")
    ticks.step = 2 * SPIN  # the wait seems to take longer than a spin
    assert selector.select(None)
    ticks.step = 0.00005
    pair[0].recv(1)
    assert selector.select(0.001) == []
    assert (selector.spins_hit, selector.spins_missed) == (0, 1), "no spin after a long wait"


def test_a_timer_due_within_a_spin_ends_the_wait_and_spinning_goes_on(
    pair: tuple[socket.socket, socket.socket], ticks: Ticks, selector: BusyPollSelector
) -> None:
    assert selector.select(SPIN / 4) == []
    assert ticks.now < SPIN, "the wait ended at its timeout, within the spin"
    assert selector.spins_missed == 0
    pair[1].send(b"x")
    assert selector.select(None)
    assert selector.spins_hit == 1, "still spinning"


def test_zero_turns_spinning_off_and_a_zero_timeout_never_spins(
    pair: tuple[socket.socket, socket.socket], ticks: Ticks, selector: BusyPollSelector
) -> None:
    off = BusyPollSelector(0, timer=ticks)
    try:
        off.register(pair[0], 1)
        assert off.select(0.001) == []
        assert ticks.now == 0.0, "a plain epoll wait: the clock is not read"
    finally:
        off.close()
    assert selector.select(0) == []
    assert (selector.spins_hit, selector.spins_missed, ticks.now) == (0, 0, 0.0)


def test_no_spin_starts_while_threads_have_work_and_the_count_follows_the_work(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    threads = ThreadWork()
    ticks = Ticks()
    selector = BusyPollSelector(SPIN, timer=ticks, may_spin=threads.idle)
    selector.register(pair[0], 1)
    release = threading.Event()
    try:
        running = threads.submit(release.wait, 10)
        assert not threads.idle()
        pair[1].send(b"x")
        assert selector.select(None)
        assert (selector.spins_hit, selector.spins_missed) == (0, 0), "a plain wait"
        release.set()
        assert running.result(10) is True
        with pytest.raises(ZeroDivisionError):
            threads.submit(lambda: 1 // 0).result(10)
        assert threads.idle(), "finished work, failed work too, is not counted"
        assert selector.select(None)
        assert selector.spins_hit == 1, "spinning again"
    finally:
        release.set()
        threads.shutdown()
        selector.close()


def test_the_standalone_broker_loop_spins_as_configured_and_the_option_is_checked() -> None:
    assert BrokerConfig().busy_poll_us == 400
    config = parse_args(["--data-dir", "x", "--busy-poll-us", "250"])
    assert config.busy_poll_us == 250
    loop = _broker_loop(config, cores=lambda: 2.0)
    try:
        assert isinstance(loop, PollingEventLoop)
        selector = loop.busy_poll
        assert loop._selector is selector and selector.spin_seconds == 0.00025  # type: ignore[attr-defined]
        threads = loop._default_executor  # type: ignore[attr-defined]
        assert isinstance(threads, ThreadWork) and selector._may_spin == threads.idle
    finally:
        loop.close()
    with pytest.raises(ValueError, match=r"busy_poll_us must be within 0\.\.10000"):
        BrokerConfig(busy_poll_us=-1)
    assert build_parser().parse_args(["--data-dir", "x", "--busy-poll-us", "0"]).busy_poll_us == 0


def test_the_cores_are_the_affinity_capped_by_a_containers_cpu_quota(tmp_path: Path) -> None:
    affinity = float(len(os.sched_getaffinity(0)))
    assert available_cores(tmp_path) == affinity, "no cgroup files: the affinity"
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path) == affinity, "v2, no quota"
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert available_cores(tmp_path) == min(affinity, 0.5), "v2: half a core"
    (tmp_path / "cpu.max").write_text("50000 0\n")
    assert available_cores(tmp_path) == affinity, "a period of 0 read as no quota"
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cores(tmp_path) == affinity, "v1, no quota"
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert available_cores(tmp_path) == min(affinity, 1.0), "v1: one core"


def test_with_fewer_than_two_cores_the_standalone_broker_does_not_spin(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "ordermq.broker")
    config = BrokerConfig()
    for cores, spin in ((1.0, 0.0), (1.5, 0.0), (2.0, 0.0004)):
        loop = _broker_loop(config, cores=lambda cores=cores: cores)
        try:
            assert isinstance(loop, PollingEventLoop) and loop.busy_poll.spin_seconds == spin
        finally:
            loop.close()
    assert "busy polling off: 1.5 core(s) to run on" in caplog.text


def test_the_metrics_say_the_spin_and_how_often_it_paid(
    selector: BusyPollSelector, pair: tuple[socket.socket, socket.socket]
) -> None:
    pair[1].send(b"x")
    assert selector.select(1.0)  # found while spinning
    pair[0].recv(1)
    assert selector.select(0.01) == []  # a quiet spin: missed, then the wait
    spin, spins = busy_poll_families(selector)
    assert (spin.name, spin.type, spin.samples[0].value) == (
        "ordermq_busy_poll_spin_seconds",
        "gauge",
        SPIN,
    )
    assert spins.type == "counter"
    assert {s.labels["outcome"]: s.value for s in spins.samples} == {"hit": 1, "missed": 1}
