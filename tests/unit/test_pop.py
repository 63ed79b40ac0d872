"""The pop core rule by rule: receive, ack, change invisible duration, expiry, DLQ, FIFO,
limits, durability; on a real store in a temporary directory and a FakeClock."""

from __future__ import annotations

import asyncio
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from grpc import StatusCode

from mockbroker.errors import BrokerError
from mockbroker.pop import PopService, Received
from mockbroker.pop.journal import STATE_FILE
from mockbroker.pop.receipts import Receipt, parse_receipt
from mockbroker.topics import Topic
from sdk._wire import encode_frame
from sdk.errors import CorruptFileError
from tests.unit.pop_world import PopWorld, record_of


@pytest.fixture
def world(tmp_path: Path) -> Iterator[PopWorld]:
    w = PopWorld(tmp_path / "broker")
    yield w
    w.close()


def bodies(got: list[Received]) -> list[bytes]:
    return [record_of(r).body for r in got]


def refused(world: PopWorld, call: object) -> BrokerError:
    with pytest.raises(BrokerError) as caught:
        world.run(call)  # type: ignore[arg-type]
    return caught.value


# ---------------------------------------------------------------------------- visibility
def test_a_received_message_is_invisible_until_its_deadline_then_comes_back(
    world: PopWorld,
) -> None:
    world.send(0, b"job")
    [first] = world.receive(invisible=30)
    assert (first.attempt, first.invisible_until_ms) == (1, int((world.clock.now() + 30) * 1000))
    assert world.receive() == []
    world.advance(29.999)
    assert world.receive() == [], "still within its time-to-run"
    world.advance(0.001)
    [again] = world.receive()
    assert (again.offset, again.attempt, bodies([again])) == (first.offset, 2, [b"job"])
    assert again.receipt != first.receipt


def test_an_acked_message_never_comes_back_and_the_offset_moves_over_the_acked_prefix(
    world: PopWorld,
) -> None:
    world.send(0, b"a", b"b", b"c")
    a, b, _c = world.receive(queue_ids=[0])
    world.ack(b)
    world.run(world.pop.commit_offsets())
    assert world.committed() == 0, "offset 0 is not settled: the offset stays before it"
    world.ack(a)
    world.run(world.pop.commit_offsets())
    assert world.committed() == 2
    world.advance(60)
    assert bodies(world.receive()) == [b"c"]
    world.advance(60)
    assert [r.offset for r in world.receive()] == [2]


def test_an_ack_after_the_deadline_is_refused_as_expired_and_the_message_comes_back(
    world: PopWorld,
) -> None:
    world.send(0, b"slow")
    [late] = world.receive(invisible=5)
    world.advance(5)
    error = refused(world, world.pop.ack("g", late.receipt))
    assert (error.status, error.reason) == (StatusCode.FAILED_PRECONDITION, "RECEIPT_EXPIRED")
    [again] = world.receive()
    assert again.attempt == 2
    error = refused(world, world.pop.ack("g", late.receipt))
    assert error.reason == "RECEIPT_EXPIRED", "still expired once redelivered"
    world.ack(again)


def test_an_expired_lease_not_yet_swept_is_expired_too(world: PopWorld) -> None:
    world.send(0, b"x")
    [got] = world.receive(invisible=1)
    world.clock.advance(1)  # no sweep: the lease ran out all the same
    assert refused(world, world.pop.ack("g", got.receipt)).reason == "RECEIPT_EXPIRED"


def test_acks_are_idempotent_while_the_receipt_is_good_or_settled_the_message(
    world: PopWorld,
) -> None:
    world.send(0, b"a", b"b")
    a, b = world.receive(queue_ids=[0], invisible=10)
    world.ack(a)
    before = world.pop.describe()
    world.ack(a)
    assert world.pop.describe() == before
    world.ack(b)  # the window moves past both: a's receipt is no longer remembered
    after = world.pop.describe()
    world.ack(a)  # below the group's base, and not expired: settled, fine
    assert world.pop.describe() == after
    world.advance(10)
    assert refused(world, world.pop.ack("g", a.receipt)).reason == "RECEIPT_EXPIRED"


