"""Generated inputs for the fuzz tests: protobuf requests built from their descriptors,
one-field changes of valid requests, and byte-level mutations of valid encodings.

The request strategy reads only the message descriptor, so a new RPC, message or field is
fuzzed without touching this file. Values are drawn from three sources: names and numbers
the broker under test knows (a `Pools`), boundaries (0, -1, the type's extremes, the
protocol's limits), and anything at all of the field's type.

Examples: `make test` runs a bounded, derandomized search; HYPOTHESIS_PROFILE=long (which
`make chaos` sets, with ORDERMQ_CHAOS=long) runs a long random one.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from mockbroker import BrokerConfig, EmbeddedBroker
from mockbroker.server import Broker
from sdk.testing import FakeClock
from tests.chaos_report import LONG as CHAOS_LONG

LONG = os.environ.get("HYPOTHESIS_PROFILE") == "long" or CHAOS_LONG


def fuzz_settings(short: int, long: int) -> settings:
    """`short` derandomized examples under `make test`, `long` random ones in the long form."""
    return settings(
        max_examples=long if LONG else short,
        derandomize=not LONG,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def machine_settings(short: int, long: int, *, steps: tuple[int, int]) -> settings:
    """A state machine's: `short` derandomized examples of steps[0] steps each under
    `make test`; `long` random ones of steps[1] in the long form (`make test-stateful`)."""
    return settings(
        max_examples=long if LONG else short,
        stateful_step_count=steps[1] if LONG else steps[0],
        derandomize=not LONG,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


class Tracebacks(logging.Handler):
    """Records logged with an exception attached (a handler that raised)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.name.startswith("grpc"):
            self.records.append(record)


def broker_state(broker: Broker) -> dict[str, Any]:
    """What a refused call must leave as it was: topics, queue sizes, the commit log,
    offsets, locks and epochs, group members, the group registry, scheduled messages,
    receiving groups' held messages, pending transactions.

    Compare it only on a broker whose clock does not move (a FakeClock): nothing then
    changes by itself between two calls, so any change is the call's."""
    state = broker.state
    assert state is not None
    store, groups = state.store, state.groups
    topics = store.topics.all()
    return {
        "topics": {t.name: (t.queue_count, t.retention) for t in topics},
        "queues": {(t.name, q): store.queue(t, q).max_offset for t in topics
                   for q in range(t.queue_count)},
        "commit log": store.commitlog.end,
        "offsets": {k: state.offsets.get(*k) for k in state.offsets.committed()},
        "locks": state.locks._snapshot(),
        # The registry itself: every group name the broker keeps something for.
        "groups": {g: (groups.version(g), groups.members(g)) for g in sorted(groups._groups)},
        "clients": {g: sorted(groups.membership(g).items()) for g in groups.active_groups()},
        "scheduled": state.scheduler.pending,
        "pops": state.pop.describe(),
        "transactions": state.transactions.pending,
    }  # fmt: skip


def still_broker(data_dir: Path, **config: Any) -> tuple[EmbeddedBroker, FakeClock]:
    """A broker (not started) for broker_state comparisons, and its clock: a FakeClock
    that never moves, and leases and client timeouts that would not end if it did."""
    clock = FakeClock(start=1_800_000_000.0)
    never = 10.0**9
    config = BrokerConfig(
        data_dir=data_dir, lock_lease_seconds=never, client_timeout_seconds=never,
        disconnect_grace_seconds=never, **config,
    )  # fmt: skip
    return EmbeddedBroker(config, clock=clock), clock


def held_pulls(broker: Broker) -> int:
    """Pulls and receives the broker holds for messages to come."""
    assert broker.state is not None
    return broker.state.holder.held


# ---------------------------------------------------------------------------- integers
_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_UINT32 = (0, 2**32 - 1)
_UINT64 = (0, 2**64 - 1)
_RANGES = {
    FieldDescriptor.TYPE_INT32: _INT32,
    FieldDescriptor.TYPE_SINT32: _INT32,
    FieldDescriptor.TYPE_SFIXED32: _INT32,
    FieldDescriptor.TYPE_INT64: _INT64,
    FieldDescriptor.TYPE_SINT64: _INT64,
    FieldDescriptor.TYPE_SFIXED64: _INT64,
    FieldDescriptor.TYPE_UINT32: _UINT32,
    FieldDescriptor.TYPE_FIXED32: _UINT32,
    FieldDescriptor.TYPE_UINT64: _UINT64,
    FieldDescriptor.TYPE_FIXED64: _UINT64,
}
#: The protocol's limits and their neighbours (queue counts, pull sizes, delay levels...).
LIMITS = (1024, 1025, 10_000, 10_001, 18, 19, 255, 256, 32 << 20, (32 << 20) + 1, 60_001)


