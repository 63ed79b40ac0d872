"""Group membership: who expires by silence, and who by a closed connection (fake clock);
who is in a group."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from mockbroker.groups import ConsumerGroups, GroupMembership
from sdk.testing import FakeClock
from tests.fuzzing import machine_settings
from tests.support import KeyedOnly

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


def test_a_groups_members_are_found_without_looking_at_every_client(
    groups: ConsumerGroups,
) -> None:
    """members() reads the group's own set: it is asked for every rebalance query and
    scrape, and once cost a look at every client (O(groups x clients) a scrape)."""
    for n in range(200):
        groups.heartbeat(f"c{n}", {f"g{n % 50}": ORDERLY["g"]})
    groups._clients = KeyedOnly(groups._clients)  # type: ignore[assignment]
    assert groups.members("g7") == ["c107", "c157", "c57", "c7"]
    assert groups.active_groups() == {f"g{n}" for n in range(50)}


MEMBERSHIPS = st.dictionaries(st.sampled_from(["g0", "g1", "g2"]), st.just(ORDERLY["g"]))


class MembershipMachine(RuleBasedStateMachine):
    """Joins, leaves, unregistering and expiry in any order: members(), membership() and
    active_groups() answer what each client's own groups say."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.groups = ConsumerGroups(self.clock, client_timeout_seconds=10)
        self.known: set[str] = set()

    @rule(client=st.sampled_from(["a", "b", "c", "d"]), memberships=MEMBERSHIPS)
    def heartbeat(self, client: str, memberships: dict[str, GroupMembership]) -> None:
        self.groups.heartbeat(client, memberships)
        self.known.add(client)

    @rule(client=st.sampled_from(["a", "b", "c", "d"]))
    def unregister(self, client: str) -> None:
        self.groups.unregister(client)

    @rule(seconds=st.sampled_from([4, 11]))
    def time_passes(self, seconds: int) -> None:
        self.clock.advance(seconds)
        self.groups.expire()

    @invariant()
    def members_are_the_clients_in_the_group(self) -> None:
        joined = {c: self.groups.groups_of(c) for c in self.known}
        for group in ("g0", "g1", "g2"):
            expected = sorted(c for c, in_ in joined.items() if group in in_)
            assert self.groups.members(group) == expected
            assert list(self.groups.membership(group)) == expected
        assert self.groups.active_groups() == {g for in_ in joined.values() for g in in_}


MembershipMachine.TestCase.settings = machine_settings(60, 500, steps=(30, 60))
test_membership_state_machine = MembershipMachine.TestCase