def test_a_batch_of_acks_settles_the_good_receipts_and_answers_each_refusal(
    world: PopWorld,
) -> None:
    world.send(0, b"a", b"b", b"c")
    a, b, c = world.receive(queue_ids=[0])
    answers = world.run(world.pop.ack_many("g", [a.receipt, "junk", c.receipt, a.receipt]))
    assert [e.reason if e else None for e in answers] == [
        None,
        "INVALID_RECEIPT_HANDLE",
        None,
        None,
    ]
    world.advance(10)
    assert [(r.offset, r.attempt) for r in world.receive()] == [(b.offset, 2)]


def test_a_repeated_ack_of_an_expired_receipt_that_did_not_settle_is_expired(
    world: PopWorld,
) -> None:
    world.send(0, b"a")
    [first] = world.receive(invisible=5)
    world.advance(5)
    [second] = world.receive(invisible=5)
    world.ack(second)
    assert refused(world, world.pop.ack("g", first.receipt)).reason == "RECEIPT_EXPIRED"
    world.ack(second)  # the settling receipt again: fine


def test_an_ack_below_the_groups_offset_after_a_restart_is_answered_ok(world: PopWorld) -> None:
    world.send(0, b"a")
    [a] = world.receive(invisible=60)
    world.ack(a)
    world.restart()  # the window is forgotten once the offsets hold it
    world.ack(a)


# ---------------------------------------------------------------------------- receipts
def test_a_change_of_invisible_duration_extends_the_lease_under_a_new_receipt(
    world: PopWorld,
) -> None:
    world.send(0, b"long job")
    [got] = world.receive(invisible=10)
    world.advance(8)
    renewed = world.run(world.pop.change_invisible_duration("g", got.receipt, 10_000))
    now_ms = int(world.clock.now() * 1000)
    assert (renewed.attempt, renewed.invisible_until_ms) == (1, now_ms + 10_000)
    error = refused(world, world.pop.ack("g", got.receipt))
    assert (error.status, error.reason) == (
        StatusCode.FAILED_PRECONDITION,
        "INVALID_RECEIPT_HANDLE",
    )
    assert "not the message's current one" in error.message
    world.advance(5)
    assert world.receive() == [], "past the first deadline, within the new one"
    error = refused(world, world.pop.ack("g", got.receipt))
    assert error.reason == "RECEIPT_EXPIRED", "past its own deadline the old one has expired"
    world.ack(renewed.receipt)
    world.advance(60)
    assert world.receive() == []


def test_a_change_can_shorten_the_lease(world: PopWorld) -> None:
    world.send(0, b"x")
    [got] = world.receive(invisible=60)
    world.run(world.pop.change_invisible_duration("g", got.receipt, 1000))
    world.advance(1)
    assert [r.attempt for r in world.receive()] == [2]


def test_a_change_of_an_expired_or_settled_receipt_is_refused(world: PopWorld) -> None:
    world.send(0, b"x", b"y")
    x, y = world.receive(queue_ids=[0], invisible=5)
    world.ack(x)
    error = refused(world, world.pop.change_invisible_duration("g", x.receipt, 1000))
    assert (error.status, error.reason) == (
        StatusCode.FAILED_PRECONDITION,
        "INVALID_RECEIPT_HANDLE",
    )
    assert "already settled" in error.message
    world.advance(5)
    error = refused(world, world.pop.change_invisible_duration("g", y.receipt, 1000))
    assert error.reason == "RECEIPT_EXPIRED"


@pytest.mark.parametrize("ms", [-1, 12 * 3600 * 1000 + 1])
def test_a_change_to_a_duration_out_of_range_is_refused(world: PopWorld, ms: int) -> None:
    world.send(0, b"x")
    [got] = world.receive()
    before = world.pop.describe()
    error = refused(world, world.pop.change_invisible_duration("g", got.receipt, ms))
    assert (error.status, error.reason) == (StatusCode.INVALID_ARGUMENT, "INVALID_INVISIBLE_TIME")
    assert world.pop.describe() == before


