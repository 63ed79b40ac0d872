"""The Exchange port (ordermq's clients' default front: framed TCP) fuzzed over real
connections to an EmbeddedBroker.

Each example is one connection: a preamble (mostly the right one), then one to three
frames, each a generated ExchangeRequests (tests/fuzzing.py, from the descriptor), a
valid one (a send, a pull, a subscription, a credit, a cancel, a ping, a hello) with
one field changed or its bytes mutated, or a frame whose length says more or less than
it carries; then the client's half-close. The broker must answer in frames that parse,
greet first, answer only ids it was sent (an error of the whole connection as id 0, in
its last frame), close the connection within the deadline (a pull it holds aside:
then the client gives up), and log no traceback; and when no send was answered as
stored, nothing changed (tests.fuzzing.broker_state, the broker on a clock that does
not move). ExchangeRequests' handling behind the framing is the gRPC ExchangeBatched
stream's, fuzzed in test_fuzz_rpc.py.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given
from hypothesis import strategies as st

from mockbroker import EmbeddedBroker
from mockbroker.fronts.exchange_port import PREAMBLE
from sdk import Message, Producer
from sdk._pb.ordermq.v1 import ordermq_pb2 as pb
from sdk._transport.codec import MessageIdGenerator, encode_message
from tests.chaos_report import ChaosRecorder
from tests.component.pulling import read_topic
from tests.fuzzing import (
    Pools,
    Tracebacks,
    broker_state,
    fuzz_settings,
    held_pulls,
    messages,
    mutated,
    one_field_changed,
    still_broker,
)

pytestmark = pytest.mark.chaos

TOPIC, GROUP = "orders", "g1"
#: Longest a connection may take to be answered and closed after the client's half-close.
DEADLINE = 10.0
#: A connection still open this long after the half-close, with a pull or a subscription
#: left waiting: given up. (A broker too busy to take the cancels in time makes the
#: example count as held: its checks are skipped, never failed.)
HELD_AFTER = 0.5


@dataclass
class Port:
    embedded: EmbeddedBroker
    seeds: list[pb.ExchangeRequests]
    pools: Pools

    @property
    def address(self) -> tuple[str, int]:
        assert self.embedded.exchange_address is not None
        host, port = self.embedded.exchange_address.rsplit(":", 1)
        return host, int(port)


def seeds(frames: bytes) -> list[pb.ExchangeRequests]:
    """Valid frames of every kind the port takes."""
    send = pb.SendRequest(topic=TOPIC, queue_id=0, frames=frames)
    pull = pb.PullRequest(group=GROUP, topic=TOPIC, queue_id=0, offset=0, max_messages=4,
                          max_bytes=1 << 16, tag_expression="*")  # fmt: skip
    subscribe = pb.Subscribe(group=GROUP, topic=TOPIC, queue_id=1, offset=0, max_messages=4,
                             max_bytes=1 << 16, credit_messages=2)  # fmt: skip
    r = pb.ExchangeRequest
    return [
        pb.ExchangeRequests(requests=[r(id=1, send=send)]),
        pb.ExchangeRequests(requests=[r(id=2, pull=pull), r(id=3, subscribe=subscribe)]),
        pb.ExchangeRequests(
            requests=[r(id=3, subscribe=subscribe), r(id=3, credit=pb.Credit(messages=4))]
        ),
        pb.ExchangeRequests(requests=[r(id=4, pull=pull), r(id=4, cancel=pb.ExchangeCancel())]),
        pb.ExchangeRequests(ping=True),
        pb.ExchangeRequests(hello=pb.ExchangeHello(access_key="ak", date_ms=1, signature="s")),
    ]


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Port]:
    broker, clock = still_broker(tmp_path_factory.mktemp("fuzz-port") / "broker", exchange_port=0)
    with broker as embedded:
        with Producer(embedded.address) as producer:
            for i in range(16):
                producer.send(Message(TOPIC, b"m%d" % i, sharding_key=f"k{i}"))
        now = clock.now()
        frames = encode_message(
            Message(TOPIC, b"x", sharding_key="k"), MessageIdGenerator().next(), now
        )
        pools = Pools(strings=(TOPIC, GROUP, "*"), binaries=(frames,), ints=(0, 1, 2, 3, 4, 16))
        yield Port(embedded, seeds(frames), pools)


def waiting(embedded: EmbeddedBroker) -> int:
    """Pulls the broker holds for messages to come, and push subscriptions it serves."""
    messaging = embedded.broker._messaging
    assert messaging is not None
    return held_pulls(embedded.broker) + len(messaging.exchanges.subscriptions)


@st.composite
def frame(draw: st.DrawFn, f: Port) -> bytes:
    """One frame as it goes on the wire: its length, then its bytes."""
    seed = draw(st.sampled_from(f.seeds))
    body = draw(
        st.one_of(
            messages(pb.ExchangeRequests.DESCRIPTOR, f.pools).map(lambda m: m.SerializeToString()),
            one_field_changed(seed, f.pools).map(lambda m: m.SerializeToString()),
            mutated(seed.SerializeToString()),
        )
    )
    length = len(body)
    if draw(st.integers(0, 9)) == 0:  # a length that is not the frame's
        length = draw(st.sampled_from([0, 1, length + 1, max(0, length - 1), 2**31, 2**32 - 1]))
    return struct.pack(">I", length) + body


@st.composite
def connection(draw: st.DrawFn, f: Port) -> tuple[bytes, list[bytes]]:
    """A preamble (mostly the right one) and the frames after it."""
    preamble = PREAMBLE if draw(st.integers(0, 7)) else draw(mutated(PREAMBLE))
    return preamble, draw(st.lists(frame(f), min_size=1, max_size=3))


def requests(frames: list[bytes]) -> list[pb.ExchangeRequest]:
    """The requests the frames carry (of those that parse)."""
    out: list[pb.ExchangeRequest] = []
    for data in frames:
        with contextlib.suppress(DecodeError):
            out += pb.ExchangeRequests.FromString(data[4:]).requests
    return out


def cancels(frames: list[bytes]) -> bytes:
    """A frame cancelling the pulls and subscriptions among the frames' requests, as a
    client that is done sends before its half-close (the ids no send shares)."""
    sent = requests(frames)
    sends = {r.id for r in sent if r.WhichOneof("body") == "send"}
    ids = {r.id for r in sent if r.WhichOneof("body") in ("pull", "subscribe")} - sends - {0}
    if not ids:
        return b""
    body = pb.ExchangeRequests(
        requests=[pb.ExchangeRequest(id=i, cancel=pb.ExchangeCancel()) for i in sorted(ids)]
    ).SerializeToString()
    return struct.pack(">I", len(body)) + body


def talk(f: Port, preamble: bytes, frames: list[bytes]) -> list[bytes] | None:
    """Send it all, cancel what may wait, half-close, read every frame until the broker
    closes.

    None: the broker still holds a pull or a subscription of the connection (one whose
    id a send shares, so not cancelled; or one behind a frame that did not parse); the
    client gives up and closes. The broker's clock never moves, so the wait would not end.
    """
    waiting_before = waiting(f.embedded)
    with socket.create_connection(f.address, timeout=DEADLINE) as sock:
        try:
            sock.sendall(preamble + b"".join(frames) + cancels(frames))
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the broker closed first (a bad preamble or frame): read what it said
        data = b""
        closed_at = time.monotonic()
        while True:
            if not select.select([sock], [], [], 0.02)[0]:
                waited = time.monotonic() - closed_at
                if waited > HELD_AFTER and waiting(f.embedded) > waiting_before:
                    return None
                assert waited < DEADLINE, f"the connection was not closed within {DEADLINE}s"
                continue
            try:
                chunk = sock.recv(1 << 16)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                break
            data += chunk
    out = []
    while data:
        assert len(data) >= 4, f"a torn frame header at the end: {data!r}"
        (length,) = struct.unpack(">I", data[:4])
        assert len(data) >= 4 + length, f"a torn frame at the end: {length} bytes declared"
        out.append(data[4 : 4 + length])
        data = data[4 + length :]
    return out


def check(frames_in: list[bytes], answered: list[bytes], preamble_ok: bool) -> bool:
    """The broker's frames as the wire says they must be; True when a send was stored."""
    ids = {r.id for r in requests(frames_in)}
    parsed = [pb.ExchangeResponses.FromString(b) for b in answered]
    if preamble_ok and parsed:
        assert not parsed[0].responses and parsed[0].broker_id, "the greeting comes first"
    stored = False
    for n, message in enumerate(parsed):
        for answer in message.responses:
            kind = answer.WhichOneof("body")
            if answer.id == 0:
                assert kind == "error" and answer.error.message, f"id 0 without an error: {answer}"
                assert n == len(parsed) - 1, "the connection's error is its last frame"
                continue
            assert answer.id in ids, f"an answer to id {answer.id}, never sent: {ids}"
            if kind == "error":
                assert answer.error.code and answer.error.message, answer
            if kind == "send":  # stored whole, or a part of it stored
                parts = answer.send.parts
                stored = stored or not parts or any(not p.HasField("error") for p in parts)
    return stored


