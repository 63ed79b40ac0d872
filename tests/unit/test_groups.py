"""Group membership: who expires by silence, and who by a closed connection (fake clock)."""

from __future__ import annotations

import pytest

from mockbroker.groups import ConsumerGroups, GroupMembership
from sdk.testing import FakeClock

ORDERLY = {"g": GroupMembership("CONSUME_ORDERLY", "CLUSTERING", (("t", "*"),))}
PEER_A, PEER_B = "ipv4:10.0.0.1:50001", "ipv4:10.0.0.2:50002"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def groups(clock: FakeClock) -> ConsumerGroups:
    return ConsumerGroups(clock, client_timeout_seconds=120, disconnect_grace_seconds=5)


def connect(groups: ConsumerGroups, client_id: str, peer: str) -> None:
    """A consumer as the SDK runs one: a heartbeat, then its membership watch."""
    groups.heartbeat(client_id, ORDERLY, peer)
    groups.stream_opened(peer)


def test_a_client_whose_connection_closed_expires_after_the_grace(
    groups: ConsumerGroups, clock: FakeClock
) -> None:
    connect(groups, "a", PEER_A)
    connect(groups, "b", PEER_B)
    version = groups.version("g")
    groups.stream_closed(PEER_A)  # a's process died
    clock.advance(5)
    assert groups.expire() == {}
    clock.advance(0.5)
    assert groups.expire() == {"a": "disconnected 6 s ago, not back"}
    assert groups.members("g") == ["b"]
    assert groups.version("g") == version + 1  # the others rebalance


def test_a_client_that_heartbeats_again_after_a_disconnect_stays(
    groups: ConsumerGroups, clock: FakeClock
) -> None:
    connect(groups, "a", PEER_A)
    groups.stream_closed(PEER_A)
    clock.advance(3)
    connect(groups, "a", PEER_B)  # reconnected: a new connection, a new peer address
    clock.advance(60)
    assert groups.expire() == {}
    assert groups.members("g") == ["a"]


def test_a_connection_with_a_stream_still_open_is_not_closed(
    groups: ConsumerGroups, clock: FakeClock
) -> None:
    # Two clients of one process share its connection; one shuts down: it unregisters,
    # and its stream ends. The other's stream keeps the connection open.
    connect(groups, "a", PEER_A)
    connect(groups, "b", PEER_A)
    groups.unregister("a")
    groups.stream_closed(PEER_A)
    clock.advance(60)
    assert groups.expire() == {}
    assert groups.members("g") == ["b"]
    groups.stream_closed(PEER_A)  # then the process dies
    clock.advance(6)
    assert list(groups.expire()) == ["b"]


def test_a_paused_client_keeps_its_connection_and_expires_only_by_silence(
    groups: ConsumerGroups, clock: FakeClock
) -> None:
    connect(groups, "a", PEER_A)  # SIGSTOP: no heartbeat, but the stream stays open
    clock.advance(120)
    assert groups.expire() == {}
    clock.advance(1)
    assert groups.expire() == {"a": "silent for 121 s"}


def test_streams_ended_by_the_broker_stopping_are_no_disconnect(
    groups: ConsumerGroups, clock: FakeClock
) -> None:
    connect(groups, "a", PEER_A)
    groups.close()
    groups.stream_closed(PEER_A)
    clock.advance(6)
    assert groups.expire() == {}


def test_a_client_never_seen_on_a_stream_expires_only_by_silence(
    groups: ConsumerGroups, clock: FakeClock
) -> None:
    groups.heartbeat("tool", ORDERLY, PEER_A)  # heartbeats only (the CLI does that)
    groups.stream_opened(PEER_B)
    groups.stream_closed(PEER_B)
    clock.advance(60)
    assert groups.expire() == {}