def test_a_change_to_zero_is_a_negative_ack_the_message_comes_back_at_once(
    tmp_path: Path,
) -> None:
    world = PopWorld(tmp_path, max_attempts=2)
    try:
        world.send(0, b"x")
        [got] = world.receive(invisible=60)
        renewed = world.run(world.pop.change_invisible_duration("g", got.receipt, 0))
        assert renewed.invisible_until_ms == int(world.clock.now() * 1000)
        [again] = world.receive(invisible=60)
        assert again.attempt == 2
        world.run(world.pop.change_invisible_duration("g", again.receipt, 0))
        assert world.advance(0) == 1, "its last attempt: dead-lettered at once"
        assert [d.body for d in world.dead_letters()] == [b"x"]
    finally:
        world.close()


def test_a_groups_policy_is_what_its_latest_receive_said(world: PopWorld) -> None:
    assert (world.pop.policy("g").fifo, world.pop.policy("g").max_attempts) == (False, 17)
    world.topic()
    world.receive(fifo=True, max_attempts=5)
    assert (world.pop.policy("g").fifo, world.pop.policy("g").max_attempts) == (True, 5)


def test_receipts_that_are_not_ours_or_another_groups_are_invalid_and_change_nothing(
    world: PopWorld,
) -> None:
    world.send(0, b"x")
    [got] = world.receive()
    r = parse_receipt(got.receipt)
    forged = Receipt(r.group, r.topic, r.queue_id, r.offset, r.nonce ^ 1, r.deadline_ms).encode()
    other_queue = Receipt(r.group, r.topic, 7, r.offset, r.nonce, r.deadline_ms).encode()
    before = world.pop.describe()
    for text, status in [
        ("", StatusCode.INVALID_ARGUMENT),
        ("not a receipt", StatusCode.INVALID_ARGUMENT),
        (got.receipt[:-3], StatusCode.INVALID_ARGUMENT),
        ("A" * 5000, StatusCode.INVALID_ARGUMENT),
        (other_queue, StatusCode.INVALID_ARGUMENT),
        (forged, StatusCode.FAILED_PRECONDITION),
    ]:
        error = refused(world, world.pop.ack("g", text))
        assert (error.status, error.reason) == (status, "INVALID_RECEIPT_HANDLE"), text
    error = refused(world, world.pop.ack("other", got.receipt))
    assert error.reason == "INVALID_RECEIPT_HANDLE" and "belongs to group 'g'" in error.message
    assert refused(world, world.pop.ack("bad group!", got.receipt)).reason == "INVALID_GROUP"
    assert world.pop.describe() == before
    world.ack(got)


def test_a_receipt_round_trips_and_names_the_delivery() -> None:
    receipt = Receipt("grp", "%DLQ%grp", 3, 2**40, 2**64 - 1, 1_800_000_000_000)
    assert parse_receipt(receipt.encode()) == receipt


# ---------------------------------------------------------------------------- attempts, DLQ
def test_a_message_delivered_max_attempts_times_goes_to_the_dead_letter_topic(
    tmp_path: Path,
) -> None:
    world = PopWorld(tmp_path, max_attempts=3)
    try:
        world.send(0, b"poison", key=b"order-1")
        world.send(0, b"fine")
        attempts = []
        for _ in range(3):
            got = world.receive(queue_ids=[0], max_messages=1)
            attempts.append(got[0].attempt)
            assert bodies(got) == [b"poison"]
            assert world.advance(10) == (1 if len(attempts) == 3 else 0)
        assert attempts == [1, 2, 3]
        [dead] = world.dead_letters()
        assert (dead.body, dead.reconsume_times, dead.sharding_key) == (b"poison", 3, b"order-1")
        assert b"ORIGIN_TOPIC" in dead.properties
        [fine] = world.receive(queue_ids=[0])
        assert bodies([fine]) == [b"fine"] and fine.attempt == 1
        world.ack(fine)
        world.run(world.pop.commit_offsets())
        assert world.committed() == 2, "a dead-lettered message counts as settled"
    finally:
        world.close()