def integers(lo: int, hi: int, pool: Sequence[int] = ()) -> st.SearchStrategy[int]:
    """Small values, boundaries, known values, and anything in [lo, hi]."""
    edges = [v for v in (0, 1, -1, 2, lo, hi, lo + 1, hi - 1, *LIMITS, *pool) if lo <= v <= hi]
    return st.one_of(
        st.integers(max(lo, -2), min(hi, 40)),
        st.sampled_from(sorted(set(edges))),
        st.integers(lo, hi),
    )


def write_int(buf: bytearray, at: int, width: int, value: int) -> None:
    """Overwrite `width` bytes at `at` with `value`, little-endian (cut at the buffer's end)."""
    raw = (value % (1 << (8 * width))).to_bytes(width, "little")
    end = min(len(buf), at + width)
    buf[at:end] = raw[: end - at]


# ---------------------------------------------------------------------------- bytes
#: Values written over a length or count field: zero, one, sign bits, all ones, huge.
INTERESTING = (0, 1, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFF_FFFF, 0x8000_0000,
               0xFFFF_FFFF, 2**63 - 1, 2**63, 2**64 - 1)  # fmt: skip


@st.composite
def mutated(draw: st.DrawFn, data: bytes, *, max_steps: int = 4) -> bytes:
    """`data` after 1..max_steps mutations: bit flips, truncation, extension, deletion,
    duplication, random bytes spliced in, and integers (huge, negative, zero, near the
    length) written over any 1, 2, 4 or 8 bytes."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, max_steps))):
        kind = draw(st.sampled_from(("flip", "cut", "int", "insert", "delete", "dup", "append")))
        size = len(buf)
        if kind == "append" or not size:
            buf += draw(st.binary(min_size=1, max_size=32))
            continue
        at = draw(st.integers(0, size - 1))
        if kind == "flip":
            buf[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "cut":
            del buf[at:]
        elif kind == "int":
            width = draw(st.sampled_from((1, 2, 4, 8)))
            near = (size, size - at, size + 1, size - 1, size * 2)
            value = draw(st.sampled_from(INTERESTING + near) | st.integers(-(2**63), 2**64 - 1))
            write_int(buf, at, width, value)
        elif kind == "insert":
            buf[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del buf[at : at + draw(st.integers(1, 16))]
        else:
            end = draw(st.integers(at, size))
            buf[end:end] = buf[at:end]
    return bytes(buf)


_HEAD = struct.Struct("<II")


def fix_crcs(data: bytes, *, size_includes_head: bool) -> bytes:
    """Recompute every CRC of a run of records that start with (u32 size, u32 CRC32 of
    what follows the head), so that a mutation gets past the CRC and reaches the parsing
    behind it. The size counts the whole record (commit log records) or what follows the
    head (spool records)."""
    buf = bytearray(data)
    pos = 0
    while pos + _HEAD.size <= len(buf):
        size, _crc = _HEAD.unpack_from(buf, pos)
        start = pos + _HEAD.size
        stop = pos + size if size_includes_head else start + size
        if stop > len(buf) or stop < start:
            break
        struct.pack_into("<I", buf, pos + 4, zlib.crc32(buf[start:stop]))
        pos = stop
    return bytes(buf)


# ---------------------------------------------------------------------------- protobuf
@dataclass(frozen=True)
class Pools:
    """Values that mean something to the broker under test (existing topics, groups,
    client ids, message ids, offsets, valid frames), mixed into the generated requests so
    that they get past the first checks."""

    strings: tuple[str, ...] = ()
    binaries: tuple[bytes, ...] = ()
    ints: tuple[int, ...] = ()
    #: Field name -> extra values for it (e.g. ids an Exchange stream has in flight).
    by_field: dict[str, tuple[object, ...]] = field(default_factory=dict)


#: Strings near the naming rules: reserved prefixes, tag expressions, bad hex, the limits.
EDGE_STRINGS = ("", " ", "*", "||", "a||", "A || B", "%RETRY%", "%DLQ%x", "rmq_sys_",
                "rmq_sys_SCHEDULE", "a" * 127, "a" * 128, "c" * 255, "c" * 256, "0" * 32,
                "0" * 31, "zz" * 16, "a/b", "..", "é", "\x00", "\U0001f600")  # fmt: skip


def field_value(f: FieldDescriptor, pools: Pools, depth: int) -> st.SearchStrategy[object]:
    """One value of field `f`'s type (a message for message fields)."""
    extra = pools.by_field.get(f.name, ())
    base = _value(f, pools, depth)
    return st.one_of(st.sampled_from(extra), base) if extra else base


