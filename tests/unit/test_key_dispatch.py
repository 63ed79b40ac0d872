"""Key mode's dispatch (KeyDispatch with ProcessQueue.finish), as a state machine.

Messages arrive in offset order with random keys; calls start, finish, fail and are
retried in any interleaving. Whatever happens: a key has at most one call at a time, a
key's messages are handled in offset order (each after all earlier ones of its key), and
the offset the queue commits never passes a message that is not finished.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sdk.consumer.key_dispatch import Key, KeyDispatch
from sdk.consumer.process_queue import ProcessQueue
from sdk.message import MessageExt, MessageQueue
from tests.fuzzing import machine_settings

Q = MessageQueue("t", "b", 0)
KEYS = st.sampled_from(["a", "b", "c", "d", None])


def msg(offset: int, key: Key) -> MessageExt:
    return MessageExt("t", b"x", None, (), {}, key, f"{offset:032X}", Q, offset, 0, 0, 0)


def test_a_key_is_called_one_batch_at_a_time_and_other_keys_go_on() -> None:
    d = KeyDispatch()
    d.add([msg(0, "a"), msg(1, "b"), msg(2, "a"), msg(3, None)])
    first = d.next_call(8)
    assert first is not None and first[0] == "a"
    assert [m.queue_offset for m in first[1]] == [0, 2], "a's waiting messages, in order"
    second, third = d.next_call(8), d.next_call(8)
    assert second is not None and third is not None
    assert [(k, [m.queue_offset for m in b]) for k, b in (second, third)] == [
        ("b", [1]),
        (None, [3]),
    ]
    assert d.next_call(8) is None, "every key has a call running"
    d.add([msg(4, "a")])
    assert d.next_call(8) is None, "a's call still runs: 4 waits for it"
    d.done("a")
    fourth = d.next_call(8)
    assert fourth is not None and [m.queue_offset for m in fourth[1]] == [4]


def test_a_failed_batch_waits_in_front_of_its_key_until_resumed() -> None:
    d = KeyDispatch()
    d.add([msg(0, "a"), msg(1, "a"), msg(2, "b")])
    call = d.next_call(1)
    assert call is not None and call[0] == "a"
    d.put_back("a", call[1])
    other = d.next_call(1)
    assert other is not None and other[0] == "b", "b goes on while a waits"
    assert d.next_call(1) is None, "a is held until resumed"
    d.resume("a")
    again = d.next_call(1)
    assert again is not None and [m.queue_offset for m in again[1]] == [0]


def test_putting_back_nothing_leaves_no_empty_call() -> None:
    d = KeyDispatch()
    d.add([msg(0, "a")])
    call = d.next_call(8)
    assert call is not None
    d.put_back("a", [])  # the whole run succeeded: nothing to put back
    d.done("a")
    assert d.next_call(8) is None


class KeyDispatchMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pq = ProcessQueue()
        self.dispatch = KeyDispatch()
        self.next_offset = 0
        self.running: dict[Key, list[MessageExt]] = {}
        self.held: set[Key] = set()  # failed, waiting to be resumed
        self.finished: set[int] = set()
        self.last_handled: dict[Key, int] = {}
        self.key_of: dict[int, Key] = {}
        self.committed = -1

    @rule(keys=st.lists(KEYS, min_size=1, max_size=6))
    def pull(self, keys: list[Key]) -> None:
        messages = [msg(self.next_offset + i, k) for i, k in enumerate(keys)]
        for m in messages:
            self.key_of[m.queue_offset] = m.sharding_key
        self.next_offset += len(keys)
        self.pq.put(messages)
        self.dispatch.add(self.pq.take_all(self.pq.buffered))

    @rule(size=st.integers(1, 3))
    def start(self, size: int) -> None:
        call = self.dispatch.next_call(size)
        if call is None:
            return
        key, batch = call
        assert key not in self.running, f"two calls at once for key {key!r}"
        assert key not in self.held, f"key {key!r} called while it waits to retry"
        assert all(m.sharding_key == key for m in batch)
        offsets = [m.queue_offset for m in batch]
        assert offsets == sorted(offsets)
        earlier = [o for o, k in self.key_of.items() if k == key and o < offsets[0]]
        assert all(o in self.finished for o in earlier), "an earlier message of the key is open"
        self.running[key] = batch

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def succeed(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running, key=str)))
        batch = self.running.pop(key)
        self.finished.update(m.queue_offset for m in batch)
        self.dispatch.done(key)
        offset = self.pq.finish(batch)
        assert offset >= self.committed, "the commit moved backwards"
        self.committed = offset

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fail(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.running, key=str)))
        self.dispatch.put_back(key, self.running.pop(key))
        self.held.add(key)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.held, key=str)))
        self.held.remove(key)
        self.dispatch.resume(key)

    @invariant()
    def the_commit_never_passes_an_unfinished_message(self) -> None:
        assert all(o in self.finished for o in range(self.committed)), self.committed

    @invariant()
    def nothing_is_lost(self) -> None:
        open_ = self.dispatch.waiting + sum(len(b) for b in self.running.values())
        assert open_ + len(self.finished) == self.next_offset
        assert self.pq.count == self.next_offset - len(self.finished)


#: `make test-stateful` (HYPOTHESIS_PROFILE=long) explores far more interleavings.
KeyDispatchMachine.TestCase.settings = machine_settings(60, 1000, steps=(30, 60))
test_key_dispatch_state_machine = KeyDispatchMachine.TestCase