def test_a_receive_may_set_its_groups_attempt_limit(world: PopWorld) -> None:
    world.send(0, b"x")
    world.receive(max_attempts=1)
    world.advance(10)
    assert [d.body for d in world.dead_letters()] == [b"x"]


def test_forwarding_to_the_dead_letter_topic_settles_the_message(world: PopWorld) -> None:
    world.send(0, b"bad")
    [got] = world.receive()
    assert world.run(world.pop.forward_to_dead_letter("g", got.receipt)) == "%DLQ%g"
    assert [d.body for d in world.dead_letters()] == [b"bad"]
    world.ack(got)  # settled, and the receipt has not expired: fine
    world.advance(60)
    assert world.receive() == []


def test_a_dead_letter_copy_that_fails_is_retried_later(
    world: PopWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.send(0, b"x")
    world.receive(max_attempts=1)
    calls = []
    real = world.retry.dead_letter

    async def full(*args: object, **kw: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise BrokerError(StatusCode.UNAVAILABLE, "DISK_FULL", "disk full")
        return await real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(world.retry, "dead_letter", full)
    assert world.advance(10) == 0
    assert world.receive(max_attempts=1) == [], "neither delivered again nor lost"
    assert world.advance(1) == 1
    assert [d.body for d in world.dead_letters()] == [b"x"]


# ---------------------------------------------------------------------------- FIFO
def test_a_fifo_group_gets_a_message_groups_next_message_only_once_the_last_is_settled(
    world: PopWorld,
) -> None:
    world.send(0, b"a1", key=b"A")
    world.send(0, b"b1", key=b"B")
    world.send(0, b"a2", key=b"A")
    world.send(0, b"b2", key=b"B")
    first = world.receive(fifo=True, queue_ids=[0])
    assert bodies(first) == [b"a1", b"b1"]
    assert world.receive(fifo=True) == []
    world.ack(first[0])
    assert bodies(world.receive(fifo=True, invisible=60)) == [b"a2"]
    world.advance(10)  # b1 comes back: b2 still waits behind it
    again = world.receive(fifo=True)
    assert [(record_of(r).body, r.attempt) for r in again] == [(b"b1", 2)]


def test_a_fifo_groups_next_message_follows_a_dead_lettered_one(tmp_path: Path) -> None:
    world = PopWorld(tmp_path, max_attempts=1)
    try:
        world.send(0, b"a1", b"a2", key=b"A")
        assert bodies(world.receive(fifo=True)) == [b"a1"]
        assert world.advance(10) == 1
        assert bodies(world.receive(fifo=True)) == [b"a2"]
    finally:
        world.close()


def test_messages_without_a_sharding_key_are_one_message_group_per_queue(
    world: PopWorld,
) -> None:
    world.send(0, b"x1", b"x2")
    world.send(1, b"y1")
    assert sorted(bodies(world.receive(fifo=True))) == [b"x1", b"y1"]


def test_a_group_cannot_switch_between_fifo_and_not_while_messages_are_delivered(
    world: PopWorld,
) -> None:
    world.send(0, b"a1", b"a2", key=b"A")
    [a1] = world.receive(fifo=True, max_messages=1)
    before = world.pop.describe()
    error = refused(world, world.pop.receive("g", "jobs", max_messages=5, invisible_ms=1000))
    assert (error.status, error.reason) == (StatusCode.FAILED_PRECONDITION, "INVALID_ARGUMENT")
    assert world.pop.describe() == before
    world.ack(a1)
    assert bodies(world.receive()) == [b"a2"], "nothing delivered and unsettled: it may switch"


def test_a_waiting_receive_checks_the_mode_again_when_it_wakes(world: PopWorld) -> None:
    """A receive waiting without fifo must not deliver a FIFO group's messages out of
    order once another receive made the group FIFO while it waited."""
    world.send(1, b"c1", key=b"A")

    async def scenario() -> list[Received]:
        waiting = asyncio.ensure_future(
            world.pop.receive(
                "g", "jobs", max_messages=4, invisible_ms=9000, wait_ms=30_000, queue_ids=[0]
            )
        )
        while not world.holder.held:
            await asyncio.sleep(0)
        taken = await world.pop.receive("g", "jobs", max_messages=4, invisible_ms=9000,
                                        queue_ids=[1], fifo=True)  # fmt: skip
        assert bodies(taken) == [b"c1"]
        await world.store.put(world.topic(), 0, _frame(b"a1", b"A") + _frame(b"a2", b"A"))
        return await waiting

    error = refused(world, scenario())
    assert (error.status, error.reason) == (StatusCode.FAILED_PRECONDITION, "INVALID_ARGUMENT")
    assert bodies(world.receive(fifo=True, queue_ids=[0])) == [b"a1"]


# ---------------------------------------------------------------------------- limits, queues
def test_a_group_holds_at_most_max_in_flight_messages_per_queue(tmp_path: Path) -> None:
    world = PopWorld(tmp_path, max_in_flight=3)
    try:
        world.send(0, *[b"m%d" % i for i in range(6)])
        got = world.receive(queue_ids=[0], max_messages=10)
        assert bodies(got) == [b"m0", b"m1", b"m2"]
        world.ack(got[1])
        assert world.receive() == [], "m0 still holds the window"
        world.ack(got[0])
        assert bodies(world.receive()) == [b"m3", b"m4"]
    finally:
        world.close()


def test_a_receive_takes_from_every_queue_or_the_ones_it_names(world: PopWorld) -> None:
    world.send(0, b"q0")
    world.send(1, b"q1")
    assert bodies(world.receive(queue_ids=[1])) == [b"q1"]
    assert bodies(world.receive()) == [b"q0"]


def test_receives_start_at_another_queue_each_time(world: PopWorld) -> None:
    world.send(0, b"a", b"b")
    world.send(1, b"x", b"y")
    first = world.receive(max_messages=1)
    second = world.receive(max_messages=1)
    assert {first[0].queue_id, second[0].queue_id} == {0, 1}


def test_a_tag_expression_settles_the_messages_it_does_not_match(world: PopWorld) -> None:
    world.send(0, b"t")  # tagged T
    world.send(1, b"u")
    assert world.receive(tags=frozenset({b"other"})) == []
    world.run(world.pop.commit_offsets())
    assert (world.committed(queue_id=0), world.committed(queue_id=1)) == (1, 1)


def test_groups_do_not_see_each_others_receives(world: PopWorld) -> None:
    world.send(0, b"a")
    [mine] = world.receive("g1")
    [theirs] = world.receive("g2")
    world.ack(mine, group="g1")
    world.advance(10)
    assert world.receive("g1") == []
    assert [r.attempt for r in world.receive("g2")] == [2]
    assert theirs.receipt != mine.receipt


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"group": "bad group"}, "INVALID_GROUP"),
        ({"topic_name": "nope"}, "TOPIC_NOT_FOUND"),
        ({"topic_name": "rmq sys"}, "INVALID_TOPIC"),
        ({"max_messages": 0}, "INVALID_ARGUMENT"),
        ({"max_messages": 1001}, "INVALID_ARGUMENT"),
        ({"invisible_ms": 0}, "INVALID_INVISIBLE_TIME"),
        ({"invisible_ms": 12 * 3600 * 1000 + 1}, "INVALID_INVISIBLE_TIME"),
        ({"wait_ms": -1}, "INVALID_ARGUMENT"),
        ({"wait_ms": 60_001}, "INVALID_ARGUMENT"),
        ({"max_attempts": -1}, "INVALID_ARGUMENT"),
        ({"queue_ids": [2]}, "INVALID_QUEUE"),
        ({"queue_ids": [-1]}, "INVALID_QUEUE"),
    ],
)
def test_a_bad_receive_is_refused_with_its_reason_and_changes_nothing(
    world: PopWorld, kw: dict[str, object], reason: str
) -> None:
    world.send(0, b"x")
    args: dict[str, object] = {"group": "g", "topic_name": "jobs", "max_messages": 1,
                               "invisible_ms": 1000} | kw  # fmt: skip
    group, topic = args.pop("group"), args.pop("topic_name")
    error = refused(world, world.pop.receive(group, topic, **args))  # type: ignore[arg-type]
    assert error.reason == reason
    assert world.pop.describe() == {}