def test_the_exchange_port_answers_fuzzed_frames_and_refusals_change_nothing(
    port: Port, tracebacks: Tracebacks, chaos_report: ChaosRecorder
) -> None:
    counts: Counter[str] = Counter()

    @fuzz_settings(60, 2000)
    @given(connection(port))
    def run(conn: tuple[bytes, list[bytes]]) -> None:
        preamble, frames = conn
        counts["examples"] += 1
        tracebacks.records.clear()
        before = broker_state(port.embedded.broker)
        answered = talk(port, preamble, frames)
        assert not tracebacks.records, [r.getMessage() for r in tracebacks.records]
        if answered is None:
            counts["held"] += 1
            return
        stored = check(frames, answered, preamble == PREAMBLE)
        counts["stored" if stored else "nothing stored"] += 1
        if not stored:
            after = broker_state(port.embedded.broker)
            assert after == before, "a connection that stored nothing changed the broker"

    for seed in port.seeds:  # each valid frame alone, as it is: what they store is stored
        body = seed.SerializeToString()
        run = example((PREAMBLE, [struct.pack(">I", len(body)) + body]))(run)
    run()
    chaos_report.record(
        fault="fuzz: the Exchange port (framed TCP)", rounds=counts["examples"], acked=0,
        lost=0, order_violations=0, duplicates=0,
        note=f"{counts['stored']} connections stored a send, {counts['nothing stored']} "
        f"nothing, {counts['held']} left a pull or subscription waiting; no crash, every "
        "connection closed",
    )  # fmt: skip


def test_the_fuzzed_port_still_serves_what_was_stored(port: Port) -> None:
    bodies = {m.body for m in read_topic(port.embedded.address, TOPIC)}
    assert {b"m%d" % i for i in range(16)} <= bodies