def _value(f: FieldDescriptor, pools: Pools, depth: int) -> st.SearchStrategy[object]:
    t = f.type
    if t == FieldDescriptor.TYPE_MESSAGE:
        return messages(f.message_type, pools, depth + 1)
    if t == FieldDescriptor.TYPE_STRING:
        known = pools.strings + EDGE_STRINGS
        return st.one_of(st.sampled_from(known), st.text(max_size=24), st.text(max_size=300))
    if t == FieldDescriptor.TYPE_BYTES:
        if not pools.binaries:
            return st.binary(max_size=64)
        known = st.sampled_from(pools.binaries)
        return st.one_of(known, known.flatmap(mutated), st.binary(max_size=64))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        defined = tuple(v.number for v in f.enum_type.values)
        return st.one_of(st.sampled_from(defined), integers(*_INT32, pools.ints))
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=True, allow_infinity=True, width=32)
    if t in _RANGES:
        return integers(*_RANGES[t], pools.ints)
    raise NotImplementedError(f"no strategy for field {f.full_name} of type {t}")


def _set(msg: Message, f: FieldDescriptor, value: object) -> None:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        entries = getattr(msg, f.name)  # a map: its entries drawn as key/value messages
        entries.clear()
        for entry in value:  # type: ignore[attr-defined]
            if f.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_MESSAGE:
                entries[entry.key].CopyFrom(entry.value)
            else:
                entries[entry.key] = entry.value
        return
    if f.is_repeated:
        target = getattr(msg, f.name)
        del target[:]
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            for item in value:  # type: ignore[attr-defined]
                target.add().CopyFrom(item)
        else:
            target.extend(value)  # type: ignore[arg-type]
    elif f.type == FieldDescriptor.TYPE_MESSAGE:
        getattr(msg, f.name).CopyFrom(value)
    else:
        setattr(msg, f.name, value)


def _field_strategy(f: FieldDescriptor, pools: Pools, depth: int) -> st.SearchStrategy[object]:
    one = field_value(f, pools, depth)
    return st.lists(one, max_size=4) if f.is_repeated else one


MAX_DEPTH = 3


def messages(desc: Descriptor, pools: Pools, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type `desc`, each field set or left unset; at most one field per oneof."""
    cls: Callable[[], Message] = GetMessageClass(desc)
    plain = [f for f in desc.fields if f.containing_oneof is None]
    if depth >= MAX_DEPTH:
        plain = [f for f in plain if f.type != FieldDescriptor.TYPE_MESSAGE]
    parts: dict[str, st.SearchStrategy[object]] = {
        f.name: st.none() | _field_strategy(f, pools, depth) for f in plain
    }
    for oneof in desc.oneofs:
        members = [
            st.tuples(st.just(f.name), _field_strategy(f, pools, depth))
            for f in oneof.fields
            if depth < MAX_DEPTH or f.type != FieldDescriptor.TYPE_MESSAGE
        ]
        parts["oneof " + oneof.name] = st.one_of(st.none(), *members)

    def build(values: dict[str, object]) -> Message:
        msg = cls()
        for name, value in values.items():
            if value is None:
                continue
            if name.startswith("oneof "):
                name, value = value  # type: ignore[misc]
            _set(msg, desc.fields_by_name[name], value)
        return msg

    return st.fixed_dictionaries(parts).map(build)


@st.composite
def one_field_changed(draw: st.DrawFn, seed: Message, pools: Pools) -> Message:
    """`seed` with one field (or one field of a nested message) given another value or cleared."""
    msg = type(seed)()
    msg.CopyFrom(seed)
    target = msg
    desc = target.DESCRIPTOR
    # Walk down into a set sub-message now and then, so that nested fields change too.
    while True:
        nested = [
            f
            for f in desc.fields
            if f.type == FieldDescriptor.TYPE_MESSAGE
            and not f.is_repeated
            and target.HasField(f.name)
        ]
        if not nested or not draw(st.booleans()):
            break
        f = draw(st.sampled_from(tuple(nested)))
        target = getattr(target, f.name)
        desc = f.message_type
    if not desc.fields:
        return msg
    f = draw(st.sampled_from(tuple(desc.fields)))
    if draw(st.integers(0, 5)) == 0:
        target.ClearField(f.name)
    else:
        _set(target, f, draw(_field_strategy(f, pools, depth=1)))
    return msg