# ---------------------------------------------------------------------------- long polling
def test_a_waiting_receive_is_answered_when_a_message_arrives(world: PopWorld) -> None:
    world.topic()

    async def scenario() -> list[Received]:
        waiting = asyncio.ensure_future(
            world.pop.receive("g", "jobs", max_messages=4, invisible_ms=1000, wait_ms=30_000)
        )
        while not world.holder.held:
            await asyncio.sleep(0)
        await world.store.put(world.topic(), 1, _frame(b"late"))
        return await waiting

    assert bodies(world.run(scenario())) == [b"late"]


def test_a_waiting_receive_is_answered_when_a_lease_runs_out(world: PopWorld) -> None:
    world.send(0, b"x")
    world.receive(invisible=5)

    async def scenario() -> list[Received]:
        waiting = asyncio.ensure_future(
            world.pop.receive("g", "jobs", max_messages=4, invisible_ms=1000, wait_ms=30_000)
        )
        while not world.holder.held:
            await asyncio.sleep(0)
        world.clock.advance(5)  # no sweep: the receive itself waits for the deadline
        return await waiting

    assert [r.attempt for r in world.run(scenario())] == [2]


def test_a_waiting_receive_answers_nothing_when_its_time_runs_out(world: PopWorld) -> None:
    world.topic()

    async def scenario() -> list[Received]:
        waiting = asyncio.ensure_future(
            world.pop.receive("g", "jobs", max_messages=4, invisible_ms=1000, wait_ms=2000)
        )
        while not world.holder.held:
            await asyncio.sleep(0)
        world.clock.advance(2)
        return await waiting

    assert world.run(scenario()) == []


def test_a_waiting_fifo_receive_is_answered_when_the_message_group_frees(
    world: PopWorld,
) -> None:
    world.send(0, b"a1", b"a2", key=b"A")
    [a1] = world.receive(fifo=True)

    async def scenario() -> list[Received]:
        waiting = asyncio.ensure_future(
            world.pop.receive(
                "g", "jobs", max_messages=4, invisible_ms=1000, wait_ms=30_000, fifo=True
            )
        )
        while not world.holder.held:
            await asyncio.sleep(0)
        await world.pop.ack("g", a1.receipt)
        return await waiting

    assert bodies(world.run(scenario())) == [b"a2"]


# ---------------------------------------------------------------------------- durability
def test_after_a_crash_unacked_messages_come_back_after_their_time_and_acked_ones_do_not(
    world: PopWorld,
) -> None:
    world.send(0, b"a", b"b", b"c")
    _a, b, c = world.receive(queue_ids=[0], invisible=30)
    world.ack(b)
    world.crash()
    assert world.receive() == [], "still invisible after the restart"
    world.ack(c)  # a receipt from before the crash still works
    world.advance(30)
    again = world.receive()
    assert [(record_of(r).body, r.attempt) for r in again] == [(b"a", 2)]
    world.crash()
    world.advance(30)
    assert [r.attempt for r in world.receive()] == [3], "attempts survive too"


def test_offsets_mirror_the_journal_and_survive_a_crash_without_going_back(
    world: PopWorld,
) -> None:
    world.send(0, b"a", b"b")
    a, b = world.receive(queue_ids=[0])
    world.ack(a)
    world.run(world.pop.commit_offsets())
    assert world.committed() == 1
    world.ack(b)
    world.crash()  # the second ack is journaled, not committed yet
    assert world.committed() == 1
    assert world.pop.progress("g", "jobs", 0) is not None
    assert world.pop.progress("g", "jobs", 0).base == 2  # type: ignore[union-attr]
    world.run(world.pop.commit_offsets())
    assert world.committed() == 2


def test_after_a_restart_an_ack_moves_the_offset_without_another_receive(
    world: PopWorld,
) -> None:
    """Found by the state machine: the replayed window's position stayed at its base,
    so an ack of a message received before the crash did not move the group's offset."""
    world.send(0, b"a", b"b")
    [a] = world.receive(queue_ids=[0], max_messages=1, invisible=30)
    world.crash()
    world.ack(a)
    world.run(world.pop.commit_offsets())
    assert world.committed() == 1


def test_a_torn_journal_tail_is_ignored(world: PopWorld) -> None:
    world.send(0, b"a", b"b")
    a, _ = world.receive(queue_ids=[0], invisible=30)
    world.ack(a)
    journal = next((world.path / "pop").glob("journal-*.log"))
    with open(journal, "ab") as f:
        f.write(b'0badc0de {"op":"settle"')  # a record cut short by the crash
    world.crash()
    world.advance(30)
    assert bodies(world.receive()) == [b"b"]


def test_a_record_that_fails_its_crc_ends_the_replay(world: PopWorld) -> None:
    world.send(0, b"a")
    [a] = world.receive(queue_ids=[0], invisible=30)
    journal = next((world.path / "pop").glob("journal-*.log"))
    world.ack(a)
    data = journal.read_bytes()
    journal.write_bytes(data.replace(b'"op":"settle"', b'"op":"settlE"'))
    world.crash()  # the ack's record is damaged: as if never written
    world.advance(30)
    assert bodies(world.receive()) == [b"a"]


def test_compaction_keeps_the_state_across_generations_and_crashes(tmp_path: Path) -> None:
    world = PopWorld(tmp_path)
    try:
        world.pop.journal._compact_bytes = 1  # every compaction check compacts
        world.send(0, *[b"m%d" % i for i in range(6)])
        got = world.receive(queue_ids=[0], invisible=30)
        world.ack(got[2])
        world.run(world.pop._compact())
        world.ack(got[3])
        world.run(world.pop._compact())
        world.ack(got[4])
        journals = sorted(p.name for p in (world.path / "pop").glob("journal-*.log"))
        assert len(journals) == 1
        world.crash()
        world.advance(30)
        assert bodies(world.receive()) == [b"m0", b"m1", b"m5"]
    finally:
        world.close()


def test_a_crash_between_compaction_steps_replays_both_journals(tmp_path: Path) -> None:
    world = PopWorld(tmp_path)
    try:
        world.send(0, b"a", b"b")
        a, b = world.receive(queue_ids=[0], invisible=30)
        world.ack(a)
        directory = world.path / "pop"
        [old] = list(directory.glob("journal-*.log"))
        generation = int(old.stem.split("-")[1])
        # What compaction leaves when killed after the switch, before the snapshot: the
        # next journal exists and holds records, state.json is still the old one.
        next_journal = directory / f"journal-{generation + 1}.log"
        world.pop.journal._fd, fd = (
            os.open(next_journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND),
            world.pop.journal._fd,
        )
        assert fd is not None
        os.close(fd)
        world.ack(b)
        world.crash()
        world.advance(30)
        assert world.receive() == []
    finally:
        world.close()


def test_an_unreadable_pop_state_stops_the_start_and_names_the_file(tmp_path: Path) -> None:
    world = PopWorld(tmp_path)
    world.close()
    (tmp_path / "pop" / STATE_FILE).write_text('{"format": 1, "generation": 0, "state": 5}')
    with pytest.raises(CorruptFileError, match=STATE_FILE):
        PopWorld(tmp_path)


def test_a_failed_journal_write_refuses_every_later_change(world: PopWorld) -> None:
    world.send(0, b"a", b"b")
    a, b = world.receive(queue_ids=[0])
    journal = world.pop.journal
    assert journal._fd is not None
    os.close(journal._fd)
    journal._fd = os.open(os.devnull, os.O_RDONLY)  # writes fail with EBADF
    error = refused(world, world.pop.ack("g", a.receipt))
    assert (error.status, error.reason) == (StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE")
    for call in (
        world.pop.ack("g", b.receipt),
        world.pop.receive("g", "jobs", max_messages=1, invisible_ms=1000),
    ):
        assert refused(world, call).reason == "STORE_UNAVAILABLE"


def test_a_receive_that_fails_part_way_hides_nothing(
    world: PopWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Queue 0's message was leased in memory and journaled, then reading queue 1 failed:
    # the receive was refused, yet queue 0's message stayed hidden for its whole
    # invisible time (up to 12 hours) with an attempt counted that nobody received.
    world.send(0, b"first")
    world.send(1, b"second")
    read = world.store.get

    def failing(topic: Topic, queue_id: int, *args: Any, **kw: Any) -> Any:
        if queue_id == 1:
            raise BrokerError(StatusCode.UNAVAILABLE, "STORE_UNAVAILABLE", "queue 1 unreadable")
        return read(topic, queue_id, *args, **kw)

    monkeypatch.setattr(world.store, "get", failing)
    assert refused(world, world.pop.receive("g", "jobs", max_messages=2, invisible_ms=3_600_000))
    monkeypatch.setattr(world.store, "get", read)
    got = world.receive(invisible=3600)
    assert sorted((bodies([r])[0], r.attempt) for r in got) == [(b"first", 1), (b"second", 1)]
    world.crash()
    world.advance(1)
    assert sorted(r.attempt for r in world.receive()) == [], "both leased by the second receive"
    world.advance(3600)
    assert sorted((bodies([r])[0], r.attempt) for r in world.receive()) == [
        (b"first", 2),
        (b"second", 2),
    ]


def test_a_broker_starting_on_a_full_disk_refuses_receives_until_the_journal_opens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker must start on a disk without a free byte (reads work): the pop journal's
    new generation is written once there is room again."""
    world = PopWorld(tmp_path)
    try:
        world.send(0, b"a", b"b")
        a, _ = world.receive(queue_ids=[0], invisible=30)
        world.ack(a)

        def full(path: Path, data: bytes) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr("mockbroker.pop.journal.write_atomically", full)
        world.crash()  # starts all the same
        error = refused(world, world.pop.receive("g", "jobs", max_messages=5, invisible_ms=9))
        assert (error.status, error.reason) == (StatusCode.UNAVAILABLE, "DISK_FULL")
        assert refused(world, world.pop.ack("g", a.receipt)).reason == "DISK_FULL"
        monkeypatch.undo()
        assert world.pop._open_journal(world.pop._state())
        world.ack(a)
        world.advance(30)
        assert bodies(world.receive()) == [b"b"]
    finally:
        world.close()


def test_retention_moves_a_window_past_deleted_messages(world: PopWorld) -> None:
    world.send(0, b"a", b"b", b"c")
    world.receive(queue_ids=[0])
    cq = world.store.queue(world.topic(), 0)
    cq.trim_below(world.store.commitlog.end)  # as if retention deleted them
    world.send(0, b"d")
    world.advance(10)
    assert bodies(world.receive()) == [b"d"]
    world.run(world.pop.commit_offsets())
    assert world.committed() == 3


def test_an_operator_reset_starts_the_group_over(world: PopWorld) -> None:
    world.send(0, b"a", b"b")
    a, b = world.receive(queue_ids=[0], invisible=60)
    world.ack(a)
    world.ack(b)
    world.run(world.pop.reset("g", "jobs", 0, 0))
    assert bodies(world.receive()) == [b"a", b"b"]
    world.crash()
    world.advance(60)
    assert [r.attempt for r in world.receive()] == [2, 2]


def test_settled_windows_are_forgotten_once_the_offsets_hold_them(world: PopWorld) -> None:
    world.send(0, b"a")
    [a] = world.receive()
    world.ack(a)
    world.run(world.pop.commit_offsets())
    world.run(world.pop._compact())
    assert world.pop.describe() == {} and world.committed() == 1
    assert world.receive() == []


def _frame(body: bytes, key: bytes = b"") -> bytes:
    return encode_frame(msg_id=body.ljust(16, b"z"), born_timestamp_ms=1, body=body,
                        sharding_key=key)  # fmt: skip


def test_pop_service_is_importable_from_the_package() -> None:
    assert PopService.__module__ == "mockbroker.pop.service"
